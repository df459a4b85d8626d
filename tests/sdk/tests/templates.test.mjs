// Template endpoints: what the SDK itself calls (Template.exists/aliasExists,
// Sandbox.deleteSnapshot, Template.build from an image and getTags refused with a
// message) and
// the list/get shapes the E2B CLI reads, fetched through the SDK's own typed
// API client.
//
// Nothing here deletes an existing template: other files run at the same
// time and need `base`.

import assert from 'node:assert/strict'
import { describe, test } from 'node:test'
import { ApiClient, BuildError, ConnectionConfig, Sandbox, Template, TemplateError } from 'e2b'
import { TEMPLATE, api, assertErrorBody, createSandbox, rejectsWith, trackCleanup, uniq } from './helpers.mjs'

trackCleanup()

const UNKNOWN = 'no-such-template-zz9'
const client = () => new ApiClient(new ConnectionConfig()).api

// Required keys of the upstream `Template` schema (spec/openapi.yml).
const TEMPLATE_KEYS = [
  'templateID', 'buildID', 'cpuCount', 'memoryMB', 'diskSizeMB', 'public', 'aliases', 'names',
  'createdAt', 'updatedAt', 'createdBy', 'lastSpawnedAt', 'spawnCount', 'buildCount',
  'envdVersion', 'buildStatus',
]

function assertTemplateShape(t, what) {
  for (const k of TEMPLATE_KEYS) assert.ok(k in t, `${what}: lacks ${k}: ${JSON.stringify(t)}`)
  assert.equal(typeof t.templateID, 'string')
  assert.equal(typeof t.buildID, 'string')
  assert.ok(t.buildID.length > 0, `${what}: empty buildID`)
  for (const k of ['cpuCount', 'memoryMB', 'diskSizeMB', 'spawnCount', 'buildCount']) {
    assert.ok(Number.isInteger(t[k]) && t[k] >= 0, `${what}: ${k} = ${t[k]}`)
  }
  assert.ok(t.cpuCount >= 1 && t.memoryMB >= 128, `${what}: cpuCount ${t.cpuCount} memoryMB ${t.memoryMB}`)
  assert.equal(typeof t.public, 'boolean')
  assert.ok(Array.isArray(t.aliases) && Array.isArray(t.names), `${what}: aliases/names must be arrays`)
  for (const k of ['createdAt', 'updatedAt']) assert.ok(!Number.isNaN(Date.parse(t[k])), `${what}: ${k} = ${t[k]}`)
  assert.equal(t.createdBy, null)
  assert.ok(t.lastSpawnedAt === null || !Number.isNaN(Date.parse(t.lastSpawnedAt)), `${what}: lastSpawnedAt = ${t.lastSpawnedAt}`)
  assert.match(t.envdVersion, /^\d+\.\d+\.\d+/)
  assert.ok(['ready', 'building', 'waiting', 'error'].includes(t.buildStatus), `${what}: buildStatus ${t.buildStatus}`)
}

