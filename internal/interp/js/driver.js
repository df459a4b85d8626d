// Airlock's JavaScript/TypeScript kernel driver (see internal/interp/node.go).
//
// Run as `node --expose-internals driver.js <marker> [typescript-module-dir]`.
// Requests arrive as JSON lines on stdin: {"id", "code", "ts", "env"}.
// Events leave as JSON lines on fd 3, tagged with the request id, so nothing the
// user's code writes to fd 1/2 can corrupt the protocol. At the end of each
// execution the marker is written to fd 1 and fd 2: the Go side knows that all
// raw output up to it belongs to the execution that just ended.
//
// Cells run in this process's global context (vm runInThisContext), so state
// persists between them. Each cell is rewritten before it runs:
//   - TypeScript is transpiled (types stripped, imports kept) by the compiler
//     passed on the command line;
//   - top-level import/export become require/plain declarations;
//   - top-level let/const/class become var, so a cell can be run again;
//   - top-level await goes through Node's own REPL rewrite.
// The value of the last expression (awaited if it is a promise) is the result.
'use strict';

const fs = require('fs');
const vm = require('vm');
const util = require('util');
const path = require('path');
const readline = require('readline');
const Module = require('module');
const { Console } = require('console');
// Node's bundled acorn and REPL await rewrite (need --expose-internals); both
// exist unchanged in Node 18 and 20.
const acorn = require('internal/deps/acorn/acorn/dist/acorn');
const { processTopLevelAwait } = require('internal/repl/await');

const EVENTS_FD = 3;
const marker = process.argv[2] || '';
const tsDir = process.argv[3] || '';

function writeAll(fd, s) {
  const buf = Buffer.from(s, 'utf8');
  let off = 0;
  while (off < buf.length) {
    try {
      off += fs.writeSync(fd, buf, off, buf.length - off);
    } catch (e) {
      if (e.code === 'EAGAIN') continue;
      throw e;
    }
  }
}

function send(obj) {
  writeAll(EVENTS_FD, JSON.stringify(obj) + '\n');
}

let ts = null;
if (tsDir) {
  try {
    ts = require(tsDir);
  } catch (e) {
    send({ t: 'fatal', message: 'cannot load the TypeScript compiler from ' + tsDir + ': ' + e.message });
    process.exit(1);
  }
}

// The execution in progress (null when idle). Output produced while idle (a
// timer firing after its cell ended) is tagged 0 and dropped by the Go side.
let current = null;
let count = 0;

function stream(name) {
  return function write(chunk, encoding, cb) {
    if (typeof encoding === 'function') { cb = encoding; encoding = undefined; }
    const text = typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8');
    if (text.length) send({ id: current ? current.id : 0, t: name, text });
    if (typeof cb === 'function') process.nextTick(cb, null);
    return true;
  };
}

// console and process.stdout/stderr write events directly and synchronously,
// so their order with results and errors is exact.
process.stdout.write = stream('stdout');
process.stderr.write = stream('stderr');
// Console wants event emitters (it listens for 'error' around each write).
const { EventEmitter } = require('events');
const sink = (name) => Object.assign(new EventEmitter(), { write: stream(name) });
globalThis.console = new Console({ stdout: sink('stdout'), stderr: sink('stderr') });

function inspect(v) {
  return typeof v === 'string' ? util.inspect(v) : util.inspect(v, { depth: 6, maxArrayLength: 200, colors: false });
}

const binaryMime = /^(image\/(png|jpeg|gif|webp)|application\/pdf)$/;

function encodeAs(mime, v) {
  if (Buffer.isBuffer(v) || v instanceof Uint8Array) {
    return binaryMime.test(mime) ? Buffer.from(v).toString('base64') : Buffer.from(v).toString('utf8');
  }
  if (mime === 'application/json' || mime === 'e2b/data' || mime === 'e2b/chart') return v;
  return typeof v === 'string' ? v : String(v);
}

// bundle turns a value into a MIME bundle: objects with toHTML/toMarkdown/
// toSVG/toLatex/toJSON-like methods give the rich forms, a plain object whose
// keys are all MIME types is taken as a bundle itself, and text/plain is the
// util.inspect form.
function bundle(v) {
  if (v && typeof v === 'object' && !Array.isArray(v)) {
    const keys = Object.keys(v);
    if (keys.length && keys.every((k) => /^[a-z0-9.+-]+\/[a-z0-9.+-]+$/i.test(k))) {
      const out = {};
      for (const k of keys) out[k] = encodeAs(k, v[k]);
      return out;
    }
  }
  const out = { 'text/plain': inspect(v) };
  if (v && (typeof v === 'object' || typeof v === 'function')) {
    const rich = [['toHTML', 'text/html'], ['toMarkdown', 'text/markdown'], ['toSVG', 'image/svg+xml'], ['toLatex', 'text/latex']];
    for (const [fn, mime] of rich) {
      if (typeof v[fn] === 'function') {
        try { out[mime] = String(v[fn]()); } catch (_) { /* keep the plain form */ }
      }
    }
  }
  return out;
}

