// Every builder verb of the SDK's Template, built through the E2B API with
// the unmodified npm `e2b`, and a sandbox of the result checked for each
// verb's effect: copy (file, dir, several sources, mode, user, symlinks
// kept or resolved, forceUpload), copyItems, remove, rename, makeDir,
// makeSymlink, runCmd (string, array, user), setWorkdir, setUser, setEnvs,
// aptInstall, npmInstall (-g and --save-dev), pipInstall (global and
// --user), gitClone (branch, depth, path), and the start command with each
// ready check (waitForPort, waitForURL, waitForProcess, waitForFile,
// waitForTimeout, setReadyCmd).
//
// Build steps reach the Debian mirror (apt) but not PyPI, and this suite
// must not depend on the npm registry either: pip and npm install packages
// the template makes itself (a wheel zipped in a step, a tarball from
// `npm pack`), and gitClone clones a repository a step made, by file://.
// The context's content is the same on every run, so a second run's builds
// are cache hits except for the forceUpload copy (force rebuilds it).

import assert from 'node:assert/strict'
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, before, describe, test } from 'node:test'
import { Sandbox, Template, waitForFile, waitForPort, waitForProcess, waitForTimeout, waitForURL } from 'e2b'
import { meta, track, trackCleanup, trackTemplates, uniq } from './helpers.mjs'

trackCleanup()

const built = trackTemplates()

const ctx = mkdtempSync(join(tmpdir(), 'airlock-verbs-'))
after(() => rmSync(ctx, { recursive: true, force: true }))

function write(rel, content, mode = 0o644) {
  const p = join(ctx, rel)
  mkdirSync(join(p, '..'), { recursive: true })
  writeFileSync(p, content, { mode })
}

// The context: fixed content, so layer keys repeat across runs.
write('app/config.json', '{"verbs": true}\n')
write('app/bin/verbs-daemon', '#!/bin/bash\nwhile true; do sleep 1; done\n', 0o755)
write('app/bin/hello.sh', '#!/bin/sh\necho hello-from-bin\n', 0o755)
write('multi/one.txt', 'one\n')
write('multi/two.txt', 'two\n')
write('links/target.txt', 'linked content\n')
symlinkSync('target.txt', join(ctx, 'links', 'rel-link.txt'))
symlinkSync('/etc/hostname', join(ctx, 'links', 'abs-link.txt'))
write('items/a.txt', 'item a\n')
write('items/b.txt', 'item b\n')
write('fresh.txt', 'uploaded every time\n')
write('npm-pkg/package.json', JSON.stringify({ name: 'airlock-verbs-cli', version: '1.0.0', bin: { 'airlock-verbs-cli': 'cli.js' } }, null, 2) + '\n')
write('npm-pkg/cli.js', '#!/usr/bin/env node\nconsole.log("verbs-cli-ok")\n', 0o755)
for (const pkg of ['airlock_verbs_sys', 'airlock_verbs_usr']) {
  const info = `${pkg}-1.0.dist-info`
  write(`wheels/${pkg}/${pkg}/__init__.py`, `WHERE = "${pkg}"\n`)
  write(`wheels/${pkg}/${info}/METADATA`, `Metadata-Version: 2.1\nName: ${pkg}\nVersion: 1.0\n`)
  write(`wheels/${pkg}/${info}/WHEEL`, 'Wheel-Version: 1.0\nGenerator: airlock-sdk-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n')
  write(`wheels/${pkg}/${info}/RECORD`, `${pkg}/__init__.py,,\n${info}/METADATA,,\n${info}/WHEEL,,\n${info}/RECORD,,\n`)
}

const gitId = '-c user.email=verbs@airlock.test -c user.name=verbs'

