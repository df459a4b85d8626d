// Sandboxes that persist, through the official SDK: pause to disk with the
// processes and memory (resume brings them back as they were) or with the
// filesystem alone (resume boots afresh on it), connect's 200/201, the
// lifecycle that pauses a sandbox at its timeout instead of killing it, and
// auto-resume on traffic through the proxy.

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { Sandbox, InvalidArgumentError } from 'e2b'
import { Sandbox as CodeInterpreter } from '@e2b/code-interpreter'
import { api, createSandbox, meta, pausedAs, proxyGet, startHTTPServer, TEMPLATE, track, trackCleanup, waitFor } from './helpers.mjs'

trackCleanup()

const sh = async (sbx, cmd) => {
  const r = await sbx.commands.run(cmd)
  return r.stdout.trim()
}

describe('pause and resume', { concurrency: true }, () => {
  test('with memory: a counter, a shell variable, open files and the cwd come back', async () => {
    const sbx = await createSandbox({ envs: { KEPT: 'from-create' } })
    // A background loop holding a file open (fd 3) in a working directory of
    // its own, counting in memory.
    await sbx.commands.run(
      'mkdir -p /tmp/work && cd /tmp/work && exec 3>held.txt && n=0 && while :; do n=$((n+1)); echo $n > /tmp/work/count; echo $n >&3; sleep 0.1; done',
      { background: true },
    )
    await waitFor(async () => Number(await sh(sbx, 'cat /tmp/work/count 2>/dev/null || echo 0')) > 3, { what: 'counter running' })
    const pid = await sh(sbx, "pgrep -f 'while :' | head -1")
    const boot = await sh(sbx, 'cat /proc/sys/kernel/random/boot_id')
    assert.equal(await sbx.pause(), true)
    assert.equal(pausedAs(sbx.sandboxId), 'memory', 'the processes and memory went to disk, not frozen in place')
    assert.equal(await sbx.isRunning(), false)
    assert.equal((await sbx.getInfo()).state, 'paused')
    const listed = await Sandbox.list({ query: { state: ['paused'], metadata: meta() } }).nextItems()
    assert.ok(listed.some((s) => s.sandboxId === sbx.sandboxId), 'the paused sandbox is listed as paused')

    const res = await api('POST', `/sandboxes/${sbx.sandboxId}/connect`, { body: { timeout: 120 } })
    assert.equal(res.status, 201, `connect resumes a paused sandbox: ${res.text}`)
    assert.equal(res.json.envdAccessToken, sbx.envdAccessToken, 'the access token is unchanged')
    const again = await api('POST', `/sandboxes/${sbx.sandboxId}/connect`, { body: { timeout: 120 } })
    assert.equal(again.status, 200, 'connect to a running sandbox')

    assert.equal(await sbx.isRunning(), true)
    const before = Number(await sh(sbx, 'cat /tmp/work/count'))
    await waitFor(async () => Number(await sh(sbx, 'cat /tmp/work/count')) > before + 2, { what: 'the counter continues after resume' })
    assert.equal(await sh(sbx, `cat /proc/${pid}/cmdline | tr '\\0' ' ' | grep -c 'while'`), '1', 'same process, same pid')
    assert.equal(await sh(sbx, `readlink /proc/${pid}/cwd`), '/tmp/work', 'cwd intact')
    assert.equal(await sh(sbx, `readlink /proc/${pid}/fd/3`), '/tmp/work/held.txt', 'open file intact')
    assert.equal(await sh(sbx, 'echo $KEPT'), 'from-create', 'env vars of the sandbox kept')
    assert.equal(await sh(sbx, 'cat /proc/sys/kernel/random/boot_id'), boot, 'a resume with memory is not a boot')
  })

  test('with memory: a background command stays listed and connectable, a server answers through the proxy', async () => {
    const sbx = await createSandbox()
    const sleeper = await sbx.commands.run('sleep 3600', { background: true })
    await startHTTPServer(sbx, 8000)
    await sbx.pause()
    assert.equal((await proxyGet(sbx.getHost(8000))).status, 502, 'a paused sandbox without auto-resume does not answer')
    await sbx.connect()
    const list = await sbx.commands.list()
    assert.ok(list.some((c) => c.pid === sleeper.pid), 'the background command is still there')
    const h = await sbx.commands.connect(sleeper.pid)
    assert.equal(h.pid, sleeper.pid)
    await h.kill()
    await waitFor(async () => (await proxyGet(sbx.getHost(8000))).status === 200, { timeoutMs: 15_000, what: 'server on 8000 after resume' })
  })

  test('with memory: Python and JavaScript variables in the code interpreter keep their values', async () => {
    const sbx = await CodeInterpreter.create('code-interpreter-v1', { metadata: meta({ file: 'persist' }) })
    track(sbx.sandboxId)
    await sbx.runCode('kept = 41')
    await sbx.runCode('globalThis.keptJs = "from before the pause"', { language: 'js' })
    await sbx.pause()
    assert.equal(pausedAs(sbx.sandboxId), 'memory')
    await sbx.connect()
    const py = await sbx.runCode('kept + 1')
    assert.equal(py.error, undefined, py.error?.traceback)
    assert.equal(py.text, '42')
    const js = await sbx.runCode('globalThis.keptJs', { language: 'js' })
    assert.equal(js.error, undefined, js.error?.traceback)
    assert.equal(js.text, 'from before the pause')
  })

  test('without memory: processes are gone, files are kept', async () => {
    const sbx = await createSandbox()
    await sbx.files.write('/home/user/kept.txt', 'still here')
    await sbx.commands.run('sleep 3600', { background: true })
    const bootBefore = await sh(sbx, 'cat /proc/sys/kernel/random/boot_id')
    await sbx.pause({ keepMemory: false })
    assert.equal((await sbx.getInfo()).state, 'paused')
    assert.equal(pausedAs(sbx.sandboxId), 'files')
    await sbx.connect()
    assert.equal(await sbx.files.read('/home/user/kept.txt'), 'still here')
    assert.equal(await sh(sbx, 'pgrep -x sleep || echo none'), 'none', 'processes did not survive')
    const bootAfter = await sh(sbx, 'cat /proc/sys/kernel/random/boot_id')
    assert.match(bootAfter, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/)
    assert.notEqual(bootAfter, bootBefore, 'a resume without memory is a boot: a new boot id')
    const r = await sbx.commands.run('echo $E2B_SANDBOX_ID')
    assert.equal(r.stdout.trim(), sbx.sandboxId)
  })

  test('pausing a paused sandbox is a 409 (SDK: false), an unknown one a 404', async () => {
    const sbx = await createSandbox()
    assert.equal(await sbx.pause(), true)
    assert.equal(await sbx.pause(), false, 'second pause reports already paused')
    const res = await api('POST', `/sandboxes/${sbx.sandboxId}/pause`, { body: {} })
    assert.equal(res.status, 409)
    assert.match(res.json.message, /already paused/)
    assert.equal((await api('POST', '/sandboxes/nosuchsandbox0000/pause', { body: {} })).status, 404)
    await sbx.connect()
    assert.equal((await sbx.getInfo()).state, 'running')
  })
})

