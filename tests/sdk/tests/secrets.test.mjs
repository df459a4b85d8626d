// Secrets (issue 18 item 2): the official SDK's Secret class against Airlock:
// create, getInfo by ID and by name, list page by page, exists, update (the
// version goes up, metadata is kept or replaced), destroy; names unique per
// key and validated; another API key sees none of them. Values are
// write-only: every call is repeated raw, and no answer's body or headers
// ever hold a value. (Their use at egress is tested with the network rules.)

import assert from 'node:assert/strict'
import { randomBytes } from 'node:crypto'
import { after, describe, test } from 'node:test'
import { InvalidArgumentError, Secret, SecretError, SecretNotFoundError } from 'e2b'
import { api, assertErrorBody, rejectsWith } from './helpers.mjs'

const OTHER_KEY = process.env.AIRLOCK_SDK_OTHER_KEY
assert.ok(OTHER_KEY, 'run.sh must export AIRLOCK_SDK_OTHER_KEY')

// Names are lower-cased by the server; a mixed-case one checks that.
const uniqName = (prefix) => `${prefix}-${randomBytes(4).toString('hex')}`
const newValue = () => `sv-${randomBytes(16).toString('hex')}`

const made = new Set() // [key, secretID]
const values = []
after(async () => {
  await Promise.allSettled([...made].map(([apiKey, id]) => Secret.destroy(id, { apiKey }).catch(() => false)))
})

async function newSecret(name, value, opts = {}) {
  values.push(value)
  const info = await Secret.create(name, value, opts)
  made.add([opts.apiKey, info.secretId])
  return info
}

/** No raw answer to any /secrets call holds a value sent so far. */
function assertNoValue(res, what) {
  const headers = JSON.stringify([...res.headers])
  for (const v of values) {
    assert.ok(!res.text.includes(v), `${what}: the body holds a secret's value: ${res.text}`)
    assert.ok(!headers.includes(v), `${what}: a header holds a secret's value: ${headers}`)
  }
}

/** Every raw read of what the key can see: list (all pages), get by ID and name. */
async function assertNoValueAnywhere(ids, key) {
  let token = ''
  for (;;) {
    const res = await api('GET', `/secrets?limit=2${token ? `&nextToken=${encodeURIComponent(token)}` : ''}`, { key })
    assert.equal(res.status, 200)
    assertNoValue(res, 'GET /secrets')
    token = res.headers.get('x-next-token')
    if (!token) break
  }
  for (const ref of ids) {
    const res = await api('GET', `/secrets/${encodeURIComponent(ref)}`, { key })
    assertNoValue(res, `GET /secrets/${ref}`)
  }
}

