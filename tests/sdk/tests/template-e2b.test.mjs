// What E2B's own template tests check (packages/js-sdk/tests/template in
// e2b-dev/E2B: build, methods/runCmd, methods/makeSymlink,
// methods/fromDockerfile, backgroundBuild, exists, uploadFile), in our own
// words, run against Airlock with the unmodified npm `e2b`.
//
// Like E2B's, most of these build fromImage('ubuntu:22.04'). This machine
// reaches no public registry: tests/sdk/run.sh starts a local registry
// (tests/sdk/registry) and runs the server with `--registry-mirror
// docker.io=<it>`, so the pull goes there. That registry's "ubuntu:22.04"
// is a Debian rootfs the suite made itself from the base template, which is
// all these tests need of it: an image pulled from a registry through the
// mirror, with bash and coreutils.

import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { randomUUID } from 'node:crypto'
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { BuildError, Sandbox, Template, waitForTimeout } from 'e2b'
import { api, meta, rejectsWith, track, trackCleanup, trackTemplates, uniq, waitFor } from './helpers.mjs'

trackCleanup()

const REGISTRY = process.env.AIRLOCK_SDK_REGISTRY
const REGISTRY_AUTH = process.env.AIRLOCK_SDK_REGISTRY_AUTH
const REGISTRY_CREDS = process.env.AIRLOCK_SDK_REGISTRY_CREDS

const built = trackTemplates()
function named(prefix) {
  const n = uniq(prefix)
  built.add(n)
  return n
}

// The context: a folder with a file, a relative symlink, an absolute one
// and one that points nowhere (E2B's build test has the same four).
const ctx = mkdtempSync(join(tmpdir(), 'airlock-e2bt-'))
after(() => rmSync(ctx, { recursive: true, force: true }))
mkdirSync(join(ctx, 'folder'))
writeFileSync(join(ctx, 'folder', 'test.txt'), 'This is a test file.')
symlinkSync('test.txt', join(ctx, 'folder', 'symlink.txt'))
symlinkSync(join(ctx, 'folder', 'test.txt'), join(ctx, 'folder', 'symlink2.txt'))
symlinkSync('12345test.txt', join(ctx, 'folder', 'symlink3.txt'))

async function sh(sbx, cmd, opts = {}) {
  const r = await sbx.commands.run(cmd, opts)
  return r.stdout.trim()
}

async function sandboxOf(name) {
  const sbx = await Sandbox.create(name, { metadata: meta({ file: 'template-e2b' }) })
  track(sbx.sandboxId)
  return sbx
}

function needRegistry() {
  assert.ok(REGISTRY, 'AIRLOCK_SDK_REGISTRY is not set: run through tests/sdk/run.sh, which starts the local registry')
}

describe('exists', () => {
  test('the built-in base template exists; a random name does not', async () => {
    assert.equal(await Template.exists('base'), true)
    assert.equal(await Template.exists(`nonexistent-${randomUUID()}`), false)
  })
})

