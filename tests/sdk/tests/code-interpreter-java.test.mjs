// Java in the code interpreter (Airlock's JShell kernel, internal/interp/java.go)
// through the unmodified npm @e2b/code-interpreter SDK, against the
// code-interpreter-v1 template. What E2B's own suite checks of Java
// (env_vars/java, cwd, default kernels) is here, with state, errors and
// interrupts besides.

import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'
import { meta, track, trackCleanup } from './helpers.mjs'

trackCleanup()

const java = { language: 'java' }
let sbx

describe('code interpreter: java', { concurrency: false }, () => {
  before(async () => {
    sbx = await Sandbox.create('code-interpreter-v1', {
      envs: { TEST_ENV_VAR: 'supertest' },
      metadata: meta({ file: 'code-interpreter-java' }),
    })
    track(sbx.sandboxId)
  })

  test('hello world on stdout; the last expression is the main result', async () => {
    const r = await sbx.runCode('System.out.println("Hello, World!")', java)
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    assert.deepEqual(r.logs.stdout, ['Hello, World!\n'])
    assert.equal(r.results.length, 0)
    const sum = await sbx.runCode('1 + 1', java)
    assert.equal(sum.text, '2')
    assert.equal(sum.results[0].isMainResult, true)
  })

  test('state persists across cells: variables, methods, classes, imports', async () => {
    await sbx.runCode('int base = 40;', java)
    await sbx.runCode('int plus(int a, int b) { return a + b; }', java)
    await sbx.runCode('record Box(String label) { String shout() { return label.toUpperCase(); } }', java)
    await sbx.runCode('import java.util.concurrent.atomic.AtomicLong;', java)
    const r = await sbx.runCode('var n = new AtomicLong(plus(base, 2));\nnew Box("n=" + n.get()).shout()', java)
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    assert.equal(r.text, 'N=42')
  })

  test('stdout and stderr, streamed to callbacks', async () => {
    const out = []
    const err = []
    const r = await sbx.runCode('System.out.println("out line");\nSystem.err.println("err line");', {
      ...java,
      onStdout: (m) => out.push(m.line),
      onStderr: (m) => err.push(m.line),
    })
    assert.deepEqual(r.logs.stdout, ['out line\n'])
    assert.deepEqual(r.logs.stderr, ['err line\n'])
    assert.deepEqual(out, ['out line\n'])
    assert.deepEqual(err, ['err line\n'])
  })

  test('a compile error is a CompilationException pointing at the code; later snippets do not run', async () => {
    const r = await sbx.runCode('int fine = 1;\nString s = 5;\nint never = 2;', java)
    assert.equal(r.error?.name, 'CompilationException', JSON.stringify(r.error))
    assert.equal(r.error.value, 'incompatible types: int cannot be converted to java.lang.String')
    assert.match(r.error.traceback, /String s = 5;\n {11}\^/)
    assert.equal((await sbx.runCode('fine', java)).text, '1')
    assert.equal((await sbx.runCode('never', java)).error?.name, 'CompilationException')
  })

  test('an uncaught exception is named by its class, with a stack trace; state is kept', async () => {
    await sbx.runCode('String keep = "kept";', java)
    const r = await sbx.runCode('int ratio(int a) { return 10 / a; }\nratio(0)', java)
    assert.equal(r.error?.name, 'java.lang.ArithmeticException', JSON.stringify(r.error))
    assert.equal(r.error.value, '/ by zero')
    assert.match(r.error.traceback, /^java\.lang\.ArithmeticException: \/ by zero\n\tat ratio \(#\d+:1\)/)
    assert.equal((await sbx.runCode('keep', java)).text, 'kept')
  })

  test("the sandbox's env vars are system properties", async () => {
    const r = await sbx.runCode('System.getProperty("TEST_ENV_VAR")', java)
    assert.equal(r.text, 'supertest')
  })

  test('env vars per execution, then restored', async () => {
    const r = await sbx.runCode('System.getProperty("FOO")', { ...java, envs: { FOO: 'bar' } })
    assert.equal(r.text, 'bar')
    const empty = await sbx.runCode('System.getProperty("FOO", "default")', java)
    assert.equal(empty.text, 'default')
    const over = await sbx.runCode('System.getProperty("TEST_ENV_VAR") + " " + System.getenv("TEST_ENV_VAR")', {
      ...java,
      envs: { TEST_ENV_VAR: 'overwrite' },
    })
    assert.equal(over.text, 'overwrite overwrite')
    const back = await sbx.runCode('System.getProperty("TEST_ENV_VAR")', java)
    assert.equal(back.text, 'supertest')
  })

  test('cwd is /home/user, or the context\'s', async () => {
    assert.equal((await sbx.runCode('System.getProperty("user.dir")', java)).text, '/home/user')
    const ctx = await sbx.createCodeContext({ language: 'java', cwd: '/tmp' })
    assert.equal((await sbx.runCode('System.getProperty("user.dir")', { context: ctx })).text, '/tmp')
    // Contexts do not share state.
    assert.equal((await sbx.runCode('keep', { context: ctx })).error?.name, 'CompilationException')
    await sbx.removeCodeContext(ctx)
  })

  test('a timeout interrupts the cell and the context keeps its state', async () => {
    await sbx.runCode('String survivor = "still here";', java)
    await assert.rejects(sbx.runCode('Thread.sleep(60_000);', { ...java, timeoutMs: 1500 }))
    const started = Date.now()
    const r = await sbx.runCode('survivor', java)
    assert.equal(r.text, 'still here')
    assert.ok(Date.now() - started < 10_000, `next run took ${Date.now() - started} ms`)
  })

  test('System.exit kills the kernel; the context comes back empty', async () => {
    const ctx = await sbx.createCodeContext({ language: 'java' })
    await sbx.runCode('int beforeExit = 1;', { context: ctx })
    const r = await sbx.runCode('System.exit(3);', { context: ctx })
    assert.equal(r.error?.name, 'KernelDied', JSON.stringify(r.error))
    assert.equal((await sbx.runCode('beforeExit', { context: ctx })).error?.name, 'CompilationException')
    assert.equal((await sbx.runCode('6 * 7', { context: ctx })).text, '42')
    await sbx.removeCodeContext(ctx)
  })
})

describe('code interpreter: java elsewhere', () => {
  test('a template without a JDK says java is unavailable', async () => {
    const s = await Sandbox.create('base', { metadata: meta({ file: 'code-interpreter-java' }) })
    track(s.sandboxId)
    const r = await s.runCode('1 + 1', java).catch((e) => e)
    assert.match(String(r.error?.value ?? r.message ?? r), /java/)
  })
})
