// Template tags through the unmodified SDK: builds of NAME:v1 and NAME:v2
// with different content, Template.assignTags / getTags / removeTags, each
// tag starting a sandbox of its own build, the errors for unknown and
// malformed tags, and GET /templates/{id} listing the builds with their
// status (a failed one included).
// The template built here is deleted at the end.

import assert from 'node:assert/strict'
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { BuildError, Sandbox, Template, TemplateError } from 'e2b'
import { api, assertErrorBody, meta, rejectsWith, track, trackCleanup, uniq } from './helpers.mjs'

trackCleanup()

const name = uniq('tags')
after(async () => {
  const res = await api('DELETE', `/templates/${name}`)
  assert.ok([204, 404].includes(res.status), `delete ${name}: ${res.status} ${res.text}`)
})

const ctxDir = mkdtempSync(join(tmpdir(), 'airlock-tags-'))
after(() => rmSync(ctxDir, { recursive: true, force: true }))

// A template whose /which.txt says which build it is.
function definition(which) {
  writeFileSync(join(ctxDir, `${which}.txt`), `${which} of ${name}\n`)
  return Template({ fileContextPath: ctxDir }).fromTemplate('base').copy(`${which}.txt`, '/which.txt')
}

async function which(ref) {
  const sbx = await Sandbox.create(ref, { metadata: meta({ file: 'template-tags' }) })
  track(sbx.sandboxId)
  try {
    return (await sbx.commands.run('cat /which.txt')).stdout.trim()
  } finally {
    await sbx.kill()
  }
}

const tagsOf = async (ref) => (await Template.getTags(ref)).map((t) => t.tag).sort()