describe('build', { concurrency: false }, () => {
  test('fromBaseImage: glob copy with forceUpload, runCmd reads it, workdir, start command', async () => {
    const name = named('e2bt-build')
    const logs = []
    await Template.build(
      Template({ fileContextPath: ctx })
        .fromBaseImage()
        .copy('folder/*', 'folder', { forceUpload: true })
        .runCmd('cat folder/test.txt')
        .setWorkdir('/app')
        // As E2B's test: a one-shot start command (it exits 0 at once)
        // and a ready check that only waits.
        .setStartCmd('echo "Hello, world!"', waitForTimeout(1000)),
      name, { skipCache: true, onBuildLogs: (e) => logs.push(e) })
    assert.ok(logs.some((e) => e.message.includes('This is a test file.')), 'the RUN step printed the copied file')
    const sbx = await sandboxOf(name)
    assert.equal(await sh(sbx, 'pwd'), '/app')
    // The glob's matches land in folder/ under the WORKDIR in effect: the
    // base template sets none, so that is / (Docker's reading; E2B's
    // builder would use the user's home). Links are copied as links,
    // the absolute and the dangling one included.
    assert.equal(await sh(sbx, 'ls -d /folder ~/folder 2>/dev/null; cd /folder && cat test.txt && echo && readlink symlink.txt symlink2.txt symlink3.txt'), `/folder\nThis is a test file.\ntest.txt\n${join(ctx, 'folder', 'test.txt')}\n12345test.txt`)
    await sbx.kill()
  })

  test('fromTemplate(base) with skipCache', async () => {
    const name = named('e2bt-from-base')
    const info = await Template.build(Template().fromTemplate('base'), name, { skipCache: true })
    assert.equal(info.name, name)
    assert.equal(await Template.exists(name), true)
  })

  test('fromImage(ubuntu:22.04) through the registry mirror: symlinks are copied as links', async () => {
    needRegistry()
    const name = named('e2bt-ubuntu-links')
    const logs = []
    await Template.build(
      Template({ fileContextPath: ctx })
        .fromImage('ubuntu:22.04')
        .skipCache()
        .copy('folder/*', 'folder', { forceUpload: true })
        .runCmd('cat folder/symlink.txt && echo && readlink folder/symlink.txt'),
      name, { onBuildLogs: (e) => logs.push(e) })
    const text = logs.map((e) => e.message).join('\n')
    assert.ok(logs.some((e) => e.message === 'This is a test file.'), text.slice(-2000))
    assert.ok(logs.some((e) => e.message === 'test.txt'), `symlink.txt is a link: ${text.slice(-2000)}`)
    assert.ok(text.includes(`FROM ubuntu:22.04: pulling through the registry mirror http://${REGISTRY}`), `pulled through the local mirror: ${text.slice(0, 2000)}`)
  })

  test('fromImage(ubuntu:22.04): resolveSymlinks copies the target\'s content', async () => {
    needRegistry()
    const name = named('e2bt-ubuntu-resolve')
    await Template.build(
      Template({ fileContextPath: ctx })
        .fromImage('ubuntu:22.04')
        .skipCache()
        .copy('folder/symlink.txt', 'folder/symlink.txt', { forceUpload: true, resolveSymlinks: true })
        .runCmd('test ! -L folder/symlink.txt && test "$(cat folder/symlink.txt)" = "This is a test file."'),
      name)
    const sbx = await sandboxOf(name)
    assert.equal(await sh(sbx, 'cat /folder/symlink.txt; test -L /folder/symlink.txt && echo " link" || echo " file"', { user: 'root' }), 'This is a test file. file')
    await sbx.kill()
  })
})

describe('copy of a symlink by name', () => {
  // E2B's builder copies such a link as a link; Airlock's COPY follows a
  // source link as Docker's does, and the SDK uploads the link alone, so the
  // build is refused at once with what to do instead.
  test('without resolveSymlinks: a clear error naming the link', async () => {
    const name = named('e2bt-link-src')
    const err = await rejectsWith(
      Template.build(Template({ fileContextPath: ctx }).fromTemplate('base').copy('folder/symlink.txt', '/tmp/s.txt'), name),
      BuildError, 'copy of a symlink')
    assert.match(err.message, /folder\/symlink\.txt: the source is a symlink \(to test\.txt\)/)
    assert.match(err.message, /resolveSymlinks/)
    assert.equal(await Template.exists(name), false)
  })
})

describe('runCmd', { concurrency: false }, () => {
  test('a command on ubuntu:22.04', async () => {
    needRegistry()
    const name = named('e2bt-run')
    const logs = []
    await Template.build(Template().fromImage('ubuntu:22.04').skipCache().runCmd('ls -l / && test -d /usr/bin'), name, { onBuildLogs: (e) => logs.push(e) })
    assert.ok(logs.some((e) => /\busr\b/.test(e.message) && e.message.startsWith('drwx')), 'ls -l output streamed')
  })

  test('as root', async () => {
    needRegistry()
    await Template.build(Template().fromImage('ubuntu:22.04').skipCache().runCmd('test "$(whoami)" = "root"', { user: 'root' }), named('e2bt-run-root'))
  })

  test('as a user that does not exist: the build fails and says which user', async () => {
    needRegistry()
    const name = named('e2bt-run-nouser')
    const err = await rejectsWith(
      Template.build(Template().fromImage('ubuntu:22.04').skipCache().runCmd('whoami', { user: 'root123' }), name),
      BuildError, 'a RUN as root123')
    assert.match(err.message, /root123/)
    assert.match(err.message, /whoami/)
    assert.equal(await Template.exists(name), false)
  })
})