// The node template has npm; base (below it) has git, python3 and curl.
function verbs() {
  return Template({ fileContextPath: ctx })
    .fromTemplate('node')
    .setEnvs({ npm_config_audit: 'false', npm_config_fund: 'false', npm_config_update_notifier: 'false' })
    // copy
    .copy('app/config.json', '/opt/verbs/config.json', { mode: 0o640, user: 'root' })
    .copy('app/bin', '/opt/verbs/bin', { user: 'root', mode: 0o755 })
    .copy(['multi/one.txt', 'multi/two.txt'], '/opt/verbs/multi/', { user: 'root' })
    .copy('links', '/opt/verbs/links', { user: 'root' })
    .copy('links/rel-link.txt', '/opt/verbs/resolved.txt', { user: 'root', resolveSymlinks: true })
    .copyItems([
      { src: 'items/a.txt', dest: '/home/user/items/a.txt', mode: 0o600 },
      { src: 'items/b.txt', dest: '/opt/verbs/items/b.txt', user: 'root' },
    ])
    // runCmd (array, as root), then the file verbs on what it made
    .runCmd([
      'mkdir -p /opt/verbs/gone/deep',
      'touch /opt/verbs/gone/deep/f /opt/verbs/gone-file',
      'echo renamed > /opt/verbs/old-name.txt',
    ], { user: 'root' })
    .remove('/opt/verbs/gone', { recursive: true, force: true, user: 'root' })
    .remove(['/opt/verbs/gone-file', '/opt/verbs/never-there'], { force: true, user: 'root' })
    .rename('/opt/verbs/old-name.txt', '/opt/verbs/new-name.txt', { user: 'root' })
    .makeDir(['/opt/verbs/made/a', '/opt/verbs/made/b'], { mode: 0o711, user: 'root' })
    .makeDir('/home/user/proj')
    .makeSymlink('/opt/verbs/config.json', '/opt/verbs/link', { user: 'root' })
    .makeSymlink('/opt/verbs/new-name.txt', '/opt/verbs/link', { force: true, user: 'root' })
    .makeSymlink('new-name.txt', '/opt/verbs/rel-link', { user: 'root' })
    .runCmd('id -un > /home/user/ran-as-default')
    // apt from the host's Debian mirror (iproute2 gives waitForPort its ss)
    .aptInstall(['iproute2', 'tree'], { noInstallRecommends: true, fixMissing: true })
    // npm: a package made here, installed globally and as a dev dependency
    .copy('npm-pkg', '/opt/pkgs/npm-src', { user: 'root' })
    .runCmd('cd /opt/pkgs/npm-src && npm pack --pack-destination /opt/pkgs >/dev/null', { user: 'root' })
    .npmInstall('/opt/pkgs/airlock-verbs-cli-1.0.0.tgz', { g: true })
    .setWorkdir('/home/user/proj')
    .runCmd('npm init -y >/dev/null')
    .npmInstall('/opt/pkgs/airlock-verbs-cli-1.0.0.tgz', { dev: true })
    // git: a repository with two branches, cloned by file://
    .runCmd([
      'git init -q --bare -b main /srv/verbs.git',
      'rm -rf /tmp/w && git init -q -b main /tmp/w && cd /tmp/w',
      'echo main > which.txt && git add which.txt',
      `git ${gitId} commit -q -m one`,
      'echo main2 > which.txt',
      `git ${gitId} commit -q -am two`,
      'git checkout -q -b feature',
      'echo feature > which.txt',
      `git ${gitId} commit -q -am three`,
      'git push -q /srv/verbs.git main feature',
      'cd / && rm -rf /tmp/w',
    ], { user: 'root' })
    .gitClone('file:///srv/verbs.git', '/opt/clone-feature', { branch: 'feature', depth: 1, user: 'root' })
    // git refuses a repository another user owns; the next clone is the user's.
    .runCmd('chown -R user:user /srv/verbs.git', { user: 'root' })
    .gitClone('file:///srv/verbs.git', 'clone-main')
    // env, a new user, workdir as the new user
    .setEnvs({ VERBS_A: 'alpha', VERBS_B: 'two words and "quotes"' })
    .setUser('builder')
    .runCmd('id -un > /tmp/builder-ran && echo "$VERBS_A" >> /tmp/builder-ran')
    .setWorkdir('/home/builder')
    .setUser('user')
    .setWorkdir('/home/user/proj')
    // last: forceUpload marks the step forced, so it (and only it) runs every time
    .copy('fresh.txt', '/home/user/fresh.txt', { forceUpload: true })
}

const name = uniq('verbs')

async function sh(sbx, cmd, opts = {}) {
  const r = await sbx.commands.run(cmd, opts)
  return r.stdout.trim()
}

async function sandboxOf(tpl) {
  const sbx = await Sandbox.create(tpl, { metadata: meta({ file: 'template-verbs' }) })
  track(sbx.sandboxId)
  return sbx
}

