// serve --domain through the official SDKs with nothing but E2B_DOMAIN (and
// the server's CA through NODE_EXTRA_CA_CERTS): run.sh starts the server with
// --domain airlock.localhost --tls-listen 127.0.0.1:<port> and passes
// AIRLOCK_SDK_DOMAIN=airlock.localhost:<port>. This file drops the plain-HTTP
// overrides (E2B_API_URL, E2B_SANDBOX_URL, E2B_VOLUME_API_URL) in its own
// process, so the SDK builds https://api.<domain> and
// https://<port>-<id>.<domain> itself, and *.localhost resolves to loopback.

import assert from 'node:assert/strict'
import { createHash, X509Certificate } from 'node:crypto'
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { dirname, join } from 'node:path'
import tls from 'node:tls'
import { after, describe, test } from 'node:test'
import { execFile } from 'node:child_process'
import { promisify } from 'node:util'
import { Sandbox, Volume } from 'e2b'
import { Sandbox as CodeInterpreter } from '@e2b/code-interpreter'
import { createSandbox, meta, runCLI, showRun, track, trackCleanup, waitFor } from './helpers.mjs'

const DOMAIN = process.env.AIRLOCK_SDK_DOMAIN
assert.ok(DOMAIN, 'AIRLOCK_SDK_DOMAIN is not set (tests/sdk/run.sh sets it)')
assert.ok(process.env.NODE_EXTRA_CA_CERTS, 'NODE_EXTRA_CA_CERTS is not set (tests/sdk/run.sh sets it)')
const [HOST, PORT] = DOMAIN.split(':')
// helpers.mjs read them at import; from here on the SDK sees only the domain.
delete process.env.E2B_API_URL
delete process.env.E2B_SANDBOX_URL
delete process.env.E2B_VOLUME_API_URL
process.env.E2B_DOMAIN = DOMAIN

trackCleanup()

// Node 22 has a global WebSocket; Node 20 only behind a flag, so then the ws
// package the suite's dependencies bring (the same event-target API).
const WebSocketImpl = globalThis.WebSocket ?? (await import('ws')).default

const work = mkdtempSync(join(tmpdir(), 'airlock-domain-'))
after(() => rmSync(work, { recursive: true, force: true }))

/** A GET with fetch; resolves to status and text (never rejects on a status). */
async function get(url, headers = {}) {
  const res = await fetch(url, { headers })
  return { status: res.status, text: await res.text(), headers: res.headers }
}

/** A websocket echo server on port 8000, in Python's standard library only. */
const WS_SERVER = `
import socket, hashlib, base64, threading
def handle(c):
    data = b''
    while b'\\r\\n\\r\\n' not in data:
        chunk = c.recv(4096)
        if not chunk: return
        data += chunk
    head = data.split(b'\\r\\n\\r\\n')[0].decode()
    keys = [l.split(':', 1)[1].strip() for l in head.split('\\r\\n') if l.lower().startswith('sec-websocket-key:')]
    if not keys:
        c.sendall(b'HTTP/1.1 200 OK\\r\\nContent-Length: 5\\r\\nConnection: close\\r\\n\\r\\nplain'); c.close(); return
    acc = base64.b64encode(hashlib.sha1((keys[0] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').encode()).digest()).decode()
    c.sendall(('HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\nSec-WebSocket-Accept: ' + acc + '\\r\\n\\r\\n').encode())
    f = c.makefile('rb')
    while True:
        h = f.read(2)
        if len(h) < 2: return
        op, n = h[0] & 0x0f, h[1] & 0x7f
        if n == 126: n = int.from_bytes(f.read(2), 'big')
        elif n == 127: n = int.from_bytes(f.read(8), 'big')
        mask = f.read(4)
        p = bytes(b ^ mask[i % 4] for i, b in enumerate(f.read(n)))
        if op == 8:
            c.sendall(b'\\x88\\x00'); c.close(); return
        out = b'echo:' + p
        c.sendall(bytes([0x81, len(out)]) + out)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(('0.0.0.0', 8000)); s.listen()
while True:
    c, _ = s.accept(); threading.Thread(target=handle, args=(c,), daemon=True).start()
`