// display(value[, mimeType]) publishes a result that is not the cell's value.
globalThis.display = function display(value, mimeType) {
  const data = mimeType ? { [mimeType]: encodeAs(mimeType, value) } : bundle(value);
  send({ id: current ? current.id : 0, t: 'result', data, main: false });
};

function refreshRequire() {
  // require resolves from the working directory, as in the Node REPL.
  globalThis.require = Module.createRequire(path.join(process.cwd(), '<repl>'));
  globalThis.__dirname = process.cwd();
}
refreshRequire();
globalThis.exports = {};
globalThis.module = { exports: globalThis.exports };

globalThis.__airlock_import = function (spec) {
  return globalThis.require(spec);
};
globalThis.__airlock_default = function (m) {
  return m && m.__esModule ? m.default : m;
};

// rewrite applies the top-level rewrites described at the top of this file by
// editing the source text at acorn's node positions.
function rewrite(src) {
  const ast = acorn.parse(src, {
    ecmaVersion: 'latest',
    sourceType: 'script',
    allowAwaitOutsideFunction: true,
    allowImportExportEverywhere: true,
    allowReturnOutsideFunction: false,
    allowHashBang: true,
  });
  const edits = []; // [start, end, text]
  let tmp = 0;
  for (const node of ast.body) {
    switch (node.type) {
      case 'ImportDeclaration': {
        const spec = JSON.stringify(node.source.value);
        if (node.specifiers.length === 0) {
          edits.push([node.start, node.end, `void __airlock_import(${spec});`]);
          break;
        }
        const m = `__airlock_m${count}_${tmp++}`;
        const parts = [`var ${m} = __airlock_import(${spec});`];
        for (const s of node.specifiers) {
          if (s.type === 'ImportNamespaceSpecifier') parts.push(`var ${s.local.name} = ${m};`);
          else if (s.type === 'ImportDefaultSpecifier') parts.push(`var ${s.local.name} = __airlock_default(${m});`);
          else {
            const imported = s.imported.type === 'Identifier' ? s.imported.name : s.imported.value;
            parts.push(`var ${s.local.name} = ${m}[${JSON.stringify(imported)}];`);
          }
        }
        edits.push([node.start, node.end, parts.join(' ')]);
        break;
      }
      case 'ExportNamedDeclaration':
        if (node.declaration) {
          edits.push([node.start, node.declaration.start, '']);
          declaration(node.declaration, edits);
        } else {
          edits.push([node.start, node.end, '']);
        }
        break;
      case 'ExportDefaultDeclaration':
        edits.push([node.start, node.declaration.start, '']);
        if (node.declaration.type === 'ClassDeclaration' && node.declaration.id) declaration(node.declaration, edits);
        break;
      case 'ExportAllDeclaration':
        edits.push([node.start, node.end, '']);
        break;
      default:
        declaration(node, edits);
    }
  }
  edits.sort((a, b) => b[0] - a[0]);
  let out = src;
  for (const [s, e, text] of edits) out = out.slice(0, s) + text + out.slice(e);
  return out;
}

function declaration(node, edits) {
  if (node.type === 'VariableDeclaration' && node.kind !== 'var') {
    edits.push([node.start, node.start + node.kind.length, 'var']);
  } else if (node.type === 'ClassDeclaration' && node.id) {
    edits.push([node.start, node.start, `var ${node.id.name} = `]);
    edits.push([node.end, node.end, ';']);
  }
}

function transpileTS(src) {
  const out = ts.transpileModule(src, {
    reportDiagnostics: true,
    fileName: 'cell.ts',
    compilerOptions: {
      // ESNext keeps import/export and top-level await for rewrite() to handle;
      // preserveValueImports keeps imports whose bindings only a later cell uses.
      module: ts.ModuleKind.ESNext,
      target: ts.ScriptTarget.ES2020,
      isolatedModules: true,
      preserveValueImports: true,
      esModuleInterop: true,
      jsx: ts.JsxEmit.React,
    },
  });
  if (out.diagnostics && out.diagnostics.length) {
    const d = out.diagnostics[0];
    const msg = ts.flattenDiagnosticMessageText(d.messageText, '\n');
    let where = '';
    if (d.file && d.start !== undefined) {
      const { line, character } = d.file.getLineAndCharacterOfPosition(d.start);
      where = ` (${line + 1}:${character + 1})`;
    }
    const err = new SyntaxError(msg + where);
    err.stack = 'SyntaxError: ' + msg + where;
    throw err;
  }
  return out.outputText.replace(/^"use strict";\s*/, '');
}

