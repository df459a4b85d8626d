// The web dashboard end to end, in Debian's headless Chromium driven by
// playwright-core: sign-in, the live list, a sandbox's page (CPU chart,
// terminal, files, kill), a sandbox dying while its page is open, the
// templates and overview pages, and a second key's sandbox never reaching
// the page. Screenshots of each page go to $AIRLOCK_ARTIFACTS_DIR/dashboard
// (default: artifacts/dashboard at the top of the clone), CI's artefacts.

import assert from 'node:assert/strict'
import { existsSync, mkdirSync } from 'node:fs'
import { join } from 'node:path'
import { fileURLToPath } from 'node:url'
import { after, before, describe, test } from 'node:test'
import { Sandbox } from 'e2b'
import { API_KEY, API_URL, TEMPLATE, accessToken, createSandbox, meta, trackCleanup, uniq, waitFor } from './helpers.mjs'

trackCleanup()

const OTHER_KEY = process.env.AIRLOCK_SDK_OTHER_KEY
const chromiumPath = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p))
const shots = join(process.env.AIRLOCK_ARTIFACTS_DIR || fileURLToPath(new URL('../../../artifacts', import.meta.url)), 'dashboard')

describe('dashboard', { skip: chromiumPath ? false : 'no chromium (scripts/setup-test.sh installs it)' }, () => {
  let browser, page
  const tag = uniq('dash')
  // Every answer of the dashboard's API this browser got, to show that the
  // other key's sandbox never reached it.
  const apiBodies = []
  let other

  const shot = async (name) => {
    mkdirSync(shots, { recursive: true })
    await page.screenshot({ path: join(shots, `${name}.png`), fullPage: true })
  }
  const row = (id) => page.locator(`[data-testid="sandbox-row"][data-sandbox-id="${id}"]`)
  // Chromium aborts a navigation with ERR_NETWORK_CHANGED when the host's
  // interfaces change, which the other test files' sandboxes do (a veth
  // per create): the host, not the server; go again (as domain.test.mjs).
  const goto = async (url) => {
    for (let i = 0; ; i++) {
      try {
        return await page.goto(url)
      } catch (e) {
        if (i >= 4 || !/ERR_NETWORK_CHANGED|interrupted by another navigation/.test(String(e))) throw e
      }
    }
  }

  // Signs in with key. The page's sign-in request can fail like a
  // navigation when the host's network changes under Chromium (see goto);
  // the page then shows the network error, and the form is sent again.
  const signIn = async (key) => {
    for (let i = 0; ; i++) {
      await page.getByTestId('signin-key').fill(key)
      await page.getByTestId('signin-submit').click()
      // The previous attempt's message may still show until this one is
      // answered: the page signed in is what counts.
      const signedIn = await page.getByTestId('nav-sandboxes').waitFor({ timeout: 15_000 }).then(() => true, () => false)
      if (signedIn) return
      const error = page.getByTestId('signin-error')
      const msg = (await error.count()) ? await error.textContent() : 'no answer in 15 s'
      if (i >= 4) throw new Error(`sign-in failed: ${msg}`)
    }
  }

  before(async () => {
    assert.ok(OTHER_KEY, 'AIRLOCK_SDK_OTHER_KEY is set by run.sh')
    other = await Sandbox.create(TEMPLATE, { apiKey: OTHER_KEY, metadata: meta({ dash: tag }) })
    const { chromium } = await import('playwright-core')
    browser = await chromium.launch({
      executablePath: chromiumPath,
      args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking',
        '--disable-component-update', '--disable-sync'],
    })
    const context = await browser.newContext({ acceptDownloads: true, viewport: { width: 1400, height: 900 } })
    page = await context.newPage()
    page.on('response', async (res) => {
      if (!res.url().includes('/dashboard/api/')) return
      try {
        apiBodies.push(await res.text())
      } catch { /* a body the page no longer holds (navigated away) */ }
    })
  })

  after(async () => {
    await browser?.close()
    if (other) await Sandbox.kill(other.sandboxId, { apiKey: OTHER_KEY }).catch(() => {})
  })

  test('a browser at / reaches the sign-in form; a wrong key is told so', async () => {
    await goto(API_URL + '/')
    assert.match(page.url(), /\/dashboard\//)
    await page.getByTestId('signin-key').fill('e2b_not_a_key_of_this_server_000000000000')
    await page.getByTestId('signin-submit').click()
    await page.getByTestId('signin-error').waitFor()
    assert.match(await page.getByTestId('signin-error').textContent(), /Invalid API key/)
    await shot('signin-error')
  })

  test('signing in shows the overview', async () => {
    await signIn(API_KEY)
    // The session is a cookie the page's scripts cannot read.
    assert.equal(await page.evaluate(() => document.cookie.includes('airlock_dashboard')), false)
    await page.getByTestId('nav-overview').click()
    await page.getByTestId('overview-running').waitFor()
    await page.getByTestId('host-headroom').waitFor()
    await page.locator('[data-testid="chart-creates"] canvas').first().waitFor()
    await shot('overview')
  })

  let sbx
  test('a sandbox created with the SDK appears in the list within 2 s', async () => {
    await page.getByTestId('nav-sandboxes').click()
    await page.getByTestId('filter-state').waitFor()
    sbx = await createSandbox({ metadata: { dash: tag } })
    const created = Date.now()
    await row(sbx.sandboxId).waitFor({ timeout: 2000 })
    const took = Date.now() - created
    assert.ok(took <= 2000, `appeared after ${took} ms`)
    // The metadata filter narrows the list to it.
    await page.getByTestId('filter-metadata').fill(`dash=${tag}`)
    await waitFor(async () => (await page.getByTestId('sandbox-row').count()) === 1, { what: 'the filtered list' })
    assert.equal(await page.getByTestId('sandbox-row').first().getAttribute('data-sandbox-id'), sbx.sandboxId)
    await shot('sandboxes')
  })

  test('its page draws the CPU chart from the samples', async () => {
    // Work for the chart to show, then the page.
    await sbx.commands.run('timeout 12 sh -c "while :; do :; done"', { background: true })
    await row(sbx.sandboxId).click()
    await page.getByTestId('sandbox-title').waitFor()
    assert.match(await page.getByTestId('sandbox-title').textContent(), new RegExp(sbx.sandboxId))
    // Samples come every 5 s, and a line needs two: the chart has drawn
    // once its canvas holds pixels of the CPU series' stroke (#2563eb),
    // which axes and grid never use.
    await waitFor(async () => page.evaluate(() => {
      const c = document.querySelector('[data-testid="chart-cpu"] canvas')
      if (!c || c.width === 0 || c.height === 0) return false
      const px = c.getContext('2d').getImageData(0, 0, c.width, c.height).data
      let stroke = 0
      for (let i = 0; i < px.length; i += 4) {
        if (Math.abs(px[i] - 0x25) < 24 && Math.abs(px[i + 1] - 0x63) < 24 && Math.abs(px[i + 2] - 0xeb) < 24 && px[i + 3] > 200) stroke++
      }
      return stroke > 30
    }), { timeoutMs: 30_000, intervalMs: 500, what: 'the CPU chart to draw its line' })
    await page.locator('[data-testid="chart-mem"] canvas').first().waitFor()
    await page.locator('[data-testid="chart-disk"] canvas').first().waitFor()
    await shot('sandbox')
  })

  test('its terminal runs a command', async () => {
    await page.getByTestId('tab-terminal').click()
    const term = page.getByTestId('terminal')
    await term.locator('.xterm').waitFor()
    // A socket dropped by the host's network changing (see goto) is
    // reopened by opening the tab again.
    await waitFor(async () => {
      await term.click()
      await page.keyboard.type('echo hi-$((40+2))\n')
      try {
        await waitFor(async () => (await term.textContent()).includes('hi-42'), { timeoutMs: 8000, what: 'the output' })
        return true
      } catch {
        await page.getByTestId('tab-files').click()
        await page.getByTestId('tab-terminal').click()
        return false
      }
    }, { timeoutMs: 40_000, intervalMs: 500, what: 'echo hi-42 in the terminal' })
    await shot('terminal')
  })

  test('its files: an upload lands in the sandbox, a download brings one back', async () => {
    await sbx.files.write('/home/user/down.txt', `from the sandbox ${tag}\n`)
    await page.getByTestId('tab-files').click()
    await page.getByTestId('file-path').waitFor()
    await page.getByTestId('file-upload').setInputFiles({ name: 'up.txt', mimeType: 'text/plain', buffer: Buffer.from(`from the browser ${tag}\n`) })
    await page.locator('[data-testid="file-row"][data-name="up.txt"]').waitFor({ timeout: 15_000 })
    assert.equal(await sbx.files.read('/home/user/up.txt'), `from the browser ${tag}\n`)
    const down = page.locator('[data-testid="file-row"][data-name="down.txt"]')
    await down.waitFor({ timeout: 15_000 })
    const [download] = await Promise.all([page.waitForEvent('download'), down.locator('a').first().click()])
    const chunks = []
    for await (const c of await download.createReadStream()) chunks.push(c)
    assert.equal(Buffer.concat(chunks).toString(), `from the sandbox ${tag}\n`)
    await shot('files')
  })

  test('killed from its page, it leaves the list', async () => {
    await page.getByTestId('action-kill').click()
    await page.getByTestId('confirm-ok').click()
    await page.getByTestId('filter-state').waitFor({ timeout: 15_000 })
    await row(sbx.sandboxId).waitFor({ state: 'detached', timeout: 5000 })
    await assert.rejects(Sandbox.getInfo(sbx.sandboxId))
  })

  test('a sandbox that dies while its page is open says so', async () => {
    const doomed = await createSandbox({ metadata: { dash: tag } })
    await row(doomed.sandboxId).waitFor({ timeout: 5000 })
    await row(doomed.sandboxId).click()
    await page.getByTestId('sandbox-title').waitFor()
    await doomed.kill()
    await page.getByTestId('sandbox-gone').waitFor({ timeout: 10_000 })
    assert.match(await page.getByTestId('sandbox-gone').textContent(), /gone|killed/i)
    await shot('sandbox-gone')
  })

  test('templates list the built-ins with their builds', async () => {
    await page.getByTestId('nav-templates').click()
    const base = page.locator('[data-testid="template-row"][data-template-id="base"]')
    await base.waitFor()
    await shot('templates')
  })

  test("the other key's sandbox, and any sandbox's token, never reached the page", async () => {
    const token = accessToken(sbx)
    assert.ok(token, 'the SDK holds the sandbox access token')
    for (const body of apiBodies) {
      assert.ok(!body.includes(token), `an answer held a sandbox's access token: ${body.slice(0, 300)}`)
      assert.ok(!body.includes(API_KEY), 'an answer held the API key')
    }
    assert.ok(apiBodies.length > 10, `the page made ${apiBodies.length} API calls`)
    for (const body of apiBodies) {
      assert.ok(!body.includes(other.sandboxId), `an answer held the other key's sandbox: ${body.slice(0, 300)}`)
    }
    assert.ok(!(await page.content()).includes(other.sandboxId))
    // And it still runs: nothing the page did touched it.
    assert.equal((await Sandbox.getInfo(other.sandboxId, { apiKey: OTHER_KEY })).sandboxId, other.sandboxId)
  })
})