describe('templates', { concurrency: true }, () => {
  test('Template.exists / aliasExists: base true, unknown false', async () => {
    assert.equal(await Template.exists(TEMPLATE), true)
    assert.equal(await Template.aliasExists(TEMPLATE), true)
    assert.equal(await Template.exists(UNKNOWN), false)
    const res = await api('GET', `/templates/aliases/${UNKNOWN}`)
    assert.equal(res.status, 404)
    assertErrorBody(res, 'alias of an unknown template')
  })

  test('Template.exists with a tag: default true, an unknown tag false, a malformed one a 400', async () => {
    assert.equal(await Template.exists(`${TEMPLATE}:default`), true)
    assert.equal(await Template.exists(`${TEMPLATE}:v1`), false)
    const res = await api('GET', `/templates/aliases/${TEMPLATE}:v1`)
    assert.equal(res.status, 404)
    assert.match(res.json.message, /no tag "v1"/)
    const err = await rejectsWith(Template.exists(`${TEMPLATE}:Bad`), TemplateError, 'exists(base:Bad)')
    assert.match(err.message, /^400: .*the tag after ':'/)
  })

  test('Sandbox.deleteSnapshot of an unknown id → false', async () => {
    assert.equal(await Sandbox.deleteSnapshot(UNKNOWN), false)
  })

  test('Template.build from an image that cannot be fetched, and tagging a built-in → clear errors, not a bare 404', async () => {
    // Builds work (template-build.test.mjs); an image at a loopback
    // registry fails before any connection (an API key's image may not
    // make the server call its own network), naming it and why, and
    // leaves no template.
    // A name of its own: the tests of this file run at once, and
    // deleteSnapshot(UNKNOWN) above would delete this build's template
    // while it is being refused.
    const image = '127.0.0.1:1/airlock-test/none:1'
    const name = uniq('no-such-image')
    const err = await rejectsWith(Template.build(Template().fromImage(image), name), BuildError, 'Template.build')
    assert.ok(err.message.includes(image), err.message)
    assert.match(err.message, /loopback, private or link-local address.*--allow-registry/)
    assert.equal(await Template.exists(name), false)
    const tags = await Template.getTags(TEMPLATE)
    assert.deepEqual(tags.map((t) => t.tag), ['default'], 'a built-in has the default tag only')
    const tagErr = await rejectsWith(Template.assignTags(TEMPLATE, 'mine'), TemplateError, 'Template.assignTags(base)')
    assert.match(tagErr.message, /^403: .*built-in/)
    const res = await api('POST', '/v3/templates', { body: { name: 'Bad:Name:x' } })
    assert.equal(res.status, 400)
    assertErrorBody(res, 'POST /v3/templates')
  })

  test('GET /templates (the CLI list): shape, base listed, a live sandbox counted', async () => {
    const sbx = await createSandbox({ metadata: { file: 'templates' } })
    const info = await sbx.getInfo()

    const { data, error, response } = await client().GET('/templates', { params: { query: { teamID: 'ignored' } } })
    assert.equal(response.status, 200, JSON.stringify(error))
    assert.ok(Array.isArray(data) && data.length > 0, `list: ${JSON.stringify(data)}`)
    for (const t of data) assertTemplateShape(t, `template ${t.templateID}`)
    const base = data.find((t) => t.templateID === info.templateId)
    assert.ok(base, `the sandbox's template ${info.templateId} is not listed: ${JSON.stringify(data.map((t) => t.templateID))}`)
    assert.ok(base.aliases.includes(TEMPLATE) || base.templateID === TEMPLATE, `base aliases ${base.aliases}`)
    assert.equal(base.buildStatus, 'ready')
    // Other files create base sandboxes at the same time: at least ours.
    assert.ok(base.spawnCount >= 1, `spawnCount ${base.spawnCount} with a live sandbox`)
    assert.ok(Date.parse(base.lastSpawnedAt) >= info.startedAt.getTime() - 1000, `lastSpawnedAt ${base.lastSpawnedAt} before our start ${info.startedAt.toISOString()}`)
    await sbx.kill()
  })

  test('GET /v2/templates pages with limit and X-Next-Token', async () => {
    const all = await client().GET('/v2/templates')
    assert.equal(all.response.status, 200)
    const seen = []
    let nextToken
    for (let page = 0; page < 50; page++) {
      const res = await client().GET('/v2/templates', { params: { query: { limit: 1, nextToken } } })
      assert.equal(res.response.status, 200, JSON.stringify(res.error))
      assert.ok(res.data.length <= 1)
      seen.push(...res.data.map((t) => t.templateID))
      nextToken = res.response.headers.get('x-next-token') || undefined
      if (!nextToken) break
    }
    // Other test files build and delete templates meanwhile (CI failed once on
    // one built during the paging): every template listed both before and
    // after the paging must be seen once, in the listing's order.
    const before = all.data.map((t) => t.templateID)
    const after = (await client().GET('/v2/templates')).data.map((t) => t.templateID)
    assert.equal(new Set(seen).size, seen.length, `a template on two pages: ${seen}`)
    const stable = before.filter((id) => after.includes(id))
    assert.ok(stable.length >= 5, `the built-ins are listed: ${stable}`)
    assert.deepEqual(seen.filter((id) => stable.includes(id)), stable)
    const bad = await api('GET', '/v2/templates?nextToken=%21%21')
    assert.equal(bad.status, 400)
    assertErrorBody(bad, 'bad nextToken')
  })

  test('GET /templates/{id}: TemplateWithBuilds; unknown → 404 JSON', async () => {
    const { data, response } = await client().GET('/templates/{templateID}', { params: { path: { templateID: TEMPLATE } } })
    assert.equal(response.status, 200)
    for (const k of ['templateID', 'public', 'aliases', 'names', 'createdAt', 'updatedAt', 'lastSpawnedAt', 'spawnCount', 'builds']) {
      assert.ok(k in data, `lacks ${k}: ${JSON.stringify(data)}`)
    }
    assert.ok(data.builds.length >= 1, `no builds: ${JSON.stringify(data)}`)
    const b = data.builds[0]
    for (const k of ['buildID', 'status', 'createdAt', 'updatedAt', 'cpuCount', 'memoryMB']) assert.ok(k in b, `build lacks ${k}: ${JSON.stringify(b)}`)
    assert.equal(b.status, 'ready')

    const res = await api('GET', `/templates/${UNKNOWN}`)
    assert.equal(res.status, 404)
    assertErrorBody(res, 'GET unknown template')
  })
})
