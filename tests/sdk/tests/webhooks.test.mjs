// Lifecycle webhooks (issue 16): the /events/webhooks API as E2B documents it,
// driven with plain fetch (the SDKs have no webhook client), and deliveries
// to a receiver on loopback (run.sh starts the server with
// --webhook-allow-private) whose every signature is checked: E2B's
// e2b-signature as its documentation computes it, and the Standard Webhooks
// signature with that specification's own verifier library.

import assert from 'node:assert/strict'
import { createHash, randomBytes } from 'node:crypto'
import http from 'node:http'
import { after, before, describe, test } from 'node:test'
import { Webhook } from 'standardwebhooks'
import { Sandbox } from 'e2b'
import { api, assertErrorBody, createSandbox, trackCleanup, uniq, waitFor } from './helpers.mjs'

trackCleanup()

const OTHER_KEY = process.env.AIRLOCK_SDK_OTHER_KEY
const ALL = [
  'sandbox.lifecycle.created',
  'sandbox.lifecycle.updated',
  'sandbox.lifecycle.paused',
  'sandbox.lifecycle.resumed',
  'sandbox.lifecycle.checkpointed',
  'sandbox.lifecycle.killed',
]

// Deliveries need the server to record lifecycle events (the events API);
// until it does, only the webhook API itself is tested.
const eventsProbe = await api('GET', '/events/sandboxes?limit=1')
const noEvents = eventsProbe.status === 404 ? 'this server records no lifecycle events yet (GET /events/sandboxes is 404)' : false

/** A receiver on loopback that checks every request's signatures. */
async function startReceiver(secret) {
  const got = []
  const bad = []
  const sw = new Webhook(secret)
  const server = http.createServer((req, res) => {
    const chunks = []
    req.on('data', (c) => chunks.push(c))
    req.on('end', () => {
      const raw = Buffer.concat(chunks).toString('utf8')
      // E2B's documented check: base64 SHA-256 of secret + body, made URL-safe, no padding.
      const expected = createHash('sha256').update(secret + raw).digest('base64')
        .replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '')
      const problems = []
      if (req.method !== 'POST') problems.push(`method ${req.method}`)
      if (req.headers['content-type'] !== 'application/json') problems.push(`content-type ${req.headers['content-type']}`)
      if (req.headers['e2b-signature'] !== expected) problems.push('e2b-signature does not verify')
      if (req.headers['e2b-signature-version'] !== 'v1') problems.push('e2b-signature-version')
      if (!req.headers['e2b-webhook-id'] || !req.headers['e2b-delivery-id']) problems.push('e2b ids missing')
      try {
        sw.verify(raw, {
          'webhook-id': req.headers['webhook-id'],
          'webhook-timestamp': req.headers['webhook-timestamp'],
          'webhook-signature': req.headers['webhook-signature'],
        })
      } catch (e) {
        problems.push(`standard webhooks: ${e.message}`)
      }
      let event
      try {
        event = JSON.parse(raw)
      } catch {
        problems.push('body is not JSON')
      }
      if (problems.length) bad.push({ problems, raw })
      else got.push({ event, headers: req.headers })
      res.writeHead(problems.length ? 400 : 200).end()
    })
  })
  await new Promise((r) => server.listen(0, '127.0.0.1', r))
  return { url: `http://127.0.0.1:${server.address().port}/hook`, got, bad, close: () => new Promise((r) => server.close(r)) }
}

const secret = () => 'whsec_' + randomBytes(24).toString('base64')

async function register(body, key) {
  const res = await api('POST', '/events/webhooks', { body, key })
  assert.equal(res.status, 201, `register: ${res.text}`)
  return res.json
}

const registered = []
after(async () => {
  for (const { id, key } of registered) await api('DELETE', `/events/webhooks/${id}`, { key }).catch(() => {})
})

