// The MCP server through the official TypeScript MCP client (@modelcontextprotocol/sdk):
// `airlock mcp` over stdio, and serve's /mcp over streamable HTTP with the API key as
// a bearer token (and refused without one).

import assert from 'node:assert/strict'
import { after, describe, test } from 'node:test'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { Sandbox, Volume } from 'e2b'
import { API_KEY, API_URL, SANDBOX_URL, api, meta, track, trackCleanup, uniq } from './helpers.mjs'

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

// Volumes through MCP (issue 17): the tools an agent manages volumes with, and
// create_sandbox's volume_mounts input. Mounting itself is tested with the
// sandboxes.
describe('MCP volumes', () => {
  const made = new Set()
  after(async () => {
    await Promise.allSettled([...made].map((id) => Volume.destroy(id).catch(() => false)))
  })

  test('the volume tools are listed, and create_sandbox takes volume_mounts', async () => {
    const client = await connectStdio()
    try {
      const tools = (await client.listTools()).tools
      const names = tools.map((t) => t.name)
      for (const name of ['create_volume', 'list_volumes', 'delete_volume']) {
        assert.ok(names.includes(name), `tool ${name} missing from ${names}`)
      }
      const create = tools.find((t) => t.name === 'create_sandbox')
      const mounts = create.inputSchema.properties.volume_mounts
      assert.equal(mounts?.type, 'array', JSON.stringify(create.inputSchema))
      assert.deepEqual([...mounts.items.required].sort(), ['name', 'path'])
    } finally {
      await client.close()
    }
  })

  test('create_volume, list_volumes, delete_volume; the token is never shown', async () => {
    const client = await connectHTTP(API_KEY)
    try {
      const name = uniq('mcpvol')
      const created = await client.callTool({ name: 'create_volume', arguments: { name, size_mb: 16 } })
      assert.ok(!created.isError, JSON.stringify(created.content))
      const vol = structured(created)
      assert.ok(vol.volume_id, JSON.stringify(vol))
      made.add(vol.volume_id)
      assert.equal(vol.name, name)
      assert.equal(vol.size_mb, 16)

      // The SDK sees the same volume; its token stays out of every tool answer.
      const info = await Volume.getInfo(vol.volume_id)
      assert.equal(info.name, name)
      const res = await api('GET', `/volumes/${vol.volume_id}`)
      assert.equal(res.status, 200)
      const { token } = res.json
      assert.ok(token)
      assert.ok(!JSON.stringify(created).includes(token), 'create_volume shows the volume token')

      const listed = await client.callTool({ name: 'list_volumes', arguments: {} })
      assert.ok(!listed.isError, JSON.stringify(listed.content))
      const entry = structured(listed).volumes.find((v) => v.volume_id === vol.volume_id)
      assert.deepEqual(entry, { volume_id: vol.volume_id, name })
      assert.ok(listed.content[0].text.includes(name), listed.content[0].text)
      assert.ok(!JSON.stringify(listed).includes(token), 'list_volumes shows the volume token')

      // A second volume of the same name is refused, saying so.
      const again = await client.callTool({ name: 'create_volume', arguments: { name } })
      assert.equal(again.isError, true, JSON.stringify(again.content))
      assert.match(again.content[0].text, /already exists/)

      const deleted = await client.callTool({ name: 'delete_volume', arguments: { volume_id: vol.volume_id } })
      assert.ok(!deleted.isError, JSON.stringify(deleted.content))
      made.delete(vol.volume_id)
      const afterDelete = await client.callTool({ name: 'list_volumes', arguments: {} })
      assert.ok(!structured(afterDelete).volumes.some((v) => v.volume_id === vol.volume_id), 'a deleted volume is listed')
      const gone = await client.callTool({ name: 'delete_volume', arguments: { volume_id: vol.volume_id } })
      assert.equal(gone.isError, true, JSON.stringify(gone.content))
      assert.match(gone.content[0].text, /not found/)
    } finally {
      await client.close()
    }
  })

  test('create_sandbox mounts a volume; an unknown one is a tool error naming it', async () => {
    const client = await connectHTTP(API_KEY)
    try {
      const vol = structured(await client.callTool({ name: 'create_volume', arguments: { name: uniq('mcpmnt'), size_mb: 16 } }))
      made.add(vol.volume_id)
      const created = await client.callTool({
        name: 'create_sandbox',
        arguments: { template: 'base', timeout: 120, metadata: meta({ file: 'mcp' }), volume_mounts: [{ name: vol.name, path: '/data' }] },
      })
      assert.ok(!created.isError, JSON.stringify(created.content))
      const id = structured(created).sandbox_id
      track(id)
      assert.deepEqual(structured(created).volume_mounts, [{ name: vol.name, path: '/data' }], JSON.stringify(structured(created)))
      const ran = await client.callTool({ name: 'run_command', arguments: { sandbox_id: id, command: 'echo via-mcp > /data/mcp.txt' } })
      assert.ok(!ran.isError, JSON.stringify(ran.content))
      assert.equal(await (await Volume.connect(vol.volume_id)).readFile('/mcp.txt'), 'via-mcp\n')
      await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } })

      const missing = uniq('nosuchvol')
      const bad = await client.callTool({
        name: 'create_sandbox',
        arguments: { template: 'base', metadata: meta({ file: 'mcp' }), volume_mounts: [{ name: missing, path: '/mnt/x' }] },
      })
      assert.equal(bad.isError, true, JSON.stringify(bad.content))
      assert.match(bad.content[0].text, new RegExp(`volume '${missing}' not found`))
    } finally {
      await client.close()
    }
  })

  test('a bad volume name is a tool error that says why', async () => {
    const client = await connectStdio()
    try {
      const bad = await client.callTool({ name: 'create_volume', arguments: { name: 'no spaces/or slashes' } })
      assert.equal(bad.isError, true, JSON.stringify(bad.content))
      assert.match(bad.content[0].text, /letters, digits, '_' and '-'/)
      const listed = await client.callTool({ name: 'list_volumes', arguments: {} })
      assert.ok(!structured(listed).volumes.some((v) => v.name === 'no spaces/or slashes'))

      const noSize = await client.callTool({ name: 'create_volume', arguments: { name: uniq('mcpvol'), size_mb: 0 } })
      assert.equal(noSize.isError, true, JSON.stringify(noSize.content))
      assert.match(noSize.content[0].text, /size_mb/)
    } finally {
      await client.close()
    }
  })
})
