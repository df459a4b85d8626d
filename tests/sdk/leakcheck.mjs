// After the suite: every sandbox of this run (metadata suite=<run id>) must be
// gone. Reports and kills leftovers; exits 1 if there were any.

import { Sandbox } from 'e2b'

const runId = process.env.AIRLOCK_SDK_RUN_ID
if (!runId) {
  console.error('[leakcheck] AIRLOCK_SDK_RUN_ID not set; skipping')
  process.exit(0)
}

let left = []
try {
  const p = Sandbox.list({ query: { metadata: { suite: runId } } })
  while (p.hasNext) left.push(...(await p.nextItems()))
} catch (e) {
  console.error(`[leakcheck] cannot list sandboxes: ${e.message}`)
  process.exit(1)
}

if (left.length === 0) {
  console.error(`[leakcheck] no sandboxes of run ${runId} left`)
  process.exit(0)
}
console.error(`[leakcheck] ${left.length} sandbox(es) of run ${runId} still listed:`)
for (const s of left) {
  console.error(`  ${s.sandboxId} state=${s.state} metadata=${JSON.stringify(s.metadata)}`)
  await Sandbox.kill(s.sandboxId).catch((e) => console.error(`  kill ${s.sandboxId}: ${e.message}`))
}
process.exit(1)
