// Volumes (issue 17): the official SDK's Volume class against Airlock, with
// no sandbox at all: managing volumes through the control plane (POST/GET
// /volumes, GET/DELETE /volumes/{id}) and their files through the content
// API the SDK reaches at E2B_VOLUME_API_URL with the volume's token. Mounting
// volumes into sandboxes is tested with the sandboxes.

import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { existsSync, symlinkSync } from 'node:fs'
import path from 'node:path'
import { after, describe, test } from 'node:test'
import {
  AuthenticationError,
  Volume,
  VolumeError,
  VolumeFileType,
  VolumeNotFoundError,
  VolumePathNotFoundError,
} from 'e2b'
import { api, assertErrorBody, rejectsWith, uniq } from './helpers.mjs'

const OTHER_KEY = process.env.AIRLOCK_SDK_OTHER_KEY
const DATA_DIR = process.env.AIRLOCK_DATA_DIR
assert.ok(process.env.E2B_VOLUME_API_URL, 'run.sh must export E2B_VOLUME_API_URL')

const made = new Set()
after(async () => {
  await Promise.allSettled([...made].map((id) => Volume.destroy(id).catch(() => false)))
})

async function newVolume(prefix = 'vol') {
  const vol = await Volume.create(uniq(prefix))
  made.add(vol.volumeId)
  return vol
}

describe('managing volumes', () => {
  test('create, list, getInfo, connect, destroy', async () => {
    const name = uniq('data')
    const vol = await Volume.create(name)
    made.add(vol.volumeId)
    assert.equal(vol.name, name)
    assert.match(vol.volumeId, /^[0-9a-f-]{36}$/)
    assert.ok(vol.token && vol.token.length >= 32, `token ${vol.token}`)

    const listed = await Volume.list()
    assert.ok(listed.some((v) => v.volumeId === vol.volumeId && v.name === name), JSON.stringify(listed))

    const info = await Volume.getInfo(vol.volumeId)
    assert.deepEqual({ id: info.volumeId, name: info.name, token: info.token }, { id: vol.volumeId, name, token: vol.token })

    const again = await Volume.connect(vol.volumeId)
    assert.equal(again.token, vol.token)
    await again.writeFile('/hello.txt', 'hi')
    assert.equal(await vol.readFile('/hello.txt'), 'hi')

    assert.equal(await Volume.destroy(vol.volumeId), true)
    made.delete(vol.volumeId)
    assert.equal(await Volume.destroy(vol.volumeId), false, 'a second destroy finds nothing')
    await rejectsWith(Volume.getInfo(vol.volumeId), VolumeNotFoundError, 'getInfo of a destroyed volume')
    await rejectsWith(vol.readFile('/hello.txt'), VolumeError, 'the token of a destroyed volume')
    assert.ok(!(await Volume.list()).some((v) => v.volumeId === vol.volumeId))
  })

  test('names: unique per key, validated as E2B does', async () => {
    const vol = await newVolume('uniq')
    const err = await rejectsWith(Volume.create(vol.name), VolumeError, 'a taken name')
    assert.match(err.message, /^400: Volume with name '.*' already exists/)
    for (const bad of ['has space', 'dot.name', 'slash/name', '../up', 'ünï', 'a'.repeat(129)]) {
      const e = await rejectsWith(Volume.create(bad), VolumeError, `name ${JSON.stringify(bad)}`)
      assert.match(e.message, /^400: Invalid volume name/)
    }
    const res = await api('POST', '/volumes', { body: {} })
    assert.equal(res.status, 400)
    assertErrorBody(res, 'create without a name')
  })

  test('another API key sees none of them and may reuse the names', async () => {
    const mine = await newVolume('mine')
    const opts = { apiKey: OTHER_KEY }
    assert.ok(!(await Volume.list(opts)).some((v) => v.volumeId === mine.volumeId))
    await rejectsWith(Volume.getInfo(mine.volumeId, opts), VolumeNotFoundError, "another key's getInfo")
    await rejectsWith(Volume.connect(mine.volumeId, opts), VolumeNotFoundError, "another key's connect")
    assert.equal(await Volume.destroy(mine.volumeId, opts), false, "another key's destroy")
    assert.ok(await Volume.getInfo(mine.volumeId), 'still there for its owner')

    const theirs = await Volume.create(mine.name, opts)
    try {
      assert.notEqual(theirs.volumeId, mine.volumeId)
      assert.notEqual(theirs.token, mine.token)
    } finally {
      await Volume.destroy(theirs.volumeId, opts)
    }
  })
})