describe('makeSymlink', { concurrency: false }, () => {
  test('a symlink, and force replacing it', async () => {
    needRegistry()
    await Template.build(
      Template().fromImage('ubuntu:22.04').skipCache()
        .makeSymlink('.bashrc', '.bashrc.local')
        .runCmd('test "$(readlink .bashrc.local)" = ".bashrc"'),
      named('e2bt-symlink'))
    const name = named('e2bt-symlink-force')
    await Template.build(
      Template().fromImage('ubuntu:22.04')
        .makeSymlink('.profile', '.bashrc.local')
        .skipCache()
        .makeSymlink('.bashrc', '.bashrc.local', { force: true })
        .runCmd('test "$(readlink .bashrc.local)" = ".bashrc"'),
      name)
    const sbx = await sandboxOf(name)
    assert.equal(await sh(sbx, 'readlink /.bashrc.local', { user: 'root' }), '.bashrc')
    await sbx.kill()
  })

  test('without force, an existing link fails the build', async () => {
    needRegistry()
    const err = await rejectsWith(
      Template.build(
        Template().fromImage('ubuntu:22.04').skipCache()
          .makeSymlink('.profile', '.bashrc.local')
          .makeSymlink('.bashrc', '.bashrc.local'),
        named('e2bt-symlink-exists')),
      BuildError, 'ln -s onto an existing link')
    assert.match(err.message, /File exists/)
  })
})

