// Shared helpers for the Airlock SDK conformance suite.
//
// Every test file runs in its own Node process (node --test), so the
// sandbox tracker below is per file: each file kills what it created in an
// `after` hook (see `trackCleanup`).

import assert from 'node:assert/strict'
import { spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { existsSync } from 'node:fs'
import http from 'node:http'
import { after } from 'node:test'
import { fileURLToPath } from 'node:url'
import { Sandbox } from 'e2b'

export const API_URL = mustEnv('E2B_API_URL').replace(/\/+$/, '')
export const SANDBOX_URL = mustEnv('E2B_SANDBOX_URL').replace(/\/+$/, '')
export const API_KEY = mustEnv('E2B_API_KEY')

// One id per suite run (run.sh exports it so that all files share it; when a
// file is run by hand it gets its own).
export const RUN_ID = process.env.AIRLOCK_SDK_RUN_ID || `sdk-${randomBytes(4).toString('hex')}`

export const TEMPLATE = 'base'

function mustEnv(name) {
  const v = process.env[name]
  if (!v) {
    throw new Error(`${name} must be set (use tests/sdk/run.sh, which starts airlock serve and sets it)`)
  }
  return v
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms))

export const uniq = (prefix = 'x') => `${prefix}-${randomBytes(4).toString('hex')}`

// Metadata every sandbox of this run carries, plus optional extra keys.
export const meta = (extra = {}) => ({ suite: RUN_ID, ...extra })

const created = new Set()

/** Remember a sandbox id so the file's `after` hook kills it. */
export function track(id) {
  created.add(id)
  return id
}

/** Create a sandbox (template base, suite metadata) and track it for cleanup. */
export async function createSandbox(opts = {}) {
  const { metadata, ...rest } = opts
  const sbx = await Sandbox.create(TEMPLATE, { ...rest, metadata: meta(metadata) })
  track(sbx.sandboxId)
  return sbx
}

/** Kill everything this file created. Call once at module top level. */
export function trackCleanup() {
  after(async () => {
    await Promise.allSettled(
      [...created].map((id) => Sandbox.kill(id).catch(() => false)),
    )
    created.clear()
  })
}

/** Plain fetch against the control plane with the API key. */
export async function api(method, path, { body, rawBody, key = API_KEY, headers = {} } = {}) {
  const h = { ...headers }
  if (key !== null) h['X-API-KEY'] = key
  let payload
  if (rawBody !== undefined) {
    payload = rawBody
    h['Content-Type'] ??= 'application/json'
  } else if (body !== undefined) {
    payload = JSON.stringify(body)
    h['Content-Type'] = 'application/json'
  }
  const res = await fetch(API_URL + path, { method, headers: h, body: payload })
  const text = await res.text()
  let json
  try {
    json = text ? JSON.parse(text) : undefined
  } catch {
    json = undefined
  }
  return { status: res.status, headers: res.headers, text, json }
}

/** Assert the E2B error body shape: JSON {code, message} with code == status. */
export function assertErrorBody(res, what) {
  const ctx = `${what}: status ${res.status}, body ${JSON.stringify(res.text)}`
  assert.ok(res.json && typeof res.json === 'object', `${ctx}: body is not a JSON object`)
  assert.equal(res.json.code, res.status, `${ctx}: body.code must equal the HTTP status`)
  assert.equal(typeof res.json.message, 'string', `${ctx}: body.message must be a string`)
  assert.ok(res.json.message.length > 0, `${ctx}: body.message must not be empty`)
}

/** Poll `fn` until it returns a truthy value or `timeoutMs` passes. `what` may be a function (evaluated on failure). */
export async function waitFor(fn, { timeoutMs = 10_000, intervalMs = 100, what = 'condition' } = {}) {
  const deadline = Date.now() + timeoutMs
  let last
  for (;;) {
    try {
      last = await fn()
      if (last) return last
    } catch (e) {
      last = e
    }
    if (Date.now() > deadline) {
      const desc = typeof what === 'function' ? what() : what
      throw new Error(`timed out after ${timeoutMs} ms waiting for ${desc} (last: ${last instanceof Error ? last.message : JSON.stringify(last)})`)
    }
    await sleep(intervalMs)
  }
}

/** Assert `p` rejects with an instance of `Cls`; returns the error. */
export async function rejectsWith(p, Cls, what) {
  let err
  try {
    const v = await p
    assert.fail(`${what}: expected ${Cls.name}, but it resolved with ${safeJson(v)}`)
  } catch (e) {
    if (e instanceof assert.AssertionError) throw e
    err = e
  }
  assert.ok(
    err instanceof Cls,
    `${what}: expected ${Cls.name}, got ${err?.constructor?.name}: ${err?.message}`,
  )
  return err
}

export function safeJson(v) {
  try {
    return JSON.stringify(v)?.slice(0, 500)
  } catch {
    return String(v)
  }
}

/** The sandbox's envd access token (set by create/connect; the SDK signs URLs with it). */
export function accessToken(sbx) {
  return sbx.envdAccessToken
}