describe('webhook API', () => {
  test('register, list, get, update and delete; the secret is never shown', async () => {
    const s = secret()
    const w = await register({ name: uniq('hook'), url: 'http://127.0.0.1:9/never', enabled: true, events: ALL.slice(0, 2), signatureSecret: s })
    registered.push({ id: w.id })
    assert.match(w.id, /^[0-9a-f-]{36}$/)
    assert.equal(w.enabled, true)
    assert.deepEqual(w.events, ALL.slice(0, 2))
    assert.ok(!Number.isNaN(Date.parse(w.createdAt)))
    assert.equal(typeof w.teamID, 'string')

    const one = await api('GET', `/events/webhooks/${w.id}`)
    assert.equal(one.status, 200)
    assert.deepEqual(one.json, w)
    const list = await api('GET', '/events/webhooks')
    assert.ok(list.json.some((x) => x.id === w.id))

    const patched = await api('PATCH', `/events/webhooks/${w.id}`, { body: { enabled: false, events: ['sandbox.lifecycle.killed'] } })
    assert.equal(patched.status, 200, patched.text)
    assert.equal(patched.json.enabled, false)
    assert.deepEqual(patched.json.events, ['sandbox.lifecycle.killed'])
    assert.equal(patched.json.url, w.url, 'fields a PATCH does not name stay')

    for (const res of [one, list, patched]) assert.ok(!res.text.includes(s) && !res.text.includes('signatureSecret'), `secret shown: ${res.text}`)

    const del = await api('DELETE', `/events/webhooks/${w.id}`)
    assert.equal(del.status, 200)
    const gone = await api('GET', `/events/webhooks/${w.id}`)
    assert.equal(gone.status, 404)
    assertErrorBody(gone, 'get after delete')
  })

  test("one key cannot see or change another key's webhook", async () => {
    const w = await register({ name: 'mine', url: 'http://127.0.0.1:9/x', events: ALL, signatureSecret: secret() })
    registered.push({ id: w.id })
    for (const [method, body, suffix = ''] of [['GET'], ['PATCH', { enabled: false }], ['DELETE'], ['GET', undefined, '/deliveries']]) {
      const res = await api(method, `/events/webhooks/${w.id}${suffix}`, { body, key: OTHER_KEY })
      assert.equal(res.status, 404, `${method} with the other key: ${res.text}`)
      assertErrorBody(res, `${method} with the other key`)
    }
    const theirs = await api('GET', '/events/webhooks', { key: OTHER_KEY })
    assert.ok(!theirs.json.some((x) => x.id === w.id), 'the other key lists it')
    assert.equal((await api('GET', `/events/webhooks/${w.id}`)).json.enabled, true, 'unchanged by the other key')
  })

  test('bad input is a 400 that says what is wrong', async () => {
    const good = { name: 'x', url: 'http://127.0.0.1:9/x', events: ALL, signatureSecret: 's' }
    for (const [change, want] of [
      [{ url: undefined }, /url is required/],
      [{ url: 'ftp://127.0.0.1/x' }, /must start with http:\/\/ or https:\/\//],
      [{ url: 'not a url' }, /must start with http/],
      [{ events: ['sandbox.lifecycle.exploded'] }, /unknown event type "sandbox.lifecycle.exploded"/],
      [{ events: [] }, /at least one event type/],
      [{ signatureSecret: undefined }, /signatureSecret is required/],
      [{ name: 'n'.repeat(500) }, /name is longer than/],
      [{ enabled: 'yes' }, /"enabled" must be a boolean/],
    ]) {
      const res = await api('POST', '/events/webhooks', { body: { ...good, ...change } })
      assert.equal(res.status, 400, `${JSON.stringify(change)}: ${res.text}`)
      assertErrorBody(res, JSON.stringify(change))
      assert.match(res.json.message, want)
    }
    const res = await api('GET', '/events/webhooks/nope')
    assert.equal(res.status, 400)
    assert.match(res.json.message, /must be a UUID/)
  })
})

describe('webhook deliveries', { skip: noEvents }, () => {
  let mine, theirs
  before(async () => {
    const s = secret()
    mine = await startReceiver(s)
    mine.webhook = await register({ name: 'flow', url: mine.url, enabled: true, events: ALL, signatureSecret: s })
    registered.push({ id: mine.webhook.id })
    const t = secret()
    theirs = await startReceiver(t)
    theirs.webhook = await register({ name: 'other', url: theirs.url, events: ALL, signatureSecret: t }, OTHER_KEY)
    registered.push({ id: theirs.webhook.id, key: OTHER_KEY })
  })
  after(async () => {
    await mine?.close()
    await theirs?.close()
  })

  test('every event of create → timeout → network → pause → resume → snapshot → kill arrives, signed, in order', async () => {
    const sbx = await createSandbox({ metadata: { purpose: 'webhooks' } })
    const id = sbx.sandboxId
    await sbx.setTimeout(120_000)
    await sbx.updateNetwork({ allowOut: [], denyOut: ['10.0.0.0/8'], allowInternetAccess: true })
    assert.equal(await sbx.pause(), true)
    await sbx.connect()
    const snap = await sbx.createSnapshot()
    try {
      await sbx.kill()
      const forSbx = () => mine.got.filter((g) => g.event.sandboxId === id)
      await waitFor(() => forSbx().some((g) => g.event.type === 'sandbox.lifecycle.killed'), {
        timeoutMs: 30_000, what: () => `the killed event (got ${forSbx().map((g) => g.event.type)})`,
      })
      assert.deepEqual(mine.bad, [], 'requests whose signature or shape did not verify')

      // Exactly the events the server recorded, in the order it recorded them.
      const recorded = await api('GET', `/events/sandboxes/${id}?orderAsc=true&limit=100`)
      assert.equal(recorded.status, 200, recorded.text)
      const events = forSbx().map((g) => g.event)
      assert.deepEqual(events.map((e) => e.id), recorded.json.map((e) => e.id), 'deliveries = recorded events, in order')
      assert.deepEqual(events, recorded.json, 'a delivery carries the event as the events API shows it')

      const types = events.map((e) => e.type)
      const want = ['created', 'updated', 'updated', 'paused', 'resumed', 'checkpointed', 'killed'].map((t) => `sandbox.lifecycle.${t}`)
      let at = -1
      for (const t of want) {
        const next = types.indexOf(t, at + 1)
        assert.ok(next > at, `${t} after position ${at} in ${types}`)
        at = next
      }
      for (const e of events) {
        assert.equal(e.version, 'v1')
        assert.equal(e.sandboxId, id)
        assert.equal(typeof e.sandboxTeamId, 'string')
        assert.ok(!Number.isNaN(Date.parse(e.timestamp)))
      }
      for (const g of forSbx()) assert.equal(g.headers['e2b-webhook-id'], mine.webhook.id)

      const ds = await api('GET', `/events/webhooks/${mine.webhook.id}/deliveries?limit=100`)
      assert.equal(ds.status, 200, ds.text)
      const mineDs = ds.json.filter((d) => d.sandboxId === id)
      assert.equal(mineDs.length, events.length)
      for (const d of mineDs) {
        assert.equal(d.status, 'delivered', JSON.stringify(d))
        assert.equal(d.attempts.length, 1)
        assert.equal(d.attempts[0].httpStatus, 200)
      }
      assert.equal(theirs.got.filter((g) => g.event.sandboxId === id).length, 0, "another key's webhook got this key's events")
    } finally {
      await Sandbox.deleteSnapshot(snap.snapshotId).catch(() => {})
    }
  })
})
