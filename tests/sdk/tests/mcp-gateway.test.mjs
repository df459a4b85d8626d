// The MCP gateway inside sandboxes (issue 20), through the unmodified npm
// `e2b` SDK and the official MCP TypeScript client: Sandbox.create({mcp})
// runs `mcp-gateway --config ...` in the sandbox; getMcpUrl() and
// getMcpToken() reach it over the one-domain TLS front door, and the same
// gateway answers through the plain-HTTP sandbox proxy with
// E2b-Sandbox-Port: 50005. Two catalog servers (filesystem, memory, npm
// packages pre-installed in the mcp-gateway template) and one custom stdio
// server (fixtures/mcp-echo, shipped in a template built here from
// mcp-gateway, so the gateway finds github/airlock-tests/echo in place and
// never clones from GitHub).

import assert from 'node:assert/strict'
import { fileURLToPath } from 'node:url'
import { after, before, describe, test } from 'node:test'
import { Client } from '@modelcontextprotocol/sdk/client/index.js'
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { Sandbox, Template } from 'e2b'
import { SANDBOX_URL, api, meta, track, trackCleanup, trackTemplates, uniq, waitFor } from './helpers.mjs'

const DOMAIN = process.env.AIRLOCK_SDK_DOMAIN
assert.ok(DOMAIN, 'AIRLOCK_SDK_DOMAIN is not set (tests/sdk/run.sh sets it)')
assert.ok(process.env.NODE_EXTRA_CA_CERTS, 'NODE_EXTRA_CA_CERTS is not set (tests/sdk/run.sh sets it)')

// helpers.mjs read the plain-HTTP overrides at import (SANDBOX_URL, api());
// from here on the SDK sees only the domain, as a user of E2B's cloud does.
delete process.env.E2B_API_URL
delete process.env.E2B_SANDBOX_URL
delete process.env.E2B_VOLUME_API_URL
process.env.E2B_DOMAIN = DOMAIN

trackCleanup()
const built = trackTemplates()

const ECHO_DIR = '/opt/mcp-gateway/github/airlock-tests/echo'
const fixtures = fileURLToPath(new URL('../fixtures/mcp-echo', import.meta.url))
const echoTemplate = uniq('mcp-echo')
built.add(echoTemplate)

const MCP = {
  filesystem: { paths: ['/home/user'] },
  memory: {},
  'github/airlock-tests/echo': {
    installCmd: 'echo installed-here > .installed',
    runCmd: 'node server.mjs',
    envs: { ECHO_GREETING: 'hello from envs' },
  },
}

async function connect(url, { token, headers = {} } = {}) {
  const client = new Client({ name: 'airlock-sdk-suite', version: '0.0.0' })
  const h = { ...headers }
  if (token !== undefined) h.Authorization = `Bearer ${token}`
  await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers: h } }))
  return client
}

const textOf = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('')

