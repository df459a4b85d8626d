// R in the code interpreter through the unmodified npm @e2b/code-interpreter SDK,
// against code-interpreter-v1 (IRkernel). The expected shapes are those of E2B's
// own R tests: a visible value is a result whose text is R's printout (`[1] "x"`),
// print() is stdout, an error is named "ERROR".

import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'
import { meta, track, trackCleanup } from './helpers.mjs'

trackCleanup()

const R = { language: 'r' }

// The text of the one result a cell gave, as E2B's tests read it.
function resultText(r) {
  assert.equal(r.error, undefined, JSON.stringify(r.error))
  assert.equal(r.results.length, 1, `results: ${JSON.stringify(r.results.map((x) => x.formats()))}`)
  return r.results[0].text.trim()
}

let sbx

describe('code interpreter: R', { concurrency: false }, () => {
  before(async () => {
    sbx = await Sandbox.create('code-interpreter-v1', { metadata: meta({ file: 'code-interpreter-r' }) })
    track(sbx.sandboxId)
  })

  test('print() is stdout, as in E2B', async () => {
    const r = await sbx.runCode('print("Hello, World!")', R)
    assert.deepEqual(r.logs.stdout, ['[1] "Hello, World!"\n'])
    assert.deepEqual(r.results, [])
    assert.equal(r.error, undefined)
  })

  test('state persists across runs; a visible value is a result', async () => {
    const first = await sbx.runCode('x <- 40', R)
    assert.deepEqual(first.results, [])
    const r = await sbx.runCode('x + 2', R)
    assert.equal(resultText(r), '[1] 42')
    assert.ok(r.executionCount >= 2, `executionCount ${r.executionCount}`)
  })

  test('stderr: message(), cat to stderr() and a child process', async () => {
    const out = []
    const err = []
    const r = await sbx.runCode(
      'message("from message", appendLF = FALSE)\ncat("to stderr\\n", file = stderr())\ninvisible(system("echo from child"))',
      { ...R, onStdout: (m) => out.push(m.line), onStderr: (m) => err.push(m.line) },
    )
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    assert.equal(r.logs.stderr.join(''), 'from message\nto stderr\n')
    assert.equal(r.logs.stdout.join(''), 'from child\n')
    assert.equal(err.join(''), 'from message\nto stderr\n')
    assert.equal(out.join(''), 'from child\n')
  })

  test('an error is an E2B error with a traceback; state is kept', async () => {
    const r = await sbx.runCode('y <- 7\nstop("boom")', R)
    assert.equal(r.error?.name, 'ERROR', JSON.stringify(r.error))
    assert.match(r.error.value, /boom/)
    assert.match(r.error.traceback, /boom/)
    assert.equal(resultText(await sbx.runCode('y', R)), '[1] 7')
  })

  test('env vars apply to one execution only', async () => {
    const r = await sbx.runCode('Sys.getenv("FOO")', { ...R, envs: { FOO: 'bar' } })
    assert.equal(resultText(r), '[1] "bar"')
    const after = await sbx.runCode('Sys.getenv("FOO", unset = "default")', R)
    assert.equal(resultText(after), '[1] "default"')
    const quoted = await sbx.runCode('cat(Sys.getenv("Q"))', { ...R, envs: { Q: 'it\'s "q" $HOME\\n é' } })
    assert.equal(quoted.logs.stdout.join(''), 'it\'s "q" $HOME\\n é')
  })

  test('the default cwd is the home directory', async () => {
    assert.equal(resultText(await sbx.runCode('getwd()', R)), '[1] "/home/user"')
  })

  test('a context has its own state and cwd', async () => {
    const ctx = await sbx.createCodeContext({ language: 'r', cwd: '/tmp' })
    assert.equal(resultText(await sbx.runCode('getwd()', { context: ctx })), '[1] "/tmp"')
    await sbx.runCode('only_here <- 1', { context: ctx })
    const other = await sbx.runCode('only_here', R)
    assert.equal(other.error?.name, 'ERROR')
    assert.match(other.error.value, /only_here/)
    await sbx.removeCodeContext(ctx.id)
  })

  test('a plot is a png result', async () => {
    const r = await sbx.runCode('plot(1:10)', R)
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    const pngs = r.results.filter((x) => x.png)
    assert.equal(pngs.length, 1, `results: ${JSON.stringify(r.results.map((x) => x.formats()))}`)
    assert.equal(Buffer.from(pngs[0].png, 'base64').subarray(1, 4).toString(), 'PNG')
  })

  test('a data.frame comes back as html, markdown and text', async () => {
    const r = await sbx.runCode('data.frame(a = 1:2, b = c("x", "y"))', R)
    const [res] = r.results
    assert.equal(r.results.length, 1)
    assert.ok(res.html?.includes('<table'), res.html)
    assert.ok(res.markdown?.includes('| a'), res.markdown)
    assert.match(res.text, /a b\n1 1 x\n2 2 y/)
  })

  test('a timeout interrupts the code and the context keeps its state', async () => {
    await sbx.runCode('survivor <- "still here"', R)
    await assert.rejects(sbx.runCode('Sys.sleep(30)', { ...R, timeoutMs: 1500 }))
    const started = Date.now()
    assert.equal(resultText(await sbx.runCode('survivor', R)), '[1] "still here"')
    assert.ok(Date.now() - started < 10_000, `next run took ${Date.now() - started} ms`)
  })
})

describe("code interpreter: R sees the sandbox's env vars", () => {
  test('a sandbox env var, overridden for one execution', async () => {
    const s = await Sandbox.create('code-interpreter-v1', {
      envs: { TEST_ENV_VAR: 'supertest' },
      metadata: meta({ file: 'code-interpreter-r' }),
    })
    track(s.sandboxId)
    try {
      assert.equal(resultText(await s.runCode('Sys.getenv("TEST_ENV_VAR")', R)), '[1] "supertest"')
      const over = await s.runCode('Sys.getenv("TEST_ENV_VAR")', { ...R, envs: { TEST_ENV_VAR: 'overwrite' } })
      assert.equal(resultText(over), '[1] "overwrite"')
      assert.equal(resultText(await s.runCode('Sys.getenv("TEST_ENV_VAR")', R)), '[1] "supertest"')
    } finally {
      await s.kill()
    }
  })
})