describe('every builder verb', { concurrency: false }, () => {
  before(async () => {
    built.add(name)
    const t0 = Date.now()
    await Template.build(verbs().setStartCmd('sleep infinity', waitForTimeout(1000)), name)
    console.log(`verbs build: ${Date.now() - t0} ms`)
  }, { timeout: 600_000 }) // cold: apt, npm and git steps, maybe queued behind other files' builds

  test('copy, copyItems: content, modes, owners, symlinks', async () => {
    const sbx = await sandboxOf(name)
    assert.equal(await sh(sbx, 'stat -c "%a %U %G" /opt/verbs/config.json'), '640 root root')
    assert.equal(await sh(sbx, 'cat /opt/verbs/config.json', { user: 'root' }), '{"verbs": true}')
    assert.equal(await sh(sbx, '/opt/verbs/bin/hello.sh'), 'hello-from-bin')
    assert.equal(await sh(sbx, 'stat -c "%a %U" /opt/verbs/bin/hello.sh /opt/verbs/bin/verbs-daemon'), '755 root\n755 root')
    assert.equal(await sh(sbx, 'cat /opt/verbs/multi/one.txt /opt/verbs/multi/two.txt'), 'one\ntwo')
    // Symlinks are kept as links by default, absolute ones as written.
    assert.equal(await sh(sbx, 'readlink /opt/verbs/links/rel-link.txt; readlink /opt/verbs/links/abs-link.txt'), 'target.txt\n/etc/hostname')
    assert.equal(await sh(sbx, 'cat /opt/verbs/links/rel-link.txt'), 'linked content')
    // resolveSymlinks: the file the link points at.
    assert.equal(await sh(sbx, 'test -L /opt/verbs/resolved.txt && echo link || cat /opt/verbs/resolved.txt'), 'linked content')
    // copyItems: mode and the user in effect (user) for a; root for b.
    assert.equal(await sh(sbx, 'stat -c "%a %U" /home/user/items/a.txt; cat /home/user/items/a.txt'), '600 user\nitem a')
    assert.equal(await sh(sbx, 'stat -c "%U" /opt/verbs/items/b.txt; cat /opt/verbs/items/b.txt'), 'root\nitem b')
    assert.equal(await sh(sbx, 'cat /home/user/fresh.txt'), 'uploaded every time')
    await sbx.kill()
  })

  test('runCmd, remove, rename, makeDir, makeSymlink', async () => {
    const sbx = await sandboxOf(name)
    assert.equal(await sh(sbx, 'ls /opt/verbs/gone /opt/verbs/gone-file 2>&1 | wc -l; test -e /opt/verbs/gone || echo removed'), '2\nremoved')
    assert.equal(await sh(sbx, 'test -e /opt/verbs/old-name.txt || cat /opt/verbs/new-name.txt'), 'renamed')
    assert.equal(await sh(sbx, 'stat -c "%a %U" /opt/verbs/made/a /opt/verbs/made/b'), '711 root\n711 root')
    assert.equal(await sh(sbx, 'stat -c "%U" /home/user/proj'), 'user')
    // force replaced the first link.
    assert.equal(await sh(sbx, 'readlink /opt/verbs/link; cat /opt/verbs/link'), '/opt/verbs/new-name.txt\nrenamed')
    assert.equal(await sh(sbx, 'readlink /opt/verbs/rel-link; cat /opt/verbs/rel-link'), 'new-name.txt\nrenamed')
    assert.equal(await sh(sbx, 'cat /home/user/ran-as-default'), 'user', 'runCmd without user runs as the user in effect')
    await sbx.kill()
  })

  test('setEnvs, setUser, setWorkdir', async () => {
    const sbx = await sandboxOf(name)
    assert.equal(await sh(sbx, 'echo "$VERBS_A|$VERBS_B"'), 'alpha|two words and "quotes"')
    assert.equal(await sh(sbx, 'whoami; pwd'), 'user\n/home/user/proj')
    assert.equal(await sh(sbx, 'cat /tmp/builder-ran; id -u builder >/dev/null && echo exists; stat -c %U /home/builder'), 'builder\nalpha\nexists\nbuilder')
    await sbx.kill()
  })

  test('aptInstall, npmInstall, gitClone', async () => {
    const sbx = await sandboxOf(name)
    assert.equal(await sh(sbx, "dpkg-query -W -f '${Package} ${Status}\\n' iproute2 tree"), 'iproute2 install ok installed\ntree install ok installed')
    assert.match(await sh(sbx, 'tree --version'), /^tree v/)
    // -g: on PATH for everyone; --save-dev: in the project's devDependencies.
    assert.equal(await sh(sbx, 'airlock-verbs-cli'), 'verbs-cli-ok')
    const pkg = JSON.parse(await sh(sbx, 'cat package.json'))
    assert.ok(pkg.devDependencies?.['airlock-verbs-cli'], JSON.stringify(pkg))
    assert.equal(await sh(sbx, 'node -e "process.stdout.write(require(\'airlock-verbs-cli/package.json\').version)"'), '1.0.0')
    assert.equal(await sh(sbx, 'stat -c %U node_modules'), 'user')
    // branch + depth 1 + single branch; the second clone is relative to the workdir.
    assert.equal(await sh(sbx, 'cd /opt/clone-feature && cat which.txt && git rev-list --count HEAD && git branch -r | grep -vc HEAD', { user: 'root' }), 'feature\n1\n1')
    assert.equal(await sh(sbx, 'cd /home/user/proj/clone-main && cat which.txt && git rev-list --count HEAD && stat -c %U .'), 'main2\n2\nuser')
    await sbx.kill()
  })

  test('pipInstall: global (root) and g: false (--user)', { timeout: 300_000 }, async () => {
    const py = uniq('verbs-pip')
    built.add(py)
    const tpl = Template({ fileContextPath: ctx })
      .fromTemplate('python3')
      .copy('wheels', '/opt/wheels', { user: 'root' })
      .runCmd([
        'cd /opt/wheels/airlock_verbs_sys && python3 -m zipfile -c /opt/airlock_verbs_sys-1.0-py3-none-any.whl airlock_verbs_sys airlock_verbs_sys-1.0.dist-info',
        'cd /opt/wheels/airlock_verbs_usr && python3 -m zipfile -c /opt/airlock_verbs_usr-1.0-py3-none-any.whl airlock_verbs_usr airlock_verbs_usr-1.0.dist-info',
      ], { user: 'root' })
      // --no-index: PyPI is not reachable from build steps here.
      .pipInstall(['--no-index', '/opt/airlock_verbs_sys-1.0-py3-none-any.whl'])
      .pipInstall(['--no-index', '/opt/airlock_verbs_usr-1.0-py3-none-any.whl'], { g: false })
    await Template.build(tpl, py)
    const sbx = await sandboxOf(py)
    const where = 'import airlock_verbs_sys as m; print(m.__file__)'
    assert.match(await sh(sbx, `python3 -c "${where}"`), /^\/usr\/local\/lib\/python3[^/]*\/dist-packages\/airlock_verbs_sys\/__init__\.py$/)
    assert.match(await sh(sbx, 'python3 -c "import airlock_verbs_usr as m; print(m.__file__)"'), /^\/home\/user\/\.local\/lib\/python3[^/]*\/site-packages\/airlock_verbs_usr\/__init__\.py$/)
    assert.equal(await sh(sbx, 'python3 -c "import airlock_verbs_usr" 2>/dev/null && echo visible || echo hidden', { user: 'root' }), 'hidden', '--user installs only for that user')
    await sbx.kill()
  })
})

