// The replica-kill test (tests/sdk/run-kube.sh runs it alone, last): the
// replica serving a streaming command is killed with SIGKILL; the sandbox
// goes on running, and the SDK's next calls through the other replica
// succeed: the command is still there, its output goes on, new commands
// run. The replica left then ends the sandbox at its timeout: the
// reconciler moved to it if the dead one held it.

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Sandbox } from 'e2b'
import { meta, sleep, track, trackCleanup, waitFor } from './helpers.mjs'

const REPLICAS = JSON.parse(process.env.AIRLOCK_KUBE_REPLICAS || '[]')
const skip = REPLICAS.length < 2 && 'needs two replicas (tests/sdk/run-kube.sh)'

trackCleanup()

describe('replica kill', { skip }, () => {
  test('killing the replica serving a stream leaves the sandbox to the other', async () => {
    const [left, killed] = REPLICAS
    const sbx = await Sandbox.create('base', { apiUrl: left.api, sandboxUrl: killed.sandbox, metadata: meta({ role: 'replica-kill' }) })
    track(sbx.sandboxId)
    let seen = ''
    let streamErr
    const handle = await sbx.commands.run(
      'for i in $(seq 1 600); do echo tick $i; echo $i >> /tmp/ticks; sleep 0.1; done',
      { background: true, onStdout: (d) => { seen += d } },
    )
    const ended = handle.wait().catch((e) => { streamErr = e })
    await waitFor(() => seen.includes('tick 5'), { timeoutMs: 20_000, what: 'the stream through the replica to be killed' })

    process.kill(killed.pid, 'SIGKILL')
    await waitFor(() => { try { process.kill(killed.pid, 0); return false } catch { return true } }, { what: 'the replica gone' })
    await Promise.race([ended, sleep(15_000)])
    assert.ok(streamErr || !seen.includes('tick 600'), 'the stream through the killed replica ended with it')

    // The other replica: same sandbox, the command still running.
    const other = await Sandbox.connect(sbx.sandboxId, { apiUrl: left.api, sandboxUrl: left.sandbox })
    const procs = await other.commands.list()
    assert.ok(procs.some((p) => p.pid === handle.pid), `the command runs on: ${JSON.stringify(procs)}`)
    const before = Number((await other.commands.run('wc -l < /tmp/ticks')).stdout.trim())
    await sleep(1_000)
    const after = Number((await other.commands.run('wc -l < /tmp/ticks')).stdout.trim())
    assert.ok(after > before, `its output goes on: ${before} then ${after}`)
    let resumed = ''
    const again = await other.commands.connect(handle.pid, { onStdout: (d) => { resumed += d } })
    await waitFor(() => /tick \d+/.test(resumed), { timeoutMs: 10_000, what: 'output through the replica left' })
    await other.commands.kill(handle.pid)
    await again.wait().catch(() => {})
    assert.equal((await other.commands.run('echo still here')).stdout, 'still here\n')

    // The replica left reconciles: the sandbox ends at its timeout.
    await Sandbox.setTimeout(sbx.sandboxId, 2_000, { apiUrl: left.api })
    await waitFor(async () => !(await Sandbox.list({ apiUrl: left.api, query: { metadata: meta({ role: 'replica-kill' }) } }).nextItems()).length,
      { timeoutMs: 30_000, what: 'the sandbox ended at its timeout by the replica left' })
  })
})