describe('volume content without a sandbox', () => {
  test('every verb: write, read, list with depth, makeDir, getInfo, exists, updateMetadata, remove', async () => {
    const vol = await newVolume('content')

    // Writes of each kind of data, and what stat says of them.
    let st = await vol.writeFile('/notes.txt', 'Hello, volume')
    assert.equal(st.name, 'notes.txt')
    assert.equal(st.path, '/notes.txt')
    assert.equal(st.type, VolumeFileType.FILE)
    assert.equal(st.size, 13)
    assert.equal(st.uid, 1000, 'owned by the templates\' default user')
    assert.ok(st.mtime instanceof Date && !Number.isNaN(st.mtime.getTime()))
    assert.equal(await vol.readFile('/notes.txt'), 'Hello, volume')
    const bin = new Uint8Array([0, 1, 2, 254, 255])
    await vol.writeFile('/bin.dat', bin.buffer)
    assert.deepEqual(await vol.readFile('/bin.dat', { format: 'bytes' }), bin)
    await vol.writeFile('/blob.txt', new Blob(['from a blob']))
    assert.equal(await (await vol.readFile('/blob.txt', { format: 'blob' })).text(), 'from a blob')
    await vol.writeFile('/empty', '')
    assert.equal(await vol.readFile('/empty'), '')

    // A streamed write of several MiB (chunked upload), read back streamed.
    const chunk = randomBytes(1 << 20)
    const chunks = 5
    let sent = 0
    const stream = new ReadableStream({
      pull(c) {
        if (sent === chunks) return c.close()
        sent++
        c.enqueue(new Uint8Array(chunk))
      },
    })
    st = await vol.writeFile('/big/stream.bin', stream, { force: true })
    assert.equal(st.size, chunks << 20)
    let got = 0
    let same = true
    for await (const part of await vol.readFile('/big/stream.bin', { format: 'stream' })) {
      for (let i = 0; i < part.length; i++) {
        if (part[i] !== chunk[(got + i) % chunk.length]) same = false
      }
      got += part.length
    }
    assert.equal(got, chunks << 20)
    assert.ok(same, 'streamed content read back differs')

    // Overwrite only with force; metadata at write.
    await rejectsWith(vol.writeFile('/notes.txt', 'again', { force: false }), VolumeError, 'overwrite without force')
    st = await vol.writeFile('/notes.txt', 'again', { force: true, mode: 0o600, uid: 1234, gid: 4321 })
    assert.deepEqual([st.size, st.mode, st.uid, st.gid], [5, 0o600, 1234, 4321])
    await rejectsWith(vol.writeFile('/missing/parent.txt', 'x'), VolumePathNotFoundError, 'write under a missing dir without force')

    // Directories, listing with depth.
    st = await vol.makeDir('/a')
    assert.equal(st.type, VolumeFileType.DIRECTORY)
    await rejectsWith(vol.makeDir('/a'), VolumeError, 'makeDir of an existing dir')
    await vol.makeDir('/a', { force: true })
    await rejectsWith(vol.makeDir('/x/y/z'), VolumePathNotFoundError, 'makeDir without parents')
    st = await vol.makeDir('/a/b/c', { force: true, mode: 0o700 })
    assert.equal(st.mode, 0o700)
    await vol.writeFile('/a/b/c/deep.txt', 'deep')
    const top = await vol.list('/')
    assert.deepEqual(top.map((e) => e.name).sort(), ['a', 'big', 'bin.dat', 'blob.txt', 'empty', 'notes.txt'])
    assert.deepEqual((await vol.list('/a')).map((e) => e.path), ['/a/b'])
    assert.deepEqual((await vol.list('/a', { depth: 3 })).map((e) => e.path), ['/a/b', '/a/b/c', '/a/b/c/deep.txt'])
    await rejectsWith(vol.list('/nope'), VolumePathNotFoundError, 'list of a missing dir')

    // getInfo, exists, updateMetadata.
    st = await vol.getInfo('/a/b/c/deep.txt')
    assert.deepEqual([st.type, st.size, st.path], [VolumeFileType.FILE, 4, '/a/b/c/deep.txt'])
    assert.equal(await vol.exists('/a/b'), true)
    assert.equal(await vol.exists('/a/nothing'), false)
    st = await vol.updateMetadata('/a/b/c/deep.txt', { mode: 0o640, uid: 0 })
    assert.deepEqual([st.mode, st.uid], [0o640, 0])
    await rejectsWith(vol.updateMetadata('/nothing', { mode: 0o600 }), VolumePathNotFoundError, 'updateMetadata of a missing path')

    // Remove a file, a tree; never the root.
    await vol.remove('/notes.txt')
    assert.equal(await vol.exists('/notes.txt'), false)
    await vol.remove('/a')
    assert.equal(await vol.exists('/a/b/c/deep.txt'), false)
    await rejectsWith(vol.remove('/a'), VolumePathNotFoundError, 'remove of a removed path')
    await rejectsWith(vol.remove('/'), VolumeError, 'remove of the root')
  })

  test('paths never leave the volume: "..", absolute paths, symlinks out', async () => {
    const vol = await newVolume('esc')
    const neighbour = await newVolume('neighbour')
    await neighbour.writeFile('/secret', 'SECRET')
    await vol.writeFile('/inside.txt', 'in')

    // Absolute paths are the volume's own; ".." above its root is refused.
    assert.equal(await vol.readFile('inside.txt'), 'in')
    assert.equal(await vol.readFile('/x/../inside.txt'), 'in', '".." inside the volume is fine')
    for (const p of ['../' + neighbour.volumeId + '/secret', '/../../../etc/passwd', 'a/../../x', '..']) {
      const e = await rejectsWith(vol.readFile(p), VolumeError, `read ${p}`)
      assert.match(e.message, /^400: .*escapes the volume/, p)
      await rejectsWith(vol.writeFile(p, 'x', { force: true }), VolumeError, `write ${p}`)
      await rejectsWith(vol.remove(p), VolumeError, `remove ${p}`)
    }
    assert.equal(await vol.exists('/etc/passwd'), false, 'an absolute path names a place in the volume')

    // Symlinks a sandbox could leave in the volume (planted here on the host).
    const dir = path.join(DATA_DIR, 'sandboxes', '.volumes', vol.volumeId)
    assert.ok(existsSync(dir), `volume directory ${dir}`)
    symlinkSync('/etc', path.join(dir, 'abs'))
    symlinkSync(`../${neighbour.volumeId}`, path.join(dir, 'rel'))
    symlinkSync('inside.txt', path.join(dir, 'ok'))
    assert.equal(await vol.readFile('/ok'), 'in', 'a symlink inside the volume is followed')
    for (const p of ['/abs/passwd', '/rel/secret', '/abs/shadow']) {
      const e = await rejectsWith(vol.readFile(p), VolumeError, `read through ${p}`)
      assert.match(e.message, /^400: .*outside the volume/, p)
      assert.doesNotMatch(e.message, /SECRET|root:/)
    }
    await rejectsWith(vol.writeFile('/rel/secret', 'overwritten', { force: true }), VolumeError, 'write through a symlink out')
    await rejectsWith(vol.updateMetadata('/rel/secret', { mode: 0o777 }), VolumeError, 'chmod through a symlink out')
    await rejectsWith(vol.list('/abs'), VolumeError, 'list through a symlink out')
    await rejectsWith(vol.makeDir('/rel/new', { force: true }), VolumeError, 'makeDir through a symlink out')
    const listing = await vol.list('/', { depth: 5 })
    assert.ok(!listing.some((e) => e.path.startsWith('/abs/') || e.path.startsWith('/rel/')), 'symlinked dirs are not entered')
    assert.equal(listing.find((e) => e.name === 'abs').type, VolumeFileType.SYMLINK)
    await vol.remove('/rel') // the link, not the neighbour
    assert.equal(await neighbour.readFile('/secret'), 'SECRET')
  })

  test("a volume's token opens no other volume; no token opens none", async () => {
    const a = await newVolume('tok-a')
    const b = await newVolume('tok-b')
    await b.writeFile('/b.txt', 'b')
    const forged = new Volume(b.volumeId, b.name, a.token)
    const e = await rejectsWith(forged.readFile('/b.txt'), VolumeError, "a's token on b")
    assert.match(e.message, /^403: /)
    await rejectsWith(forged.writeFile('/new', 'x'), VolumeError, "a's token writing to b")
    await rejectsWith(forged.list('/'), VolumeError, "a's token listing b")
    await rejectsWith(new Volume(b.volumeId, b.name, 'vol_' + 'f'.repeat(64)).getInfo('/b.txt'), VolumeError, 'a made-up token')
    await rejectsWith(new Volume(b.volumeId, b.name, undefined).getInfo('/b.txt'), AuthenticationError, 'no token')
    await rejectsWith(new Volume('no-such-volume', 'x', a.token).list('/'), VolumeError, 'an unknown volume')
    // The error bodies are the content spec's: code is a string.
    const res = await fetch(`${process.env.E2B_VOLUME_API_URL}/volumecontent/${b.volumeId}/file?path=/b.txt`, {
      headers: { Authorization: `Bearer ${a.token}` },
    })
    assert.equal(res.status, 403)
    const body = await res.json()
    assert.equal(body.code, '403')
    assert.equal(typeof body.message, 'string')
    assert.equal(await b.readFile('/b.txt'), 'b')
  })

  test('a full volume: 507 through the content API, room again after a remove', async () => {
    // sizeMB is Airlock's extension of POST /volumes (the SDK sends only a name).
    const res = await api('POST', '/volumes', { body: { name: uniq('small'), sizeMB: 8 } })
    assert.equal(res.status, 201, res.text)
    made.add(res.json.volumeID)
    assert.equal(res.json.sizeMB, 8)
    const vol = await Volume.connect(res.json.volumeID)
    const e = await rejectsWith(vol.writeFile('/too-big', randomBytes(16 << 20)), VolumeError, 'a 16 MiB write into an 8 MiB volume')
    assert.match(e.message, /^507: .*is full: its quota is 8 MiB/)
    assert.equal(await vol.exists('/too-big'), false, 'a failed upload leaves nothing')
    await vol.writeFile('/fits', randomBytes(4 << 20))
    const e2 = await rejectsWith(vol.writeFile('/more', randomBytes(6 << 20)), VolumeError, 'past the quota with files in it')
    assert.match(e2.message, /^507: /)
    await vol.remove('/fits')
    await vol.writeFile('/more', randomBytes(6 << 20))

    const tooBig = await api('POST', '/volumes', { body: { name: uniq('huge'), sizeMB: 1 << 30 } })
    assert.equal(tooBig.status, 400)
    assertErrorBody(tooBig, 'a size above the maximum')
  })
})
