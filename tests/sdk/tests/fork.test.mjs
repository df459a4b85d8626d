// Fork and snapshots through the official SDK: a running sandbox forked into
// one or many independent sandboxes that start with its files (and, where
// the runtime can save them, its processes), the original running on; and
// snapshots that any number of sandboxes start from, listed, filtered by
// name and sandbox, and deleted.

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Sandbox, SandboxNotFoundError } from 'e2b'
import { api, createSandbox, meta, rejectsWith, track, trackCleanup, uniq } from './helpers.mjs'

trackCleanup()

const forked = (list) => list.map((f) => {
  assert.ok(f instanceof Sandbox, `fork failed: ${f?.message ?? f}`)
  track(f.sandboxId)
  return f
})

describe('fork', { concurrency: true }, () => {
  test('one fork has the original files; both run; afterwards they are independent', async () => {
    const sbx = await createSandbox()
    await sbx.files.write('/home/user/state.txt', 'before fork')
    const [fork] = forked(await sbx.fork())
    assert.notEqual(fork.sandboxId, sbx.sandboxId)
    assert.equal(await sbx.isRunning(), true)
    assert.equal(await fork.isRunning(), true)
    assert.equal(await fork.files.read('/home/user/state.txt'), 'before fork')
    await fork.files.write('/home/user/state.txt', 'written in the fork')
    await sbx.files.write('/home/user/other.txt', 'written in the original')
    assert.equal(await sbx.files.read('/home/user/state.txt'), 'before fork')
    assert.equal(await fork.files.exists('/home/user/other.txt'), false)
    const r = await fork.commands.run('echo ok')
    assert.equal(r.stdout.trim(), 'ok')
  })

  test('count 3 with a timeout: three distinct running sandboxes (static Sandbox.fork)', async () => {
    const sbx = await createSandbox()
    const forks = forked(await Sandbox.fork(sbx.sandboxId, { count: 3, timeoutMs: 60_000 }))
    assert.equal(forks.length, 3)
    const ids = new Set(forks.map((f) => f.sandboxId))
    assert.equal(ids.size, 3)
    assert.ok(!ids.has(sbx.sandboxId))
    for (const f of forks) {
      assert.equal(await f.isRunning(), true)
      const end = (await f.getInfo()).endAt.getTime()
      assert.ok(end - Date.now() <= 61_000, 'the forks get the requested timeout')
    }
  })

  test('bad input: count 0 and 101 are refused, an unknown or killed sandbox is not found', async () => {
    // E2B's own test expects InvalidArgumentError; npm e2b 2.51 has no
    // client-side check and maps the server's 400 to a SandboxError.
    const zero = await rejectsWith(Sandbox.fork('whatever', { count: 0 }), Error, 'count 0')
    assert.equal(zero.statusCode, 400)
    assert.match(zero.message, /at least 1/)
    const res = await api('POST', '/sandboxes/whatever/fork', { body: { count: 101 } })
    assert.equal(res.status, 400)
    assert.match(res.json.message, /101/)
    const sbx = await createSandbox()
    await sbx.kill()
    await rejectsWith(sbx.fork(), SandboxNotFoundError, 'fork of a killed sandbox')
  })
})

describe('snapshots', { concurrency: true }, () => {
  test('sandboxes from a snapshot start with its files and are independent of each other', async () => {
    const sbx = await createSandbox()
    await sbx.files.makeDir('/home/user/app')
    await sbx.files.write('/home/user/app/config.json', '{"env":"test"}')
    const snap = await sbx.createSnapshot()
    assert.ok(snap.snapshotId.length > 0)
    assert.equal(await sbx.isRunning(), true, 'the sandbox runs on after a snapshot')
    try {
      const a = await Sandbox.create(snap.snapshotId, { metadata: meta() })
      track(a.sandboxId)
      const b = await Sandbox.create(snap.snapshotId, { metadata: meta() })
      track(b.sandboxId)
      assert.equal(await a.files.read('/home/user/app/config.json'), '{"env":"test"}')
      await a.files.write('/home/user/app/config.json', 'changed in a')
      assert.equal(await b.files.read('/home/user/app/config.json'), '{"env":"test"}')
      assert.equal(await sbx.files.read('/home/user/app/config.json'), '{"env":"test"}')
    } finally {
      assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), true)
    }
    assert.equal(await Sandbox.deleteSnapshot(snap.snapshotId), false, 'a second delete finds nothing')
    await assert.rejects(Sandbox.create(snap.snapshotId, { metadata: meta() }))
  })

  test('named snapshots: names, listing by name and by sandbox, the name moves to the newest', async () => {
    const sbx = await createSandbox()
    const name = uniq('snap')
    const first = await sbx.createSnapshot({ name })
    assert.ok(first.names.some((n) => n.includes(name)))
    const byName = await Sandbox.listSnapshots({ name }).nextItems()
    assert.deepEqual(byName.map((s) => s.snapshotId), [first.snapshotId])
    assert.deepEqual(await Sandbox.listSnapshots({ name: `${name}-none` }).nextItems(), [])
    const mine = await sbx.listSnapshots().nextItems()
    assert.ok(mine.some((s) => s.snapshotId === first.snapshotId))
    await sbx.files.write('/tmp/v', 'two')
    const second = await sbx.createSnapshot({ name })
    const again = await Sandbox.listSnapshots({ name }).nextItems()
    assert.equal(again.length, 1, 'one snapshot holds a name')
    const from = await Sandbox.create(second.snapshotId, { metadata: meta() })
    track(from.sandboxId)
    assert.equal(await from.files.read('/tmp/v'), 'two')
    assert.equal(await Sandbox.deleteSnapshot(second.snapshotId), true)
  })

  test('a snapshot of an unknown sandbox is a 404', async () => {
    const res = await api('POST', '/sandboxes/nosuchsandbox0000/snapshots', { body: {} })
    assert.equal(res.status, 404)
  })
})
