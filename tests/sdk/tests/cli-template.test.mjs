// The official E2B CLI (npm @e2b/cli, pinned in package.json) run as a child
// process against Airlock: `template create` from a Dockerfile (with start and
// ready commands, CPU and memory), `template list` (table and JSON),
// `template delete`, a failing RUN, a wrong API key, and `sandbox list`,
// `sandbox exec` and `sandbox kill` on a sandbox of the built template.
//
// How the CLI reaches Airlock: it carries its own copy of the JS SDK, whose
// connection settings read E2B_API_URL and E2B_SANDBOX_URL from the
// environment before falling back to https://api.<E2B_DOMAIN>, so the same
// three variables run.sh exports for the SDK (E2B_API_URL, E2B_SANDBOX_URL,
// E2B_API_KEY) point it at the test server. These commands need no
// E2B_ACCESS_TOKEN (only `auth` and the team commands use one). Besides them
// the child gets an empty HOME, so a developer's `e2b auth login`
// (~/.e2b/config.json) cannot leak into the run, NO_UPDATE_NOTIFIER so it
// never asks registry.npmjs.org for a newer version, and NO_COLOR so its
// output is plain text to match.
//
// Not covered: `template create --no-cache`. The CLI declares it as commander's
// negatable `--no-cache` (which sets opts.cache = false) but reads
// opts.noCache, so the flag never reaches the build; the SDK's skipCache() is
// tested in template-build.test.mjs.
//
// Every template built here is deleted at the end.

import assert from 'node:assert/strict'
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { Sandbox, Template } from 'e2b'
import { meta, runCLI, showRun, track, trackCleanup, trackTemplates, uniq } from './helpers.mjs'

trackCleanup()


const work = mkdtempSync(join(tmpdir(), 'airlock-cli-'))
after(() => rmSync(work, { recursive: true, force: true }))
const home = join(work, 'home')
mkdirSync(home)

const built = trackTemplates()

/** Run the CLI with args in cwd (see helpers.mjs' runCLI). */
const e2b = (args, { cwd = work, env = {}, timeoutMs = 100_000 } = {}) => runCLI(args, { home, cwd, env, timeoutMs })

const show = showRun

/** A build context: a directory with e2b.Dockerfile (the name the CLI looks for first) and files. */
function context(dockerfile, files = {}) {
  const dir = mkdtempSync(join(work, 'ctx-'))
  writeFileSync(join(dir, 'e2b.Dockerfile'), dockerfile)
  for (const [path, body] of Object.entries(files)) {
    mkdirSync(join(dir, path, '..'), { recursive: true })
    writeFileSync(join(dir, path), body)
  }
  return dir
}

async function sh(sbx, cmd) {
  const r = await sbx.commands.run(cmd)
  return r.stdout.trim()
}