describe('start and ready commands', { concurrency: false }, () => {
  // The same steps as above with other start/ready commands: every layer is
  // a cache hit, only the settings differ.
  const cases = [
    ['waitForPort', () => verbs().setStartCmd('python3 -m http.server 8123 --bind 0.0.0.0', waitForPort(8123)),
      async (sbx) => assert.equal(await sh(sbx, 'curl -s -o /dev/null -w "%{http_code}" http://127.0.0.1:8123/'), '200')],
    ['waitForURL', () => verbs().setStartCmd('mkdir -p /tmp/www && echo fine > /tmp/www/health && cd /tmp/www && python3 -m http.server 8124', waitForURL('http://127.0.0.1:8124/health', 200)),
      async (sbx) => assert.equal(await sh(sbx, 'curl -s http://127.0.0.1:8124/health'), 'fine')],
    ['waitForProcess', () => verbs().setStartCmd('/opt/verbs/bin/verbs-daemon', waitForProcess('verbs-daemon')),
      async (sbx) => assert.match(await sh(sbx, 'pgrep -a verbs-daemon'), /verbs-daemon/)],
    ['waitForFile', () => verbs().setStartCmd('sleep 1 && echo up > /tmp/up-marker && sleep infinity', waitForFile('/tmp/up-marker')),
      async (sbx) => assert.equal(await sh(sbx, 'cat /tmp/up-marker'), 'up')],
    ['waitForTimeout', () => verbs().setStartCmd('date +%s%N > /tmp/started-at && sleep infinity', waitForTimeout(2000)),
      async (sbx, ms) => {
        assert.ok(ms >= 2000, `create waited for the timeout: ${ms} ms`)
        assert.match(await sh(sbx, 'cat /tmp/started-at'), /^\d+$/)
      }],
    ['setReadyCmd', () => verbs().setStartCmd('sleep 3 && touch /tmp/ready-later && sleep infinity', waitForTimeout(1000)).setReadyCmd('test -f /tmp/ready-later'),
      async (sbx) => assert.equal(await sh(sbx, 'test -f /tmp/ready-later && echo there'), 'there')],
  ]
  for (const [what, def, check] of cases) {
    test(what, async () => {
      const n = uniq(`verbs-${what.toLowerCase()}`)
      built.add(n)
      const logs = []
      await Template.build(def(), n, { onBuildLogs: (e) => logs.push(e) })
      // The steps were built above: cached now, except the forceUpload
      // copy (the last step), which force builds every time.
      const text = logs.map((e) => e.message).join('\n')
      assert.match(text, /step 1\/(\d+) .*: cached/, text.slice(-3000))
      assert.match(text, /step (\d+)\/\1 COPY .*: done in/, text.slice(-3000))
      const t0 = Date.now()
      const sbx = await sandboxOf(n)
      const ms = Date.now() - t0
      await check(sbx, ms)
      await sbx.kill()
    })
  }
})
