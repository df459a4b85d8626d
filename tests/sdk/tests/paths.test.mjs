// Path handling: `..` traversal and symlinks resolve inside the sandbox's own
// root and never reach the host's filesystem. The suite runs on the same
// machine as `airlock serve`, so a marker file written on the HOST must be
// invisible from the sandbox, and files written from the sandbox must not
// appear on the host.

import assert from 'node:assert/strict'
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { CommandExitError, FileNotFoundError, NotFoundError } from 'e2b'
import { createSandbox, rejectsWith, trackCleanup, uniq } from './helpers.mjs'

trackCleanup()

let sbx
let hostDir
let hostMarker
const markerContent = `host-only-${uniq('m')}`
const up = '../../../../../../../..' // far more `..` than /home/user is deep

describe('paths stay inside the sandbox', { concurrency: true }, () => {
  before(async () => {
    hostDir = mkdtempSync(join(tmpdir(), 'airlock-sdk-host-'))
    hostMarker = join(hostDir, 'marker.txt')
    writeFileSync(hostMarker, markerContent)
    sbx = await createSandbox({ metadata: { file: 'paths' } })
    await sbx.commands.run('ln -s / /home/user/rootlink')
  })

  after(() => {
    if (hostDir) rmSync(hostDir, { recursive: true, force: true })
  })

  test('an absolute host path is not visible from the sandbox', async () => {
    await rejectsWith(sbx.files.read(hostMarker), FileNotFoundError, `read(${hostMarker})`)
    await rejectsWith(sbx.files.read(hostMarker, { user: 'root' }), FileNotFoundError, `read(${hostMarker}) as root`)
    assert.equal(await sbx.files.exists(hostMarker), false)
    await rejectsWith(sbx.commands.run(`cat ${hostMarker}`, { user: 'root' }), CommandExitError, 'cat host marker')
    const dl = await fetch(await sbx.downloadUrl(hostMarker))
    const t = await dl.text()
    assert.equal(dl.status, 404, `signed download of a host path: ${dl.status} ${t}`)
    assert.ok(!t.includes(markerContent))
  })

  test('relative ../../.. paths are clamped to the sandbox root', async () => {
    // `../../../../etc/os-release` from /home/user is the sandbox's own /etc/os-release
    const viaDots = await sbx.files.read(`${up}/etc/os-release`)
    const inside = await sbx.commands.run('cat /etc/os-release')
    assert.equal(viaDots, inside.stdout)
    assert.match(viaDots, /bookworm/)

    const marker = uniq('inside')
    await sbx.files.write(`/tmp/${marker}`, 'inside')
    assert.equal(await sbx.files.read(`${up}/tmp/${marker}`), 'inside')

    await rejectsWith(sbx.files.read(`${up}${hostMarker}`), FileNotFoundError, 'read(../..host marker)')
    await rejectsWith(sbx.files.list(`${up}${hostDir}`), NotFoundError, 'list(../..host dir)')
  })

  test('a symlink to / inside the sandbox resolves to the sandbox root', async () => {
    const info = await sbx.files.getInfo('/home/user/rootlink')
    assert.equal(info.symlinkTarget, '/')

    const listed = await sbx.files.list('/home/user/rootlink')
    const names = listed.map((e) => e.name)
    for (const n of ['etc', 'home', 'tmp', 'usr']) assert.ok(names.includes(n), `${n} in listing of rootlink: ${names}`)
    assert.ok(listed.every((e) => e.path.startsWith('/home/user/rootlink/')), 'paths rebuilt from the requested path')

    const osr = await sbx.files.read('/home/user/rootlink/etc/os-release')
    assert.equal(osr, (await sbx.commands.run('cat /etc/os-release')).stdout)

    await rejectsWith(sbx.files.read(`/home/user/rootlink${hostMarker}`), FileNotFoundError, 'read(rootlink + host marker)')
    await rejectsWith(sbx.files.read(`rootlink/${up}${hostMarker}`), FileNotFoundError, 'read(rootlink/../.. + host marker)')
    await rejectsWith(sbx.files.list(`/home/user/rootlink${hostDir}`), NotFoundError, 'list(rootlink + host dir)')
  })

  test('a symlink pointing at the host path is dangling inside the sandbox', async () => {
    await sbx.commands.run(`ln -s ${hostMarker} /home/user/hostlink; ln -s ${hostDir} /home/user/hostdirlink`)
    await rejectsWith(sbx.files.read('/home/user/hostlink'), FileNotFoundError, 'read(symlink → host marker)')
    await rejectsWith(sbx.files.read('/home/user/hostdirlink/marker.txt', { user: 'root' }), FileNotFoundError, 'read(dir symlink → host dir)')
    const dl = await fetch(await sbx.downloadUrl('/home/user/hostlink'))
    assert.equal(dl.status, 404, `signed download through the symlink: ${dl.status}`)
    assert.ok(!(await dl.text()).includes(markerContent))
  })

  test('/proc/1/root and /proc/self/root do not lead to the host', async () => {
    for (const p of [`/proc/1/root${hostMarker}`, `/proc/self/root${hostMarker}`]) {
      await rejectsWith(sbx.files.read(p, { user: 'root' }), NotFoundError, `read(${p}) as root`)
    }
  })

  test('writes through symlinks and `..` land inside the sandbox, not on the host', async (t) => {
    // a host dir of its own: the other tests assert that hostDir is absent in the sandbox
    const hostDir = mkdtempSync(join(tmpdir(), 'airlock-sdk-host-w-'))
    t.after(() => rmSync(hostDir, { recursive: true, force: true }))
    const hostMarker = join(hostDir, 'marker.txt')
    writeFileSync(hostMarker, markerContent)
    const name = `airlock-escape-${uniq('w')}.txt`
    const hostTarget = join(tmpdir(), name)
    // through the symlink to /
    await sbx.files.write(`/home/user/rootlink/tmp/${name}`, 'via-link')
    assert.equal((await sbx.commands.run(`cat /tmp/${name}`)).stdout, 'via-link')
    assert.equal(existsSync(hostTarget), false, `${hostTarget} must not exist on the host`)

    // through `..`, as root, into the host temp dir's path
    const viaDots = `${up}${hostDir}/written-from-sandbox.txt`
    const w = await sbx.files.write(viaDots, 'via-dots', { user: 'root' })
    assert.equal(w.path, `${hostDir}/written-from-sandbox.txt`)
    assert.equal(existsSync(join(hostDir, 'written-from-sandbox.txt')), false, 'host dir untouched')
    assert.equal(await sbx.files.read(`${hostDir}/written-from-sandbox.txt`), 'via-dots')

    // through a symlink that points at the host dir (dangling in the sandbox → created inside)
    await sbx.commands.run(`ln -sfn ${hostDir} /home/user/hostdirlink2`)
    await sbx.files.write('/home/user/hostdirlink2/through-link.txt', 'x', { user: 'root' }).catch(() => {})
    assert.equal(existsSync(join(hostDir, 'through-link.txt')), false, 'host dir untouched via dir symlink')

    // signed upload with `..`
    const ul = await sbx.uploadUrl(`${up}${hostDir}/uploaded.txt`)
    const form = new FormData()
    form.append('file', new Blob(['up']), 'uploaded.txt')
    await (await fetch(ul, { method: 'POST', body: form })).text()
    assert.equal(existsSync(join(hostDir, 'uploaded.txt')), false, 'host dir untouched via signed upload')

    // and the host marker was never overwritten
    const { readFileSync } = await import('node:fs')
    assert.equal(readFileSync(hostMarker, 'utf8'), markerContent)
  })
})
