// Who may see, use and change a template built through the E2B API, driven
// by the unmodified SDK with two API keys of one server (run.sh starts it
// with both): a template is its builder's key's; another key neither sees,
// uses, rebuilds, builds from, changes nor deletes it until the owner makes
// it public, and then only uses it. And the per-key bounds on builds: a
// build over the bound (run.sh's --builds-per-key) is refused with 429 naming it; a build can be
// cancelled, and deleting its template stops a running build.

import assert from 'node:assert/strict'
import { after, describe, test } from 'node:test'
import { Sandbox, Template } from 'e2b'
import { api, assertErrorBody, meta, track, trackCleanup, uniq, waitFor } from './helpers.mjs'

trackCleanup()

const OTHER = process.env.AIRLOCK_SDK_OTHER_KEY
if (!OTHER) throw new Error('AIRLOCK_SDK_OTHER_KEY must be set (use tests/sdk/run.sh)')

const built = []
after(async () => {
  for (const [name, key] of built) {
    const res = await api('DELETE', `/templates/${name}`, { key })
    assert.ok([204, 404].includes(res.status), `delete ${name}: ${res.status} ${res.text}`)
  }
})

async function fails(p, what) {
  try {
    await p
  } catch (e) {
    return e
  }
  assert.fail(`${what}: expected an error`)
}

describe('template ownership', { concurrency: false }, () => {
  const name = uniq('acc')
  built.push([name, undefined])

  test("another key's private template is not there for it", async () => {
    await Template.build(Template().fromTemplate('base').runCmd('echo built-by-owner > /owner.txt', { user: 'root' }), name)
    assert.equal(await Template.exists(name), true)
    assert.equal(await Template.exists(name, { apiKey: OTHER }), false)

    const e = await fails(Sandbox.create(name, { apiKey: OTHER, metadata: meta() }), 'create from another key\'s template')
    assert.match(e.message, /not found/i)

    const list = await api('GET', '/templates', { key: OTHER })
    assert.equal(list.status, 200)
    assert.ok(!list.json.some((t) => t.templateID === name || t.aliases.includes(name)), 'listed for the other key')
    assert.ok(list.json.some((t) => t.templateID === 'base' || t.aliases.includes('base')), 'built-ins are listed for every key')
    const get = await api('GET', `/templates/${name}`, { key: OTHER })
    assert.equal(get.status, 404, get.text)
    assertErrorBody(get, 'get another key\'s template')

    // It cannot take the name, nor build from the template.
    const taken = await fails(Template.build(Template().fromTemplate('base'), name, { apiKey: OTHER }), 'rebuild another key\'s name')
    assert.match(taken.message, /belongs to another API key/)
    const from = await fails(Template.build(Template().fromTemplate(name), uniq('acc-from'), { apiKey: OTHER }), 'build from another key\'s template')
    assert.match(from.message, new RegExp(name))

    // Nor change or delete it.
    for (const [method, path, body] of [['DELETE', `/templates/${name}`], ['PATCH', `/v2/templates/${name}`, { public: true }]]) {
      const res = await api(method, path, { key: OTHER, body })
      assert.equal(res.status, 404, `${method} ${path}: ${res.text}`)
    }
  })

  test('made public, every key uses it; only the owner changes it', async () => {
    const patch = await api('PATCH', `/v2/templates/${name}`, { body: { public: true } })
    assert.equal(patch.status, 200, patch.text)
    assert.deepEqual(patch.json.names, [name])
    assert.equal(await Template.exists(name, { apiKey: OTHER }), true)
    const sbx = await Sandbox.create(name, { apiKey: OTHER, metadata: meta() })
    track(sbx.sandboxId)
    try {
      assert.equal((await sbx.commands.run('cat /owner.txt')).stdout.trim(), 'built-by-owner')
    } finally {
      await sbx.kill()
    }
    const del = await api('DELETE', `/templates/${name}`, { key: OTHER })
    assert.equal(del.status, 403, del.text)
    assert.match(del.json.message, /belongs to another API key/)
    const unpatch = await api('PATCH', `/templates/${name}`, { key: OTHER, body: { public: false } })
    assert.equal(unpatch.status, 403, unpatch.text)
    const bad = await api('PATCH', `/templates/${name}`, { body: { public: 'yes' } })
    assert.equal(bad.status, 400, bad.text)
    assertErrorBody(bad, 'PATCH with a non-boolean public')
    // Built-ins are nobody's to change.
    const base = await api('PATCH', '/templates/base', { body: { public: false } })
    assert.equal(base.status, 403, base.text)
  })
})

