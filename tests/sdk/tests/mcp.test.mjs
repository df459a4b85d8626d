// The MCP server through the official TypeScript MCP client (@modelcontextprotocol/sdk):
// `airlock mcp` over stdio, and serve's /mcp over streamable HTTP with the API key as
// a bearer token (and refused without one).

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { Sandbox } from 'e2b'
import { API_KEY, API_URL, SANDBOX_URL, meta, track, trackCleanup } from './helpers.mjs'

trackCleanup()

const BIN = process.env.AIRLOCK_BIN
if (!BIN) throw new Error('AIRLOCK_BIN must be set (tests/sdk/run.sh does)')

async function connectStdio() {
  const client = new Client({ name: 'airlock-sdk-suite', version: '0.0.0' })
  await client.connect(new StdioClientTransport({
    command: BIN,
    args: ['mcp', '--url', API_URL, '--sandbox-url', SANDBOX_URL, '--api-key', API_KEY],
    stderr: 'inherit',
  }))
  return client
}

async function connectHTTP(key) {
  const client = new Client({ name: 'airlock-sdk-suite', version: '0.0.0' })
  const headers = key ? { Authorization: `Bearer ${key}` } : {}
  await client.connect(new StreamableHTTPClientTransport(new URL(`${API_URL}/mcp`), { requestInit: { headers } }))
  return client
}

const structured = (r) => r.structuredContent ?? JSON.parse(r.content.find((c) => c.type === 'text').text)

// The journey the issue names: create → run_code twice (state kept) → a plot
// returns an image → list → kill → list no longer shows it.
async function journey(client) {
  const tools = (await client.listTools()).tools.map((t) => t.name)
  for (const name of ['create_sandbox', 'kill_sandbox', 'list_sandboxes', 'run_code', 'run_command',
    'read_file', 'write_file', 'list_files', 'set_timeout', 'get_metrics']) {
    assert.ok(tools.includes(name), `tool ${name} missing from ${tools}`)
  }
  const created = await client.callTool({
    name: 'create_sandbox',
    arguments: { template: 'code-interpreter-v1', timeout: 300, metadata: meta({ file: 'mcp' }) },
  })
  assert.ok(!created.isError, JSON.stringify(created.content))
  const id = structured(created).sandbox_id
  assert.ok(id, JSON.stringify(created))
  track(id)

  const first = await client.callTool({ name: 'run_code', arguments: { sandbox_id: id, code: 'counter = 41' } })
  assert.ok(!first.isError, JSON.stringify(first.content))
  const second = await client.callTool({ name: 'run_code', arguments: { sandbox_id: id, code: 'counter + 1' } })
  assert.ok(!second.isError, JSON.stringify(second.content))
  assert.match(JSON.stringify(second.content), /42/)

  const plot = await client.callTool({
    name: 'run_code',
    arguments: { sandbox_id: id, code: 'import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()' },
  })
  const image = plot.content.find((c) => c.type === 'image')
  assert.ok(image, JSON.stringify(plot.content.map((c) => c.type)))
  assert.equal(image.mimeType, 'image/png')
  assert.equal(Buffer.from(image.data, 'base64').subarray(1, 4).toString(), 'PNG')

  const listed = await client.callTool({ name: 'list_sandboxes', arguments: {} })
  assert.ok(!listed.isError)
  assert.ok(JSON.stringify(listed.content).includes(id), 'the new sandbox is listed')

  const killed = await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } })
  assert.ok(!killed.isError, JSON.stringify(killed.content))
  const after = await client.callTool({ name: 'list_sandboxes', arguments: {} })
  assert.ok(!JSON.stringify(after.content).includes(id), 'a killed sandbox is not listed')

  const gone = await client.callTool({ name: 'run_code', arguments: { sandbox_id: id, code: '1' } })
  assert.equal(gone.isError, true, 'a tool on a killed sandbox is an isError result')
}

describe('MCP', () => {
  test('airlock mcp over stdio', async () => {
    const client = await connectStdio()
    try {
      await journey(client)
    } finally {
      await client.close()
    }
  })

  test('/mcp over streamable HTTP with the API key', async () => {
    const client = await connectHTTP(API_KEY)
    try {
      await journey(client)
    } finally {
      await client.close()
    }
  })

  test('/mcp refuses a missing or wrong key', async () => {
    await assert.rejects(connectHTTP(undefined), /401|nauthori|bearer/i)
    await assert.rejects(connectHTTP('e2b_not_a_key'), /401|nauthori|invalid/i)
  })

  test('run_code without a sandbox creates one and says its id', async () => {
    const client = await connectStdio()
    try {
      const r = await client.callTool({ name: 'run_code', arguments: { code: 'print(6 * 7)' } })
      assert.ok(!r.isError, JSON.stringify(r.content))
      const id = structured(r).sandbox_id
      assert.ok(id, JSON.stringify(r))
      track(id)
      assert.match(JSON.stringify(r.content), /42/)
      const again = await client.callTool({ name: 'run_code', arguments: { sandbox_id: id, code: 'print("same sandbox")' } })
      assert.match(JSON.stringify(again.content), /same sandbox/)
      await Sandbox.kill(id)
    } finally {
      await client.close()
    }
  })
})
