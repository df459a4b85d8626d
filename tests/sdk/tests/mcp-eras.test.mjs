// MCP in both protocol eras, over both transports, through the official clients:
// @modelcontextprotocol/sdk 1.32.2 (2025-era: initialize, a session over HTTP) and
// @modelcontextprotocol/client 2.4.0 pinned to 2026-07-28 (stateless: server/discover,
// per-request _meta, no session), each over `airlock mcp` (stdio) and serve's /mcp
// (HTTP); the same stateless exchange with plain fetch; and the MCP Inspector CLI over
// stdio and HTTP. What each checks: every tool annotated with an output schema,
// progress notifications (a create's phases, a command's output, a template build's
// log), the tools for pause/resume/snapshot/fork, sandbox files as resources, and
// unknown protocol versions answered with the supported list.

import assert from 'node:assert/strict'
import { execFile } from 'node:child_process'
import { describe, test } from 'node:test'
import { promisify } from 'node:util'
import { Client as ClientV1 } from '@modelcontextprotocol/sdk/client/index.js'
import { StdioClientTransport as StdioV1 } from '@modelcontextprotocol/sdk/client/stdio.js'
import { StreamableHTTPClientTransport as HttpV1 } from '@modelcontextprotocol/sdk/client/streamableHttp.js'
import { Client as ClientV2, StreamableHTTPClientTransport as HttpV2 } from '@modelcontextprotocol/client'
import { StdioClientTransport as StdioV2 } from '@modelcontextprotocol/client/stdio'
import { API_KEY, API_URL, SANDBOX_URL, api, meta, track, trackCleanup, uniq } from './helpers.mjs'

trackCleanup()

const BIN = process.env.AIRLOCK_BIN
if (!BIN) throw new Error('AIRLOCK_BIN must be set (tests/sdk/run.sh does)')
const MCP_URL = `${API_URL}/mcp`
const AUTH = { Authorization: `Bearer ${API_KEY}` }
const STDIO = { command: BIN, args: ['mcp', '--url', API_URL, '--sandbox-url', SANDBOX_URL, '--api-key', API_KEY], stderr: 'inherit' }

const TOOLS = ['create_sandbox', 'kill_sandbox', 'list_sandboxes', 'run_code', 'run_command', 'read_file', 'write_file',
  'list_files', 'set_timeout', 'get_metrics', 'sandbox_logs', 'sandbox_events', 'create_volume', 'list_volumes', 'get_volume',
  'delete_volume', 'pause_sandbox', 'resume_sandbox', 'snapshot_sandbox', 'fork_sandbox', 'list_snapshots', 'delete_snapshot',
  'build_template', 'get_template_build']

// The four clients: [name, connect() → {client, transport}, era].
const CLIENTS = [
  ['sdk 1.32.2 (2025 era) over stdio', async () => {
    const client = new ClientV1({ name: 'airlock-sdk-suite', version: '0.0.0' })
    const transport = new StdioV1(STDIO)
    await client.connect(transport)
    return { client, transport }
  }, 'legacy'],
  ['sdk 1.32.2 (2025 era) over HTTP', async () => {
    const client = new ClientV1({ name: 'airlock-sdk-suite', version: '0.0.0' })
    const transport = new HttpV1(new URL(MCP_URL), { requestInit: { headers: AUTH } })
    await client.connect(transport)
    return { client, transport }
  }, 'legacy'],
  ['client 2.4.0 (2026-07-28) over stdio', async () => {
    const client = new ClientV2({ name: 'airlock-sdk-suite', version: '0.0.0' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } })
    const transport = new StdioV2(STDIO)
    await client.connect(transport)
    return { client, transport }
  }, 'modern'],
  ['client 2.4.0 (2026-07-28) over HTTP', async () => {
    const client = new ClientV2({ name: 'airlock-sdk-suite', version: '0.0.0' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } })
    const transport = new HttpV2(new URL(MCP_URL), { requestInit: { headers: AUTH } })
    await client.connect(transport)
    return { client, transport }
  }, 'modern'],
]

