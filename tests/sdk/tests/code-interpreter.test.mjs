// The code interpreter through the unmodified npm @e2b/code-interpreter SDK
// (port 49999: /execute, /contexts), against the code-interpreter-v1 template.

import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'
import { Sandbox } from '@e2b/code-interpreter'
import { meta, track, trackCleanup } from './helpers.mjs'

trackCleanup()

let sbx

describe('code interpreter', { concurrency: false }, () => {
  before(async () => {
    sbx = await Sandbox.create('code-interpreter-v1', { metadata: meta({ file: 'code-interpreter' }) })
    track(sbx.sandboxId)
  })

  test('python: state persists across runs; the last expression is the main result', async () => {
    await sbx.runCode('x = 40')
    const r = await sbx.runCode('x + 2')
    assert.equal(r.text, '42')
    assert.equal(r.results.length, 1)
    assert.equal(r.results[0].isMainResult, true)
    assert.equal(r.error, undefined)
    assert.ok(r.executionCount >= 2, `executionCount ${r.executionCount}`)
  })

  test("python: a kernel sees the sandbox's memory through sysinfo and holds no CAP_SYS_PTRACE", async () => {
    const info = await sbx.getInfo()
    const r = await sbx.runCode(
      "import os\n" +
        "caps = [l.split()[1] for l in open('/proc/self/status') if l.startswith(('CapPrm', 'CapEff'))]\n" +
        "(os.sysconf('SC_PHYS_PAGES') * os.sysconf('SC_PAGE_SIZE') >> 20, [int(c, 16) >> 19 & 1 for c in caps])",
    )
    assert.equal(r.error, undefined, r.error?.traceback)
    assert.equal(r.text, `(${info.memoryMB}, [0, 0])`)
  })

  test('python: stdout and stderr, streamed to callbacks', async () => {
    const out = []
    const err = []
    const r = await sbx.runCode('import sys\nprint("hello")\nprint("oops", file=sys.stderr)', {
      onStdout: (m) => out.push(m.line),
      onStderr: (m) => err.push(m.line),
    })
    assert.deepEqual(r.logs.stdout, ['hello\n'])
    assert.deepEqual(r.logs.stderr, ['oops\n'])
    assert.deepEqual(out, ['hello\n'])
    assert.deepEqual(err, ['oops\n'])
  })

  test('python: an exception comes back as error with a traceback; state is kept', async () => {
    const r = await sbx.runCode('y = 7\n1 / 0')
    assert.equal(r.error.name, 'ZeroDivisionError')
    assert.match(r.error.value, /division by zero/)
    assert.match(r.error.traceback, /ZeroDivisionError/)
    assert.equal((await sbx.runCode('y')).text, '7')
  })

  test('python: a matplotlib plot is one png with chart data', async () => {
    const r = await sbx.runCode(`
import matplotlib.pyplot as plt
plt.figure()
plt.plot([1, 2, 3], [1, 4, 9], label="squares")
plt.title("Squares")
plt.xlabel("n")
plt.ylabel("n^2")
plt.show()
`)
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    const pngs = r.results.filter((x) => x.png)
    assert.equal(pngs.length, 1, `results: ${JSON.stringify(r.results.map((x) => x.formats()))}`)
    assert.ok(Buffer.from(pngs[0].png, 'base64').subarray(1, 4).toString() === 'PNG')
    const chart = pngs[0].chart
    assert.ok(chart, 'chart data')
    assert.equal(chart.type, 'line')
    assert.equal(chart.title, 'Squares')
    assert.equal(chart.x_label, 'n')
    assert.equal(chart.y_label, 'n^2')
    assert.equal(chart.elements.length, 1)
    assert.deepEqual(chart.elements[0].points.map(([x, y]) => [Number(x), Number(y)]), [[1, 1], [2, 4], [3, 9]])
  })

  test('python: bar chart data', async () => {
    const r = await sbx.runCode(`
import matplotlib.pyplot as plt
plt.figure()
plt.bar(["a", "b", "c"], [3, 5, 2])
plt.title("Bars")
plt.show()
`)
    const chart = r.results.find((x) => x.chart)?.chart
    assert.ok(chart, JSON.stringify(r.results.map((x) => x.formats())))
    assert.equal(chart.type, 'bar')
    assert.deepEqual(chart.elements.map((e) => [e.label, Number(e.value)]), [['a', 3], ['b', 5], ['c', 2]])
  })

  test('python: a pandas DataFrame comes back as html, text and its columns as data', async () => {
    const r = await sbx.runCode('import pandas as pd\npd.DataFrame({"a": [1, 2, 3], "b": ["x", "y", None]})')
    const main = r.results.find((x) => x.isMainResult)
    assert.ok(main.html && main.html.includes('<table'), main.html)
    assert.match(main.text, /a\s+b/)
    assert.deepEqual(main.data, { a: [1, 2, 3], b: ['x', 'y', null] })
    assert.ok(main.formats().includes('data'), main.formats().join())
  })

  test('python: every MIME type E2B maps comes back under its key, others nested under extra', async () => {
    const code = [
      'import base64',
      'class Rich:',
      '    def _repr_html_(self): return "<b>h</b>"',
      '    def _repr_markdown_(self): return "**m**"',
      '    def _repr_svg_(self): return "<svg></svg>"',
      '    def _repr_png_(self): return b"\\x89PNG"',
      '    def _repr_jpeg_(self): return b"\\xff\\xd8"',
      '    def _repr_pdf_(self): return b"%PDF-1"',
      '    def _repr_latex_(self): return "$x$"',
      '    def _repr_json_(self): return {"k": 1}',
      '    def _repr_javascript_(self): return "console.log(1)"',
      '    def _repr_mimebundle_(self, include=None, exclude=None): return {"application/x-airlock": "custom"}',
      '    def __repr__(self): return "Rich()"',
      'Rich()',
    ].join('\n')
    const r = await sbx.runCode(code)
    assert.equal(r.error, undefined, r.error?.traceback)
    const m = r.results[0]
    const b64 = (s) => Buffer.from(s, 'latin1').toString('base64')
    assert.deepEqual(
      { text: m.text, html: m.html, markdown: m.markdown, svg: m.svg, png: m.png, jpeg: m.jpeg, pdf: m.pdf, latex: m.latex, json: m.json, javascript: m.javascript },
      { text: 'Rich()', html: '<b>h</b>', markdown: '**m**', svg: '<svg></svg>', png: b64('\x89PNG'), jpeg: b64('\xff\xd8'), pdf: b64('%PDF-1'), latex: '$x$', json: { k: 1 }, javascript: 'console.log(1)' },
    )
    // Other types ride nested under extra, as E2B's server sends them: the
    // Python SDK reads that as result.extra, the JS SDK keeps it in raw.
    assert.deepEqual(m.raw.extra, { 'application/x-airlock': 'custom' })
  })

  test('python: a dict is also json; an image saved to a file is displayed', async () => {
    const r = await sbx.runCode('{"n": 1, "l": [1, 2]}')
    assert.deepEqual(r.results[0].json, { n: 1, l: [1, 2] })
    const img = await sbx.runCode("from PIL import Image\nImage.new('RGB', (8, 8), 'blue').save('/tmp/blue.png')")
    assert.equal(img.error, undefined, img.error?.traceback)
    assert.equal(img.results.length, 1)
    assert.ok(img.results[0].png, 'no png in ' + img.results[0].formats().join())
  })

  test("contexts run as root in the default user's home, as E2B's", async () => {
    const r = await sbx.runCode('import os, pathlib; (os.getuid(), str(pathlib.Path.cwd()))')
    assert.equal(r.text, "(0, '/home/user')")
    const sh = await sbx.runCode('!pwd')
    assert.equal(sh.logs.stdout.join('').trim(), '/home/user')
    const ctx = await sbx.createCodeContext({ language: 'python', cwd: '/root' })
    assert.equal(ctx.cwd, '/root')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/root')
    const listed = (await sbx.listCodeContexts()).find((c) => c.id === ctx.id)
    assert.deepEqual({ id: listed.id, language: listed.language, cwd: listed.cwd }, { id: ctx.id, language: 'python', cwd: '/root' })
    await sbx.removeCodeContext(ctx)
    for (const lang of ['javascript', 'bash']) {
      const c = await sbx.createCodeContext({ language: lang, cwd: '/root' })
      const out = await sbx.runCode(lang === 'bash' ? 'pwd' : 'process.cwd()', { context: c })
      assert.equal(lang === 'bash' ? out.logs.stdout.join('').trim() : out.text, '/root', lang)
      await sbx.removeCodeContext(c)
    }
  })

  test('a context in a directory that does not exist is a 400, and none is made', async () => {
    // The SDK shows the status; the body, which names the directory, is
    // checked in internal/interp's TestContextsAPI.
    const before = (await sbx.listCodeContexts()).length
    await assert.rejects(sbx.createCodeContext({ language: 'python', cwd: '/no/such/dir' }), /400/)
    assert.equal((await sbx.listCodeContexts()).length, before)
  })

  test('contexts are isolated from each other and from the default one', async () => {
    const ctx = await sbx.createCodeContext({ language: 'python', cwd: '/tmp' })
    assert.ok(ctx.id)
    await sbx.runCode('iso = "in ctx"', { context: ctx })
    assert.equal((await sbx.runCode('iso', { context: ctx })).text, 'in ctx')
    const other = await sbx.runCode('iso')
    assert.equal(other.error?.name, 'NameError')
    assert.equal((await sbx.runCode('import os; os.getcwd()', { context: ctx })).text, '/tmp')
    const list = await sbx.listCodeContexts()
    assert.ok(list.some((c) => c.id === ctx.id && c.language === 'python' && c.cwd === '/tmp'))
    await sbx.removeCodeContext(ctx.id)
    assert.ok(!(await sbx.listCodeContexts()).some((c) => c.id === ctx.id))
  })

  test('restart resets a context', async () => {
    const ctx = await sbx.createCodeContext({ language: 'python' })
    await sbx.runCode('kept = 1', { context: ctx })
    await sbx.restartCodeContext(ctx)
    const r = await sbx.runCode('kept', { context: ctx })
    assert.equal(r.error?.name, 'NameError')
    await sbx.removeCodeContext(ctx)
  })

  test('javascript: state, top-level await, re-declarable const', async () => {
    await sbx.runCode('const a = 20', { language: 'javascript' })
    await sbx.runCode('const a = 21', { language: 'javascript' })
    const r = await sbx.runCode('const b = await Promise.resolve(a * 2); b', { language: 'javascript' })
    assert.equal(r.text, '42')
    const logs = await sbx.runCode('console.log("from js")', { language: 'js' })
    assert.deepEqual(logs.logs.stdout, ['from js\n'])
  })

  test('typescript: types are stripped, generics work', async () => {
    const r = await sbx.runCode(
      'interface P { n: number }\nfunction twice<T extends P>(p: T): number { return p.n * 2 }\ntwice({ n: 21 })',
      { language: 'typescript' },
    )
    assert.equal(r.error, undefined, JSON.stringify(r.error))
    assert.equal(r.text, '42')
  })

  test('bash: a persistent shell per context', async () => {
    await sbx.runCode('export GREETING=hi; cd /tmp', { language: 'bash' })
    const r = await sbx.runCode('echo "$GREETING from $(pwd)"', { language: 'bash' })
    assert.deepEqual(r.logs.stdout, ['hi from /tmp\n'])
  })

  test('bash: env vars per execution, each line with its newline as E2B sends it', async () => {
    const r = await sbx.runCode('echo $FOO', { language: 'bash', envs: { FOO: 'bar' } })
    assert.equal(r.logs.stdout[0], 'bar\n')
    const after = await sbx.runCode('echo ${FOO:-default}', { language: 'bash' })
    assert.equal(after.logs.stdout[0], 'default\n')
  })

  test('env vars apply to one execution only', async () => {
    const r = await sbx.runCode('import os; os.environ.get("ONE_SHOT")', { envs: { ONE_SHOT: 'yes' } })
    assert.equal(r.text, 'yes')
    const after = await sbx.runCode('import os; str(os.environ.get("ONE_SHOT"))')
    assert.equal(after.text, 'None')
    const js = await sbx.runCode('process.env.ONE_SHOT', { language: 'javascript', envs: { ONE_SHOT: 'js' } })
    assert.equal(js.text, 'js')
  })

  test('a timeout interrupts the code and the context keeps its state', async () => {
    await sbx.runCode('survivor = "still here"')
    await assert.rejects(sbx.runCode('import time\ntime.sleep(30)', { timeoutMs: 1500 }))
    // The interrupted execution must not block the next one for long.
    const started = Date.now()
    const r = await sbx.runCode('survivor')
    assert.equal(r.text, 'still here')
    assert.ok(Date.now() - started < 10_000, `next run took ${Date.now() - started} ms`)
  })

  test('a kernel crash is an error, and the context comes back empty', async () => {
    const ctx = await sbx.createCodeContext({ language: 'python' })
    await sbx.runCode('before_crash = 1', { context: ctx })
    const r = await sbx.runCode('import os\nos._exit(3)', { context: ctx })
    assert.equal(r.error?.name, 'KernelDied', JSON.stringify(r.error))
    const again = await sbx.runCode('before_crash', { context: ctx })
    assert.equal(again.error?.name, 'NameError')
    assert.equal((await sbx.runCode('2 * 21', { context: ctx })).text, '42')
    await sbx.removeCodeContext(ctx)
  })

  test('an unknown language is a clear error', async () => {
    const r = await sbx.runCode('x', { language: 'cobol' })
    assert.equal(r.error?.name, 'UnknownLanguage')
    assert.match(r.error.value, /"cobol" is not supported; supported languages: .*python/)
  })
})

describe('code interpreter in other templates', () => {
  test('python and javascript work in base (no ipykernel: the stdlib driver)', async () => {
    const s = await Sandbox.create('base', { metadata: meta({ file: 'code-interpreter' }) })
    track(s.sandboxId)
    await s.runCode('z = 5')
    const r = await s.runCode('z * 2')
    assert.equal(r.text, '10')
    const js = await s.runCode('[1, 2, 3].map((n) => n * 2).join(",")', { language: 'javascript' })
    assert.equal(js.text, '2,4,6')
    const ts = await s.runCode('let n: number = 1', { language: 'typescript' }).catch((e) => e)
    assert.match(String(ts.error?.value ?? ts.message ?? ts), /typescript|TypeScript/)
  })
})
