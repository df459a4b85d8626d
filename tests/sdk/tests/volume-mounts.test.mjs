// Volumes mounted into sandboxes (issue 17, item 2), through the official
// SDK: Sandbox.create({volumeMounts}) mounts each volume read-write for the
// default user; sandboxes share a volume's writes, the content API sees
// them, and pause/resume, snapshots and forks keep the mounts. A volume a
// sandbox mounts cannot be destroyed without force.

import assert from 'node:assert/strict'
import { after, describe, test } from 'node:test'
import { Sandbox, Volume } from 'e2b'
import { api, createSandbox, trackCleanup, track, uniq, TEMPLATE, meta } from './helpers.mjs'

trackCleanup()

const made = new Set()
after(async () => {
  await Promise.allSettled([...made].map((id) => api('DELETE', `/volumes/${id}?force=true`)))
})

async function newVolume(prefix = 'mnt') {
  const vol = await Volume.create(uniq(prefix))
  made.add(vol.volumeId)
  return vol
}

async function sh(sbx, cmd, opts = {}) {
  const r = await sbx.commands.run(cmd, { timeoutMs: 60_000, ...opts })
  return r.stdout
}

describe('volume mounts', () => {
  test('mounted read-write for the default user; listed in getInfo and list; the content API sees the writes', async () => {
    const data = await newVolume('data')
    const cache = await newVolume('cache')
    await data.writeFile('/seed.txt', 'from the content API')
    const sbx = await createSandbox({ volumeMounts: { '/data': data, '/home/user/cache': cache.name } })

    assert.equal(await sh(sbx, 'cat /data/seed.txt'), 'from the content API')
    // The default user writes; its files are its own, in the sandbox and on the volume.
    assert.equal(await sh(sbx, 'echo hello > /data/hello.txt && stat -c %U:%G /data/hello.txt /data'), 'user:user\nuser:user\n')
    await sh(sbx, 'mkdir -p /home/user/cache/a/b && echo deep > /home/user/cache/a/b/c.txt')
    assert.equal(await data.readFile('/hello.txt'), 'hello\n')
    assert.equal(await cache.readFile('/a/b/c.txt'), 'deep\n')
    const st = await data.getInfo('/hello.txt')
    assert.equal(st.uid, 1000, JSON.stringify(st))

    const info = await sbx.getInfo()
    const mounts = [...info.volumeMounts].sort((a, b) => a.path.localeCompare(b.path))
    assert.deepEqual(mounts, [
      { name: data.name, path: '/data' },
      { name: cache.name, path: '/home/user/cache' },
    ])
    const listed = (await Sandbox.list({ query: { metadata: meta() } }).nextItems()).find((s) => s.sandboxId === sbx.sandboxId)
    assert.ok(listed, 'the sandbox is listed')
    assert.equal(listed.volumeMounts.length, 2, JSON.stringify(listed.volumeMounts))

    // Root in the sandbox is root on the volume too, nothing more.
    assert.equal(await sh(sbx, 'touch /data/by-root && stat -c %u /data/by-root', { user: 'root' }), '0\n')
    await sbx.kill()
    // Files outlive the sandbox.
    assert.equal(await data.readFile('/hello.txt'), 'hello\n')
  })

  test('two sandboxes write one volume at once and see each other\'s writes', async () => {
    const vol = await newVolume('shared')
    const [a, b] = await Promise.all([
      createSandbox({ volumeMounts: { '/shared': vol } }),
      createSandbox({ volumeMounts: { '/mnt/shared': vol } }),
    ])
    // Both append 200 lines each to their own file and to one common file at once.
    const writer = (who, dir) => `for i in $(seq 1 200); do echo ${who}-$i >> ${dir}/${who}.txt; echo ${who}-$i >> ${dir}/common.txt; done`
    await Promise.all([sh(a, writer('a', '/shared')), sh(b, writer('b', '/mnt/shared'))])
    assert.equal(await sh(a, 'wc -l < /shared/b.txt'), '200\n')
    assert.equal(await sh(b, 'wc -l < /mnt/shared/a.txt'), '200\n')
    assert.equal(await sh(a, 'wc -l < /shared/common.txt'), '400\n')
    assert.equal((await vol.readFile('/common.txt')).split('\n').filter(Boolean).length, 400)
  })

  test('pause/resume, a snapshot and a fork keep the mount (a fork mounts the same volume)', async () => {
    const vol = await newVolume('keep')
    const sbx = await createSandbox({ volumeMounts: { '/data': vol } })
    await sh(sbx, 'echo before > /data/before.txt')
    await sbx.pause()
    await vol.writeFile('/while-paused.txt', 'written while paused')
    const resumed = await Sandbox.connect(sbx.sandboxId)
    assert.equal(await sh(resumed, 'cat /data/before.txt /data/while-paused.txt'), 'before\nwritten while paused')
    assert.deepEqual((await resumed.getInfo()).volumeMounts, [{ name: vol.name, path: '/data' }])

    const snap = await resumed.createSnapshot()
    const fromSnap = track((await Sandbox.create(snap.snapshotId, { metadata: meta() })).sandboxId)
    const snapSbx = await Sandbox.connect(fromSnap)
    await sh(snapSbx, 'echo from-snapshot > /data/snap.txt')
    assert.equal(await sh(resumed, 'cat /data/snap.txt'), 'from-snapshot\n', 'the snapshot\'s sandbox writes the same volume')
    assert.deepEqual((await snapSbx.getInfo()).volumeMounts, [{ name: vol.name, path: '/data' }])

    const [fork] = await resumed.fork()
    assert.ok(fork instanceof Sandbox, `fork failed: ${fork?.message ?? fork}`)
    track(fork.sandboxId)
    assert.deepEqual((await fork.getInfo()).volumeMounts, [{ name: vol.name, path: '/data' }])
    await sh(fork, 'echo from-fork > /data/fork.txt')
    assert.equal(await vol.readFile('/fork.txt'), 'from-fork\n', 'the fork writes the volume, not a copy')
    await api('DELETE', `/snapshots/${encodeURIComponent(snap.snapshotId)}`)
  })

  test('a mounted volume cannot be destroyed without force; the message names the sandbox', async () => {
    const vol = await newVolume('busy')
    const sbx = await createSandbox({ volumeMounts: { '/data': vol } })
    const res = await api('DELETE', `/volumes/${vol.volumeId}`)
    assert.equal(res.status, 409, JSON.stringify(res.json))
    assert.match(res.json.message, new RegExp(sbx.sandboxId))
    await sbx.pause()
    assert.equal((await api('DELETE', `/volumes/${vol.volumeId}`)).status, 409, 'a paused sandbox holds it too')
    await Sandbox.kill(sbx.sandboxId)
    assert.equal(await Volume.destroy(vol.volumeId), true, 'destroyed once no sandbox mounts it')
    made.delete(vol.volumeId)
  })

  test('a full volume is a quota error inside the sandbox', async () => {
    const res = await api('POST', '/volumes', { body: { name: uniq('small'), sizeMB: 16 } })
    assert.equal(res.status, 201, JSON.stringify(res.json))
    made.add(res.json.volumeID)
    const sbx = await createSandbox({ volumeMounts: { '/small': res.json.name } })
    const r = await sbx.commands.run('head -c 64M /dev/zero > /small/big; echo exit=$?', { timeoutMs: 60_000 })
    assert.match(r.stdout, /exit=1/, r.stdout)
    assert.match(r.stderr, /quota exceeded|No space left/i, r.stderr)
    // The sandbox's own disk is not the volume's.
    assert.equal(await sh(sbx, 'head -c 1M /dev/zero > /tmp/ok && echo ok'), 'ok\n')
  })

  test('bad mounts are a 400 listing every wrong one', async () => {
    const vol = await newVolume('bad')
    const res = await api('POST', '/sandboxes', {
      body: {
        templateID: TEMPLATE, metadata: meta(),
        volumeMounts: [
          { name: vol.name, path: 'relative' },
          { name: 'no-such-volume', path: '/x' },
          { name: vol.name, path: '/proc/x' },
          { name: vol.name, path: '/a/../b' },
          { name: vol.name, path: '/' },
          { name: vol.name, path: '/ok' },
          { name: vol.name, path: '/ok' },
        ],
      },
    })
    assert.equal(res.status, 400, JSON.stringify(res.json))
    for (const want of ['#0: path must be absolute', "#1: volume 'no-such-volume' not found", '#2: path /proc/x', '#3: path must not contain', "#4: path cannot be '/'", "#6: path '/ok' is already used"]) {
      assert.ok(res.json.message.includes(want), `${want} in ${res.json.message}`)
    }
    // Another key's volume is not found either.
    const other = await api('POST', '/sandboxes', {
      key: process.env.AIRLOCK_SDK_OTHER_KEY,
      body: { templateID: TEMPLATE, metadata: meta(), volumeMounts: [{ name: vol.name, path: '/data' }] },
    })
    assert.equal(other.status, 400, JSON.stringify(other.json))
    assert.match(other.json.message, /not found/)
  })
})