describe('fromDockerfile', { concurrency: false }, () => {
  test('the SDK turns a Dockerfile into steps (what it sends)', async () => {
    const t = Template().fromDockerfile(`FROM node:24
WORKDIR /app
COPY --chown=myuser:mygroup package.json package-lock.json .
RUN npm install
ENTRYPOINT ["sleep", "20"]`)
    const json = JSON.parse(await Template.toJSON(t, false))
    assert.equal(json.fromImage, 'node:24')
    const seq = json.steps.map((s) => [s.type, ...s.args].join(' '))
    assert.deepEqual(seq, [
      'USER root', 'WORKDIR /', 'WORKDIR /app',
      'COPY package.json . myuser:mygroup ', 'COPY package-lock.json . myuser:mygroup ',
      // The SDK appends USER user (no USER in the Dockerfile), and
      // WORKDIR /home/user only when the Dockerfile set no WORKDIR.
      'RUN npm install', 'USER user',
    ])
    assert.equal(json.startCmd, 'sleep 20')
  })

  test('a Dockerfile on ubuntu:22.04 built; a sandbox sees its effects', async () => {
    needRegistry()
    const dir = mkdtempSync(join(tmpdir(), 'airlock-e2bt-df-'))
    try {
      writeFileSync(join(dir, 'app.conf'), 'conf=1\n')
      const name = named('e2bt-dockerfile')
      const t = Template({ fileContextPath: dir }).fromDockerfile(`FROM ubuntu:22.04
ARG FLAVOR
ENV GREETING=from-a-dockerfile MODE=test
WORKDIR /srv/app
COPY app.conf ./
RUN echo "$GREETING" > greeting.txt && useradd -m mish
USER mish
WORKDIR /home/mish
RUN echo "$MODE" > mode.txt`)
      await Template.build(t, name)
      const sbx = await sandboxOf(name)
      assert.equal(await sh(sbx, 'whoami; pwd'), 'mish\n/home/mish')
      assert.equal(await sh(sbx, 'cat /srv/app/app.conf /srv/app/greeting.txt /home/mish/mode.txt'), 'conf=1\nfrom-a-dockerfile\ntest')
      // ARG without a value: the SDK sends it as an empty ENV.
      assert.equal(await sh(sbx, 'echo "$GREETING|$MODE|${FLAVOR-unset}"'), 'from-a-dockerfile|test|')
      await sbx.kill()
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe('backgroundBuild', () => {
  test('buildInBackground returns at once; the build is then waiting or building, and finishes', async () => {
    needRegistry()
    const name = named('e2bt-bg')
    const t0 = Date.now()
    const info = await Template.buildInBackground(
      Template().fromImage('ubuntu:22.04').skipCache().runCmd('sleep 5').setStartCmd('echo "Hello" && sleep infinity', waitForTimeout(1000)),
      name, { cpuCount: 1, memoryMB: 1024 })
    assert.ok(Date.now() - t0 < 10_000, `buildInBackground took ${Date.now() - t0} ms`)
    const first = await Template.getBuildStatus(info)
    assert.ok(['waiting', 'building'].includes(first.status), first.status)
    const final = await waitFor(async () => {
      const st = await Template.getBuildStatus(info)
      return ['ready', 'error'].includes(st.status) && st
    }, { timeoutMs: 120_000, intervalMs: 500, what: 'the background build' })
    assert.equal(final.status, 'ready', JSON.stringify(final.reason))
  })
})

describe('uploadFile', () => {
  // E2B's test checks that the SDK sends a Content-Length and no chunked
  // body or Content-Type (S3 presigned URLs need that). Airlock's upload
  // URL is its own: it must take what the SDK sends and also a streamed
  // (chunked) body, which other clients send.
  test('the upload URL takes a chunked body; the build uses it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'airlock-e2bt-up-'))
    try {
      writeFileSync(join(dir, 'hello.txt'), 'hello world')
      const t = Template({ fileContextPath: dir }).fromTemplate('base').copy('hello.txt', '/tmp/hello.txt', { user: 'root' })
      const spec = JSON.parse(await Template.toJSON(t, true))
      const hash = spec.steps[0].filesHash
      const req = await api('POST', '/v3/templates', { body: { name: named('e2bt-upload') } })
      assert.equal(req.status, 202, req.text)
      const link = await api('GET', `/templates/${req.json.templateID}/files/${hash}`)
      assert.equal(link.status, 201, link.text)
      let url = link.json.url
      if (link.json.present) url = undefined
      if (url) {
        execFileSync('tar', ['-czf', join(dir, 'up.tgz'), '-C', dir, 'hello.txt'])
        const bytes = readFileSync(join(dir, 'up.tgz'))
        const body = new ReadableStream({
          start(c) {
            c.enqueue(bytes.subarray(0, 10))
            c.enqueue(bytes.subarray(10))
            c.close()
          },
        })
        const put = await fetch(url, { method: 'PUT', body, duplex: 'half' })
        assert.equal(put.status, 200, await put.text())
        const again = await api('GET', `/templates/${req.json.templateID}/files/${hash}`)
        assert.equal(again.json.present, true)
      }
      const start = await api('POST', `/v2/templates/${req.json.templateID}/builds/${req.json.buildID}`, { body: spec })
      assert.equal(start.status, 202, start.text)
      const final = await waitFor(async () => {
        const st = await Template.getBuildStatus({ templateId: req.json.templateID, buildId: req.json.buildID })
        return ['ready', 'error'].includes(st.status) && st
      }, { timeoutMs: 120_000, intervalMs: 300, what: 'the build' })
      assert.equal(final.status, 'ready', JSON.stringify(final.reason))
      const sbx = await sandboxOf(req.json.templateID)
      assert.equal(await sh(sbx, 'cat /tmp/hello.txt'), 'hello world')
      await sbx.kill()
    } finally {
      rmSync(dir, { recursive: true, force: true })
    }
  })
})

describe('fromImage with registry credentials', { concurrency: false }, () => {
  test('a registry that needs basic auth: pulled with the credentials, refused without', async () => {
    needRegistry()
    assert.ok(REGISTRY_AUTH && REGISTRY_CREDS, 'AIRLOCK_SDK_REGISTRY_AUTH/CREDS are not set')
    const [username, password] = REGISTRY_CREDS.split(':')
    const image = `${REGISTRY_AUTH}/private/tool:1`
    const name = named('e2bt-auth')
    await Template.build(Template().fromImage(image, { username, password }).runCmd('echo pulled-with-auth > /pulled', { user: 'root' }), name)
    const sbx = await sandboxOf(name)
    assert.equal(await sh(sbx, 'cat /pulled', { user: 'root' }), 'pulled-with-auth')
    await sbx.kill()

    const wrong = await rejectsWith(
      Template.build(Template().fromImage(image, { username, password: 'not-the-password' }).runCmd('true'), named('e2bt-auth-bad')),
      BuildError, 'a wrong password')
    assert.match(wrong.message, /private\/tool:1/)
    assert.match(wrong.message, /401|UNAUTHORIZED|unauthorized|authentication/i)
  })
})