describe('serve --domain with only E2B_DOMAIN', { concurrency: true }, () => {
  test('create, commands and files over TLS; the API returns the domain as the client used it', async () => {
    const sbx = await createSandbox()
    assert.equal(sbx.sandboxDomain, DOMAIN)
    assert.equal(sbx.getHost(8000), `8000-${sbx.sandboxId}.${DOMAIN}`)
    assert.equal((await sbx.commands.run('echo over tls')).stdout, 'over tls\n')
    await sbx.files.write('/tmp/domain.txt', 'through https')
    assert.equal(await sbx.files.read('/tmp/domain.txt'), 'through https')
    assert.equal(await sbx.isRunning(), true)
    // The API itself, on api.<domain>.
    const health = await get(`https://api.${DOMAIN}/health`)
    assert.equal(health.status, 200, health.text)
    const info = await Sandbox.getInfo(sbx.sandboxId)
    assert.equal(info.sandboxId, sbx.sandboxId)
  })

  test('https://getHost(8000) reaches a server in the sandbox; a closed port is "port is not open"', async () => {
    const sbx = await createSandbox()
    await sbx.commands.run('cd /tmp && echo hello > index.html && python3 -m http.server 8000', { background: true })
    const url = `https://${sbx.getHost(8000)}/index.html`
    await waitFor(async () => (await get(url).catch(() => ({}))).status === 200, { timeoutMs: 15_000, what: `GET ${url}` })
    assert.equal((await get(url)).text, 'hello\n')
    const closed = await get(`https://${sbx.getHost(8001)}/`)
    assert.equal(closed.status, 502, closed.text)
    assert.match(JSON.parse(closed.text).message, /port is not open/)
  })

  test('allowPublicTraffic=false: 403 without e2b-traffic-access-token, 200 with it', async () => {
    const sbx = await createSandbox({ network: { allowPublicTraffic: false } })
    assert.ok(sbx.trafficAccessToken)
    await sbx.commands.run('cd /tmp && python3 -m http.server 8000', { background: true })
    const url = `https://${sbx.getHost(8000)}/`
    const token = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
    await waitFor(async () => (await get(url, token).catch(() => ({}))).status === 200, { timeoutMs: 15_000, what: 'private port with token' })
    assert.equal((await get(url)).status, 403)
    assert.equal((await get(url, { 'e2b-traffic-access-token': 'nope' })).status, 403)
  })

  test('signed uploadUrl / downloadUrl are https URLs a bare fetch can use', async () => {
    const sbx = await createSandbox()
    const up = await sbx.uploadUrl('/tmp/signed.txt')
    assert.ok(up.startsWith(`https://49983-${sbx.sandboxId}.${DOMAIN}/files?`), up)
    const form = new FormData()
    form.append('file', new Blob(['signed over tls']), 'x.txt')
    const ures = await fetch(up, { method: 'POST', body: form })
    assert.equal(ures.status, 200, await ures.clone().text())
    const down = await sbx.downloadUrl('/tmp/signed.txt')
    assert.ok(down.startsWith(`https://49983-${sbx.sandboxId}.${DOMAIN}/files?`), down)
    const dres = await get(down)
    assert.equal(dres.status, 200)
    assert.equal(dres.text, 'signed over tls')
  })

  test('a websocket server in the sandbox through wss://8000-<id>.<domain>', async () => {
    const sbx = await createSandbox()
    await sbx.files.write('/tmp/ws.py', WS_SERVER)
    await sbx.commands.run('python3 /tmp/ws.py', { background: true })
    const host = sbx.getHost(8000)
    await waitFor(async () => (await get(`https://${host}/`).catch(() => ({}))).text === 'plain', { timeoutMs: 15_000, what: 'the websocket server' })
    const ws = new WebSocketImpl(`wss://${host}/echo`)
    const replies = []
    await new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`no echo after 15 s: ${replies}`)), 15_000)
      ws.addEventListener('open', () => { ws.send('one'); ws.send('two') })
      ws.addEventListener('message', (ev) => {
        replies.push(String(ev.data))
        if (replies.length === 2) { clearTimeout(timer); resolve() }
      })
      ws.addEventListener('error', (ev) => reject(new Error(`websocket: ${ev.message ?? ev.error ?? 'error'}`)))
    })
    assert.deepEqual(replies, ['echo:one', 'echo:two'])
    ws.close()
  })

  test('bad names: an unknown sandbox, a name under the domain nothing serves, a name outside it', async () => {
    const gone = await get(`https://49983-nosuchsandbox000000000.${DOMAIN}/health`)
    assert.equal(gone.status, 502, gone.text) // what the SDKs read as "sandbox gone"
    assert.match(JSON.parse(gone.text).message, /The sandbox was not found/)
    const www = await get(`https://www.${DOMAIN}/`)
    assert.equal(www.status, 404)
    assert.equal(JSON.parse(www.text).code, 404)
    // No certificate for a name outside the domain: the handshake fails.
    const outside = await new Promise((resolve) => {
      const s = tls.connect({ host: '127.0.0.1', port: Number(PORT), servername: 'example.com', rejectUnauthorized: false })
      s.on('secureConnect', () => { s.destroy(); resolve('connected') })
      s.on('error', (e) => resolve(e.message))
    })
    assert.notEqual(outside, 'connected')
    assert.match(outside, /alert|handshake/i)
    // The same connection by the domain's name works.
    const inside = await new Promise((resolve) => {
      const s = tls.connect({ host: '127.0.0.1', port: Number(PORT), servername: `api.${HOST}` })
      s.on('secureConnect', () => { s.destroy(); resolve('connected') })
      s.on('error', (e) => resolve(e.message))
    })
    assert.equal(inside, 'connected')
  })

  test('@e2b/code-interpreter runCode', async () => {
    const sbx = await CodeInterpreter.create('code-interpreter-v1', { metadata: meta({ file: 'domain' }) })
    track(sbx.sandboxId)
    assert.equal(sbx.sandboxDomain, DOMAIN)
    const r = await sbx.runCode('x = 40\nx + 2')
    assert.equal(r.error, undefined, r.error?.traceback)
    assert.equal(r.text, '42')
  })

  test('the official CLI: sandbox list', async () => {
    const sbx = await createSandbox()
    const home = mkdtempSync(join(work, 'home-'))
    const r = await runCLI(['sandbox', 'list', '--format', 'json'], {
      home, cwd: work, env: { E2B_DOMAIN: DOMAIN, NODE_EXTRA_CA_CERTS: process.env.NODE_EXTRA_CA_CERTS },
    })
    assert.equal(r.code, 0, showRun(r))
    assert.ok(r.stdout.includes(sbx.sandboxId), showRun(r))
  })

  test('the volume client: create, write and read through the content API, mount, destroy', async () => {
    const vol = await Volume.create(`dom-${Date.now().toString(36)}`)
    try {
      await vol.writeFile('/hello.txt', 'over tls')
      assert.equal(await vol.readFile('/hello.txt'), 'over tls')
      const sbx = await createSandbox({ volumeMounts: { '/data': vol } })
      assert.equal((await sbx.commands.run('cat /data/hello.txt')).stdout, 'over tls')
      await sbx.kill()
    } finally {
      assert.equal(await Volume.destroy(vol.volumeId), true)
    }
  })

  test('Python on the host reaches https://getHost(8000) with SSL_CERT_FILE set to the bundle', async () => {
    const sbx = await createSandbox()
    await sbx.commands.run('cd /tmp && echo from-python > p.txt && python3 -m http.server 8000', { background: true })
    const url = `https://${sbx.getHost(8000)}/p.txt`
    await waitFor(async () => (await get(url)).status === 200, { timeoutMs: 15_000, what: 'the server' })
    const bundle = join(dirname(process.env.NODE_EXTRA_CA_CERTS), 'bundle.crt')
    const { stdout } = await promisify(execFile)('python3', ['-c', 'import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1]).read().decode(), end="")', url],
      { env: { ...process.env, SSL_CERT_FILE: bundle } })
    assert.equal(stdout, 'from-python\n')
  })

  test('getMcpUrl() reaches port 50005 of the sandbox', async () => {
    const sbx = await createSandbox()
    await sbx.commands.run('mkdir -p /tmp/m/mcp && echo gateway-stand-in > /tmp/m/mcp/index.html && cd /tmp/m && python3 -m http.server 50005', { background: true })
    const url = sbx.getMcpUrl()
    assert.equal(url, `https://50005-${sbx.sandboxId}.${DOMAIN}/mcp`)
    await waitFor(async () => (await get(url + '/')).text.includes('gateway-stand-in'), { timeoutMs: 15_000, what: 'the server on 50005' })
  })

  // Debian's chromium, driven by playwright-core. The browser trusts exactly
  // the server's certificate (its public key pinned with
  // --ignore-certificate-errors-spki-list; every other certificate error
  // still fails), and resolves *.localhost to loopback by itself.
  const chromiumPath = ['/usr/bin/chromium', '/usr/bin/chromium-browser'].find((p) => existsSync(p))
  test('headless Chromium opens https://8000-<id>.<domain>', { skip: chromiumPath ? false : 'no chromium (scripts/setup-test.sh installs it)' }, async () => {
    const { chromium } = await import('playwright-core')
    const leafPem = readFileSync(join(dirname(process.env.NODE_EXTRA_CA_CERTS), 'leaf.pem'), 'utf8')
    const leaf = new X509Certificate(leafPem.slice(0, leafPem.indexOf('-----END CERTIFICATE-----') + 25))
    const spki = createHash('sha256').update(leaf.publicKey.export({ type: 'spki', format: 'der' })).digest('base64')
    const sbx = await createSandbox()
    const page = '<!doctype html><title>airlock page</title><h1 id="t">served from the sandbox</h1><script>document.getElementById("t").dataset.js = location.protocol</script>'
    await sbx.files.write('/tmp/www/index.html', page)
    await sbx.commands.run('cd /tmp/www && python3 -m http.server 8000', { background: true })
    const url = `https://${sbx.getHost(8000)}/index.html`
    await waitFor(async () => (await get(url)).status === 200, { timeoutMs: 15_000, what: 'the page server' })
    const browser = await chromium.launch({
      executablePath: chromiumPath,
      args: ['--no-sandbox', `--ignore-certificate-errors-spki-list=${spki}`],
    })
    // Chromium aborts a navigation with ERR_NETWORK_CHANGED when the host's
    // interfaces change under it, which the other test files' sandboxes do
    // (a veth per create, one gone per kill): that is the host, not the
    // server; go again. Playwright reports it either by that name or as the
    // navigation "interrupted by another navigation" to Chromium's error
    // page, which a certificate refusal never is (that one names ERR_CERT_),
    // or as the navigation interrupted by another to the same address
    // (Chromium going again by itself after the change; seen once in make
    // test).
    const networkChanged = (e, u) => /ERR_NETWORK_CHANGED|interrupted by another navigation to "chrome-error:\/\/chromewebdata\/"/.test(String(e)) ||
      String(e).includes(`interrupted by another navigation to "${u}"`)
    const goto = async (tab, u) => {
      for (let i = 0; ; i++) {
        try {
          return await tab.goto(u)
        } catch (e) {
          if (i >= 4 || !networkChanged(e, u)) throw e
        }
      }
    }
    try {
      const tab = await browser.newPage()
      const res = await goto(tab, url)
      assert.equal(res.status(), 200)
      assert.equal(await tab.title(), 'airlock page')
      assert.equal(await tab.textContent('#t'), 'served from the sandbox')
      assert.equal(await tab.getAttribute('#t', 'data-js'), 'https:')
      // A port nothing listens on: E2B's answer, as a page a person can read.
      const closed = await goto(tab, `https://${sbx.getHost(8001)}/`)
      assert.equal(closed.status(), 502)
      assert.match(await tab.textContent('p'), /port is not open/)
      // The pin is for this server's key only: a name outside the domain is
      // refused at the handshake, which the browser reports as a failure.
      await assert.rejects(goto(tab, `https://8000-${sbx.sandboxId}.elsewhere.localhost:${PORT}/`), /ERR_CERT_|ERR_SSL_/)
    } finally {
      await browser.close()
    }
  })
})
