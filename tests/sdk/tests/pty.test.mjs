// pty.* through the official SDK.

import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'
import { createSandbox, trackCleanup, waitFor } from './helpers.mjs'

trackCleanup()

let sbx
const enc = new TextEncoder()

// Start a PTY and collect its output as text.
async function openPty(size = { cols: 80, rows: 24 }, extra = {}) {
  const dec = new TextDecoder()
  const out = { text: '', ended: null }
  const handle = await sbx.pty.create({
    ...size,
    timeoutMs: 60_000,
    onData: (d) => { out.text += dec.decode(d, { stream: true }) },
    ...extra,
  })
  // Record how the stream ended, so a timeout below can say why output stopped.
  handle.wait().then(
    (r) => { out.ended = `exited ${r.exitCode}` },
    (e) => { out.ended = `${e.constructor.name}: ${e.message}` },
  )
  return { handle, out, send: (s) => sbx.pty.sendInput(handle.pid, enc.encode(s)) }
}

describe('pty', { concurrency: true }, () => {
  before(async () => {
    sbx = await createSandbox({ metadata: { file: 'pty' } })
  })

  test('pty.create + sendInput: the command output shows up in onData', async () => {
    const { handle, out, send } = await openPty()
    try {
      assert.ok(handle.pid > 0)
      // $((40+2)) keeps the expected text out of the terminal's echo of the input
      await send('echo hi; echo pty-$((40+2))\n')
      await waitFor(() => /(^|[\r\n])hi\r?\n/.test(out.text) && out.text.includes('pty-42'), {
        what: () => `'hi' and 'pty-42' in pty output (got ${JSON.stringify(out.text.slice(-300))}; stream ended: ${out.ended ?? 'no'})`,
      })
      // it is a real terminal
      await send('tty; echo "term=$TERM"\n')
      await waitFor(() => /\/dev\/pts\/\d+/.test(out.text) && out.text.includes('term=xterm-256color'), {
        what: () => `tty + TERM in pty output (got ${JSON.stringify(out.text.slice(-300))}; stream ended: ${out.ended ?? 'no'})`,
      })
      // default user
      await send('echo "who=$(whoami)"\n')
      await waitFor(() => out.text.includes('who=user'), { what: () => `who=user (stream ended: ${out.ended ?? 'no'})` })
    } finally {
      await sbx.pty.kill(handle.pid)
    }
  })

  test('pty.resize changes the terminal size (stty size)', async () => {
    const { handle, out, send } = await openPty({ cols: 80, rows: 24 })
    try {
      await send('stty size\n')
      await waitFor(() => out.text.includes('24 80'), { what: () => `initial size '24 80' (got ${JSON.stringify(out.text.slice(-200))}; stream ended: ${out.ended ?? 'no'})` })
      await sbx.pty.resize(handle.pid, { cols: 132, rows: 43 })
      await send('stty size\n')
      await waitFor(() => out.text.includes('43 132'), { what: () => `resized '43 132' (got ${JSON.stringify(out.text.slice(-200))}; stream ended: ${out.ended ?? 'no'})` })
    } finally {
      await sbx.pty.kill(handle.pid)
    }
  })

  test('pty.kill ends the pty: true, wait() ends, pid gone from commands.list', async () => {
    const { handle } = await openPty()
    const listed = await sbx.commands.list()
    assert.ok(listed.some((p) => p.pid === handle.pid), 'pty listed while running')
    assert.equal(await sbx.pty.kill(handle.pid), true)
    // a killed pty ends with a non-zero (signal) result: wait() rejects
    await assert.rejects(handle.wait(), (e) => {
      assert.notEqual(e.exitCode, 0, `killed pty exit code: ${e.message}`)
      return true
    })
    const list = await sbx.commands.list()
    assert.ok(!list.some((p) => p.pid === handle.pid), 'killed pty no longer listed')
  })

  test('pty exits by itself on `exit`', async () => {
    const { handle, send } = await openPty()
    await send('exit 0\n')
    const r = await handle.wait()
    assert.equal(r.exitCode, 0)
  })

  test('pty.create with cwd, envs and user root', async () => {
    const { handle, out, send } = await openPty({ cols: 80, rows: 24 }, { cwd: '/tmp', envs: { PTY_VAR: 'pv1' }, user: 'root' })
    try {
      await send('echo "$(pwd)|$PTY_VAR|$(whoami)|done"\n')
      await waitFor(() => out.text.includes('/tmp|pv1|root|done'), { what: () => `cwd/env/user in pty (got ${JSON.stringify(out.text.slice(-300))}; stream ended: ${out.ended ?? 'no'})` })
    } finally {
      await sbx.pty.kill(handle.pid)
    }
  })
})