function errorEvent(id, e) {
  if (e instanceof Error || (e && typeof e === 'object' && 'stack' in e && 'message' in e)) {
    let stack = String(e.stack || '');
    // Drop the driver's own frames and Node internals below the cell.
    stack = stack.split('\n').filter((l) => !(l.includes(__filename) || /\(node:|at node:/.test(l))).join('\n');
    return { id, t: 'error', name: String(e.name || 'Error'), value: String(e.message || ''), traceback: stack };
  }
  return { id, t: 'error', name: 'Error', value: inspect(e), traceback: 'Uncaught ' + inspect(e) };
}

async function execute(req) {
  const id = req.id;
  count++;
  const exec = { id, interrupted: false, abort: null };
  const aborted = new Promise((_, reject) => {
    exec.abort = () => {
      const e = new Error('Execution interrupted');
      e.name = 'KeyboardInterrupt';
      reject(e);
    };
  });
  aborted.catch(() => {});
  current = exec;
  const saved = {};
  for (const [k, v] of Object.entries(req.env || {})) {
    saved[k] = Object.prototype.hasOwnProperty.call(process.env, k) ? process.env[k] : undefined;
    process.env[k] = v;
  }
  try {
    let src = String(req.code);
    if (req.ts) {
      if (!ts) throw new Error('TypeScript is not available in this kernel');
      src = transpileTS(src);
    }
    let js;
    try {
      js = rewrite(src);
    } catch (e) {
      if (e instanceof SyntaxError && e.loc) {
        const line = src.split('\n')[e.loc.line - 1] || '';
        e.stack = `<cell-${count}>:${e.loc.line}\n${line}\n${' '.repeat(e.loc.column)}^\n\nSyntaxError: ${e.message}`;
      }
      throw e;
    }
    // A trailing "// comment" would swallow the closing of the await wrapper.
    const wrapped = processTopLevelAwait(js + '\n');
    const script = new vm.Script(wrapped || js, { filename: `<cell-${count}>` });
    if (exec.interrupted) exec.abort();
    let value = script.runInThisContext({ breakOnSigint: true, displayErrors: false });
    if (wrapped) {
      const r = await Promise.race([value, aborted]);
      value = r ? r.value : undefined;
    }
    if (value && typeof value.then === 'function') value = await Promise.race([value, aborted]);
    if (value !== undefined) send({ id, t: 'result', data: bundle(value), main: true });
  } catch (e) {
    send(errorEvent(id, e));
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
    if (process.cwd() !== globalThis.__dirname) refreshRequire();
    current = null;
    // Raw output written to fd 1/2 before this point belongs to this execution.
    for (const fd of [1, 2]) {
      try { writeAll(fd, marker); } catch (_) { /* fd closed by the user */ }
    }
    send({ id, t: 'done', count });
  }
}

// SIGINT interrupts: a synchronous cell is stopped by breakOnSigint (which
// disables this handler while the script runs); an awaiting cell is abandoned
// here (its pending work stays, as in a REPL), and idle SIGINTs are ignored.
process.on('SIGINT', () => {
  if (current) {
    current.interrupted = true;
    current.abort();
  }
});

// Errors from callbacks that outlive their cell must not kill the kernel.
function report(e) {
  if (process.env.AIRLOCK_DRIVER_DEBUG) fs.writeSync(2, String(e && e.stack) + "\n");
  const ev = errorEvent(0, e);
  send({ id: current ? current.id : 0, t: 'stderr', text: (ev.traceback || ev.name + ': ' + ev.value) + '\n' });
}
process.on('uncaughtException', report);
process.on('unhandledRejection', report);

const queue = [];
let running = false;
async function pump() {
  if (running) return;
  running = true;
  while (queue.length) await execute(queue.shift());
  running = false;
}

const rl = readline.createInterface({ input: process.stdin, crlfDelay: Infinity });
rl.on('line', (line) => {
  if (!line.trim()) return;
  let req;
  try {
    req = JSON.parse(line);
  } catch (e) {
    send({ t: 'fatal', message: 'bad request: ' + e.message });
    return;
  }
  queue.push(req);
  pump();
});
// The Go side closing stdin means the kernel is being stopped.
rl.on('close', () => process.exit(0));

send({ t: 'ready', node: process.version, typescript: ts ? ts.version : '' });