describe('the MCP gateway', { concurrency: false }, () => {
  let sbx
  let token
  let client

  before(async () => {
    await Template.build(
      Template({ fileContextPath: fixtures }).fromTemplate('mcp-gateway').copy('server.mjs', `${ECHO_DIR}/server.mjs`),
      echoTemplate,
      { cpuCount: 1, memoryMB: 1024 },
    )
    const t0 = Date.now()
    sbx = await Sandbox.create(echoTemplate, { mcp: MCP, timeoutMs: 300_000, metadata: meta({ file: 'mcp-gateway' }) })
    track(sbx.sandboxId)
    console.log(`create with an mcp config of three servers: ${Date.now() - t0} ms`)
    token = await sbx.getMcpToken()
    client = await connect(sbx.getMcpUrl(), { token })
  })
  after(async () => {
    await client?.close().catch(() => {})
  })

  test('getMcpUrl() is the 50005 host of the domain; the token is the one in /etc/mcp-gateway/.token', async () => {
    assert.equal(sbx.getMcpUrl(), `https://50005-${sbx.sandboxId}.${DOMAIN}/mcp`)
    assert.match(token, /^[0-9a-f-]{36}$/)
    const onDisk = await sbx.files.read('/etc/mcp-gateway/.token', { user: 'root' })
    assert.equal(onDisk.trim(), token)
    const mode = (await sbx.commands.run('stat -c %a:%U /etc/mcp-gateway/.token', { user: 'root' })).stdout.trim()
    assert.equal(mode, '600:root')
    // Not readable by the sandbox's default user's processes (envd's file
    // API reads as root for any user, as E2B's does: the API key holds it).
    const asUser = await sbx.commands.run('cat /etc/mcp-gateway/.token').catch((e) => e)
    assert.notEqual(asUser.exitCode, 0, 'user read the token')
    assert.match(asUser.stderr, /Permission denied/)
  })

  test('tools of every server, prefixed by server; one call of each', async () => {
    const names = (await client.listTools()).tools.map((t) => t.name)
    for (const n of ['filesystem_read_text_file', 'filesystem_list_directory', 'memory_create_entities', 'memory_read_graph', 'echo_echo', 'echo_whereami']) {
      assert.ok(names.includes(n), `${n} missing from ${names.join(', ')}`)
    }

    await sbx.files.write('/home/user/note.txt', 'written by the SDK\n')
    const read = await client.callTool({ name: 'filesystem_read_text_file', arguments: { path: '/home/user/note.txt' } })
    assert.ok(!read.isError, textOf(read))
    assert.match(textOf(read), /written by the SDK/)
    // Outside the configured paths: the server's own refusal, as an isError result.
    const outside = await client.callTool({ name: 'filesystem_read_text_file', arguments: { path: '/etc/hostname' } })
    assert.ok(outside.isError, textOf(outside))

    const made = await client.callTool({
      name: 'memory_create_entities',
      arguments: { entities: [{ name: 'airlock', entityType: 'project', observations: ['runs sandboxes'] }] },
    })
    assert.ok(!made.isError, textOf(made))
    const graph = await client.callTool({ name: 'memory_read_graph', arguments: {} })
    assert.match(textOf(graph), /runs sandboxes/)

    const echo = await client.callTool({ name: 'echo_echo', arguments: { text: 'through the gateway' } })
    assert.equal(textOf(echo), 'echo: through the gateway')
    const where = JSON.parse(textOf(await client.callTool({ name: 'echo_whereami', arguments: {} })))
    assert.deepEqual(where, { cwd: ECHO_DIR, installed: 'installed-here', greeting: 'hello from envs' })
  })

  test('refused without the token, or with a wrong one', async () => {
    await assert.rejects(connect(sbx.getMcpUrl()), /401|nauthori[sz]ed|bearer/i)
    await assert.rejects(connect(sbx.getMcpUrl(), { token: 'not-the-token' }), /401|nauthori[sz]ed|bearer/i)
    const res = await fetch(sbx.getMcpUrl(), {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    })
    assert.equal(res.status, 401)
  })

  test('the same gateway through the plain-HTTP proxy with E2b-Sandbox-Port: 50005', async () => {
    const plain = await connect(`${SANDBOX_URL}/mcp`, {
      token,
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '50005' },
    })
    try {
      const r = await plain.callTool({ name: 'echo_echo', arguments: { text: 'plain http' } })
      assert.equal(textOf(r), 'echo: plain http')
    } finally {
      await plain.close()
    }
    await assert.rejects(
      connect(`${SANDBOX_URL}/mcp`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '50005' } }),
      /401|nauthori[sz]ed|bearer/i,
    )
  })

  test('an oversized tool result is truncated with a note', async () => {
    const r = await client.callTool({ name: 'echo_big', arguments: { n: 3_000_000 } })
    const t = textOf(r)
    assert.ok(t.length < 2_000_000, `result of ${t.length} chars was not truncated`)
    assert.match(t, /\d+ of its \d+ bytes of content were omitted/)
  })

  test('a server that crashes is restarted; its calls answer isError meanwhile', async () => {
    const crashed = await client.callTool({ name: 'echo_crash', arguments: {} }).catch((e) => ({ isError: true, content: [{ type: 'text', text: String(e) }] }))
    assert.ok(crashed.isError, `a call whose server died answered ${JSON.stringify(crashed)}`)
    // The restarted server takes 3 s to come up (the fixture waits when it
    // crashed before): calls meanwhile are isError results, not hangs.
    const down = await client.callTool({ name: 'echo_echo', arguments: { text: 'anyone?' } })
    assert.ok(down.isError, `echo while the server restarts: ${textOf(down)}`)
    assert.match(textOf(down), /restart/i)
    // Other servers are unaffected.
    const other = await client.callTool({ name: 'memory_read_graph', arguments: {} })
    assert.ok(!other.isError, textOf(other))
    await waitFor(async () => {
      const r = await client.callTool({ name: 'echo_echo', arguments: { text: 'back' } })
      return !r.isError && textOf(r) === 'echo: back'
    }, { timeoutMs: 30_000, intervalMs: 500, what: 'the echo server restarted' })
    const log = await sbx.files.read('/var/log/mcp-gateway/gateway.log', { user: 'root' })
    assert.match(log, /echo/)
    assert.match(log, /restart/i)
  })
})

