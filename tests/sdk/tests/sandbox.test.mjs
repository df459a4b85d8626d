// Sandbox lifecycle through the official SDK: create (v2 path used by the SDK
// and the older v1 path used by the Python SDK), connect, isRunning, kill,
// getInfo, setTimeout, expiry, metrics.

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Sandbox, SandboxNotFoundError } from 'e2b'
import {
  TEMPLATE, api, createSandbox, meta, rejectsWith, sleep, track, trackCleanup, uniq, waitFor,
} from './helpers.mjs'

trackCleanup()

const SANDBOX_ID_RE = /^[a-z0-9]+$/

function semverAtLeast(v, min) {
  const a = String(v).split(/[.+-]/).slice(0, 3).map(Number)
  const b = min.split('.').map(Number)
  for (let i = 0; i < 3; i++) {
    if ((a[i] || 0) !== b[i]) return (a[i] || 0) > b[i]
  }
  return true
}

function assertNear(actualMs, expectedMs, tolMs, what) {
  assert.ok(
    Math.abs(actualMs - expectedMs) <= tolMs,
    `${what}: expected ~${expectedMs} ms (±${tolMs}), got ${actualMs} ms`,
  )
}

describe('sandbox lifecycle', { concurrency: true }, () => {
  test('Sandbox.create with defaults gives a running sandbox that runs commands', async () => {
    const sbx = await createSandbox()
    assert.match(sbx.sandboxId, SANDBOX_ID_RE, 'sandbox id must be [a-z0-9]+')
    assert.equal(await sbx.isRunning(), true)
    const r = await sbx.commands.run('echo created-ok')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'created-ok\n')
    // default timeout is 300 s
    const info = await sbx.getInfo()
    assertNear(info.endAt.getTime() - info.startedAt.getTime(), 300_000, 5_000, 'default timeout (endAt - startedAt)')
  })

  test('Sandbox.create with metadata: getInfo returns it verbatim', async () => {
    const extra = { case: 'metadata', 'key with space': 'value & more=1', unicode: 'žluťoučký' }
    const sbx = await createSandbox({ metadata: extra })
    const info = await sbx.getInfo()
    assert.deepEqual(info.metadata, meta(extra))
  })

  test('Sandbox.create with envs: visible to commands', async () => {
    const val = uniq('envval')
    const sbx = await createSandbox({ envs: { FOO: val, SECOND_VAR: 'two words' } })
    const r = await sbx.commands.run('echo "$FOO|$SECOND_VAR"')
    assert.equal(r.stdout, `${val}|two words\n`)
    // sandbox-level envs also reach commands run as root
    const r2 = await sbx.commands.run('echo $FOO', { user: 'root' })
    assert.equal(r2.stdout, `${val}\n`)
  })

  test('Sandbox.create with timeoutMs: reflected in getInfo().endAt', async () => {
    const before = Date.now()
    const sbx = await createSandbox({ timeoutMs: 120_000 })
    const info = await sbx.getInfo()
    assertNear(info.endAt.getTime() - info.startedAt.getTime(), 120_000, 3_000, 'endAt - startedAt')
    assertNear(info.endAt.getTime() - before, 120_000, 5_000, 'endAt - time of create')
  })

  test('POST /sandboxes (v1, as the Python SDK sends it): 201, required fields, then connect + run', async () => {
    const envVal = uniq('v1env')
    const metadata = meta({ case: 'v1-create' })
    const res = await api('POST', '/sandboxes', {
      body: { templateID: TEMPLATE, timeout: 60, metadata, envVars: { V1_VAR: envVal }, secure: true },
    })
    if (res.json?.sandboxID) track(res.json.sandboxID)
    assert.equal(res.status, 201, `POST /sandboxes: expected 201, got ${res.status} ${res.text}`)
    const b = res.json
    assert.equal(typeof b.sandboxID, 'string')
    assert.match(b.sandboxID, SANDBOX_ID_RE)
    assert.equal(typeof b.templateID, 'string')
    assert.ok(b.templateID.length > 0, 'templateID non-empty')
    assert.equal(typeof b.clientID, 'string', 'clientID is required (Python SDK KeyErrors otherwise)')
    assert.equal(typeof b.envdVersion, 'string')
    assert.match(b.envdVersion, /^\d+\.\d+\.\d+/)
    assert.equal(typeof b.envdAccessToken, 'string', 'secure: true must return envdAccessToken')
    assert.ok(b.envdAccessToken.length > 0)

    // check the expiry before connecting: connect without a timeout may extend it to 300 s
    const before = await Sandbox.getInfo(b.sandboxID)
    assert.deepEqual(before.metadata, metadata)
    assertNear(before.endAt.getTime() - Date.now(), 60_000, 5_000, 'v1 timeout 60 s → endAt')
    assertNear(before.endAt.getTime() - before.startedAt.getTime(), 60_000, 3_000, 'v1 timeout 60 s → endAt - startedAt')

    const sbx = await Sandbox.connect(b.sandboxID)
    assert.equal(sbx.sandboxId, b.sandboxID)
    const r = await sbx.commands.run('echo "$V1_VAR"; whoami')
    assert.equal(r.stdout, `${envVal}\nuser\n`)
    assert.equal((await sbx.getInfo()).state, 'running')
  })

  test('POST /v2/sandboxes: 201 with required fields and envdVersion >= 0.6.4', async () => {
    const res = await api('POST', '/v2/sandboxes', {
      body: { templateID: TEMPLATE, timeout: 60, metadata: meta({ case: 'v2-create' }) },
    })
    if (res.json?.sandboxID) track(res.json.sandboxID)
    assert.equal(res.status, 201, `POST /v2/sandboxes: expected 201, got ${res.status} ${res.text}`)
    const b = res.json
    assert.match(b.sandboxID, SANDBOX_ID_RE)
    assert.equal(typeof b.templateID, 'string')
    assert.equal(typeof b.clientID, 'string')
    assert.equal(typeof b.envdAccessToken, 'string', 'v2 create is always secure')
    assert.ok(
      semverAtLeast(b.envdVersion, '0.6.4'),
      `envdVersion must be >= 0.6.4 so the SDK enables every feature (got ${b.envdVersion})`,
    )
  })

  test('Sandbox.connect(id) to a running sandbox and run a command', async () => {
    const sbx = await createSandbox()
    const marker = uniq('conn')
    await sbx.files.write('/tmp/connect-marker', marker)
    const again = await Sandbox.connect(sbx.sandboxId)
    assert.equal(again.sandboxId, sbx.sandboxId)
    const r = await again.commands.run('cat /tmp/connect-marker')
    assert.equal(r.stdout, marker)
    assert.equal(await again.isRunning(), true)
  })

  test('Sandbox.connect to an unknown sandbox throws SandboxNotFoundError', async () => {
    await rejectsWith(Sandbox.connect('nosuchsandbox000000'), SandboxNotFoundError, 'connect(unknown)')
  })

  test('isRunning: true, then false after kill', async () => {
    const sbx = await createSandbox()
    assert.equal(await sbx.isRunning(), true)
    assert.equal(await sbx.kill(), true)
    assert.equal(await sbx.isRunning(), false)
  })

  test('Sandbox.kill(id): true, then false; false for an unknown id', async () => {
    const sbx = await createSandbox()
    assert.equal(await Sandbox.kill(sbx.sandboxId), true)
    assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'second kill of the same id')
    assert.equal(await Sandbox.kill('nosuchsandbox000000'), false, 'kill of unknown id')
    await rejectsWith(Sandbox.getInfo(sbx.sandboxId), SandboxNotFoundError, 'getInfo after kill')
  })

  test('getInfo fields: sandboxId, templateId, metadata, startedAt, endAt, state', async () => {
    const before = Date.now()
    const md = { case: 'info', n: '1' }
    const sbx = await createSandbox({ metadata: md })
    const after = Date.now()
    for (const info of [await sbx.getInfo(), await Sandbox.getInfo(sbx.sandboxId)]) {
      assert.equal(info.sandboxId, sbx.sandboxId)
      assert.equal(typeof info.templateId, 'string')
      assert.ok(
        info.templateId === TEMPLATE || info.name === TEMPLATE,
        `templateId (${info.templateId}) or name/alias (${info.name}) must be '${TEMPLATE}'`,
      )
      assert.deepEqual(info.metadata, meta(md))
      assert.ok(info.startedAt instanceof Date && !isNaN(info.startedAt), 'startedAt is a date')
      assert.ok(info.endAt instanceof Date && !isNaN(info.endAt), 'endAt is a date')
      assert.ok(
        info.startedAt.getTime() >= before - 2_000 && info.startedAt.getTime() <= after + 2_000,
        `startedAt ${info.startedAt.toISOString()} must be within create call`,
      )
      assert.ok(info.endAt > info.startedAt, 'endAt after startedAt')
      assert.equal(info.state, 'running')
      assert.equal(typeof info.cpuCount, 'number')
      assert.ok(info.cpuCount > 0, `cpuCount > 0 (got ${info.cpuCount})`)
      assert.equal(typeof info.memoryMB, 'number')
      assert.ok(info.memoryMB > 0, `memoryMB > 0 (got ${info.memoryMB})`)
      assert.equal(typeof info.envdVersion, 'string')
    }
  })

  test('setTimeout shortens endAt', async () => {
    const sbx = await createSandbox()
    const info1 = await sbx.getInfo()
    const t0 = Date.now()
    await sbx.setTimeout(30_000)
    const info2 = await sbx.getInfo()
    assert.ok(info2.endAt < info1.endAt, `endAt must move earlier: ${info1.endAt.toISOString()} → ${info2.endAt.toISOString()}`)
    assertNear(info2.endAt.getTime() - t0, 30_000, 3_000, 'endAt after setTimeout(30 s)')
    // and it can be extended again
    await Sandbox.setTimeout(sbx.sandboxId, 90_000)
    const info3 = await sbx.getInfo()
    assertNear(info3.endAt.getTime() - Date.now(), 90_000, 3_000, 'endAt after setTimeout(90 s)')
  })

  test('setTimeout on an unknown sandbox throws SandboxNotFoundError', async () => {
    await rejectsWith(Sandbox.setTimeout('nosuchsandbox000000', 10_000), SandboxNotFoundError, 'setTimeout(unknown)')
  })

  test('a sandbox created with timeoutMs 3000 is gone after ~6 s', async () => {
    const sbx = await createSandbox({ timeoutMs: 3_000 })
    assert.equal(await sbx.isRunning(), true)
    await sleep(6_000)
    assert.equal(await sbx.isRunning(), false, 'isRunning after expiry')
    await rejectsWith(sbx.getInfo(), SandboxNotFoundError, 'getInfo after expiry')
    assert.equal(await Sandbox.kill(sbx.sandboxId), false, 'kill after expiry')
  })

  test('getMetrics returns samples with cpuCount, memTotal, diskTotal after ~6 s', async () => {
    const sbx = await createSandbox()
    await sleep(6_000)
    const metrics = await waitFor(async () => {
      const m = await sbx.getMetrics()
      return m.length > 0 ? m : null
    }, { timeoutMs: 8_000, intervalMs: 1_000, what: 'a metrics sample' })
    const m = metrics[metrics.length - 1]
    assert.ok(m.timestamp instanceof Date && !isNaN(m.timestamp), 'timestamp is a date')
    assert.ok(Math.abs(m.timestamp.getTime() - Date.now()) < 60_000, `timestamp recent: ${m.timestamp}`)
    assert.ok(m.cpuCount > 0, `cpuCount > 0: ${JSON.stringify(m)}`)
    assert.equal(typeof m.cpuUsedPct, 'number')
    assert.ok(m.memTotal > 0, `memTotal > 0: ${JSON.stringify(m)}`)
    assert.ok(m.memUsed >= 0 && m.memUsed <= m.memTotal, `0 <= memUsed <= memTotal: ${JSON.stringify(m)}`)
    assert.ok(m.diskTotal > 0, `diskTotal > 0: ${JSON.stringify(m)}`)
    assert.ok(m.diskUsed >= 0 && m.diskUsed <= m.diskTotal, `0 <= diskUsed <= diskTotal: ${JSON.stringify(m)}`)
    // static form works too
    const again = await Sandbox.getMetrics(sbx.sandboxId)
    assert.ok(again.length >= 1)
  })

  test('getMetrics on an unknown sandbox throws SandboxNotFoundError', async () => {
    await rejectsWith(Sandbox.getMetrics('nosuchsandbox000000'), SandboxNotFoundError, 'getMetrics(unknown)')
  })
})

