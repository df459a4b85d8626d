// The product's own scenarios right after a first `make run` (tests/sdk/firstrun.sh
// starts `airlock serve` with default flags on an empty data dir, so the built-ins
// other than base are still building when this starts). Everything goes through
// the official MCP TypeScript client: `airlock mcp` over stdio (configured only with
// the E2B_* variables serve prints; it asks the server for the sandbox URL) and
// serve's /mcp over streamable HTTP; then the same tools through
// `npx @modelcontextprotocol/inspector --cli`.

import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { test } from 'node:test'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js'

const run = promisify(execFile)
const { AIRLOCK_BIN: BIN, E2B_API_URL: API_URL, E2B_API_KEY: API_KEY } = process.env
if (!BIN || !API_URL || !API_KEY) throw new Error('AIRLOCK_BIN, E2B_API_URL and E2B_API_KEY must be set (tests/sdk/firstrun.sh does)')
// firstrun.sh saw a 503 for these templates just before this file started: their
// creates must wait, with progress notifications.
const BUILDING = (process.env.FIRSTRUN_BUILDING ?? '').split(',').filter(Boolean)

const structured = (r) => r.structuredContent ?? JSON.parse(r.content.find((c) => c.type === 'text').text)
const text = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n')

// A tool call that may wait for a template build: up to the tools' 10 minutes, the
// client's timeout reset by each progress notification, which are collected.
async function callWaiting(client, name, args) {
  const progress = []
  const res = await client.callTool({ name, arguments: args }, CallToolResultSchema, {
    onprogress: (p) => progress.push(p),
    timeout: 120_000,
    resetTimeoutOnProgress: true,
    maxTotalTimeout: 11 * 60_000,
  })
  assert.ok(!res.isError, `${name}: ${text(res)}`)
  return { res, progress }
}

function checkProgress(template, progress) {
  if (!BUILDING.includes(template)) return
  // The tools also report their phases (creating, running); the wait's own
  // notifications are the server's message, out of the 600 s they wait.
  const waits = progress.filter((p) => p.message.includes('is still being built'))
  assert.ok(waits.length > 0, `no progress notification while ${template} was building: ${JSON.stringify(progress)}`)
  for (const p of waits) {
    assert.match(p.message, new RegExp(`template ${template} is still being built: .+ \\(for \\d+:\\d\\d`), JSON.stringify(p))
    assert.equal(p.total, 600)
  }
  for (let i = 1; i < progress.length; i++) assert.ok(progress[i].progress > progress[i - 1].progress, 'progress only grows')
  console.log(`${template}: waited with ${waits.length} progress notifications, first: ${waits[0].message}; last: ${waits.at(-1).message}`)
}

async function connectStdio() {
  const client = new Client({ name: 'airlock-firstrun', version: '0.0.0' })
  // Only what serve tells users to export: no --url, no --sandbox-url, no AIRLOCK_*.
  const env = { PATH: process.env.PATH, E2B_API_URL: API_URL, E2B_API_KEY: API_KEY }
  await client.connect(new StdioClientTransport({ command: BIN, args: ['mcp', '--data-dir', '/nonexistent'], env, stderr: 'inherit' }))
  return client
}

async function connectHTTP() {
  const client = new Client({ name: 'airlock-firstrun', version: '0.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${API_URL}/mcp`), {
    requestInit: { headers: { Authorization: `Bearer ${API_KEY}` } },
  }))
  return client
}

const pandasScript = `import pandas as pd
df = pd.DataFrame({"city": ["Oslo", "Lima", "Oslo", "Pune", "Lima", "Oslo"], "sales": [10, 20, 30, 40, 50, 60]})
summary = df.groupby("city")["sales"].agg(["sum", "mean"])
print(summary.to_json())
print("pandas", pd.__version__)
`