describe('bad gateway configs fail Sandbox.create with the reason, and leave nothing', () => {
  const cases = [
    { name: 'a catalog name Airlock lacks', mcp: { exa: { apiKey: 'x' } }, want: /Failed to start MCP gateway: .*exa.*filesystem/s },
    { name: 'a wrong type', mcp: { filesystem: { paths: '/home/user' } }, want: /Failed to start MCP gateway: .*paths/s },
    { name: 'an unknown field', mcp: { memory: { colour: 'blue' } }, want: /Failed to start MCP gateway: .*colour/s },
    { name: 'a custom server without runCmd', mcp: { 'github/airlock-tests/none': { installCmd: 'true' } }, want: /Failed to start MCP gateway: .*runCmd/s },
  ]
  for (const c of cases) {
    test(c.name, async () => {
      const tag = uniq('badmcp')
      await assert.rejects(
        Sandbox.create({ mcp: c.mcp, timeoutMs: 60_000, metadata: meta({ file: 'mcp-gateway', tag }) }),
        (err) => {
          assert.match(err.message, c.want)
          return true
        },
      )
      const res = await api('GET', `/v2/sandboxes?metadata=${encodeURIComponent(new URLSearchParams({ tag }).toString())}&state=running,paused`)
      assert.equal(res.status, 200, res.text)
      assert.deepEqual(res.json, [], 'the SDK kills the sandbox whose gateway failed')
    })
  }
})

describe('mcp-gateway in every template', () => {
  test('base has the binary; a catalog server it lacks is named with the fix', async () => {
    const sbx = await Sandbox.create('base', { metadata: meta({ file: 'mcp-gateway' }) })
    track(sbx.sandboxId)
    const v = await sbx.commands.run('mcp-gateway --version')
    assert.ok(v.stdout.trim().length > 0)
    const r = await sbx.commands.run(`mcp-gateway --config '{"memory":{}}'`, { user: 'root' }).catch((e) => e)
    assert.notEqual(r.exitCode, 0)
    assert.match(r.stderr, /memory/)
    assert.match(r.stderr, /mcp-gateway pull|mcp-gateway template/)
  })

  test('Template.addMcpServer: a catalog server builds; an unknown one fails the build naming the catalog', async () => {
    const name = uniq('mcp-pull')
    built.add(name)
    await Template.build(Template().fromTemplate('mcp-gateway').addMcpServer(['memory', 'filesystem']), name, { cpuCount: 1, memoryMB: 1024 })
    const bad = uniq('mcp-pull-bad')
    built.add(bad)
    await assert.rejects(
      Template.build(Template().fromTemplate('mcp-gateway').addMcpServer('no-such-server'), bad, { cpuCount: 1, memoryMB: 1024 }),
      /no-such-server/,
    )
  })
})
