// commands.* through the official SDK (process.Process Connect RPCs).

import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'
import { CommandExitError, NotFoundError, TimeoutError } from 'e2b'
import { createSandbox, rejectsWith, trackCleanup, uniq, waitFor } from './helpers.mjs'

trackCleanup()

let sbx

describe('commands', { concurrency: true }, () => {
  before(async () => {
    sbx = await createSandbox({ metadata: { file: 'commands' } })
  })

  test('run: stdout, stderr and exitCode', async () => {
    const r = await sbx.commands.run('echo out-line; echo err-line 1>&2; printf "no-newline"')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'out-line\nno-newline')
    assert.equal(r.stderr, 'err-line\n')
    assert.equal(r.error, undefined)
  })

  test('run: non-zero exit throws CommandExitError with exitCode and stderr', async () => {
    const err = await rejectsWith(
      sbx.commands.run('echo partial-out; echo boom-err >&2; exit 3'),
      CommandExitError,
      'exit 3',
    )
    assert.equal(err.exitCode, 3)
    assert.equal(err.stderr, 'boom-err\n')
    assert.equal(err.stdout, 'partial-out\n')
    assert.match(err.error ?? '', /exit status 3/)
  })

  test('run: envs are set for that command only', async () => {
    const r = await sbx.commands.run('echo "$MY_VAR/$OTHER"', { envs: { MY_VAR: 'value 1', OTHER: 'ö"\'' } })
    assert.equal(r.stdout, 'value 1/ö"\'\n')
    const r2 = await sbx.commands.run('echo "[${MY_VAR:-unset}]"')
    assert.equal(r2.stdout, '[unset]\n', 'request envs must not leak into later commands')
  })

  test('run: cwd, and the default cwd is the user home', async () => {
    const r = await sbx.commands.run('pwd', { cwd: '/tmp' })
    assert.equal(r.stdout, '/tmp\n')
    const d = await sbx.commands.run('pwd; echo $HOME')
    assert.equal(d.stdout, '/home/user\n/home/user\n')
    await sbx.files.makeDir('/home/user/cwd-test/sub')
    const rel = await sbx.commands.run('pwd', { cwd: '/home/user/cwd-test/sub' })
    assert.equal(rel.stdout, '/home/user/cwd-test/sub\n')
  })

  test("run: default user is 'user', user: 'root' runs as root", async () => {
    const d = await sbx.commands.run('whoami; id -u; id -g; echo $HOME')
    assert.equal(d.stdout, 'user\n1000\n1000\n/home/user\n')
    const r = await sbx.commands.run('whoami; id -u; echo $HOME; pwd', { user: 'root' })
    assert.equal(r.stdout, 'root\n0\n/root\n/root\n')
    const u = await sbx.commands.run('whoami', { user: 'user' })
    assert.equal(u.stdout, 'user\n')
  })

  test('run: passwordless sudo works for user', async () => {
    const r = await sbx.commands.run('sudo -n true && sudo -n whoami')
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'root\n')
  })

  test('run: timeoutMs on sleep 10 throws TimeoutError and kills the process', async () => {
    const t0 = Date.now()
    await rejectsWith(
      sbx.commands.run('sleep 10; echo should-not-print > /tmp/timeout-marker', { timeoutMs: 1_000 }),
      TimeoutError,
      'run(sleep 10, timeoutMs 1000)',
    )
    const elapsed = Date.now() - t0
    assert.ok(elapsed < 6_000, `TimeoutError must come soon after 1 s (took ${elapsed} ms)`)
    // The process lifetime limit kills the command: it leaves the list while its
    // `sleep 10` would still be running, so the marker line never runs (idle it
    // is gone 3-60 ms after the TimeoutError; a single look 500 ms later failed
    // once under a loaded full run).
    let list
    await waitFor(async () => {
      list = await sbx.commands.list()
      return !list.some((p) => (p.args ?? []).join(' ').includes('timeout-marker'))
    }, { timeoutMs: 5_000, what: () => `the timed-out command to end (list: ${JSON.stringify(list)})` })
  })

  test('run: onStdout/onStderr stream chunks while the command runs', async () => {
    const out = []
    const err = []
    let firstOutAt
    const t0 = Date.now()
    const r = await sbx.commands.run(
      'echo first; echo efirst >&2; sleep 1.5; for i in 1 2 3; do echo out$i; echo err$i >&2; done',
      {
        onStdout: (d) => { firstOutAt ??= Date.now(); out.push(d) },
        onStderr: (d) => err.push(d),
      },
    )
    const doneAt = Date.now()
    assert.equal(out.join(''), 'first\nout1\nout2\nout3\n')
    assert.equal(err.join(''), 'efirst\nerr1\nerr2\nerr3\n')
    assert.equal(r.stdout, out.join(''))
    assert.equal(r.stderr, err.join(''))
    assert.ok(out.length >= 2, `stdout arrived in >= 2 chunks (got ${out.length})`)
    assert.ok(
      doneAt - firstOutAt >= 1_000,
      `first stdout chunk must arrive before the sleep ends (first at +${firstOutAt - t0} ms, done at +${doneAt - t0} ms)`,
    )
  })

  test('run: background returns a handle whose wait() gives the result', async () => {
    // The command cannot end before the test lets it (it waits for a file),
    // so run() returning at all shows it returns while the command runs; no
    // wall-clock bound, which a loaded machine breaks.
    const gate = `/tmp/bg-gate-${uniq()}`
    const h = await sbx.commands.run(`while [ ! -e ${gate} ]; do sleep 0.05; done; echo bg-done; exit 0`, { background: true })
    assert.equal(typeof h.pid, 'number')
    assert.ok(h.pid > 0)
    assert.equal(h.exitCode, undefined, 'still running')
    const listed = await sbx.commands.list()
    assert.ok(listed.some((p) => p.pid === h.pid), `the background command is listed as running: ${JSON.stringify(listed)}`)
    await sbx.files.write(gate, '')
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'bg-done\n')
    assert.equal(h.exitCode, 0)
  })

  test('run: special characters', async () => {
    const s = 'äöü 日本語 "dq" \'sq\' $HOME `bt` \\ back; & | < > * ? ! # ~ {} []'
    // single-quote for bash: ' → '\''
    const q = `'${s.replace(/'/g, "'\\''")}'`
    const r = await sbx.commands.run(`printf '%s' ${q}`)
    assert.equal(r.stdout, s)
    const r2 = await sbx.commands.run('echo "!@#$%^&*()_+"')
    assert.equal(r2.stdout, '!@#$%^&*()_+\n')
  })

  test('run: multiline command', async () => {
    const r = await sbx.commands.run('x=1\necho line$x\nif [ "$x" = 1 ]; then\n  echo yes\nfi\ncat <<EOF\nheredoc $x\nEOF')
    assert.equal(r.stdout, 'line1\nyes\nheredoc 1\n')
  })

  test('run: large output arrives complete', async () => {
    const r = await sbx.commands.run('head -c 300000 /dev/zero | tr "\\0" a; echo; seq 1 20000 | tail -n 1')
    assert.equal(r.stdout.length, 300000 + 1 + 6)
    assert.ok(r.stdout.startsWith('aaaa'))
    assert.ok(r.stdout.endsWith('\n20000\n'))
  })

  test('commands.list shows a background sleep with pid and cmd', async () => {
    const tag = uniq('sleeper').replace('-', '')
    const h = await sbx.commands.run(`sleep 30 # ${tag}`, { background: true, envs: { LIST_TAG: tag }, cwd: '/tmp' })
    try {
      const list = await sbx.commands.list()
      const p = list.find((x) => x.pid === h.pid)
      assert.ok(p, `pid ${h.pid} in commands.list(): ${JSON.stringify(list)}`)
      assert.equal(p.cmd, '/bin/bash')
      assert.ok(p.args.some((a) => a.includes(`sleep 30 # ${tag}`)), `args contain the command: ${JSON.stringify(p.args)}`)
      assert.equal(p.envs.LIST_TAG, tag)
      assert.equal(p.cwd, '/tmp')
    } finally {
      await h.kill()
    }
  })

  test('commands.kill(pid): true, then the handle ends as killed and the pid is gone', async () => {
    const h = await sbx.commands.run('sleep 30', { background: true })
    assert.equal(await sbx.commands.kill(h.pid), true)
    const err = await rejectsWith(h.wait(), CommandExitError, 'wait() after kill')
    assert.notEqual(err.exitCode, 0, 'killed command has a non-zero exit code')
    assert.match(err.error ?? '', /signal: killed|killed/, `error names the signal: ${err.error}`)
    const list = await sbx.commands.list()
    assert.ok(!list.some((p) => p.pid === h.pid), 'killed pid no longer listed')
  })

  test('commands.kill of an unknown pid returns false', async () => {
    assert.equal(await sbx.commands.kill(999_999), false)
  })

  test('sendStdin to cat (stdin: true) and closeStdin ends it', async () => {
    const chunks = []
    const h = await sbx.commands.run('cat', { background: true, stdin: true, onStdout: (d) => chunks.push(d) })
    await sbx.commands.sendStdin(h.pid, 'hello stdin\n')
    await waitFor(() => chunks.join('').includes('hello stdin\n'), { what: 'cat to echo the first line' })
    await h.sendStdin(new TextEncoder().encode('second line\n'))
    await waitFor(() => chunks.join('').includes('second line\n'), { what: 'cat to echo the second line' })
    await sbx.commands.closeStdin(h.pid)
    const r = await h.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, 'hello stdin\nsecond line\n')
  })

  test('sendStdin to read: the line reaches the process', async () => {
    const h = await sbx.commands.run('read -r line; echo "got:$line"', { background: true, stdin: true })
    await h.sendStdin('a b c\n')
    const r = await h.wait()
    assert.equal(r.stdout, 'got:a b c\n')
  })

  test('closeStdin on a stdin process with no input: read gets EOF', async () => {
    const h = await sbx.commands.run('if read -r line; then echo line; else echo eof; fi', { background: true, stdin: true })
    await h.closeStdin()
    const r = await h.wait()
    assert.equal(r.stdout, 'eof\n')
  })

  test('commands.connect(pid) receives output produced after connecting', async () => {
    const marker = uniq('later')
    const h = await sbx.commands.run(`sleep 1.5; echo ${marker}; echo late-err >&2`, { background: true })
    await h.disconnect()
    const out = []
    const c = await sbx.commands.connect(h.pid, { onStdout: (d) => out.push(d) })
    assert.equal(c.pid, h.pid)
    const r = await c.wait()
    assert.equal(r.exitCode, 0)
    assert.equal(r.stdout, `${marker}\n`)
    assert.equal(r.stderr, 'late-err\n')
    assert.equal(out.join(''), `${marker}\n`)
  })

  test('commands.connect to an unknown pid throws', async () => {
    await rejectsWith(sbx.commands.connect(999_999), NotFoundError, 'commands.connect(unknown pid)')
  })
})
