// Lifecycle events (E2B's lifecycle events API), driven by the official SDK:
// a sandbox is taken through create, setTimeout, updateNetwork, pause,
// connect (resume), createSnapshot and kill, and GET /events/sandboxes[/id]
// must then tell that story in order, with E2B's payload, page it with
// offset/limit/orderAsc, refuse bad queries with a 400, and show another
// API key nothing. An auto-pause at the timeout and an auto-resume by traffic
// are events too, and a timeout kill says so.

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Sandbox } from 'e2b'
import { api, assertErrorBody, createSandbox, meta, TEMPLATE, track, trackCleanup, waitFor } from './helpers.mjs'

trackCleanup()

const OTHER = process.env.AIRLOCK_SDK_OTHER_KEY
if (!OTHER) throw new Error('AIRLOCK_SDK_OTHER_KEY must be set (use tests/sdk/run.sh)')

const short = (t) => t.replace('sandbox.lifecycle.', '')

async function eventsOf(path, key) {
  const res = await api('GET', path, key ? { key } : {})
  assert.equal(res.status, 200, `GET ${path}: ${res.text}`)
  assert.ok(Array.isArray(res.json), `GET ${path} answers an array: ${res.text}`)
  return res.json
}

describe('lifecycle events', () => {
  test('every transition is an event, in order, with E2B’s payload; paging and scoping', async () => {
    const sbx = await createSandbox({ metadata: { purpose: 'events' } })
    const id = sbx.sandboxId
    await sbx.setTimeout(600_000)
    await sbx.updateNetwork({ allowOut: ['8.8.8.8', 'example.org'], denyOut: ['0.0.0.0/0'] })
    assert.equal(await sbx.pause(), true)
    const resumed = await Sandbox.connect(id)
    assert.equal(await resumed.isRunning(), true)
    const snap = await resumed.createSnapshot()
    try {
      assert.equal(await resumed.kill(), true)

      const evs = await eventsOf(`/events/sandboxes/${id}?orderAsc=true&limit=100`)
      assert.deepEqual(evs.map((e) => short(e.type)),
        ['created', 'updated', 'updated', 'paused', 'resumed', 'checkpointed', 'killed'])
      const ids = new Set()
      for (const e of evs) {
        for (const k of ['version', 'id', 'type', 'eventData', 'sandboxBuildId', 'sandboxExecutionId', 'sandboxId', 'sandboxTeamId', 'sandboxTemplateId', 'timestamp']) {
          assert.ok(k in e, `${e.type} lacks ${k}: ${JSON.stringify(e)}`)
        }
        assert.equal(e.version, 'v1')
        assert.match(e.id, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
        assert.ok(!ids.has(e.id), 'event ids are unique')
        ids.add(e.id)
        assert.equal(e.sandboxId, id)
        assert.equal(e.sandboxTemplateId, 'base')
        assert.ok(e.sandboxBuildId.length > 0 && e.sandboxTeamId.length > 0)
        assert.ok(!Number.isNaN(Date.parse(e.timestamp)))
        assert.equal(e.eventData.sandbox_metadata.purpose, 'events', `${e.type} carries the metadata`)
      }
      const [created, timeout, network, paused, resumedEv, checkpointed, killed] = evs
      assert.ok(Date.parse(timeout.eventData.set_timeout) > Date.now() + 8 * 60_000, `set_timeout: ${JSON.stringify(timeout.eventData)}`)
      assert.deepEqual(network.eventData.network_egress,
        { allowed_cidrs: ['8.8.8.8'], allowed_domains: ['example.org'], denied_cidrs: ['0.0.0.0/0'] })
      for (const e of [paused, killed]) {
        const x = e.eventData.execution
        assert.ok(x && x.vcpu_count >= 1 && x.memory_mb >= 1 && x.execution_time > 0 && !Number.isNaN(Date.parse(x.started_at)),
          `${e.type} describes the execution: ${JSON.stringify(e.eventData)}`)
      }
      assert.equal(killed.eventData.kill_reason, 'request')
      assert.equal(checkpointed.eventData.snapshot_id, snap.snapshotId)
      // The pause ends an execution; the resume starts another.
      assert.equal(paused.sandboxExecutionId, created.sandboxExecutionId)
      assert.notEqual(resumedEv.sandboxExecutionId, created.sandboxExecutionId)
      assert.equal(killed.sandboxExecutionId, resumedEv.sandboxExecutionId)

      // Newest first by default, 10 at most.
      const desc = await eventsOf(`/events/sandboxes/${id}`)
      assert.deepEqual(desc.map((e) => e.id), evs.map((e) => e.id).reverse())
      // Pages of 2 (offset/limit) walk the same events in the same order.
      const walked = []
      for (let off = 0; off < evs.length + 2; off += 2) {
        walked.push(...(await eventsOf(`/events/sandboxes/${id}?orderAsc=true&limit=2&offset=${off}`)).map((e) => e.id))
      }
      assert.deepEqual(walked, evs.map((e) => e.id))
      assert.equal((await eventsOf(`/events/sandboxes/${id}?limit=1`))[0].id, killed.id)
      // The key's events across its sandboxes include these.
      const mine = await eventsOf('/events/sandboxes?limit=100')
      assert.ok(evs.every((e) => mine.some((m) => m.id === e.id)), "the key's list holds the sandbox's events")
      assert.equal((await eventsOf('/events/sandboxes')).length <= 10, true, 'default limit 10')

      // Another key sees none of them.
      assert.deepEqual(await eventsOf(`/events/sandboxes/${id}`, OTHER), [])
      const theirs = await eventsOf('/events/sandboxes?limit=100', OTHER)
      assert.ok(!theirs.some((e) => e.sandboxId === id), 'another key lists none of the events')

      for (const q of ['limit=0', 'limit=101', 'offset=-3', 'orderAsc=sideways', 'limit=ten', 'types=sandbox.lifecycle.nope']) {
        const res = await api('GET', `/events/sandboxes/${id}?${q}`)
        assert.equal(res.status, 400, `?${q}: ${res.text}`)
        assertErrorBody(res, `?${q}`)
      }
      const noKey = await api('GET', '/events/sandboxes', { key: null })
      assert.equal(noKey.status, 401)
    } finally {
      await Sandbox.deleteSnapshot(snap.snapshotId).catch(() => {})
    }
  })

  test('auto-pause at the timeout and auto-resume by traffic are paused and resumed events', async () => {
    const sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 60_000, metadata: meta(), lifecycle: { onTimeout: 'pause', autoResume: true } })
    track(sbx.sandboxId)
    await sbx.setTimeout(1_000)
    await waitFor(async () => (await sbx.getInfo()).state === 'paused', { timeoutMs: 30_000, what: 'paused at timeout' })
    // An envd call through the proxy wakes it.
    assert.equal((await sbx.commands.run('echo awake')).stdout.trim(), 'awake')
    const evs = await eventsOf(`/events/sandboxes/${sbx.sandboxId}?orderAsc=true`)
    assert.deepEqual(evs.map((e) => short(e.type)), ['created', 'updated', 'paused', 'resumed'])
    assert.ok(evs[2].eventData.execution.execution_time > 0)
    assert.notEqual(evs[3].sandboxExecutionId, evs[2].sandboxExecutionId, 'the auto-resume starts an execution')
  })

  test('a sandbox that reaches its timeout is killed with reason timeout', async () => {
    const sbx = await createSandbox({ timeoutMs: 1_000 })
    let evs
    await waitFor(async () => {
      evs = await eventsOf(`/events/sandboxes/${sbx.sandboxId}`)
      return evs.length > 0 && evs[0].type === 'sandbox.lifecycle.killed'
    }, { timeoutMs: 30_000, what: 'the killed event of a timed-out sandbox' })
    assert.equal(evs[0].eventData.kill_reason, 'timeout')
    assert.deepEqual(evs.map((e) => short(e.type)), ['killed', 'created'])
  })
})
