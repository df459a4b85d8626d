// Bad input and authentication: error status codes and the {code, message}
// body shape (control plane), SDK error classes, envd access token checks.

import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { describe, test } from 'node:test'
import { AuthenticationError, Sandbox, SandboxNotFoundError } from 'e2b'
import {
  API_URL, TEMPLATE, api, assertErrorBody, createSandbox, envdFetch, meta, rejectsWith, track, trackCleanup,
} from './helpers.mjs'

trackCleanup()

const WRONG_KEY = `e2b_${randomBytes(20).toString('hex')}`
// Created on first use, so tests that need no sandbox still run (and report)
// when sandbox creation itself is broken.
let sbxPromise
const getSbx = () => (sbxPromise ??= createSandbox({ metadata: { file: 'errors' } }))

// If the server wrongly creates a sandbox for bad input, do not leak it.
function trackIfCreated(res) {
  if (res.json?.sandboxID) track(res.json.sandboxID)
}

describe('bad input and auth', { concurrency: true }, () => {
  test('GET /health on the API is 200 without a key', async () => {
    const res = await fetch(`${API_URL}/health`)
    assert.equal(res.status, 200)
  })

  test('unknown template → 4xx JSON {code, message} with code == status', async () => {
    for (const path of ['/v2/sandboxes', '/sandboxes']) {
      const res = await api('POST', path, {
        body: { templateID: 'no-such-template-zz9', timeout: 30, metadata: meta({ case: 'bad-template' }) },
      })
      trackIfCreated(res)
      assert.ok(res.status >= 400 && res.status < 500, `${path} unknown template: expected 4xx, got ${res.status} ${res.text}`)
      assertErrorBody(res, `${path} unknown template`)
    }
    // the SDK surfaces it as an error too
    const p = Sandbox.create('no-such-template-zz9', { metadata: meta() })
    p.then((s) => track(s.sandboxId), () => {})
    await assert.rejects(p, (e) => {
      assert.ok(!(e instanceof AuthenticationError), `unexpected ${e.constructor.name}: ${e.message}`)
      return true
    })
  })

  test('unknown sandbox: getInfo → SandboxNotFoundError; GET → 404 JSON', async () => {
    await rejectsWith(Sandbox.getInfo('nosuchsandbox000000'), SandboxNotFoundError, 'getInfo(unknown)')
    const res = await api('GET', '/sandboxes/nosuchsandbox000000')
    assert.equal(res.status, 404)
    assertErrorBody(res, 'GET /sandboxes/unknown')
    const del = await api('DELETE', '/sandboxes/nosuchsandbox000000')
    assert.equal(del.status, 404)
    assertErrorBody(del, 'DELETE /sandboxes/unknown')
  })

  test('malformed JSON body on create → 400 JSON', async () => {
    for (const path of ['/v2/sandboxes', '/sandboxes']) {
      for (const rawBody of ['{"templateID": "base",', 'not json at all', '[1,2,3]']) {
        const res = await api('POST', path, { rawBody })
        trackIfCreated(res)
        assert.equal(res.status, 400, `${path} body ${JSON.stringify(rawBody)}: expected 400, got ${res.status} ${res.text}`)
        assertErrorBody(res, `${path} malformed body`)
      }
    }
  })

  test('negative timeout → 400 JSON (create and setTimeout)', async () => {
    const sbx = await getSbx()
    for (const path of ['/v2/sandboxes', '/sandboxes']) {
      const res = await api('POST', path, {
        body: { templateID: TEMPLATE, timeout: -5, metadata: meta({ case: 'negative-timeout' }) },
      })
      trackIfCreated(res)
      assert.equal(res.status, 400, `${path} timeout -5: expected 400, got ${res.status} ${res.text}`)
      assertErrorBody(res, `${path} negative timeout`)
    }
    const t = await api('POST', `/sandboxes/${sbx.sandboxId}/timeout`, { body: { timeout: -1 } })
    assert.equal(t.status, 400, `POST /sandboxes/{id}/timeout -1: expected 400, got ${t.status} ${t.text}`)
    assertErrorBody(t, 'setTimeout negative')
    // the sandbox is unaffected
    assert.equal((await sbx.getInfo()).state, 'running')
  })

  test('wrong API key → SDK AuthenticationError and 401 JSON', async () => {
    const sbx = await getSbx()
    await rejectsWith(Sandbox.list({ apiKey: WRONG_KEY }).nextItems(), AuthenticationError, 'list with wrong key')
    await rejectsWith(Sandbox.getInfo(sbx.sandboxId, { apiKey: WRONG_KEY }), AuthenticationError, 'getInfo with wrong key')
    await rejectsWith(Sandbox.kill(sbx.sandboxId, { apiKey: WRONG_KEY }), AuthenticationError, 'kill with wrong key')
    const created = Sandbox.create(TEMPLATE, { apiKey: WRONG_KEY, metadata: meta() })
    created.then((s) => track(s.sandboxId), () => {})
    await rejectsWith(created, AuthenticationError, 'create with wrong key')
    await rejectsWith(Sandbox.connect(sbx.sandboxId, { apiKey: WRONG_KEY }), AuthenticationError, 'connect with wrong key')

    for (const key of [WRONG_KEY, null]) {
      const res = await api('GET', '/v2/sandboxes', { key })
      assert.equal(res.status, 401, `GET /v2/sandboxes with ${key ? 'wrong' : 'no'} key: ${res.status} ${res.text}`)
      assertErrorBody(res, `${key ? 'wrong' : 'missing'} API key`)
    }
    const del = await api('DELETE', `/sandboxes/${sbx.sandboxId}`, { key: WRONG_KEY })
    assert.equal(del.status, 401)
    // the sandbox survived the unauthenticated kill
    assert.equal(await sbx.isRunning(), true)
  })

  test('wrong envd access token on the sandbox URL → 401', async () => {
    const sbx = await getSbx()
    await sbx.files.write('/home/user/x', 'token-check')
    const token = sbx.envdAccessToken
    assert.equal(typeof token, 'string', 'SDK holds an envd access token (v2 create is always secure)')

    const ok = await envdFetch(sbx.sandboxId, '/files?path=x', { token })
    assert.equal(ok.status, 200, `right token: ${ok.status} ${ok.text}`)
    assert.equal(ok.text, 'token-check')

    const bad = await envdFetch(sbx.sandboxId, '/files?path=x', { token: 'wrong' })
    assert.equal(bad.status, 401, `wrong token on /files: ${bad.status} ${bad.text}`)
    assert.equal(bad.json?.code, 401, `JSON body with code 401: ${bad.text}`)
    assert.ok(!bad.text.includes('token-check'))

    // RPCs need the token too
    const rpc = await envdFetch(sbx.sandboxId, '/filesystem.Filesystem/Stat', {
      token: 'wrong',
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' },
      body: JSON.stringify({ path: '/home/user/x' }),
    })
    assert.equal(rpc.status, 401, `wrong token on Stat RPC: ${rpc.status} ${rpc.text}`)
    const none = await envdFetch(sbx.sandboxId, '/filesystem.Filesystem/Stat', {
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' },
      body: JSON.stringify({ path: '/home/user/x' }),
    })
    assert.equal(none.status, 401, `no token on Stat RPC: ${none.status} ${none.text}`)
    const good = await envdFetch(sbx.sandboxId, '/filesystem.Filesystem/Stat', {
      token,
      method: 'POST',
      headers: { 'Content-Type': 'application/json', 'Connect-Protocol-Version': '1' },
      body: JSON.stringify({ path: '/home/user/x' }),
    })
    assert.equal(good.status, 200, `right token on Stat RPC: ${good.status} ${good.text}`)
    assert.equal(good.json?.entry?.name, 'x')

    // another sandbox's token does not open this one
    const other = await createSandbox({ metadata: { case: 'other-token' } })
    const cross = await envdFetch(sbx.sandboxId, '/files?path=x', { token: other.envdAccessToken })
    assert.equal(cross.status, 401, `other sandbox's token: ${cross.status} ${cross.text}`)
  })

  test('sandbox URL: unknown sandbox id → 502 JSON, SDK isRunning false', async () => {
    const res = await envdFetch('nosuchsandbox000000', '/health')
    assert.equal(res.status, 502, `unknown sandbox on the proxy: ${res.status} ${res.text}`)
    assert.equal(res.json?.code, 502)
    assert.equal(res.json?.sandboxId, 'nosuchsandbox000000')
  })
})
