// Sandbox.list: metadata filter, state filter, pagination (GET /v2/sandboxes).

import assert from 'node:assert/strict'
import { before, describe, test } from 'node:test'
import { Sandbox } from 'e2b'
import { RUN_ID, api, createSandbox, meta, trackCleanup, uniq } from './helpers.mjs'

trackCleanup()

// Three sandboxes that share a list-specific tag (other files of this run
// create sandboxes with the same `suite` concurrently, so filter on `group`).
const group = uniq('list')
const special = { 'a b': 'c&d=e', 'π/?#': '100%' }
let ids = []

async function collect(paginator) {
  const pages = []
  while (paginator.hasNext) {
    pages.push(await paginator.nextItems())
    assert.ok(pages.length < 100, 'runaway pagination')
  }
  return pages
}

describe('Sandbox.list', () => {
  before(async () => {
    const sbxs = await Promise.all([
      createSandbox({ metadata: { group, idx: '0', ...special } }),
      createSandbox({ metadata: { group, idx: '1' } }),
      createSandbox({ metadata: { group, idx: '2' } }),
    ])
    ids = sbxs.map((s) => s.sandboxId).sort()
  })

  test('metadata filter returns exactly the matching sandboxes', async () => {
    const pages = await collect(Sandbox.list({ query: { metadata: { suite: RUN_ID, group } } }))
    const got = pages.flat()
    assert.deepEqual(got.map((s) => s.sandboxId).sort(), ids)
    for (const s of got) {
      assert.equal(s.metadata.group, group)
      assert.equal(s.metadata.suite, RUN_ID)
      assert.equal(s.state, 'running')
      assert.ok(s.startedAt instanceof Date && !isNaN(s.startedAt))
      assert.ok(s.endAt instanceof Date && !isNaN(s.endAt))
      assert.equal(typeof s.templateId, 'string')
      assert.equal(typeof s.cpuCount, 'number')
      assert.equal(typeof s.memoryMB, 'number')
      assert.equal(typeof s.envdVersion, 'string')
    }
    // a narrower filter (two pairs must both match)
    const one = (await collect(Sandbox.list({ query: { metadata: { group, idx: '1' } } }))).flat()
    assert.deepEqual(one.map((s) => s.sandboxId), [got.find((s) => s.metadata.idx === '1').sandboxId])
    // a filter that matches nothing
    const none = (await collect(Sandbox.list({ query: { metadata: { group, idx: 'nope' } } }))).flat()
    assert.deepEqual(none, [])
  })

  test('metadata filter with spaces, &, =, %, / and unicode (double-encoded by the SDK)', async () => {
    const got = (await collect(Sandbox.list({ query: { metadata: { group, ...special } } }))).flat()
    assert.equal(got.length, 1, `expected exactly the idx=0 sandbox, got ${JSON.stringify(got.map((s) => s.metadata))}`)
    assert.equal(got[0].metadata.idx, '0')
    assert.deepEqual(got[0].metadata, meta({ group, idx: '0', ...special }))
  })

  test("state filter ['running'] lists our running sandboxes, ['paused'] does not", async () => {
    const running = (await collect(Sandbox.list({ query: { state: ['running'], metadata: { group } } }))).flat()
    assert.deepEqual(running.map((s) => s.sandboxId).sort(), ids)
    assert.ok(running.every((s) => s.state === 'running'))

    // unfiltered by metadata: every returned item must be running, ours included
    const all = (await collect(Sandbox.list({ query: { state: ['running'] } }))).flat()
    assert.ok(all.every((s) => s.state === 'running'), 'state=running returns only running sandboxes')
    const allIds = new Set(all.map((s) => s.sandboxId))
    for (const id of ids) assert.ok(allIds.has(id), `running list contains ${id}`)

    const paused = (await collect(Sandbox.list({ query: { state: ['paused'], metadata: { group } } }))).flat()
    assert.deepEqual(paused, [], 'none of our sandboxes is paused')
  })

  test('pagination with limit 2: hasNext/nextItems see every sandbox exactly once', async () => {
    const paginator = Sandbox.list({ query: { metadata: { group } }, limit: 2 })
    assert.equal(paginator.hasNext, true, 'hasNext before the first page')
    const pages = await collect(paginator)
    assert.ok(pages.length >= 2, `3 sandboxes with limit 2 need >= 2 pages, got ${pages.length}`)
    for (const p of pages) assert.ok(p.length <= 2, `page size <= limit (got ${p.length})`)
    assert.equal(pages[0].length, 2, 'first page is full')
    const seen = pages.flat().map((s) => s.sandboxId)
    assert.equal(seen.length, new Set(seen).size, `no duplicates across pages: ${seen}`)
    assert.deepEqual([...seen].sort(), ids)
    assert.equal(paginator.hasNext, false)
    await assert.rejects(paginator.nextItems(), /No more items/)
  })

  test('pagination header: X-Next-Token only while more items exist; default order is newest first', async () => {
    const md = new URLSearchParams({ group }).toString()
    const q = `metadata=${encodeURIComponent(md)}&limit=2`
    const p1 = await api('GET', `/v2/sandboxes?${q}`)
    assert.equal(p1.status, 200, p1.text)
    assert.equal(p1.json.length, 2)
    const token = p1.headers.get('x-next-token')
    assert.ok(token, 'X-Next-Token on a non-last page')
    const p2 = await api('GET', `/v2/sandboxes?${q}&nextToken=${encodeURIComponent(token)}`)
    assert.equal(p2.status, 200, p2.text)
    assert.equal(p2.json.length, 1)
    assert.ok(!p2.headers.get('x-next-token'), `no X-Next-Token on the last page (got ${p2.headers.get('x-next-token')})`)
    const all = [...p1.json, ...p2.json]
    const starts = all.map((s) => Date.parse(s.startedAt))
    for (let i = 1; i < starts.length; i++) {
      assert.ok(starts[i - 1] >= starts[i], `desc order by startedAt: ${all.map((s) => s.startedAt)}`)
    }
    // every ListedSandbox field the Python SDK requires
    for (const s of all) {
      for (const k of ['sandboxID', 'templateID', 'clientID', 'startedAt', 'endAt', 'cpuCount', 'memoryMB', 'diskSizeMB', 'state', 'envdVersion']) {
        assert.ok(k in s && s[k] !== null, `ListedSandbox.${k} present: ${JSON.stringify(s)}`)
      }
    }
    const bad = await api('GET', '/v2/sandboxes?nextToken=not-a-valid-token!!')
    assert.equal(bad.status, 400, `invalid nextToken → 400 (got ${bad.status} ${bad.text})`)
  })
})