/** Fetch on the sandbox listener with the E2B routing headers. */
export async function envdFetch(sandboxId, path, { token, method = 'GET', headers = {}, body } = {}) {
  const h = {
    'E2b-Sandbox-Id': sandboxId,
    'E2b-Sandbox-Port': '49983',
    ...headers,
  }
  if (token !== undefined) h['X-Access-Token'] = token
  const res = await fetch(SANDBOX_URL + path, { method, headers: h, body })
  const buf = new Uint8Array(await res.arrayBuffer())
  const text = new TextDecoder().decode(buf)
  let json
  try {
    json = JSON.parse(text)
  } catch {
    json = undefined
  }
  return { status: res.status, headers: res.headers, text, json, bytes: buf }
}

/** GET / through the sandbox proxy with the given Host header (fetch may not set Host; node:http does). */
export function proxyGet(host, headers = {}) {
  const u = new URL(SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request(
      { hostname: u.hostname, port: u.port, path: '/', method: 'GET', headers: { ...headers, host } },
      (res) => {
        let body = ''
        res.setEncoding('utf8')
        res.on('data', (c) => { body += c })
        res.on('end', () => resolve({ status: res.statusCode, body }))
      },
    )
    req.on('error', reject)
    req.setTimeout(30_000, () => req.destroy(new Error('timeout')))
    req.end()
  })
}

/** Start python3 -m http.server on port in /tmp and wait until the proxy reaches it. */
export async function startHTTPServer(sbx, port) {
  await sbx.commands.run(`cd /tmp && python3 -m http.server ${port}`, { background: true })
  await waitFor(async () => (await proxyGet(sbx.getHost(port))).status === 200, {
    timeoutMs: 15_000, what: `http.server on ${port} through the proxy`,
  })
}

/**
 * How the server holds a paused sandbox, read from its data dir: 'memory'
 * when a complete checkpoint of its processes is on disk (the RAM went back
 * to the host), 'files' when only its files are kept.
 */
export function pausedAs(sandboxId) {
  const dir = process.env.AIRLOCK_DATA_DIR
  assert.ok(dir, 'AIRLOCK_DATA_DIR is not set (tests/sdk/run.sh sets it)')
  return existsSync(`${dir}/paused/${sandboxId}/complete`) ? 'memory' : 'files'
}

/** The official CLI (npm @e2b/cli) of this suite. */
export const E2B_CLI = fileURLToPath(new URL('../node_modules/.bin/e2b', import.meta.url))

/**
 * Run the official CLI with args against the test server; resolve with its
 * exit code and output (never reject on a non-zero exit: the tests look at
 * it). `home` is the CLI's HOME: an empty dir of the test's, so that nobody's
 * `e2b auth login` leaks in. NO_UPDATE_NOTIFIER keeps it off the npm
 * registry; colours are off so output can be matched. A CLI that hangs is
 * killed after timeoutMs and fails the test.
 */
export function runCLI(args, { home, cwd, env = {}, timeoutMs = 100_000 }) {
  return new Promise((resolve, reject) => {
    const child = spawn(E2B_CLI, args, {
      cwd,
      env: {
        PATH: process.env.PATH,
        HOME: home,
        E2B_API_URL: process.env.E2B_API_URL,
        E2B_SANDBOX_URL: process.env.E2B_SANDBOX_URL,
        E2B_API_KEY: process.env.E2B_API_KEY,
        NO_UPDATE_NOTIFIER: '1',
        NO_COLOR: '1',
        FORCE_COLOR: '0',
        ...env,
      },
      stdio: ['ignore', 'pipe', 'pipe'],
    })
    let stdout = ''
    let stderr = ''
    child.stdout.on('data', (d) => (stdout += d))
    child.stderr.on('data', (d) => (stderr += d))
    const timer = setTimeout(() => {
      child.kill('SIGKILL')
      reject(new Error(`e2b ${args.join(' ')}: no exit after ${timeoutMs} ms\nstdout:\n${stdout}\nstderr:\n${stderr}`))
    }, timeoutMs)
    child.on('error', (err) => {
      clearTimeout(timer)
      reject(err)
    })
    child.on('close', (code, signal) => {
      clearTimeout(timer)
      resolve({ code, signal, stdout, stderr, all: `${stdout}\n${stderr}` })
    })
  })
}

/** A CLI run as text, for assertion messages. */
export const showRun = (r) => `exit ${r.code}\n--- stdout\n${r.stdout}\n--- stderr\n${r.stderr}`

/**
 * The templates a file builds: returns a Set to add their names to; the
 * file's `after` hook deletes each (gone already is fine). Call once at
 * module top level.
 */
export function trackTemplates() {
  const built = new Set()
  after(async () => {
    for (const name of built) {
      const res = await api('DELETE', `/templates/${name}`)
      assert.ok([204, 404].includes(res.status), `delete ${name}: ${res.status} ${res.text}`)
    }
  })
  return built
}