const structured = (r) => r.structuredContent ?? JSON.parse(r.content.find((c) => c.type === 'text').text)
const textOf = (r) => r.content.filter((c) => c.type === 'text').map((c) => c.text).join('\n')

// callTool with a progress handler; returns the result and the messages.
async function withProgress(client, name, args) {
  const messages = []
  const options = { onprogress: (p) => messages.push(p.message), resetTimeoutOnProgress: true, timeout: 300_000 }
  // v1 takes a result schema before the options; v2 does not.
  const result = client instanceof ClientV1
    ? await client.callTool({ name, arguments: args }, undefined, options)
    : await client.callTool({ name, arguments: args }, options)
  return { result, messages }
}

function ok(r) {
  assert.ok(!r.isError, textOf(r))
  return structured(r)
}

describe('MCP eras', () => {
  for (const [name, connect, era] of CLIENTS) {
    test(name, async () => {
      const { client, transport } = await connect()
      try {
        // The era the client asked for is the one it got, with a session only in the 2025 era over HTTP.
        if (era === 'modern') {
          assert.equal(client.getProtocolEra(), 'modern')
          assert.equal(client.getNegotiatedProtocolVersion(), '2026-07-28')
        }
        if (transport instanceof HttpV1) assert.ok(transport.sessionId, 'a 2025-era HTTP client has a session')
        if (transport instanceof HttpV2) assert.equal(transport.sessionId, undefined, 'a 2026-07-28 client has no session')

        // Every tool: annotations with every hint, an object output schema.
        const tools = (await client.listTools()).tools
        assert.deepEqual(tools.map((t) => t.name).sort(), [...TOOLS].sort())
        for (const t of tools) {
          const a = t.annotations
          assert.ok(a?.title && typeof a.readOnlyHint === 'boolean' && typeof a.destructiveHint === 'boolean' &&
            typeof a.idempotentHint === 'boolean' && typeof a.openWorldHint === 'boolean', `${t.name}: ${JSON.stringify(a)}`)
          assert.equal(t.outputSchema?.type, 'object', `${t.name} has no output schema`)
        }
        assert.equal(tools.find((t) => t.name === 'kill_sandbox').annotations.destructiveHint, true)
        assert.equal(tools.find((t) => t.name === 'list_sandboxes').annotations.readOnlyHint, true)

        // A create reports its phases; the sandbox is the client's to kill.
        const created = await withProgress(client, 'create_sandbox', { template: 'base', timeout: 300, metadata: meta({ file: 'mcp-eras' }) })
        const id = ok(created.result).sandbox_id
        track(id)
        // (The TS clients run progress handlers after a tick, so the last
        // notification before a result, "sandbox … is running", may be
        // dropped with the call's handler; the server sends it.)
        assert.ok(created.messages.includes('creating a sandbox from template base'), JSON.stringify(created.messages))

        // A command's output arrives as progress while it runs.
        const ran = await withProgress(client, 'run_command', {
          sandbox_id: id, command: 'for i in 1 2 3; do echo line$i; sleep 0.4; done; echo oops >&2',
        })
        assert.equal(ok(ran.result).stdout, 'line1\nline2\nline3\n')
        for (const want of ['stdout: line1', 'stdout: line2', 'stdout: line3']) {
          assert.ok(ran.messages.includes(want), `${want} not in ${JSON.stringify(ran.messages)}`)
        }

        // Files as resources: text, a directory listing, resources/list.
        ok(await client.callTool({ name: 'write_file', arguments: { sandbox_id: id, path: '/home/user/notes/hello.txt', content: 'hi from mcp' } }))
        const file = await client.readResource({ uri: `sandbox://${id}/home/user/notes/hello.txt` })
        assert.equal(file.contents[0].text, 'hi from mcp')
        assert.match(file.contents[0].mimeType, /^text\/plain/)
        const dir = JSON.parse((await client.readResource({ uri: `sandbox://${id}/home/user/notes` })).contents[0].text)
        assert.deepEqual(dir.entries.map((e) => e.uri), [`sandbox://${id}/home/user/notes/hello.txt`])
        const listed = (await client.listResources()).resources.map((r) => r.uri)
        assert.ok(listed.includes(`sandbox://${id}/home/user`), JSON.stringify(listed))
        const templates = (await client.listResourceTemplates()).resourceTemplates
        assert.deepEqual(templates.map((t) => t.uriTemplate), ['sandbox://{sandbox_id}/{+path}'])
        await assert.rejects(client.readResource({ uri: `sandbox://${id}/home/user/none.txt` }), /not found/i)

        // Pause: tools say to resume; resume: the file is there.
        ok(await client.callTool({ name: 'pause_sandbox', arguments: { sandbox_id: id } }))
        const paused = await client.callTool({ name: 'run_command', arguments: { sandbox_id: id, command: 'true' } })
        assert.equal(paused.isError, true)
        assert.match(textOf(paused), /paused.*resume_sandbox/)
        assert.equal(ok(await client.callTool({ name: 'resume_sandbox', arguments: { sandbox_id: id } })).resumed, true)
        assert.equal(ok(await client.callTool({ name: 'read_file', arguments: { sandbox_id: id, path: 'notes/hello.txt' } })).content, 'hi from mcp')

        ok(await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } }))
        const gone = await client.callTool({ name: 'pause_sandbox', arguments: { sandbox_id: id } })
        assert.equal(gone.isError, true, 'a tool on a killed sandbox is an isError result')
      } finally {
        await client.close()
      }
    })
  }

  test('snapshot, a sandbox from it, fork, delete (2026-07-28 over HTTP)', async () => {
    const { client } = await CLIENTS[3][1]()
    const snapName = uniq('mcp-snap')
    try {
      const id = ok(await client.callTool({ name: 'create_sandbox', arguments: { template: 'base', metadata: meta({ file: 'mcp-eras' }) } })).sandbox_id
      track(id)
      ok(await client.callTool({ name: 'write_file', arguments: { sandbox_id: id, path: 'state.txt', content: 'v1' } }))
      const snap = ok(await client.callTool({ name: 'snapshot_sandbox', arguments: { sandbox_id: id, name: snapName } }))
      assert.ok(snap.snapshot_id)
      const listed = ok(await client.callTool({ name: 'list_snapshots', arguments: { sandbox_id: id } }))
      assert.ok(listed.snapshots.some((s) => s.snapshot_id === snap.snapshot_id), JSON.stringify(listed))

      const fromSnap = ok(await client.callTool({ name: 'create_sandbox', arguments: { template: snap.snapshot_id, metadata: meta({ file: 'mcp-eras' }) } })).sandbox_id
      track(fromSnap)
      assert.equal(ok(await client.callTool({ name: 'read_file', arguments: { sandbox_id: fromSnap, path: 'state.txt' } })).content, 'v1')

      const forked = ok(await client.callTool({ name: 'fork_sandbox', arguments: { sandbox_id: id, count: 2 } }))
      assert.equal(forked.forks.length, 2, JSON.stringify(forked))
      for (const f of forked.forks) {
        track(f.sandbox_id)
        assert.equal(ok(await client.callTool({ name: 'read_file', arguments: { sandbox_id: f.sandbox_id, path: 'state.txt' } })).content, 'v1')
      }
      for (const sid of [id, fromSnap, ...forked.forks.map((f) => f.sandbox_id)]) {
        ok(await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: sid } }))
      }
      ok(await client.callTool({ name: 'delete_snapshot', arguments: { snapshot_id: snapName } }))
      const again = await client.callTool({ name: 'delete_snapshot', arguments: { snapshot_id: snapName } })
      assert.equal(again.isError, true)
      const template = await client.callTool({ name: 'delete_snapshot', arguments: { snapshot_id: 'base' } })
      assert.equal(template.isError, true, 'delete_snapshot never deletes a template')
      assert.match(textOf(template), /no snapshot "base"/)
    } finally {
      await api('DELETE', `/templates/${encodeURIComponent(snapName)}`)
      await client.close()
    }
  })

  test('build_template: the log as progress, a sandbox of the template (2025 era over stdio)', async () => {
    const { client } = await CLIENTS[0][1]()
    const name = uniq('mcp-tpl')
    try {
      const built = await withProgress(client, 'build_template', {
        name,
        dockerfile: 'FROM base\nCOPY app /opt/app\nRUN cat /opt/app/main.py > /home/user/copied.txt\nENV GREETING="hi there"\n',
        files: { 'app/main.py': 'print("hello")\n' },
      })
      const out = ok(built.result)
      assert.equal(out.status, 'ready')
      assert.equal(built.messages[0], `starting the build of template ${name}`)
      assert.ok(built.messages.includes(`Building template ${name} from base`), JSON.stringify(built.messages))

      const id = ok(await client.callTool({ name: 'create_sandbox', arguments: { template: name, metadata: meta({ file: 'mcp-eras' }) } })).sandbox_id
      track(id)
      const ran = ok(await client.callTool({ name: 'run_command', arguments: { sandbox_id: id, command: 'cat copied.txt; echo $GREETING' } }))
      assert.equal(ran.stdout, 'print("hello")\nhi there\n')
      ok(await client.callTool({ name: 'kill_sandbox', arguments: { sandbox_id: id } }))

      const failed = await client.callTool({ name: 'build_template', arguments: { name: `${name}-bad`, dockerfile: 'FROM base\nRUN echo about to fail; exit 3\n' } })
      assert.equal(failed.isError, true)
      assert.match(textOf(failed), /about to fail/)
      const bad = await client.callTool({ name: 'build_template', arguments: { name: `${name}-bad`, dockerfile: 'FROM base\nCMD ["sleep", "1"]\n' } })
      assert.equal(bad.isError, true)
      assert.match(textOf(bad), /start_cmd/)
    } finally {
      for (const t of [name, `${name}-bad`]) await api('DELETE', `/templates/${encodeURIComponent(t)}`)
      await client.close()
    }
  })
})