describe('per-key build bounds and cancel', { concurrency: false }, () => {
  const sleeper = () => Template().fromTemplate('base').runCmd(`sleep 600 # ${uniq('n')}`)
  const statusOf = (info, key) => api('GET', `/templates/${info.templateId}/builds/${info.buildId}/status`, { key })

  test('a build over the bound is refused; cancel and delete stop builds', async () => {
    const a = uniq('acc-a')
    const b = uniq('acc-b')
    built.push([a, OTHER], [b, OTHER])
    const bound = Number(process.env.AIRLOCK_SDK_BUILDS_PER_KEY)
    assert.ok(bound >= 2, 'AIRLOCK_SDK_BUILDS_PER_KEY (run.sh) is the server\'s --builds-per-key')
    const first = await Template.buildInBackground(sleeper(), a, { apiKey: OTHER })
    const second = await Template.buildInBackground(sleeper(), b, { apiKey: OTHER })
    const more = []
    for (let i = 2; i < bound; i++) {
      const n = uniq('acc-more')
      built.push([n, OTHER])
      more.push(await Template.buildInBackground(sleeper(), n, { apiKey: OTHER }))
    }
    const over = await fails(Template.buildInBackground(sleeper(), uniq('acc-c'), { apiKey: OTHER }), 'a build over the bound')
    assert.match(over.message, /builds-per-key/)
    for (const m of more) {
      const res = await api('DELETE', `/templates/${m.templateId}/builds/${m.buildId}`, { key: OTHER })
      assert.equal(res.status, 204, res.text)
    }
    // The bound is per key: this key's build is taken (it waits for the
    // server's one build slot, held by the other key's first build).
    const mine = uniq('acc-mine')
    built.push([mine, undefined])
    const mineInfo = await Template.buildInBackground(Template().fromTemplate('base').runCmd('true'), mine)

    // The builds' owner sees them; this key does not, and cannot cancel them.
    assert.equal((await statusOf(first)).status, 404)
    const foreign = await api('DELETE', `/templates/${first.templateId}/builds/${first.buildId}`)
    assert.equal(foreign.status, 404, foreign.text)

    const cancel = await api('DELETE', `/templates/${first.templateId}/builds/${first.buildId}`, { key: OTHER })
    assert.equal(cancel.status, 204, cancel.text)
    const st = await waitFor(async () => {
      const s = await Template.getBuildStatus(first, { apiKey: OTHER })
      return s.status === 'error' && s
    }, { timeoutMs: 30_000, what: 'the cancelled build to end' })
    assert.match(st.reason.message, /cancelled/)
    const again = await api('DELETE', `/templates/${first.templateId}/builds/${first.buildId}`, { key: OTHER })
    assert.equal(again.status, 409, again.text)

    // Deleting a template whose first build runs stops that build.
    const del = await api('DELETE', `/templates/${b}`, { key: OTHER })
    assert.equal(del.status, 204, del.text)
    const st2 = await waitFor(async () => {
      const s = await statusOf(second, OTHER)
      return s.json.status === 'error' && s.json
    }, { timeoutMs: 30_000, what: 'the deleted template\'s build to end' })
    assert.match(st2.reason.message, /cancelled/)
    assert.equal(await Template.exists(b, { apiKey: OTHER }), false)
    const done = await waitFor(async () => {
      const s = await Template.getBuildStatus(mineInfo)
      return ['ready', 'error'].includes(s.status) && s
    }, { timeoutMs: 60_000, what: 'this key\'s build once the slot is free' })
    assert.equal(done.status, 'ready', JSON.stringify(done.reason))
    // Both slots are free again.
    const fourth = await Template.buildInBackground(Template().fromTemplate('base').runCmd('true'), uniq('acc-d'), { apiKey: OTHER })
    built.push([fourth.templateId, OTHER])
  })
})