describe('e2b CLI: template create / list / delete', { concurrency: false }, () => {
  const name = uniq('cli')
  const nonce = uniq('n')
  // e2bdev/base is what E2B's own Dockerfiles start from; Airlock serves it
  // as its built-in base template.
  const dir = context(
    [
      'FROM e2bdev/base',
      `RUN echo "run-step-output ${nonce}" && echo "${nonce}" > /opt/run-marker`,
      'COPY greeting.txt /opt/app/greeting.txt',
      'COPY conf/ /opt/app/conf/',
      // No quoted value with spaces: the SDK's Dockerfile parser (in the
      // client, before anything reaches the server) splits it at the spaces.
      'ENV CLI_GREETING=hello-from-env CLI_LEVEL=3',
      'WORKDIR /opt/app',
      '',
    ].join('\n'),
    // Contents unique to this run, so that both uploads really happen (the
    // server keeps uploaded files by hash across runs).
    { 'greeting.txt': `greeting ${nonce}\n`, 'conf/a.ini': `a=${nonce}\n`, 'conf/deep/b.ini': 'b=2\n' },
  )
  let sandboxId

  test('template create builds the Dockerfile, printing the build logs', async () => {
    built.add(name)
    const r = await e2b(
      [
        'template', 'create', name,
        '--cmd', 'echo started > /tmp/start-marker && sleep infinity',
        '--ready-cmd', 'test -f /tmp/start-marker',
        '--cpu-count', '1',
        '--memory-mb', '768',
      ],
      { cwd: dir },
    )
    assert.equal(r.code, 0, show(r))
    assert.match(r.stdout, /Found \.\/e2b\.Dockerfile/, show(r))
    // The files went up through Airlock's upload URL, and the RUN step's own
    // output came back through the build's log polling.
    assert.match(r.stdout, /Uploaded 'greeting\.txt'/, show(r))
    assert.match(r.stdout, /Uploaded 'conf\/'/, show(r))
    assert.match(r.stdout, new RegExp(`INFO\\s+run-step-output ${nonce}`), show(r))
    assert.match(r.stdout, new RegExp(`Building sandbox template ${name}[^\\n]* finished`), show(r))
    assert.equal(await Template.exists(name), true)
  })

  test('a sandbox of the template sees every step, the start command, CPU and memory', async () => {
    const sbx = await Sandbox.create(name, { metadata: meta({ cli: name }) })
    sandboxId = track(sbx.sandboxId)
    assert.equal(await sh(sbx, 'cat /opt/run-marker'), nonce)
    assert.equal(await sh(sbx, 'cat /opt/app/greeting.txt'), `greeting ${nonce}`)
    assert.equal(await sh(sbx, 'cat /opt/app/conf/a.ini /opt/app/conf/deep/b.ini'), `a=${nonce}\nb=2`)
    assert.equal(await sh(sbx, 'echo "$CLI_GREETING/$CLI_LEVEL"'), 'hello-from-env/3')
    assert.equal(await sh(sbx, 'pwd'), '/opt/app')
    assert.equal(await sh(sbx, 'cat /tmp/start-marker'), 'started')
    const info = await sbx.getInfo()
    assert.equal(info.cpuCount, 1, JSON.stringify(info))
    assert.equal(info.memoryMB, 768, JSON.stringify(info))
  })

  test('template create again with nothing changed: no upload, every step cached', async () => {
    const r = await e2b(['template', 'create', name, '--cpu-count', '1', '--memory-mb', '768'], { cwd: dir })
    assert.equal(r.code, 0, show(r))
    assert.match(r.stdout, /Skipping upload of 'greeting\.txt', already cached/, show(r))
    assert.doesNotMatch(r.stdout, /INFO\s+run-step-output/, `the RUN step ran again:\n${show(r)}`)
    assert.match(r.stdout, /(\d+) layers, \1 from cache/, show(r))
  })

  test('template list shows it, as a table and as JSON', async () => {
    const table = await e2b(['template', 'list'])
    assert.equal(table.code, 0, show(table))
    const row = table.stdout.split('\n').find((l) => l.split(/\s+/).includes(name))
    assert.ok(row, `no row for ${name}:\n${show(table)}`)
    assert.match(row, /\b1\s+768\b/, `vCPUs and RAM of ${name}: ${row}`)

    const json = await e2b(['template', 'list', '--format', 'json'])
    assert.equal(json.code, 0, show(json))
    const list = JSON.parse(json.stdout)
    const t = list.find((x) => x.aliases.includes(name))
    assert.ok(t, `${name} not in ${json.stdout}`)
    assert.equal(t.cpuCount, 1)
    assert.equal(t.memoryMB, 768)
    assert.equal(t.buildStatus, 'ready')
    assert.ok(list.some((x) => x.aliases.includes('base')), 'the built-in base is listed too')
  })

  test('sandbox list, exec and kill reach the sandbox', async () => {
    assert.ok(sandboxId, 'the sandbox test did not run')
    const list = await e2b(['sandbox', 'list', '--format', 'json', '--template', name])
    assert.equal(list.code, 0, show(list))
    const sbs = JSON.parse(list.stdout)
    const s = sbs.find((x) => x.sandboxId === sandboxId)
    assert.ok(s, `${sandboxId} not in ${list.stdout}`)
    assert.equal(s.state, 'running')
    assert.equal(s.cpuCount, 1)

    const exec = await e2b(['sandbox', 'exec', sandboxId, '--', 'cat', '/opt/run-marker'])
    assert.equal(exec.code, 0, show(exec))
    assert.equal(exec.stdout.trim(), nonce)

    const kill = await e2b(['sandbox', 'kill', sandboxId])
    assert.equal(kill.code, 0, show(kill))
    assert.match(kill.stdout, /has been killed/, show(kill))
    const left = await Sandbox.list({ query: { metadata: { cli: name } } }).nextItems()
    assert.deepEqual(left.map((x) => x.sandboxId), [], 'killed sandbox still listed')
  })

  test('template delete -y removes it; a second delete fails with 404', async () => {
    const r = await e2b(['template', 'delete', name, '-y'])
    assert.equal(r.code, 0, show(r))
    assert.equal(await Template.exists(name), false)
    const list = await e2b(['template', 'list', '--format', 'json'])
    assert.equal(list.code, 0, show(list))
    assert.ok(!JSON.parse(list.stdout).some((x) => x.aliases.includes(name)), `${name} still listed`)

    const again = await e2b(['template', 'delete', name, '-y'])
    assert.notEqual(again.code, 0, show(again))
    assert.match(again.all, /404/, show(again))
    assert.match(again.all, new RegExp(name), show(again))
  })
})

describe('e2b CLI: errors', { concurrency: true }, () => {
  test('a failing RUN: non-zero exit, the exit code and the step output shown, no template left', async () => {
    const name = uniq('clifail')
    built.add(name)
    const dir = context('FROM e2bdev/base\nRUN echo "before the failure" && echo "on stderr" >&2 && exit 7\n')
    const r = await e2b(['template', 'create', name], { cwd: dir })
    assert.notEqual(r.code, 0, show(r))
    assert.match(r.stderr, /Template build failed/, show(r))
    assert.match(r.stderr, /exited with code 7/, show(r))
    assert.match(r.stderr, /before the failure/, show(r))
    assert.match(r.stderr, /on stderr/, show(r))
    assert.equal(await Template.exists(name), false)
  })

  test('a Dockerfile whose base nobody serves: non-zero exit naming the image', async () => {
    const name = uniq('clinoimg')
    built.add(name)
    // A registry on a loopback port nothing listens on: fails at once, offline.
    const dir = context('FROM 127.0.0.1:9/nobody/nothing:1\nRUN true\n')
    const r = await e2b(['template', 'create', name], { cwd: dir })
    assert.notEqual(r.code, 0, show(r))
    assert.match(r.stderr, /127\.0\.0\.1:9\/nobody\/nothing:1/, show(r))
    assert.equal(await Template.exists(name), false)
  })

  test('a wrong API key: template list exits non-zero with the 401', async () => {
    const r = await e2b(['template', 'list'], { env: { E2B_API_KEY: 'e2b_' + '0'.repeat(40) } })
    assert.notEqual(r.code, 0, show(r))
    assert.match(r.all, /401/, show(r))
  })
})