describe('lifecycle', { concurrency: true }, () => {
  test('onTimeout pause: paused at the timeout, lifecycle reported, connect wakes it', async () => {
    const sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 3_000, metadata: meta(), lifecycle: { onTimeout: 'pause', autoResume: false } })
    track(sbx.sandboxId)
    const info = await sbx.getInfo()
    assert.deepEqual(info.lifecycle, { onTimeout: 'pause', autoResume: false })
    await sbx.files.write('/tmp/marker', 'm')
    await waitFor(async () => (await sbx.getInfo()).state === 'paused', { timeoutMs: 30_000, what: 'paused at timeout' })
    // Without auto-resume, traffic does not wake it.
    assert.equal((await proxyGet(sbx.getHost(8000))).status, 502)
    assert.equal((await sbx.getInfo()).state, 'paused')
    await sbx.connect({ timeoutMs: 60_000 })
    assert.equal((await sbx.getInfo()).state, 'running')
    assert.equal(await sbx.files.read('/tmp/marker'), 'm')
    // The setting persists across the cycle.
    assert.deepEqual((await sbx.getInfo()).lifecycle, { onTimeout: 'pause', autoResume: false })
  })

  test('autoResume: a request through the proxy resumes the paused sandbox and succeeds', async () => {
    const sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 60_000, metadata: meta(), lifecycle: { onTimeout: 'pause', autoResume: true } })
    track(sbx.sandboxId)
    await startHTTPServer(sbx, 8000)
    await sbx.setTimeout(1_000)
    await waitFor(async () => (await sbx.getInfo()).state === 'paused', { timeoutMs: 30_000, what: 'paused at timeout' })
    const res = await proxyGet(sbx.getHost(8000))
    assert.equal(res.status, 200, 'the request that woke it succeeded')
    assert.equal((await sbx.getInfo()).state, 'running')
    // An envd call from the SDK wakes it too.
    await sbx.setTimeout(1_000)
    await waitFor(async () => (await sbx.getInfo()).state === 'paused', { timeoutMs: 30_000, what: 'paused again' })
    assert.equal(await sh(sbx, 'echo awake'), 'awake')
  })

  test('onTimeout pause without memory: connect cold-boots, files kept', async () => {
    const sbx = await Sandbox.create(TEMPLATE, { timeoutMs: 3_000, metadata: meta(), lifecycle: { onTimeout: { action: 'pause', keepMemory: false } } })
    track(sbx.sandboxId)
    await sbx.files.write('/home/user/m.txt', 'kept')
    await waitFor(async () => (await sbx.getInfo()).state === 'paused', { timeoutMs: 30_000, what: 'paused at timeout' })
    await sbx.connect()
    assert.equal(await sbx.files.read('/home/user/m.txt'), 'kept')
  })

  test('invalid lifecycles are refused by the SDK and by the API', async () => {
    await assert.rejects(
      Sandbox.create(TEMPLATE, { lifecycle: { onTimeout: { action: 'pause', keepMemory: false }, autoResume: true } }),
      InvalidArgumentError,
    )
    const res = await api('POST', '/sandboxes', { body: { templateID: TEMPLATE, autoPause: true, autoPauseMemory: false, autoResume: { enabled: true } } })
    assert.equal(res.status, 400)
    assert.match(res.json.message, /autoResume/)
    const res2 = await api('POST', '/sandboxes', { body: { templateID: TEMPLATE, autoResume: { enabled: true } } })
    assert.equal(res2.status, 400)
  })
})