describe('secrets', () => {
  test('create, getInfo by ID and name, exists, update, destroy', async () => {
    const name = uniqName('OpenAI-Key')
    const v1 = newValue()
    const info = await newSecret(name, v1, { metadata: { team: 'ml' } })
    assert.match(info.secretId, /^sec_[0-9a-z]+$/)
    assert.equal(info.name, name.toLowerCase(), 'names come back in their canonical lower case')
    assert.equal(info.version, 1)
    assert.deepEqual(info.metadata, { team: 'ml' })
    assert.ok(info.createdAt instanceof Date && !Number.isNaN(info.createdAt.getTime()))
    assert.equal(info.updatedAt.getTime(), info.createdAt.getTime())
    assert.ok(!JSON.stringify(info).includes(v1), 'the SDK got the value back')
    assert.equal(Secret.fill(info.name), `\${e2b.secrets.${info.name}}`)

    for (const ref of [info.secretId, info.name, name, name.toUpperCase()]) {
      const got = await Secret.getInfo(ref)
      assert.equal(got.secretId, info.secretId, `getInfo(${ref})`)
      assert.equal(got.version, 1)
      assert.equal(await Secret.exists(ref), true, `exists(${ref})`)
    }
    assert.equal(await Secret.exists(uniqName('never-made')), false)
    await rejectsWith(Secret.getInfo(uniqName('never-made')), SecretNotFoundError, 'getInfo of an unknown name')
    await rejectsWith(Secret.getInfo('sec_0000000000000000'), SecretNotFoundError, 'getInfo of an unknown ID')
    await rejectsWith(Secret.update(uniqName('never-made'), 'x'), SecretNotFoundError, 'update of an unknown name')

    // Update without metadata keeps it; with metadata replaces it.
    await new Promise((r) => setTimeout(r, 5))
    const v2 = newValue()
    values.push(v2)
    let up = await Secret.update(info.name, v2)
    assert.equal(up.version, 2)
    assert.deepEqual(up.metadata, { team: 'ml' })
    assert.equal(up.createdAt.getTime(), info.createdAt.getTime())
    assert.ok(up.updatedAt > info.updatedAt, `updatedAt ${up.updatedAt.toISOString()} after ${info.updatedAt.toISOString()}`)
    const v3 = newValue()
    values.push(v3)
    up = await Secret.update(info.secretId, v3, { metadata: { env: 'prod', owner: 'me' } })
    assert.equal(up.version, 3)
    assert.deepEqual(up.metadata, { env: 'prod', owner: 'me' })
    up = await Secret.update(info.secretId, newValue(), { metadata: {} })
    assert.equal(up.version, 4)
    assert.deepEqual(up.metadata, {})
    assert.equal((await Secret.getInfo(info.secretId)).version, 4)

    // Raw: the body shape the spec gives, and no value anywhere.
    const raw = await api('GET', `/secrets/${info.secretId}`)
    assert.equal(raw.status, 200)
    assert.deepEqual(Object.keys(raw.json).sort(), ['createdAt', 'currentVersion', 'metadata', 'name', 'secretID', 'updatedAt'])
    const v5 = newValue()
    values.push(v5)
    const rawUpdate = await api('POST', `/secrets/${info.secretId}`, { body: { value: v5 } })
    assert.equal(rawUpdate.status, 200)
    assert.equal(rawUpdate.json.currentVersion, 5)
    assertNoValue(rawUpdate, 'POST /secrets/{id}')
    await assertNoValueAnywhere([info.secretId, info.name])

    assert.equal(await Secret.destroy(name.toUpperCase()), true)
    assert.equal(await Secret.destroy(info.secretId), false, 'a second destroy finds nothing')
    assert.equal(await Secret.exists(info.name), false)
    await rejectsWith(Secret.getInfo(info.secretId), SecretNotFoundError, 'getInfo of a destroyed secret')
    await rejectsWith(Secret.update(info.secretId, 'x'), SecretNotFoundError, 'update of a destroyed secret')
    const rawDelete = await api('DELETE', `/secrets/${info.secretId}`)
    assert.equal(rawDelete.status, 404)
    assertErrorBody(rawDelete, 'DELETE of a destroyed secret')
  })

  test('list: pages of a small limit, name order, every secret once', async () => {
    const prefix = `page-${randomBytes(3).toString('hex')}`
    const names = []
    for (const n of ['e', 'b', 'd', 'a', 'c']) {
      const info = await newSecret(`${prefix}-${n}`, newValue())
      names.push(info.name)
    }
    names.sort()
    const seen = []
    let pages = 0
    const p = Secret.list({ limit: 2 })
    while (p.hasNext) {
      const items = await p.nextItems()
      pages++
      assert.ok(items.length <= 2, `a page of limit 2 has ${items.length}`)
      for (const s of items) {
        assert.equal(typeof s.version, 'number')
        assert.ok(!JSON.stringify(s).match(/sv-[0-9a-f]{32}/), `a listed secret carries a value: ${JSON.stringify(s)}`)
        if (s.name.startsWith(prefix)) seen.push(s.name)
      }
    }
    assert.deepEqual(seen, names, 'each of this test\'s secrets once, in name order')
    assert.ok(pages >= 3, `5 secrets in pages of 2 took ${pages} page(s)`)

    // Raw: limit bounds a page and X-Next-Token goes on; limit is clamped.
    const first = await api('GET', '/secrets?limit=1')
    assert.equal(first.status, 200)
    assert.equal(first.json.length, 1)
    assert.ok(first.headers.get('x-next-token'), 'a next token while more remain')
    const big = await api('GET', '/secrets?limit=1000')
    assert.equal(big.status, 200)
    const bad = await api('GET', '/secrets?nextToken=not-a-token!')
    assert.equal(bad.status, 400)
    assertErrorBody(bad, 'a bad next token')
    await assertNoValueAnywhere([])
  })

  test('names: unique per key in any case, validated, sec_ reserved; values required', async () => {
    const info = await newSecret(uniqName('uniq'), newValue())
    const dup = await rejectsWith(Secret.create(info.name.toUpperCase(), 'x'), SecretError, 'a taken name')
    assert.match(dup.message, /^409: secret with name '.*' already exists/)
    for (const bad of ['has space', 'dot.name', 'slash/name', 'ünï', 'a'.repeat(129), 'sec_mine', 'SEC_x']) {
      const e = await rejectsWith(Secret.create(bad, 'x'), SecretError, `name ${JSON.stringify(bad)}`)
      assert.match(e.message, /^400: invalid secret name/, bad)
    }
    const empty = await rejectsWith(Secret.create('', 'x'), SecretError, 'an empty name')
    assert.match(empty.message, /^400: name is required/)
    assert.throws(() => Secret.fill(''), InvalidArgumentError, 'fill of an empty name')
    for (const [body, what] of [
      [{ name: uniqName('novalue') }, 'no value'],
      [{ value: 'x' }, 'no name'],
      [{ name: uniqName('n'), value: 42 }, 'a number for a value'],
    ]) {
      const res = await api('POST', '/secrets', { body })
      assert.equal(res.status, 400, what)
      assertErrorBody(res, what)
    }
    const value = newValue()
    values.push(value)
    const broken = await api('POST', '/secrets', { rawBody: `{"name":"x","value":"${value}` })
    assert.equal(broken.status, 400)
    assertErrorBody(broken, 'malformed JSON')
    assertNoValue(broken, 'malformed JSON')
    const tooBig = await api('POST', '/secrets', { body: { name: uniqName('big'), value: 'x'.repeat(65537) } })
    assert.equal(tooBig.status, 400)
    assert.match(tooBig.json.message, /at most 65536 bytes/)
    const md = Object.fromEntries(Array.from({ length: 33 }, (_, i) => [`k${i}`, 'v']))
    const e = await rejectsWith(Secret.create(uniqName('md'), 'x', { metadata: md }), SecretError, '33 metadata entries')
    assert.match(e.message, /^400: metadata has 33 entries/)
  })

  test('another API key sees none of them and may reuse the names', async () => {
    const mine = await newSecret(uniqName('mine'), newValue())
    const opts = { apiKey: OTHER_KEY }
    for (const ref of [mine.secretId, mine.name]) {
      await rejectsWith(Secret.getInfo(ref, opts), SecretNotFoundError, `another key's getInfo(${ref})`)
      assert.equal(await Secret.exists(ref, opts), false)
      await rejectsWith(Secret.update(ref, 'stolen', opts), SecretNotFoundError, `another key's update(${ref})`)
      assert.equal(await Secret.destroy(ref, opts), false, `another key's destroy(${ref})`)
    }
    const p = Secret.list({ ...opts, limit: 100 })
    while (p.hasNext) {
      assert.ok(!(await p.nextItems()).some((s) => s.secretId === mine.secretId), "another key's list")
    }
    assert.equal((await Secret.getInfo(mine.secretId)).version, 1, 'untouched for its owner')

    const theirs = await newSecret(mine.name, newValue(), opts)
    assert.notEqual(theirs.secretId, mine.secretId)
    assert.equal((await Secret.getInfo(mine.name, opts)).secretId, theirs.secretId)
    assert.equal((await Secret.getInfo(mine.name)).secretId, mine.secretId)
    await assertNoValueAnywhere([theirs.secretId, mine.name], OTHER_KEY)
    await assertNoValueAnywhere([mine.secretId, mine.name])
  })
})
