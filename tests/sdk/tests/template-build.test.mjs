// Template builds through the E2B API, driven by the unmodified SDK:
// Template.build with streamed logs, buildInBackground + getBuildStatus,
// COPY of a file and a directory, ENV/WORKDIR/USER/RUN effects seen by a
// sandbox of the new template, start/ready commands, a failing RUN's
// error, a cached rebuild, fromBaseImage(), skipCache(), Template.exists;
// and the 400s for bad input.
// Every template built here is deleted at the end.

import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { createHash } from 'node:crypto'
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { BuildError, Sandbox, Template, waitForFile } from 'e2b'
import { api, assertErrorBody, meta, rejectsWith, track, trackCleanup, trackTemplates, uniq, waitFor } from './helpers.mjs'

trackCleanup()

const built = trackTemplates()

const ctxDir = mkdtempSync(join(tmpdir(), 'airlock-tplbuild-'))
after(() => rmSync(ctxDir, { recursive: true, force: true }))
writeFileSync(join(ctxDir, 'hello.txt'), 'hello from the client\n')
mkdirSync(join(ctxDir, 'dir', 'sub'), { recursive: true })
writeFileSync(join(ctxDir, 'dir', 'a.txt'), 'a\n')
writeFileSync(join(ctxDir, 'dir', 'sub', 'b.sh'), '#!/bin/sh\necho b\n', { mode: 0o755 })

const name = uniq('tplb')
built.add(name)

function definition() {
  return Template({ fileContextPath: ctxDir })
    .fromTemplate('base')
    .copy('hello.txt', '/opt/app/hello.txt')
    .copy('dir', '/opt/app/dir')
    .setEnvs({ GREETING: 'hi there', LIB: '/opt/lib' })
    .setWorkdir('/opt/app')
    .runCmd('echo build-output-marker && id -un > /ran-as-root', { user: 'root' })
    .setUser('user')
    .runCmd('id -un > /home/user/ran-as && echo "$GREETING" > /home/user/greeting')
    .setStartCmd('echo started > /tmp/started && sleep infinity', waitForFile('/tmp/started'))
}

async function run(sbx, cmd) {
  const r = await sbx.commands.run(cmd)
  return r.stdout.trim()
}

describe('Template.build', { concurrency: false }, () => {
  test('build with logs; a sandbox sees every step; exists', async () => {
    const logs = []
    const t0 = Date.now()
    const info = await Template.build(definition(), name, { onBuildLogs: (e) => logs.push(e), cpuCount: 1, memoryMB: 512 })
    console.log(`first build: ${Date.now() - t0} ms, ${logs.length} log entries`)
    assert.equal(info.templateId, name)
    const text = logs.map((e) => e.message).join('\n')
    assert.ok(logs.some((e) => e.message === 'build-output-marker'), `RUN output streamed: ${text.slice(-2000)}`)
    assert.ok(await Template.exists(name))

    const sbx = await Sandbox.create(name, { metadata: meta({ file: 'template-build' }) })
    track(sbx.sandboxId)
    assert.equal(await run(sbx, 'cat /opt/app/hello.txt'), 'hello from the client')
    assert.equal(await run(sbx, 'cat /opt/app/dir/a.txt && /opt/app/dir/sub/b.sh'), 'a\nb')
    assert.equal(await run(sbx, 'echo "$GREETING|$LIB"'), 'hi there|/opt/lib')
    assert.equal(await run(sbx, 'pwd'), '/opt/app')
    assert.equal(await run(sbx, 'whoami'), 'user')
    assert.equal(await run(sbx, 'cat /ran-as-root'), 'root')
    assert.equal(await run(sbx, 'cat /home/user/ran-as /home/user/greeting'), 'user\nhi there')
    assert.equal(await run(sbx, 'stat -c %U /opt/app/hello.txt'), 'user', 'COPY owned by the user in effect (base: user)')
    assert.equal(await run(sbx, 'cat /tmp/started'), 'started')
    await sbx.kill()
  })

  test('an unchanged rebuild comes from the cache', async () => {
    const logs = []
    const t0 = Date.now()
    await Template.build(definition(), name, { onBuildLogs: (e) => logs.push(e) })
    const ms = Date.now() - t0
    console.log(`rebuild: ${ms} ms`)
    const text = logs.map((e) => e.message).join('\n')
    assert.match(text, /cached/, text.slice(-2000))
    assert.ok(!logs.some((e) => e.message === 'build-output-marker'), `no RUN ran again: ${text.slice(-2000)}`)
  })

  test('buildInBackground + getBuildStatus', async () => {
    const bg = uniq('tplb-bg')
    built.add(bg)
    const data = await Template.buildInBackground(Template().fromTemplate('base').runCmd('echo background > /tmp/bg'), bg)
    const seen = new Set()
    let offset = 0
    let entries = 0
    const final = await waitFor(async () => {
      const st = await Template.getBuildStatus(data, { logsOffset: offset })
      seen.add(st.status)
      offset += st.logEntries.length
      entries += st.logEntries.length
      return ['ready', 'error'].includes(st.status) && st
    }, { timeoutMs: 300_000, intervalMs: 300, what: 'the background build' })
    assert.equal(final.status, 'ready', JSON.stringify(final.reason))
    assert.ok(entries > 0, 'log entries were returned')
    for (const s of seen) assert.ok(['waiting', 'building', 'ready'].includes(s), s)
    assert.ok(await Template.exists(bg))
  })

  test('fromBaseImage() is the built-in base template (no pull)', async () => {
    const fb = uniq('tplb-fbi')
    built.add(fb)
    const logs = []
    await Template.build(Template().fromBaseImage().runCmd('echo base-image-marker; id -un > /tmp/who'), fb, { onBuildLogs: (e) => logs.push(e) })
    const text = logs.map((e) => e.message).join('\n')
    assert.ok(logs.some((e) => e.message === 'base-image-marker'), text.slice(-2000))
    assert.match(text, /FROM base: template base/, text.slice(-2000))
    const sbx = await Sandbox.create(fb, { metadata: meta({ file: 'template-build' }) })
    track(sbx.sandboxId)
    assert.equal(await run(sbx, 'cat /tmp/who'), 'user', 'steps run as the base template\'s user')
    await sbx.kill()
  })

  test('skipCache() rebuilds that step and the ones after it', async () => {
    const sc = uniq('tplb-skip')
    built.add(sc)
    const stampOf = async () => {
      const sbx = await Sandbox.create(sc, { metadata: meta({ file: 'template-build' }) })
      track(sbx.sandboxId)
      const out = await run(sbx, 'cat /one /stamp')
      await sbx.kill()
      return out
    }
    const def = (skip) => {
      const t = Template().fromTemplate('base').runCmd('echo one > /tmp/one-src && cp /tmp/one-src /one', { user: 'root' })
      return (skip ? t.skipCache() : t).runCmd('date +%s%N > /stamp', { user: 'root' })
    }
    await Template.build(def(false), sc)
    const first = await stampOf()
    const logs = []
    await Template.build(def(true), sc, { onBuildLogs: (e) => logs.push(e) })
    const second = await stampOf()
    const text = logs.map((e) => e.message).join('\n')
    assert.notEqual(second, first, `the skipped step ran again: ${text.slice(-2000)}`)
    assert.equal(second.split('\n')[0], 'one')
    assert.match(text, /step 1\/2 .*one-src.*: cached/, `the step before skipCache() is cached: ${text.slice(-2000)}`)
    assert.match(text, /step 2\/2 .*stamp.*: done in/, `the skipped step ran: ${text.slice(-2000)}`)
  })

  test('a failing RUN → BuildError with exit code and output; no template left', async () => {
    const bad = uniq('tplb-bad')
    built.add(bad)
    const err = await rejectsWith(
      Template.build(Template().fromTemplate('base').runCmd('echo about-to-fail; exit 3'), bad),
      BuildError, 'failing build')
    assert.match(err.message, /exited with code 3/)
    assert.match(err.message, /about-to-fail/)
    assert.equal(await Template.exists(bad), false)
  })
})