// The 2026-07-28 exchange by hand: server/discover, then a stateless call, no
// session; and versions the server does not speak answered with those it does.
describe('MCP over plain fetch', () => {
  const post = async (body, headers = {}) => {
    const res = await fetch(MCP_URL, {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', ...AUTH, ...headers },
      body: JSON.stringify(body),
    })
    const text = await res.text()
    // An event stream carries the answer on a data: line.
    const line = text.split('\n').find((l) => l.startsWith('data: ') && l.includes('"id"'))
    return { status: res.status, headers: res.headers, json: JSON.parse(line ? line.slice(6) : text) }
  }
  const meta2026 = { 'io.modelcontextprotocol/protocolVersion': '2026-07-28', 'io.modelcontextprotocol/clientCapabilities': {} }
  const h2026 = (method, name) => ({ 'Mcp-Protocol-Version': '2026-07-28', 'Mcp-Method': method, ...(name ? { 'Mcp-Name': name } : {}) })

  test('server/discover and a stateless tools/call', async () => {
    const disc = await post({ jsonrpc: '2.0', id: 1, method: 'server/discover', params: { _meta: meta2026 } }, h2026('server/discover'))
    assert.equal(disc.status, 200, JSON.stringify(disc.json))
    assert.equal(disc.headers.get('mcp-session-id'), null)
    assert.ok(disc.json.result.supportedVersions.includes('2026-07-28'))
    assert.ok(disc.json.result.supportedVersions.includes('2025-06-18'))
    assert.ok(disc.json.result.capabilities.tools && disc.json.result.capabilities.resources)

    const call = await post({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'list_sandboxes', arguments: {}, _meta: meta2026 } },
      h2026('tools/call', 'list_sandboxes'))
    assert.equal(call.status, 200, JSON.stringify(call.json))
    assert.equal(call.headers.get('mcp-session-id'), null)
    assert.ok(Array.isArray(call.json.result.structuredContent.sandboxes))
    assert.equal(call.json.result._meta['io.modelcontextprotocol/serverInfo'].name, 'airlock')
  })

  test('initialize (2025-06-18) starts a session; an unknown version is answered with a supported one', async () => {
    const init = await post({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'fetch', version: '0' } } })
    assert.equal(init.json.result.protocolVersion, '2025-06-18')
    assert.ok(init.headers.get('mcp-session-id'))
    const old = await post({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: '1999-01-01', capabilities: {}, clientInfo: { name: 'fetch', version: '0' } } })
    assert.equal(old.json.result.protocolVersion, '2025-11-25')
  })

  test('a version the server does not speak: HTTP 400 with the supported versions', async () => {
    for (const [headers, params, requested] of [
      [{ 'Mcp-Protocol-Version': '2024-01-01' }, {}, '2024-01-01'],
      [{ 'Mcp-Protocol-Version': '2099-01-01' }, { _meta: { ...meta2026, 'io.modelcontextprotocol/protocolVersion': '2099-01-01' } }, '2099-01-01'],
      [{}, { _meta: { ...meta2026, 'io.modelcontextprotocol/protocolVersion': '2030-01-01' } }, '2030-01-01'],
    ]) {
      const res = await post({ jsonrpc: '2.0', id: 9, method: 'tools/list', params }, headers)
      assert.equal(res.status, 400, JSON.stringify(res.json))
      assert.equal(res.json.id, 9)
      assert.equal(res.json.error.code, -32022)
      assert.equal(res.json.error.data.requested, requested)
      assert.deepEqual(res.json.error.data.supported, ['2026-07-28', '2025-11-25', '2025-06-18', '2025-03-26', '2024-11-05'])
      assert.match(res.json.error.message, /supports 2026-07-28, 2025-11-25/)
    }
  })

  test('the API key is required in both eras', async () => {
    for (const headers of [h2026('server/discover'), {}]) {
      const res = await fetch(MCP_URL, {
        method: 'POST',
        headers: { 'Content-Type': 'application/json', Accept: 'application/json, text/event-stream', ...headers },
        body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'server/discover', params: { _meta: meta2026 } }),
      })
      assert.equal(res.status, 401)
    }
  })
})

