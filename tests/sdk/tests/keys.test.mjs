// Teams, scoped API keys and the audit log through the official SDK, the
// REST API and the `airlock keys` / `airlock audit` commands: a read-only
// key lists but cannot create (a clear error naming the scope), another
// team's key finds nothing of this team's, a revoked key is refused at its
// next request, and each of those is in the audit log.

import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { describe, test } from 'node:test'
import { Sandbox } from 'e2b'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { API_KEY, API_URL, TEMPLATE, api, createSandbox, meta, trackCleanup, uniq } from './helpers.mjs'

trackCleanup()

const BIN = process.env.AIRLOCK_BIN
const run = promisify(execFile)
const mcpClient = async (key) => {
  const client = new Client({ name: 'airlock-keys-test', version: '0.0.0' })
  await client.connect(new StreamableHTTPClientTransport(new URL(`${API_URL}/mcp`), { requestInit: { headers: { Authorization: `Bearer ${key}` } } }))
  return client
}
const cli = (...args) => run(BIN, [...args, '--url', API_URL, '--api-key', API_KEY], { timeout: 30_000 })

describe('API keys and teams', () => {
  const tag = uniq('keys')
  let sbx, readOnly, otherTeam

  test('airlock keys create makes keys, shown once, listed masked', async () => {
    sbx = await createSandbox({ metadata: { keys: tag } })
    const ro = await cli('keys', 'create', '--name', `reader-${tag}`, '--scopes', 'sandboxes:read,templates:read')
    readOnly = ro.stdout.trim()
    assert.match(readOnly, /^e2b_[0-9a-f]{40}$/)
    assert.match(ro.stderr, /sandboxes:read templates:read/)
    const other = await cli('keys', 'create', '--team', tag, '--name', 'elsewhere')
    otherTeam = other.stdout.trim()
    const list = await cli('keys', 'list')
    assert.match(list.stdout, new RegExp(`reader-${tag}`))
    assert.ok(!list.stdout.includes(readOnly), 'the list shows the key itself')
    assert.ok(list.stdout.includes(readOnly.slice(-4)), 'the list shows the key masked')
  })

  test('a read-only key lists, and Sandbox.create fails naming the scope', async () => {
    const page = await Sandbox.list({ apiKey: readOnly, query: { metadata: { keys: tag } } }).nextItems()
    assert.deepEqual(page.map((s) => s.sandboxId), [sbx.sandboxId])
    const err = await Sandbox.create(TEMPLATE, { apiKey: readOnly, metadata: meta() }).then(() => null, (e) => e)
    assert.ok(err, 'Sandbox.create with a read-only key succeeded')
    assert.match(String(err.message), /sandboxes:write/)
    // Its detail holds no token: the key cannot reach into the sandbox.
    const res = await api('GET', `/sandboxes/${sbx.sandboxId}`, { key: readOnly })
    assert.equal(res.status, 200)
    assert.ok(!res.json.envdAccessToken, 'a read-only key got the access token')
    assert.equal((await api('POST', `/sandboxes/${sbx.sandboxId}/connect`, { key: readOnly, body: { timeout: 60 } })).status, 403)
  })

  test("/mcp offers a read-only key the read tools only, and another team none of this team's sandboxes", async () => {
    const ro = await mcpClient(readOnly)
    try {
      const names = (await ro.listTools()).tools.map((t) => t.name).sort()
      assert.deepEqual(names, ['get_metrics', 'get_template_build', 'list_sandboxes', 'list_snapshots', 'sandbox_events', 'sandbox_logs']) // sandboxes:read and templates:read
    } finally {
      await ro.close()
    }
    const other = await mcpClient(otherTeam)
    try {
      const res = await other.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: sbx.sandboxId } })
      assert.equal(res.isError, true, 'another team killed the sandbox through MCP')
      assert.match(JSON.stringify(res.content), /not found/i)
    } finally {
      await other.close()
    }
  })

  test("another team's key finds nothing of this team's", async () => {
    const page = await Sandbox.list({ apiKey: otherTeam, query: { metadata: { keys: tag } } }).nextItems()
    assert.deepEqual(page, [])
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId, { apiKey: otherTeam }), (e) => e.name === 'SandboxNotFoundError' || /not found/i.test(e.message))
    assert.equal(await Sandbox.kill(sbx.sandboxId, { apiKey: otherTeam }), false)
    for (const [method, path] of [['GET', `/sandboxes/${sbx.sandboxId}`], ['POST', `/sandboxes/${sbx.sandboxId}/pause`],
      ['POST', `/sandboxes/${sbx.sandboxId}/timeout`], ['GET', `/sandboxes/${sbx.sandboxId}/metrics`]]) {
      const res = await api(method, path, { key: otherTeam, body: method === 'POST' ? { timeout: 30 } : undefined })
      assert.equal(res.status, 404, `${method} ${path} as another team: ${res.status}`)
    }
    assert.equal((await Sandbox.getInfo(sbx.sandboxId)).sandboxId, sbx.sandboxId, 'the sandbox survived')
  })

  test('airlock keys quota: a team past its quota of sandboxes is told which quota, its limit and use', async () => {
    const { stdout } = await cli('keys', 'quota', tag, '--sandboxes', '1')
    assert.match(stdout, /sandboxes 1/)
    const one = await Sandbox.create(TEMPLATE, { apiKey: otherTeam, metadata: meta({ keys: tag }) })
    try {
      const err = await Sandbox.create(TEMPLATE, { apiKey: otherTeam, metadata: meta() }).then((s) => s.kill().then(() => null), (e) => e)
      assert.ok(err, 'a create past the quota succeeded')
      assert.match(String(err.message), /quota of concurrent sandboxes reached: team .+ has 1 running, paused or starting, its limit is 1/)
    } finally {
      await Sandbox.kill(one.sandboxId, { apiKey: otherTeam })
    }
  })

  test('a revoked key is refused at its next request', async () => {
    const keys = await api('GET', '/api-keys')
    const id = keys.json.find((k) => k.name === `reader-${tag}`).id
    await cli('keys', 'revoke', id)
    const err = await Sandbox.list({ apiKey: readOnly }).nextItems().then(() => null, (e) => e)
    assert.ok(err, 'a revoked key listed')
    assert.match(String(err.message), /revoked/)
    // /mcp refuses it too.
    const res = await fetch(`${API_URL}/mcp`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${readOnly}`, 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 't', version: '0' } } }),
    })
    assert.equal(res.status, 401)
  })

  test("a key's sandbox handle, its signed URLs and its volume token end with the key: revoked, or made read-only", async () => {
    const made = async (name) => {
      const r = await cli('keys', 'create', '--name', `${name}-${tag}`, '--scopes', 'sandboxes:*,volumes:*')
      return { key: r.stdout.trim(), id: r.stderr.match(/^key (\S+) /)[1] }
    }
    const worker = await made('worker')
    const demoted = await made('demoted')
    const handle = await Sandbox.connect(sbx.sandboxId, { apiKey: worker.key })
    const other = await Sandbox.connect(sbx.sandboxId, { apiKey: demoted.key })
    await handle.files.write('/home/user/grant.txt', 'by the worker')
    assert.equal((await other.commands.run('cat /home/user/grant.txt')).stdout, 'by the worker')
    const url = await handle.downloadUrl('/home/user/grant.txt')
    assert.equal(await (await fetch(url)).text(), 'by the worker')
    const vol = await api('POST', '/volumes', { key: worker.key, body: { name: `grant-${tag}` } })
    assert.equal(vol.status, 201, JSON.stringify(vol.json))
    const volFile = `${API_URL}/volumecontent/${vol.json.volumeID}/file?path=f`
    assert.equal((await fetch(volFile, { method: 'PUT', headers: { Authorization: `Bearer ${vol.json.token}` }, body: 'v' })).status, 201)

    await cli('keys', 'revoke', worker.id)
    const runErr = await handle.commands.run('echo still here').then(() => null, (e) => e)
    assert.ok(runErr, "a revoked key's handle still runs commands")
    assert.match(String(runErr.message), /revoked/)
    const readErr = await handle.files.read('/home/user/grant.txt').then(() => null, (e) => e)
    assert.ok(readErr, "a revoked key's handle still reads files")
    assert.equal((await fetch(url)).status, 401, "a revoked key's signed URL still downloads")
    assert.equal((await fetch(volFile, { headers: { Authorization: `Bearer ${vol.json.token}` } })).status, 401, "a revoked key's volume token still reads")

    await cli('keys', 'update', demoted.id, '--scopes', 'sandboxes:read')
    const roErr = await other.commands.run('echo still here').then(() => null, (e) => e)
    assert.ok(roErr, 'a key made read-only still runs commands with the token it had')
    assert.match(String(roErr.message), /sandboxes:write/)

    // The team's other keys are untouched.
    assert.equal((await sbx.commands.run('cat /home/user/grant.txt')).stdout, 'by the worker')
    assert.equal((await api('DELETE', `/volumes/${vol.json.volumeID}`)).status, 204)
  })

  test('airlock audit shows who did what', async () => {
    const { stdout } = await cli('audit', '--limit', '1000')
    assert.match(stdout, new RegExp(`reader-${tag}\\s+\\S+\\s+POST /v2/sandboxes\\s+-\\s+403`))
    assert.match(stdout, new RegExp(`elsewhere\\s+\\S+\\s+DELETE /sandboxes/\\{sandboxID\\}\\s+sandbox ${sbx.sandboxId}\\s+404`))
    assert.match(stdout, /DELETE \/api-keys\/\{apiKeyID\}/)
    assert.ok(!stdout.includes(readOnly) && !stdout.includes(otherTeam), 'the audit log holds a key')
  })
})