describe('bad input → 400', () => {
  async function request() {
    const res = await api('POST', '/v3/templates', { body: { name: uniq('tplb-x') } })
    assert.equal(res.status, 202, res.text)
    return res.json
  }
  const start = (r, body) => api('POST', `/v2/templates/${r.templateID}/builds/${r.buildID}`, { body })

  test('malformed names and tags', async () => {
    for (const body of [{ name: 'Upper' }, { name: 'a:b:c' }, { name: 'x:' }, { name: 'x:V2' }, { name: 'x', tags: ['ok', 'not ok'] }, { name: '' }, { name: 'base' }, { name: 'base:v1' }]) {
      const res = await api('POST', '/v3/templates', { body })
      assert.equal(res.status, 400, `${JSON.stringify(body)}: ${res.text}`)
      assertErrorBody(res, JSON.stringify(body))
    }
  })

  test('unknown step type', async () => {
    const res = await start(await request(), { fromTemplate: 'base', steps: [{ type: 'ADDX', args: ['x'] }] })
    assert.equal(res.status, 400, res.text)
    assert.match(res.json.message, /unknown step type/)
  })

  test('a files hash never uploaded', async () => {
    const hash = createHash('sha256').update('never').digest('hex')
    const res = await start(await request(), { fromTemplate: 'base', steps: [{ type: 'COPY', args: ['f', '/f'], filesHash: hash }] })
    assert.equal(res.status, 400, res.text)
    assert.match(res.json.message, /never uploaded/)
  })

  test('an upload that does not match its hash', async () => {
    const r = await request()
    const dir = mkdtempSync(join(tmpdir(), 'airlock-tplbad-'))
    try {
      writeFileSync(join(dir, 'f.txt'), 'not what was hashed\n')
      execFileSync('tar', ['-czf', join(dir, 'f.tgz'), '-C', dir, 'f.txt'])
      const hash = createHash('sha256').update('something else').digest('hex')
      const link = await api('GET', `/templates/${r.templateID}/files/${hash}`)
      assert.equal(link.status, 201, link.text)
      assert.equal(link.json.present, false)
      const put = await fetch(link.json.url, { method: 'PUT', body: readFileSync(join(dir, 'f.tgz')) })
      assert.equal(put.status, 200, await put.text())
      const forged = await fetch(link.json.url.replace(/token=\w+/, 'token=00'), { method: 'PUT', body: 'x' })
      assert.equal(forged.status, 403)
      const res = await start(r, { fromTemplate: 'base', steps: [{ type: 'COPY', args: ['f.txt', '/f.txt'], filesHash: hash }] })
      assert.equal(res.status, 400, res.text)
      assert.match(res.json.message, /do not match their hash/)
      // The refused build is gone (its first build: the name too); a new
      // request finds the bad upload dropped.
      const gone = await api('GET', `/templates/${r.templateID}/builds/${r.buildID}/status`)
      assert.equal(gone.status, 404, gone.text)
      const r2 = await request()
      const again = await api('GET', `/templates/${r2.templateID}/files/${hash}`)
      assert.equal(again.status, 201, again.text)
      assert.equal(again.json.present, false, 'the bad upload was dropped')
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})
