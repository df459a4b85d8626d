// A sandbox killed under a request: the official SDK's call must fail soon,
// with an error, never hang or succeed (issue 11 #4). run.sh then fails the
// suite if the server logged a panic while serving these.

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Sandbox } from 'e2b'
import { createSandbox, sleep, trackCleanup } from './helpers.mjs'

trackCleanup()

/** p's outcome, {ok, value} or {ok: false, error}, handled from the start
 * (a call that fails while the test awaits the kill is not "unhandled"). */
const outcome = (p) => p.then((value) => ({ ok: true, value }), (error) => ({ ok: false, error }))

/** The outcome o within ms of now, or fail. */
async function settle(o, ms, what) {
  let timer
  const timeout = new Promise((_, rej) => { timer = setTimeout(() => rej(new Error(`${what}: no answer within ${ms} ms of the kill`)), ms) })
  try {
    return await Promise.race([o, timeout])
  } finally {
    clearTimeout(timer)
  }
}

describe('sandbox killed under a request', { concurrency: true }, () => {
  test('commands.run streaming output rejects with the sandbox-gone message', async () => {
    const sbx = await createSandbox({ metadata: { file: 'teardown', case: 'stream' } })
    let first
    const seen = new Promise((r) => { first = r })
    const run = outcome(sbx.commands.run('while :; do echo tick; sleep 0.05; done', { onStdout: () => first(), timeoutMs: 60_000 }))
    await seen
    await Sandbox.kill(sbx.sandboxId)
    const got = await settle(run, 10_000, 'commands.run')
    assert.equal(got.ok, false, 'commands.run of a killed sandbox resolved')
    // The proxy ends the Connect stream with its own error message.
    assert.match(String(got.error?.message), /stopped answering: it was killed/, `error: ${got.error}`)
  })

  test('files.write of a large file rejects', async () => {
    const sbx = await createSandbox({ metadata: { file: 'teardown', case: 'upload' } })
    const write = outcome(sbx.files.write('/tmp/big', new Uint8Array(512 << 20)))
    await sleep(300)
    await Sandbox.kill(sbx.sandboxId)
    const got = await settle(write, 20_000, 'files.write')
    assert.equal(got.ok, false, 'files.write of 512 MiB to a sandbox killed 300 ms in resolved')
    // The proxy's 502 for a sandbox gone, as the SDK words it.
    assert.match(String(got.error?.message), /sandbox was not found/i, `error: ${got.error}`)
  })

  test('files.read of a large file as a stream fails mid-way', async () => {
    const sbx = await createSandbox({ metadata: { file: 'teardown', case: 'download' } })
    // Large, so that the transfer is still under way when the kill lands:
    // Node's fetch reads the socket ahead of a paused reader, and on a
    // quick moment a smaller file arrived whole before the kill (seen).
    await sbx.commands.run('head -c 768M /dev/zero > /tmp/big')
    const stream = await sbx.files.read('/tmp/big', { format: 'stream' })
    const reader = stream.getReader()
    let n = 0
    while (n < (1 << 20)) {
      const { value, done } = await reader.read()
      assert.ok(!done, 'download ended before 1 MiB')
      n += value.length
    }
    await Sandbox.kill(sbx.sandboxId)
    // Not reading meanwhile holds the transfer at what the buffers take.
    // The kill's answer may come before its processes are gone on a loaded
    // host; draining at once could then fetch the whole file from a dying
    // envd (seen: 256 MiB in full while other files built templates).
    await sleep(2000)
    const drain = outcome((async () => {
      for (;;) {
        const { value, done } = await reader.read()
        if (done) return n
        n += value.length
      }
    })())
    const got = await settle(drain, 10_000, 'files.read stream')
    assert.ok(!got.ok || got.value < (768 << 20), `the download of a killed sandbox ended cleanly after ${got.value} bytes of 768 MiB`)
  })
})