// The MCP Inspector CLI (@modelcontextprotocol/inspector 2.12.0) over stdio and HTTP:
// the tool list passes its --strict schema check, a tool call, a resource read.
describe('MCP Inspector CLI', () => {
  const run = promisify(execFile)
  const targets = [
    ['stdio', [BIN, 'mcp', '--url', API_URL, '--sandbox-url', SANDBOX_URL, '--api-key', API_KEY]],
    ['HTTP', [MCP_URL, '--header', `Authorization: Bearer ${API_KEY}`]],
  ]
  const inspector = async (target, ...args) => {
    const { stdout, stderr } = await run('npx', ['mcp-inspector', '--cli', ...target, ...args], { maxBuffer: 16 << 20, timeout: 120_000 })
    return { json: JSON.parse(stdout), stderr }
  }
  for (const [name, target] of targets) {
    test(`over ${name}: tools/list --strict, tools/call, resources/read`, async () => {
      const { json: list, stderr } = await inspector(target, '--method', 'tools/list', '--strict')
      assert.deepEqual(list.tools.map((t) => t.name).sort(), [...TOOLS].sort())
      assert.doesNotMatch(stderr, /warning|error:/i, 'the schemas pass the inspector\'s portability check')

      const { json: created } = await inspector(target, '--method', 'tools/call', '--tool-name', 'create_sandbox', '--tool-arg', 'template=base', 'timeout=120')
      const id = created.structuredContent.sandbox_id
      assert.ok(id, JSON.stringify(created))
      track(id)
      const { json: wrote } = await inspector(target, '--method', 'tools/call', '--tool-name', 'write_file',
        '--tool-arg', `sandbox_id=${id}`, 'path=/home/user/inspected.txt', 'content=seen by the inspector')
      assert.equal(wrote.structuredContent.bytes, 21)
      const { json: read } = await inspector(target, '--method', 'resources/read', '--uri', `sandbox://${id}/home/user/inspected.txt`)
      assert.equal(read.contents[0].text, 'seen by the inspector')
      await inspector(target, '--method', 'tools/call', '--tool-name', 'kill_sandbox', '--tool-arg', `sandbox_id=${id}`)
      // A tool error exits 5 (isError), the CI-usable signal.
      await assert.rejects(inspector(target, '--method', 'tools/call', '--tool-name', 'kill_sandbox', '--tool-arg', `sandbox_id=${id}`),
        (e) => e.code === 5)
    })
  }
})