describe('template tags', { concurrency: false }, () => {
  let v1, v2

  test('builds of name:v1 and name:v2 each keep their own content', async () => {
    v1 = await Template.build(definition('one'), `${name}:v1`)
    assert.deepEqual(v1.tags, ['v1'])
    v2 = await Template.build(definition('two'), `${name}:v2`, { tags: ['stable'] })
    assert.deepEqual(v2.tags.sort(), ['stable', 'v2'])
    assert.notEqual(v1.buildId, v2.buildId)
    // The first build of a name is its default too (Airlock's choice: the
    // name alone starts something after any first build).
    assert.deepEqual(await tagsOf(name), ['default', 'stable', 'v1', 'v2'])
    assert.equal(await which(`${name}:v1`), `one of ${name}`)
    assert.equal(await which(`${name}:v2`), `two of ${name}`)
    assert.equal(await which(`${name}:stable`), `two of ${name}`)
    assert.equal(await which(name), `one of ${name}`)
    assert.equal(await which(`${name}:default`), `one of ${name}`)
    assert.equal(await Template.exists(`${name}:v2`), true)
    assert.equal(await Template.exists(`${name}:v3`), false)
  })

  test('fromTemplate(name:tag) builds on that build', async () => {
    const child = `${name}-child`
    try {
      await Template.build(Template().fromTemplate(`${name}:v2`).runCmd('cat /which.txt > /home/user/parent.txt'), child)
      const sbx = await Sandbox.create(child, { metadata: meta({ file: 'template-tags' }) })
      track(sbx.sandboxId)
      try {
        assert.equal((await sbx.commands.run('cat /home/user/parent.txt')).stdout.trim(), `two of ${name}`)
      } finally {
        await sbx.kill()
      }
    } finally {
      const res = await api('DELETE', `/templates/${child}`)
      assert.ok([204, 404].includes(res.status), `delete ${child}: ${res.status} ${res.text}`)
    }
  })

  test('getTags: each tag with its build id and when it was assigned', async () => {
    const tags = await Template.getTags(name)
    const byTag = Object.fromEntries(tags.map((t) => [t.tag, t]))
    assert.equal(byTag.v1.buildId, v1.buildId)
    assert.equal(byTag.default.buildId, v1.buildId)
    assert.equal(byTag.v2.buildId, v2.buildId)
    assert.equal(byTag.stable.buildId, v2.buildId)
    for (const t of tags) {
      assert.ok(t.createdAt instanceof Date && !Number.isNaN(t.createdAt.getTime()), `${t.tag}: createdAt ${t.createdAt}`)
    }
    // A tag in the reference is ignored: the template's tags are listed.
    assert.deepEqual(await tagsOf(`${name}:v2`), ['default', 'stable', 'v1', 'v2'])
  })

  test('assignTags moves tags, default included; a sandbox of the name follows', async () => {
    const info = await Template.assignTags(`${name}:v2`, ['default', 'prod'])
    assert.equal(info.buildId, v2.buildId)
    assert.deepEqual(info.tags.sort(), ['default', 'prod'])
    assert.equal(await which(name), `two of ${name}`)
    assert.equal(await which(`${name}:prod`), `two of ${name}`)
    assert.equal(await which(`${name}:v1`), `one of ${name}`, 'v1 still names the first build')
    const one = await Template.assignTags(`${name}:v1`, 'old')
    assert.equal(one.buildId, v1.buildId)
  })

  test('removeTags: the tag is gone, the other tags of its build stay', async () => {
    await Template.removeTags(name, ['prod', 'old'])
    assert.deepEqual(await tagsOf(name), ['default', 'stable', 'v1', 'v2'])
    const err = await rejectsWith(Sandbox.create(`${name}:prod`), Error, 'create from a removed tag')
    assert.match(err.message, /prod/)
    assert.equal(await which(`${name}:stable`), `two of ${name}`)
  })

  test('unknown and malformed tags → clear errors', async () => {
    const unknown = await rejectsWith(Sandbox.create(`${name}:nope`), Error, 'create from an unknown tag')
    assert.match(unknown.message, /nope/)
    const res = await api('GET', `/templates/aliases/${name}:nope`)
    assert.equal(res.status, 404)
    assert.match(res.json.message, new RegExp(`${name} has no tag "nope"`))

    const missing = await rejectsWith(Template.getTags(uniq('never-built')), TemplateError, 'getTags of an unknown template')
    assert.match(missing.message, /^404: .*not found/)
    const from = await rejectsWith(Template.assignTags(`${name}:nope`, 'x'), TemplateError, 'assignTags from an unknown tag')
    assert.match(from.message, /^404: .*no tag "nope"/)
    const bad = await rejectsWith(Template.assignTags(`${name}:v1`, 'Not OK'), TemplateError, 'assignTags of a bad tag')
    assert.match(bad.message, /^400: Invalid tag "Not OK"/)
    const def = await rejectsWith(Template.removeTags(name, 'default'), TemplateError, 'removeTags default')
    assert.match(def.message, /^400: .*"default" cannot be removed/)
    const gone = await rejectsWith(Template.removeTags(name, 'nope'), TemplateError, 'removeTags of an unknown tag')
    assert.match(gone.message, /^404: .*no tag "nope"/)
    for (const body of [{ target: `${name}:a:b`, tags: ['x'] }, { target: name, tags: [] }, { target: '', tags: ['x'] }]) {
      const r = await api('POST', '/templates/tags', { body })
      assert.equal(r.status, 400, `${JSON.stringify(body)}: ${r.text}`)
      assertErrorBody(r, JSON.stringify(body))
    }
    const tagged = await api('DELETE', '/templates/tags', { body: { name: `${name}:v1`, tags: ['v1'] } })
    assert.equal(tagged.status, 400, tagged.text)
    assert.deepEqual(await tagsOf(name), ['default', 'stable', 'v1', 'v2'], 'refused requests changed nothing')
  })

  test('GET /templates/{id} lists the builds newest first with their status, a failed one included', async () => {
    const failing = definition('three').runCmd('echo about-to-fail && exit 3')
    const err = await rejectsWith(Template.build(failing, `${name}:v3`), BuildError, 'a failing build')
    assert.match(err.message, /exit/)
    assert.equal(await Template.exists(`${name}:v3`), false)
    const res = await api('GET', `/templates/${name}`)
    assert.equal(res.status, 200, res.text)
    const builds = res.json.builds
    assert.deepEqual(builds.map((b) => b.status), ['error', 'ready', 'ready'], JSON.stringify(builds))
    assert.deepEqual(builds.slice(1).map((b) => b.buildID), [v2.buildId, v1.buildId])
    for (const b of builds) {
      assert.ok(!Number.isNaN(Date.parse(b.createdAt)), `createdAt ${b.createdAt}`)
    }
    assert.ok(builds[1].finishedAt, 'a ready build has finishedAt')
    // The list keeps one entry per template.
    const list = await api('GET', '/v2/templates')
    assert.equal(list.json.filter((t) => t.templateID === name).length, 1)
    // Dropping v1's last tags drops that build from the list.
    await Template.removeTags(name, 'v1')
    const after = await api('GET', `/templates/${name}`)
    assert.deepEqual(after.json.builds.map((b) => b.buildID).slice(1), [v2.buildId])
    assert.equal(await which(name), `two of ${name}`)
  })
})
