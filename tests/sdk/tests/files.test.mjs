// files.* through the official SDK (/files HTTP + filesystem.Filesystem RPCs),
// plus the signed download/upload URLs fetched without any headers.

import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'
import { FileNotFoundError, FilesystemEventType, NotFoundError } from 'e2b'
import { SANDBOX_URL, createSandbox, rejectsWith, trackCleanup, uniq, waitFor } from './helpers.mjs'

trackCleanup()

let sbx
const HOME = '/home/user'

describe('files', { concurrency: true }, () => {
  before(async () => {
    sbx = await createSandbox({ metadata: { file: 'files' } })
  })

  test('write/read text (absolute and home-relative paths)', async () => {
    const p = `${HOME}/${uniq('text')}.txt`
    const content = 'hello airlock\nsecond line ä日本\n'
    const info = await sbx.files.write(p, content)
    assert.equal(info.path, p)
    assert.equal(info.name, p.split('/').pop())
    assert.equal(info.type, 'file')
    assert.equal(await sbx.files.read(p), content)
    // the command side sees the same file, owned by user
    const r = await sbx.commands.run(`cat ${p}; stat -c '%U:%G %a' ${p}`)
    assert.equal(r.stdout, `${content}user:user 644\n`)

    const rel = `${uniq('rel')}.txt`
    const relInfo = await sbx.files.write(rel, 'relative')
    assert.equal(relInfo.path, `${HOME}/${rel}`, 'relative path resolves against /home/user')
    assert.equal(await sbx.files.read(`${HOME}/${rel}`), 'relative')
    assert.equal(await sbx.files.read(rel), 'relative')

    // overwrite truncates
    await sbx.files.write(p, 'short')
    assert.equal(await sbx.files.read(p), 'short')

    // parents are created
    const deep = `/tmp/${uniq('deep')}/a/b/c.txt`
    await sbx.files.write(deep, 'deep')
    assert.equal(await sbx.files.read(deep), 'deep')

    // empty file
    const empty = `/tmp/${uniq('empty')}`
    await sbx.files.write(empty, '')
    assert.equal(await sbx.files.read(empty), '')
  })

  test('write/read binary: all 256 byte values round-trip (format bytes, blob)', async () => {
    const bytes = new Uint8Array(256 * 4)
    for (let i = 0; i < bytes.length; i++) bytes[i] = i % 256
    const p = `/tmp/${uniq('bin')}.bin`
    await sbx.files.write(p, bytes)
    const back = await sbx.files.read(p, { format: 'bytes' })
    assert.ok(back instanceof Uint8Array)
    assert.equal(back.length, bytes.length)
    assert.deepEqual(Buffer.from(back), Buffer.from(bytes))
    const blob = await sbx.files.read(p, { format: 'blob' })
    assert.deepEqual(Buffer.from(await blob.arrayBuffer()), Buffer.from(bytes))
    const sum = await sbx.commands.run(`sha256sum ${p} | cut -d' ' -f1`)
    const { createHash } = await import('node:crypto')
    assert.equal(sum.stdout.trim(), createHash('sha256').update(bytes).digest('hex'))
    // ArrayBuffer input too
    const p2 = `/tmp/${uniq('bin2')}.bin`
    await sbx.files.write(p2, bytes.buffer)
    assert.deepEqual(Buffer.from(await sbx.files.read(p2, { format: 'bytes' })), Buffer.from(bytes))
  })

  test('write several files at once (array form) and read each', async () => {
    const d = uniq('multi')
    const files = [
      { path: `/tmp/${d}/one.txt`, data: 'one' },
      { path: `${HOME}/${d}/two.txt`, data: 'two' },
      { path: `${d}/nested/three.txt`, data: 'three' }, // relative → home
      { path: `/tmp/${d}/four.bin`, data: new Uint8Array([0, 1, 2, 255]) },
    ]
    const infos = await sbx.files.write(files)
    assert.ok(Array.isArray(infos))
    assert.equal(infos.length, files.length)
    const expectPaths = [
      `/tmp/${d}/one.txt`, `${HOME}/${d}/two.txt`, `${HOME}/${d}/nested/three.txt`, `/tmp/${d}/four.bin`,
    ]
    assert.deepEqual(infos.map((i) => i.path).sort(), [...expectPaths].sort())
    for (const i of infos) assert.equal(i.type, 'file')
    assert.equal(await sbx.files.read(expectPaths[0]), 'one')
    assert.equal(await sbx.files.read(expectPaths[1]), 'two')
    assert.equal(await sbx.files.read(expectPaths[2]), 'three')
    assert.deepEqual([...(await sbx.files.read(expectPaths[3], { format: 'bytes' }))], [0, 1, 2, 255])
  })

  test('write via octet-stream, gzip and a ReadableStream; metadata; read as stream and gzip', async () => {
    const d = `/tmp/${uniq('oct')}`
    const payload = 'octet payload '.repeat(1000)
    const w1 = await sbx.files.write(`${d}/octet.txt`, payload, { useOctetStream: true, metadata: { Owner: 'sdk-suite', purpose: 'test' } })
    assert.equal(w1.path, `${d}/octet.txt`)
    assert.deepEqual(w1.metadata, { owner: 'sdk-suite', purpose: 'test' }, 'metadata keys lower-cased in the upload result')
    assert.equal(await sbx.files.read(`${d}/octet.txt`), payload)
    const info = await sbx.files.getInfo(`${d}/octet.txt`)
    assert.deepEqual(info.metadata, { owner: 'sdk-suite', purpose: 'test' }, 'getInfo returns the metadata')

    await sbx.files.write(`${d}/gz.txt`, payload, { gzip: true })
    assert.equal(await sbx.files.read(`${d}/gz.txt`), payload, 'gzip upload is stored decompressed')
    assert.equal(await sbx.files.read(`${d}/gz.txt`, { gzip: true }), payload, 'gzip download decodes')

    const stream = new ReadableStream({
      start(c) {
        c.enqueue(new TextEncoder().encode('chunk-1;'))
        c.enqueue(new TextEncoder().encode('chunk-2'))
        c.close()
      },
    })
    await sbx.files.write(`${d}/stream.txt`, stream)
    assert.equal(await sbx.files.read(`${d}/stream.txt`), 'chunk-1;chunk-2')

    const rs = await sbx.files.read(`${d}/octet.txt`, { format: 'stream' })
    let got = ''
    const dec = new TextDecoder()
    for await (const chunk of rs) got += dec.decode(chunk, { stream: true })
    assert.equal(got, payload)
  })

  test('list with depth 1 and depth 2: entries, order, name/path/type', async () => {
    const dir = `${HOME}/${uniq('lst')}`
    await sbx.files.write([
      { path: `${dir}/b.txt`, data: 'b' },
      { path: `${dir}/a/y/deep.txt`, data: 'deep' },
      { path: `${dir}/a/x.txt`, data: 'x' },
    ])
    await sbx.files.makeDir(`${dir}/c`)

    const l1 = await sbx.files.list(dir)
    assert.deepEqual(
      l1.map((e) => [e.name, e.path, e.type]),
      [
        ['a', `${dir}/a`, 'dir'],
        ['b.txt', `${dir}/b.txt`, 'file'],
        ['c', `${dir}/c`, 'dir'],
      ],
    )
    const b = l1.find((e) => e.name === 'b.txt')
    assert.equal(b.size, 1)
    assert.equal(b.owner, 'user')

    const l2 = await sbx.files.list(dir, { depth: 2 })
    assert.deepEqual(
      l2.map((e) => [e.name, e.path, e.type]),
      [
        ['a', `${dir}/a`, 'dir'],
        ['x.txt', `${dir}/a/x.txt`, 'file'],
        ['y', `${dir}/a/y`, 'dir'],
        ['b.txt', `${dir}/b.txt`, 'file'],
        ['c', `${dir}/c`, 'dir'],
      ],
    )
    const l3 = await sbx.files.list(dir, { depth: 3 })
    assert.ok(l3.some((e) => e.path === `${dir}/a/y/deep.txt`), 'depth 3 reaches a/y/deep.txt')

    await rejectsWith(sbx.files.list(`${dir}/missing`), NotFoundError, 'list(missing dir)')
  })

  test('exists: true for files and dirs, false for missing', async () => {
    const p = `/tmp/${uniq('exists')}`
    await sbx.files.write(p, 'x')
    assert.equal(await sbx.files.exists(p), true)
    assert.equal(await sbx.files.exists('/tmp'), true)
    assert.equal(await sbx.files.exists(HOME), true)
    assert.equal(await sbx.files.exists(`${p}-missing`), false)
    assert.equal(await sbx.files.exists('/no/such/dir/file'), false)
  })

  test('getInfo: name, type, size, mode, permissions, owner, group, modifiedTime', async () => {
    const name = `${uniq('info')}.txt`
    const p = `${HOME}/${name}`
    const t0 = Date.now()
    await sbx.files.write(p, '12345')
    const f = await sbx.files.getInfo(p)
    assert.equal(f.name, name)
    assert.equal(f.path, p)
    assert.equal(f.type, 'file')
    assert.equal(f.size, 5)
    assert.equal(f.mode, 0o644, `mode 0644 (got 0${f.mode?.toString(8)})`)
    assert.equal(f.permissions, '-rw-r--r--')
    assert.equal(f.owner, 'user')
    assert.equal(f.group, 'user')
    assert.ok(f.modifiedTime instanceof Date, 'modifiedTime is a Date')
    assert.ok(Math.abs(f.modifiedTime.getTime() - t0) < 60_000, `modifiedTime recent: ${f.modifiedTime?.toISOString()}`)

    const dname = uniq('infodir')
    await sbx.files.makeDir(`${HOME}/${dname}`)
    const d = await sbx.files.getInfo(`${HOME}/${dname}`)
    assert.equal(d.name, dname)
    assert.equal(d.type, 'dir')
    assert.equal(d.owner, 'user')
    assert.ok(d.permissions.startsWith('d'), `dir permissions start with d: ${d.permissions}`)
    assert.equal(d.mode & 0o700, 0o700, 'owner rwx on a new dir')
    // As on ext4 (E2B's own SDK tests check size > 0): an empty directory is one 4 KiB block.
    assert.equal(d.size, 4096, `empty dir size (got ${d.size})`)
    const home = await sbx.files.getInfo(HOME)
    assert.ok(home.size > 0 && home.size % 4096 === 0, `home dir size in whole 4 KiB blocks (got ${home.size})`)

    const root = await sbx.files.getInfo('/etc/passwd', { user: 'root' })
    assert.equal(root.owner, 'root')

    await rejectsWith(sbx.files.getInfo(`${p}.missing`), FileNotFoundError, 'getInfo(missing)')
  })

  test('makeDir: true when created (with parents), false when it already exists', async () => {
    const d = `${HOME}/${uniq('mk')}/p/q`
    assert.equal(await sbx.files.makeDir(d), true)
    assert.equal((await sbx.files.getInfo(d)).type, 'dir')
    assert.equal((await sbx.files.getInfo(d)).owner, 'user')
    assert.equal(await sbx.files.makeDir(d), false)
  })

  test('rename moves a file (and a dir) and returns the new entry', async () => {
    const base = `${HOME}/${uniq('mv')}`
    await sbx.files.write(`${base}/old.txt`, 'moved content')
    const e = await sbx.files.rename(`${base}/old.txt`, `${base}/new.txt`)
    assert.equal(e.path, `${base}/new.txt`)
    assert.equal(e.name, 'new.txt')
    assert.equal(e.type, 'file')
    assert.equal(await sbx.files.exists(`${base}/old.txt`), false)
    assert.equal(await sbx.files.read(`${base}/new.txt`), 'moved content')

    const e2 = await sbx.files.rename(base, `${base}-renamed`)
    assert.equal(e2.type, 'dir')
    assert.equal(await sbx.files.read(`${base}-renamed/new.txt`), 'moved content')

    await rejectsWith(sbx.files.rename(`${base}/nope`, `${base}/nope2`), NotFoundError, 'rename(missing)')
  })

  test('remove deletes files and directories recursively', async () => {
    const base = `/tmp/${uniq('rm')}`
    await sbx.files.write([{ path: `${base}/f.txt`, data: 'f' }, { path: `${base}/sub/g.txt`, data: 'g' }])
    await sbx.files.remove(`${base}/f.txt`)
    assert.equal(await sbx.files.exists(`${base}/f.txt`), false)
    await sbx.files.remove(base)
    assert.equal(await sbx.files.exists(base), false)
    await rejectsWith(sbx.files.read(`${base}/sub/g.txt`), FileNotFoundError, 'read after remove')
  })

  test('read of a missing file throws FileNotFoundError', async () => {
    await rejectsWith(sbx.files.read(`/tmp/${uniq('missing')}`), FileNotFoundError, 'read(missing)')
  })

  test('watchDir receives a create/write event for a file written after the watch starts', async () => {
    const dir = `${HOME}/${uniq('watch')}`
    await sbx.files.makeDir(dir)
    const events = []
    let ended = 'no'
    const handle = await sbx.files.watchDir(dir, (e) => { events.push(e) }, {
      timeoutMs: 30_000,
      onExit: (err) => { ended = err ? `${err.constructor.name}: ${err.message}` : 'yes, without error' },
    })
    try {
      await sbx.files.write(`${dir}/w.txt`, 'watched')
      await waitFor(
        () => events.some((e) => e.name === 'w.txt' && [FilesystemEventType.CREATE, FilesystemEventType.WRITE].includes(e.type)),
        { what: () => `create/write event for w.txt (got ${JSON.stringify(events)}; watch stream ended: ${ended})` },
      )
    } finally {
      await handle.stop()
    }
    // after stop no more events are delivered
    const n = events.length
    await sbx.files.write(`${dir}/after-stop.txt`, 'x')
    await new Promise((r) => setTimeout(r, 500))
    assert.ok(!events.slice(n).some((e) => e.name === 'after-stop.txt'), 'no events after stop()')
  })

  test('watchDir with recursive and includeEntry; missing dir → NotFound', async () => {
    const dir = `${HOME}/${uniq('watchr')}`
    await sbx.files.makeDir(`${dir}/sub`)
    const events = []
    let ended = 'no'
    const handle = await sbx.files.watchDir(dir, (e) => { events.push(e) }, {
      recursive: true,
      includeEntry: true,
      timeoutMs: 30_000,
      onExit: (err) => { ended = err ? `${err.constructor.name}: ${err.message}` : 'yes, without error' },
    })
    try {
      await sbx.files.write(`${dir}/sub/inner.txt`, 'inner')
      const ev = await waitFor(
        () => events.find((e) => e.name === 'sub/inner.txt' && e.type === FilesystemEventType.CREATE),
        { what: () => `create event for sub/inner.txt (got ${JSON.stringify(events)}; watch stream ended: ${ended})` },
      )
      if (ev.entry) {
        assert.equal(ev.entry.path, `${dir}/sub/inner.txt`)
        assert.equal(ev.entry.type, 'file')
      }
      assert.ok(events.some((e) => e.entry && e.entry.path === `${dir}/sub/inner.txt`), 'includeEntry: an event carries the entry')
    } finally {
      await handle.stop()
    }
    await rejectsWith(sbx.files.watchDir(`${dir}/missing`, () => {}), NotFoundError, 'watchDir(missing)')
  })

  test('signed downloadUrl / uploadUrl work with a bare fetch (no headers)', async () => {
    const p = `${HOME}/${uniq('signed')}.txt`
    await sbx.files.write(p, 'download me')

    const dl = await sbx.downloadUrl(p)
    assert.ok(dl.startsWith(`${SANDBOX_URL}/files?`), `download URL on the sandbox URL: ${dl}`)
    assert.ok(new URL(dl).searchParams.get('signature')?.startsWith('v1_'), 'URL carries a v1_ signature')
    const res = await fetch(dl)
    assert.equal(res.status, 200, `GET ${dl}: ${res.status} ${await res.clone().text()}`)
    assert.equal(await res.text(), 'download me')

    const up = `${HOME}/${uniq('uploaded')}.txt`
    const ul = await sbx.uploadUrl(up)
    const form = new FormData()
    form.append('file', new Blob(['uploaded via signed url']), 'ignored-name.txt')
    const ures = await fetch(ul, { method: 'POST', body: form })
    const utext = await ures.text()
    assert.equal(ures.status, 200, `POST ${ul}: ${ures.status} ${utext}`)
    const uj = JSON.parse(utext)
    assert.ok(Array.isArray(uj) && uj.length === 1, `upload response is a 1-element array: ${utext}`)
    assert.equal(uj[0].path, up)
    assert.equal(await sbx.files.read(up), 'uploaded via signed url')
    assert.equal((await sbx.files.getInfo(up)).owner, 'user')

    // with an expiration in the future
    const dle = await sbx.downloadUrl(p, { useSignatureExpiration: 120 })
    assert.ok(new URL(dle).searchParams.get('signature_expiration'))
    const rese = await fetch(dle)
    assert.equal(rese.status, 200)
    assert.equal(await rese.text(), 'download me')

    // as root
    const dlr = await sbx.downloadUrl('/etc/passwd', { user: 'root' })
    assert.equal(new URL(dlr).searchParams.get('username'), 'root')
    assert.equal((await fetch(dlr)).status, 200)
  })

  test('signed URLs: tampered, missing or expired signature → 401', async () => {
    const p = `${HOME}/${uniq('tamper')}.txt`
    await sbx.files.write(p, 'secret')

    const dl = new URL(await sbx.downloadUrl(p))
    const sig = dl.searchParams.get('signature')
    const tampered = new URL(dl)
    tampered.searchParams.set('signature', sig.slice(0, -1) + (sig.endsWith('A') ? 'B' : 'A'))
    const r1 = await fetch(tampered)
    const t1 = await r1.text()
    assert.equal(r1.status, 401, `tampered download signature: ${r1.status} ${t1}`)
    assert.ok(!t1.includes('secret'), 'no file content on 401')

    // the signature is bound to the path
    const other = new URL(dl)
    other.searchParams.set('path', '/etc/passwd')
    assert.equal((await fetch(other)).status, 401, 'signature for another path')

    // a read signature does not authorize a write
    const asWrite = await fetch(dl, { method: 'POST', body: (() => { const f = new FormData(); f.append('file', new Blob(['pwned']), 'x'); return f })() })
    assert.equal(asWrite.status, 401, `read signature used for upload: ${asWrite.status} ${await asWrite.text()}`)
    assert.equal(await sbx.files.read(p), 'secret')

    const ul = new URL(await sbx.uploadUrl(p))
    const usig = ul.searchParams.get('signature')
    ul.searchParams.set('signature', usig.slice(0, -2) + 'zz')
    const form = new FormData()
    form.append('file', new Blob(['overwritten']), 'x.txt')
    const r2 = await fetch(ul, { method: 'POST', body: form })
    assert.equal(r2.status, 401, `tampered upload signature: ${r2.status} ${await r2.text()}`)
    assert.equal(await sbx.files.read(p), 'secret', 'file unchanged after rejected upload')

    // a header-routed request without signature or token → 401 (sandbox has a token)
    const unsigned = await fetch(`${SANDBOX_URL}/files?path=${encodeURIComponent(p)}`, {
      headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983' },
    })
    const ut = await unsigned.text()
    assert.equal(unsigned.status, 401, `unsigned /files: ${unsigned.status} ${ut}`)
    assert.match(ut, /missing signature/, 'message says the signature is missing')

    const expired = await sbx.downloadUrl(p, { useSignatureExpiration: -60 })
    const r3 = await fetch(expired)
    const t3 = await r3.text()
    assert.equal(r3.status, 401, `expired signature: ${r3.status} ${t3}`)
    assert.deepEqual(JSON.parse(t3), { code: 401, message: 'signature is already expired' })
  })
})
