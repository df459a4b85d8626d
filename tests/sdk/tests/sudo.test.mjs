// sudo as E2B users use it, as the default user "user", through the official
// SDK. /usr/bin/sudo in a sandbox is envd's no-setuid shim (it asks envd, over
// /run/envd/sudo.sock, to run the command), so it must work whether or not the
// sandbox runs with no_new_privs.

import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'
import { CommandExitError } from 'e2b'
import { createSandbox, rejectsWith, trackCleanup, waitFor } from './helpers.mjs'

trackCleanup()

let sbx
const enc = new TextEncoder()

describe('sudo', { concurrency: true }, () => {
  before(async () => {
    sbx = await createSandbox({ metadata: { file: 'sudo' } })
  })

  test('sudo whoami is root; sudo -u user id -u is 1000; the caller is user', async () => {
    assert.equal((await sbx.commands.run('whoami')).stdout, 'user\n')
    assert.equal((await sbx.commands.run('sudo whoami')).stdout, 'root\n')
    assert.equal((await sbx.commands.run('sudo -u user id -u')).stdout, '1000\n')
    assert.equal((await sbx.commands.run('sudo sh -c \'echo $SUDO_USER $SUDO_UID\'')).stdout, 'user 1000\n')
  })

  test('/usr/bin/sudo is the shim: no setuid bit, and it works under no_new_privs', async () => {
    const mode = (await sbx.commands.run('stat -c %A /usr/bin/sudo')).stdout.trim()
    assert.ok(!/s/i.test(mode.slice(0, 10)), `sudo has a setuid/setgid bit: ${mode}`)
    assert.match((await sbx.commands.run('sudo -V')).stdout, /^Sudo version .*airlock envd/)
    // setpriv (util-linux) is in every Debian base: prove it sets no_new_privs...
    const nnp = await sbx.commands.run('setpriv --no-new-privs grep ^NoNewPrivs: /proc/self/status')
    assert.equal(nnp.stdout, 'NoNewPrivs:\t1\n')
    // ...and that sudo does not care.
    assert.equal((await sbx.commands.run('setpriv --no-new-privs sudo whoami')).stdout, 'root\n')
  })

  test('exit codes propagate', async () => {
    const err = await rejectsWith(sbx.commands.run("sudo sh -c 'exit 7'"), CommandExitError, 'sudo exit 7')
    assert.equal(err.exitCode, 7)
    const sig = await rejectsWith(sbx.commands.run("sudo sh -c 'kill -TERM $$'"), CommandExitError, 'sudo killed by TERM')
    assert.equal(sig.exitCode, 143)
    assert.equal((await sbx.commands.run('sudo -n true')).exitCode, 0)
  })

  test('stdin is piped through: echo hi | sudo tee /root/x', async () => {
    const r = await sbx.commands.run('echo hi | sudo tee /root/sudo-x')
    assert.equal(r.stdout, 'hi\n')
    assert.equal((await sbx.commands.run('sudo cat /root/sudo-x')).stdout, 'hi\n')
    assert.equal((await sbx.commands.run('sudo stat -c %U /root/sudo-x')).stdout, 'root\n')
    // and /root really is out of user's reach
    await rejectsWith(sbx.commands.run('cat /root/sudo-x'), CommandExitError, 'user reads /root')
  })

  test('environment is reset; -E keeps it', async () => {
    const envs = { SUDO_TEST_VAR: 'kept' }
    const reset = await sbx.commands.run('sudo sh -c \'echo "${SUDO_TEST_VAR:-unset} $HOME $USER"\'', { envs })
    assert.equal(reset.stdout, 'unset /root root\n')
    const kept = await sbx.commands.run('sudo -E sh -c \'echo "${SUDO_TEST_VAR:-unset} $USER"\'', { envs })
    assert.equal(kept.stdout, 'kept root\n')
  })

  test('unknown flags are a usage error (exit 1); sudo -l lists ALL', async () => {
    const err = await rejectsWith(sbx.commands.run('sudo -Z true'), CommandExitError, 'sudo -Z')
    assert.equal(err.exitCode, 1)
    assert.match(err.stderr, /usage: sudo/)
    assert.match((await sbx.commands.run('sudo -l')).stdout, /\(ALL : ALL\) NOPASSWD: ALL/)
  })

  test('sudo apt-get --version', async () => {
    const r = await sbx.commands.run('sudo apt-get --version')
    assert.match(r.stdout, /^apt /)
  })

  test('killing a running sudo through the SDK kills its command too', async () => {
    let out = ''
    const h = await sbx.commands.run("sudo sh -c 'echo $$; exec sleep 1000'", {
      background: true,
      onStdout: (d) => { out += d },
    })
    const pid = await waitFor(() => out.match(/^(\d+)\n/)?.[1], { timeoutMs: 30_000, what: () => `the command's pid (got ${JSON.stringify(out)})` })
    const alive = async () => (await sbx.commands.run(`test -e /proc/${pid} && ! grep -q '^State:.*Z' /proc/${pid}/status && echo alive || echo gone`)).stdout.trim()
    assert.equal(await alive(), 'alive')
    assert.equal(await sbx.commands.run(`ps -o user= -p ${pid}`).then((r) => r.stdout.trim()), 'root')
    assert.equal(await h.kill(), true)
    await waitFor(async () => (await alive()) === 'gone', { timeoutMs: 30_000, what: `root's sleep ${pid} to die with its sudo` })
  })

  test('pty: sudo -i is an interactive root login shell; sudo bash -c tty; ^C', async () => {
    const dec = new TextDecoder()
    let text = ''
    let ended = null
    const handle = await sbx.pty.create({
      cols: 100,
      rows: 30,
      timeoutMs: 60_000,
      onData: (d) => { text += dec.decode(d, { stream: true }) },
    })
    handle.wait().then((r) => { ended = `exited ${r.exitCode}` }, (e) => { ended = `${e.constructor.name}: ${e.message}` })
    const send = (s) => sbx.pty.sendInput(handle.pid, enc.encode(s))
    const see = (re, what) => waitFor(() => re.test(text), {
      timeoutMs: 30_000,
      what: () => `${what} (got ${JSON.stringify(text.slice(-400))}; pty ended: ${ended ?? 'no'})`,
    })
    try {
      // Arithmetic keeps the expected text out of the terminal's echo of the input.
      await send('sudo -i\n')
      await send('echo "who=$(whoami) pwd=$(pwd) size=$(stty size) r=$((20+1))"\n')
      await see(/who=root pwd=\/root size=30 100 r=21/, 'a root login shell in /root with the pty size')
      // job control works in it: a background job, then fg ^C
      await send('sleep 1000 & echo "jobs=$((1+1))"; fg\n')
      await see(/jobs=2/, 'a background job')
      await send('\x03')
      await send('echo "after-int=$((3+4))"\n')
      await see(/after-int=7/, 'the shell survives ^C of its foreground job')
      await send('exit\n')
      // Wait for the user's own prompt: typeahead sent while the root shell is
      // ending goes to its terminal and is lost, as with sudo's use_pty.
      await see(/logout[\s\S]*user@airlock/, "the user's prompt after logout")
      await send('echo "back=$(whoami)-$((5+5))"\n')
      await see(/back=user-10/, 'back to user after exit')
      await send("sudo bash -c 'tty; echo t=$((6+6))'\n")
      await see(/\/dev\/pts\/\d+\r?\n.*t=12/s, 'sudo bash -c tty prints a terminal')
      // ^C of a plain sudo command returns to the user's shell
      await send("sudo sh -c 'echo ready-$((2+3)); exec sleep 1000'\n")
      await see(/ready-5/, 'sudo sleep running')
      const before = text.length
      await send('\x03')
      // As after `exit` above: type only once the user's shell prompts again.
      await waitFor(() => /user@airlock/.test(text.slice(before)), {
        timeoutMs: 30_000,
        what: () => `the user's prompt after ^C (got ${JSON.stringify(text.slice(-300))})`,
      })
      await send('echo "code=$? x=$((8+1))"\n')
      await see(/code=130 x=9/, '^C kills sudo sleep with 130')
    } finally {
      await sbx.pty.kill(handle.pid)
    }
  })
})
