// `e2b sandbox logs <id>` (the official CLI, npm @e2b/cli) against Airlock:
// the commands this file runs through the SDK show up as process entries
// (started, and ended with their exit code), the CLI's --level and
// --loggers options filter them, and the log stays readable after the kill.
// The CLI reads the deprecated v1 endpoint and parses each `line` as a JSON
// object; the v2 endpoint's level, search and direction filters and another
// key's 404 are checked on the wire.
//
// The CLI runs as a child with an empty HOME (no developer login can leak
// in), NO_UPDATE_NOTIFIER (it never asks the registry for a newer version)
// and NO_COLOR, as in cli-template.test.mjs.

import assert from 'node:assert/strict'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { after, describe, test } from 'node:test'
import { CommandExitError, Sandbox } from 'e2b'
import { api, assertErrorBody, createSandbox, runCLI, showRun, trackCleanup, uniq } from './helpers.mjs'

trackCleanup()

const OTHER = process.env.AIRLOCK_SDK_OTHER_KEY
if (!OTHER) throw new Error('AIRLOCK_SDK_OTHER_KEY must be set (use tests/sdk/run.sh)')

const home = mkdtempSync(join(tmpdir(), 'airlock-cli-logs-'))
after(() => rmSync(home, { recursive: true, force: true }))

const e2b = (args, timeoutMs = 60_000) => runCLI(args, { home, timeoutMs })

const show = showRun

/** `e2b sandbox logs --format json`: one JSON object per printed line. */
async function cliLogs(id, ...opts) {
  const r = await e2b(['sandbox', 'logs', id, '--format', 'json', ...opts])
  assert.equal(r.code, 0, show(r))
  const entries = r.stdout
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l))
  // In JSON the entry's own (lower-case) level overrides the CLI's badge.
  return entries.map((e) => ({ ...e, level: String(e.level).trim().toUpperCase() }))
}

describe('e2b sandbox logs', () => {
  test('shows the process entries of SDK commands, filtered by level and logger, before and after the kill', async () => {
    const sbx = await createSandbox()
    const id = sbx.sandboxId
    const marker = uniq('logmark')
    const ok = await sbx.commands.run(`echo ${marker}-ok`)
    assert.equal(ok.exitCode, 0)
    await assert.rejects(sbx.commands.run(`echo ${marker}-three; exit 3`), (err) => err instanceof CommandExitError && err.exitCode === 3)

    const mine = (entries) => entries.filter((e) => (e.cmd ?? '').includes(marker))
    let all = mine(await cliLogs(id))
    const started = all.filter((e) => e.message.includes(' started: '))
    const ended = all.filter((e) => e.exitCode !== undefined)
    assert.equal(started.length, 2, `two starts in ${JSON.stringify(all, null, 1)}`)
    assert.equal(ended.length, 2, `two ends in ${JSON.stringify(all, null, 1)}`)
    const three = ended.find((e) => e.exitCode === '3')
    assert.ok(three, `an end with exit code 3 in ${JSON.stringify(ended)}`)
    assert.equal(three.level, 'WARN')
    assert.equal(three.logger, 'envd.process')
    assert.equal(three.origin, 'sandbox')
    assert.match(three.message, /^process \d+ exited with code 3$/)
    assert.ok(started.some((e) => e.pid === three.pid && e.level === 'INFO' && e.user === 'user'), 'its start, as user, at INFO')
    assert.ok(ended.some((e) => e.exitCode === '0' && e.level === 'INFO'), 'the clean exit at INFO')
    for (const e of all) assert.ok(!Number.isNaN(Date.parse(e.timestamp)), `timestamp ${e.timestamp}`)

    // --level WARN keeps the exit 3 and drops the starts and the clean exit.
    const warn = mine(await cliLogs(id, '--level', 'WARN'))
    assert.deepEqual(warn.map((e) => e.exitCode), ['3'], JSON.stringify(warn))
    // --loggers keeps the logger asked for.
    const other = await cliLogs(id, '--loggers', 'airlock.')
    assert.equal(mine(other).length, 0, JSON.stringify(other))
    assert.equal(mine(await cliLogs(id, '--loggers', 'envd.process')).length, 4)

    // The pretty format prints the story too.
    const pretty = await e2b(['sandbox', 'logs', id])
    assert.equal(pretty.code, 0, show(pretty))
    assert.match(pretty.stdout, new RegExp(`Logs for sandbox ${id}`))
    assert.match(pretty.stdout, /exited with code 3/)

    // v2 on the wire: level, search (case-sensitive), direction and limit.
    const v2 = async (q) => {
      const res = await api('GET', `/v2/sandboxes/${id}/logs?${q}`)
      assert.equal(res.status, 200, res.text)
      return res.json.logs
    }
    const searched = await v2(`search=${encodeURIComponent(`${marker}-three`)}`)
    assert.equal(searched.length, 1, JSON.stringify(searched))
    assert.equal(searched[0].fields.logger, 'envd.process')
    assert.match(searched[0].message, / started: /)
    assert.equal((await v2(`search=${encodeURIComponent(marker.toUpperCase())}`)).length, 0)
    const errorsOnly = await v2('level=error')
    assert.ok(errorsOnly.every((e) => e.level === 'error'), JSON.stringify(errorsOnly))
    const newest = await v2('direction=backward&limit=1')
    assert.equal(newest.length, 1)
    assert.equal(newest[0].fields.exitCode, '3', JSON.stringify(newest))
    for (const [q, what] of [
      ['level=loud', 'level'],
      ['direction=sideways', 'direction'],
      ['limit=5000', 'limit'],
      ['cursor=yesterday', 'cursor'],
      [`search=${'s'.repeat(300)}`, 'search'],
    ]) {
      const res = await api('GET', `/v2/sandboxes/${id}/logs?${q}`)
      assert.equal(res.status, 400, `${q}: ${res.text}`)
      assertErrorBody(res, q)
      assert.match(res.json.message, new RegExp(what))
    }
    // Another key sees no such sandbox.
    const foreign = await api('GET', `/v2/sandboxes/${id}/logs`, { key: OTHER })
    assert.equal(foreign.status, 404, foreign.text)

    // Killed: the CLI still prints the log.
    assert.equal(await Sandbox.kill(id), true)
    let afterKill = []
    for (let i = 0; i < 50 && afterKill.length < 4; i++) {
      afterKill = mine(await cliLogs(id))
      if (afterKill.length < 4) await new Promise((r) => setTimeout(r, 100))
    }
    assert.equal(afterKill.length, 4, JSON.stringify(afterKill))
    assert.ok(afterKill.some((e) => e.exitCode === '3'))
    const foreignKilled = await api('GET', `/v2/sandboxes/${id}/logs`, { key: OTHER })
    assert.equal(foreignKilled.status, 404, foreignKilled.text)
  })

  test('an unknown sandbox is a 404 the CLI reports', async () => {
    const r = await e2b(['sandbox', 'logs', 'nosuchsandbox'])
    assert.notEqual(r.code, 0, show(r))
    const res = await api('GET', '/v2/sandboxes/nosuchsandbox/logs')
    assert.equal(res.status, 404)
    assertErrorBody(res, 'unknown sandbox logs')
  })
})