test('first run: python3 + pandas over stdio, node over HTTP, list, kill, run_code without a sandbox', { timeout: 25 * 60_000 }, async () => {
  const stdio = await connectStdio()
  const http = await connectHTTP()
  const created = []
  try {
    // 1. "Create a Python sandbox so I can run a data analysis script" (stdio).
    const py = await callWaiting(stdio, 'create_sandbox', { template: 'python3', timeout: 600 })
    checkProgress('python3', py.progress)
    const pyID = structured(py.res).sandbox_id
    created.push(pyID)
    const wrote = await stdio.callTool({ name: 'write_file', arguments: { sandbox_id: pyID, path: 'analysis.py', content: pandasScript } })
    assert.ok(!wrote.isError, text(wrote))
    const ran = await stdio.callTool({ name: 'run_command', arguments: { sandbox_id: pyID, command: 'python3 analysis.py' } })
    assert.ok(!ran.isError, text(ran))
    const out = structured(ran)
    assert.equal(out.exit_code, 0, JSON.stringify(out))
    const summary = JSON.parse(out.stdout.split('\n')[0])
    assert.deepEqual(summary.sum, { Lima: 70, Oslo: 100, Pune: 40 })
    assert.equal(summary.mean.Lima, 35)
    assert.equal(summary.mean.Oslo.toFixed(3), '33.333')
    console.log(`python3 sandbox ${pyID}: ${out.stdout.trim().split('\n').at(-1)}`)

    // 2. A node sandbox running JavaScript (HTTP).
    const node = await callWaiting(http, 'create_sandbox', { template: 'node', timeout: 600 })
    checkProgress('node', node.progress)
    const nodeID = structured(node.res).sandbox_id
    created.push(nodeID)
    const js = await http.callTool({
      name: 'run_command',
      arguments: { sandbox_id: nodeID, command: `node -e 'const xs = [3, 1, 2]; console.log(JSON.stringify({sorted: xs.sort(), node: process.version}))'` },
    })
    assert.ok(!js.isError, text(js))
    const jsOut = JSON.parse(structured(js).stdout)
    assert.deepEqual(jsOut.sorted, [1, 2, 3])
    assert.match(jsOut.node, /^v\d+\./)

    // 3. list_sandboxes: template, status, how long ago it started, CPU and memory
    // (metrics are sampled every few seconds: wait for a sample of each).
    let listed
    for (let i = 0; i < 30; i++) {
      listed = await stdio.callTool({ name: 'list_sandboxes', arguments: {} })
      assert.ok(!listed.isError, text(listed))
      const mine = structured(listed).sandboxes.filter((s) => created.includes(s.sandbox_id))
      if (mine.length === 2 && mine.every((s) => s.cpu_percent !== undefined && s.memory_used_mb !== undefined)) break
      await new Promise((r) => setTimeout(r, 1000))
    }
    const rows = structured(listed).sandboxes
    for (const [id, tpl] of [[pyID, 'python3'], [nodeID, 'node']]) {
      const row = rows.find((s) => s.sandbox_id === id)
      assert.ok(row, `${id} not listed: ${text(listed)}`)
      assert.equal(row.template, tpl)
      assert.equal(row.status, 'running')
      assert.match(row.uptime, /^(\d+m)?\d+s$/)
      assert.equal(typeof row.cpu_percent, 'number', JSON.stringify(row))
      assert.ok(row.memory_used_mb > 0 && row.memory_total_mb > 0, JSON.stringify(row))
    }
    const table = text(listed)
    assert.match(table, /SANDBOX ID\s+TEMPLATE\s+STATUS\s+STARTED\s+EXPIRES\s+CPU\s+MEMORY/)
    assert.match(table, new RegExp(`${pyID}\\s+python3\\s+running\\s+(\\d+m)?\\d+s ago`))
    console.log(table)

    // 4. kill_sandbox ends each; the next list no longer shows them.
    for (const id of [pyID, nodeID]) {
      const k = await http.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } })
      assert.ok(!k.isError, text(k))
    }
    const after = structured(await stdio.callTool({ name: 'list_sandboxes', arguments: {} })).sandboxes
    assert.ok(!after.some((s) => [pyID, nodeID].includes(s.sandbox_id)), JSON.stringify(after))
    created.length = 0

    // 5. run_code with no sandbox: creates a code-interpreter-v1 sandbox (waiting
    // for its build when needed) and runs the cell.
    const rc = await callWaiting(http, 'run_code', { code: 'import pandas as pd\npd.Series([1, 2, 3, 4]).mean()' })
    checkProgress('code-interpreter-v1', rc.progress)
    const rcOut = structured(rc.res)
    assert.equal(rcOut.created_sandbox, true)
    created.push(rcOut.sandbox_id)
    assert.equal(rcOut.results.find((r) => r.is_main_result)?.text, '2.5', JSON.stringify(rcOut))
  } finally {
    for (const id of created) {
      await stdio.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } }).catch(() => {})
    }
    await stdio.close()
    await http.close()
  }
})

// The same tools through the MCP Inspector's CLI, over both transports, now that
// every template is ready (the test above waited for the last one).
test('MCP inspector CLI: stdio and HTTP', { timeout: 5 * 60_000 }, async () => {
  const inspector = async (...args) => {
    const { stdout } = await run('npx', ['--no-install', '@modelcontextprotocol/inspector', '--cli', ...args], {
      env: { ...process.env, E2B_SANDBOX_URL: '', AIRLOCK_SANDBOX_URL: '', AIRLOCK_URL: '', AIRLOCK_API_KEY: '' },
      timeout: 180_000,
      maxBuffer: 16 << 20,
    })
    return JSON.parse(stdout)
  }
  const stdio = [BIN, 'mcp', '-e', `E2B_API_URL=${API_URL}`, '-e', `E2B_API_KEY=${API_KEY}`]
  const http = [`${API_URL}/mcp`, '--transport', 'http', '--header', `Authorization: Bearer ${API_KEY}`]

  const tools = await inspector(...stdio, '--method', 'tools/list')
  assert.ok(tools.tools.some((t) => t.name === 'create_sandbox'), JSON.stringify(tools).slice(0, 500))

  const created = await inspector(...http, '--method', 'tools/call', '--tool-name', 'create_sandbox', '--tool-arg', 'template=python3')
  assert.ok(!created.isError, JSON.stringify(created))
  const id = created.structuredContent.sandbox_id
  try {
    const ran = await inspector(...stdio, '--method', 'tools/call', '--tool-name', 'run_command',
      '--tool-arg', `sandbox_id=${id}`, '--tool-arg', `command=python3 -c 'import pandas as pd; print(pd.DataFrame({"x": [1, 2, 3]}).x.sum())'`)
    assert.ok(!ran.isError, JSON.stringify(ran))
    assert.equal(ran.structuredContent.stdout.trim(), '6')
    const listed = await inspector(...http, '--method', 'tools/call', '--tool-name', 'list_sandboxes')
    assert.ok(listed.structuredContent.sandboxes.some((s) => s.sandbox_id === id && s.template === 'python3'))
  } finally {
    const killed = await inspector(...stdio, '--method', 'tools/call', '--tool-name', 'kill_sandbox', '--tool-arg', `sandbox_id=${id}`)
    assert.ok(!killed.isError, JSON.stringify(killed))
  }
  const after = await inspector(...http, '--method', 'tools/call', '--tool-name', 'list_sandboxes')
  assert.ok(!after.structuredContent.sandboxes.some((s) => s.sandbox_id === id))
})
