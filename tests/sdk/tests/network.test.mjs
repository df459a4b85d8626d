// Sandbox network through the official SDK: user ports reached through the
// sandbox proxy by the host name getHost(port) gives, allowPublicTraffic and
// the traffic access token, and the network options of create and
// updateNetwork as getInfo reports them. Egress enforcement itself needs a
// network to egress to; the Go tests internal/sandbox/network_test.go and
// network_private_test.go cover it against a stand-in internet. The last
// block here checks the default policy's closed private ranges through the
// SDK, with two test hosts in a network namespace of its own.

import assert from 'node:assert/strict'
import { execFileSync, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { after, before, describe, test } from 'node:test'
import { ALL_TRAFFIC } from 'e2b'
import { API_URL, SANDBOX_URL, createSandbox, proxyGet as get, startHTTPServer as startServer, trackCleanup, waitFor } from './helpers.mjs'

trackCleanup()

describe('sandbox network', { concurrency: true }, () => {
  test('getHost(port) reaches a server in the sandbox; a closed port is a 502', async () => {
    const sbx = await createSandbox()
    await startServer(sbx, 8000)
    const host = sbx.getHost(8000)
    assert.match(host, new RegExp(`^8000-${sbx.sandboxId}\\.`))
    const ok = await get(host)
    assert.equal(ok.status, 200)
    assert.match(ok.body, /Directory listing/)
    const closed = await get(sbx.getHost(8001))
    assert.equal(closed.status, 502)
    const err = JSON.parse(closed.body)
    assert.equal(err.code, 502)
    assert.match(err.message, /port is not open/)
  })

  test('maskRequestHost: the server in the sandbox sees the masked Host, ${PORT} filled in; getInfo shows it', async () => {
    const sbx = await createSandbox({ network: { maskRequestHost: 'localhost:${PORT}' } })
    // A server that answers with the Host header it got.
    const server = 'import http.server as h\n' +
      'class H(h.BaseHTTPRequestHandler):\n' +
      '    def do_GET(self):\n' +
      '        b = self.headers.get("Host", "").encode()\n' +
      '        self.send_response(200); self.send_header("Content-Length", str(len(b))); self.end_headers(); self.wfile.write(b)\n' +
      'h.HTTPServer(("0.0.0.0", 8000), H).serve_forever()\n'
    await sbx.files.write('/tmp/echo_host.py', server)
    await sbx.commands.run('python3 /tmp/echo_host.py', { background: true })
    const host = sbx.getHost(8000)
    await waitFor(async () => (await get(host)).status === 200, { timeoutMs: 15_000, what: 'the Host echo server' })
    assert.equal((await get(host)).body, 'localhost:8000')
    const info = await sbx.getInfo()
    assert.equal(info.network?.maskRequestHost, 'localhost:${PORT}', JSON.stringify(info.network))
    // envd's own traffic keeps working: the mask is for user ports.
    assert.equal((await sbx.commands.run('echo ok')).stdout, 'ok\n')

    // Without a mask the server sees the Host the client used.
    const plain = await createSandbox()
    await plain.files.write('/tmp/echo_host.py', server)
    await plain.commands.run('python3 /tmp/echo_host.py', { background: true })
    await waitFor(async () => (await get(plain.getHost(8000))).status === 200, { timeoutMs: 15_000, what: 'the Host echo server' })
    assert.equal((await get(plain.getHost(8000))).body, plain.getHost(8000))
  })

  test('allowPublicTraffic=false requires the traffic access token', async () => {
    const sbx = await createSandbox({ network: { allowPublicTraffic: false } })
    assert.ok(sbx.trafficAccessToken, 'create must return trafficAccessToken')
    await sbx.commands.run('cd /tmp && python3 -m http.server 8000', { background: true })
    const host = sbx.getHost(8000)
    const headers = { 'e2b-traffic-access-token': sbx.trafficAccessToken }
    await waitFor(async () => (await get(host, headers)).status === 200, { timeoutMs: 15_000, what: 'private port with token' })
    assert.equal((await get(host)).status, 403)
    assert.equal((await get(host, { 'e2b-traffic-access-token': 'nope' })).status, 403)
    const info = await sbx.getInfo()
    assert.equal(info.network?.allowPublicTraffic, false)
  })

  test('network options at create and updateNetwork show in getInfo', async () => {
    const sbx = await createSandbox({
      network: { denyOut: [ALL_TRAFFIC], allowOut: ['example.com', '192.0.2.7'] },
    })
    let info = await sbx.getInfo()
    assert.deepEqual(info.network?.denyOut, [ALL_TRAFFIC])
    assert.deepEqual(info.network?.allowOut, ['example.com', '192.0.2.7'])
    assert.equal(info.allowInternetAccess, false)

    await sbx.updateNetwork({ allowOut: [], denyOut: ['10.0.0.0/8'], allowInternetAccess: true })
    info = await sbx.getInfo()
    assert.deepEqual(info.network?.denyOut, ['10.0.0.0/8'])
    assert.equal(info.allowInternetAccess, true)

    await assert.rejects(sbx.updateNetwork({ denyOut: ['not-a-cidr'] }), /denyOut entry "not-a-cidr"/)
    // The sandbox still runs and its rules did not change.
    assert.equal((await sbx.commands.run('echo alive')).stdout, 'alive\n')
    info = await sbx.getInfo()
    assert.deepEqual(info.network?.denyOut, ['10.0.0.0/8'])
  })

  test('the sandbox has its own network: eth0, a gateway resolver, its hosts file', async () => {
    const sbx = await createSandbox({ allowInternetAccess: false })
    const r = await sbx.commands.run('cat /etc/resolv.conf /etc/hosts /proc/net/route')
    assert.match(r.stdout, /nameserver \d+\.\d+\.\d+\.\d+/)
    assert.match(r.stdout, /eth0\t00000000\t/) // default route via eth0
  })
})

// Two test hosts in a network namespace this file creates (never a real
// network): a private one (192.168.249.2, behind a /30 of its own on the
// host) and a public-range one (198.18.249.2, the benchmarking range, routed
// to the same namespace). Each runs an HTTP server answering its address.
// The same for IPv6: a unique-local host on the link (fdaa:a1c0:249::2/64)
// and a public-looking one in the documentation range (2001:db8:a1c0:249::2,
// a /128 route to the namespace), used when the server gives sandboxes IPv6
// (serve --sandbox-ipv6; auto turns it on where the host has an IPv6
// default route). Needs root and a server on this machine (run.sh starts one).
const PRIVATE_HOST = '192.168.249.2'
const PUBLIC_HOST = '198.18.249.2'
const PRIVATE_HOST6 = 'fdaa:a1c0:249::2'
const PUBLIC_HOST6 = '2001:db8:a1c0:249::2'
const localServer = /^http:\/\/(127\.0\.0\.1|localhost)[:/]/.test(API_URL)
const canNetns = process.getuid?.() === 0 && localServer

describe('private networks are closed by default', { concurrency: true, skip: canNetns ? false : 'needs root and a local server' }, () => {
  const tag = randomBytes(3).toString('hex')
  const ns = `airlock-sdk-${tag}`
  const hostIf = `lks${tag}` // not a server's veth prefix: its firewall ignores it
  let server
  const ip = (...args) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] })

  before(async () => {
    ip('netns', 'add', ns)
    ip('link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns)
    ip('addr', 'add', '192.168.249.1/30', 'dev', hostIf)
    ip('link', 'set', hostIf, 'up')
    ip('route', 'add', `${PUBLIC_HOST}/32`, 'via', PRIVATE_HOST, 'dev', hostIf)
    ip('-n', ns, 'addr', 'add', `${PRIVATE_HOST}/30`, 'dev', 'eth0')
    ip('-n', ns, 'addr', 'add', `${PUBLIC_HOST}/32`, 'dev', 'eth0')
    ip('-6', 'addr', 'add', 'fdaa:a1c0:249::1/64', 'dev', hostIf, 'nodad')
    ip('-6', 'route', 'add', `${PUBLIC_HOST6}/128`, 'via', PRIVATE_HOST6, 'dev', hostIf)
    ip('-n', ns, '-6', 'addr', 'add', `${PRIVATE_HOST6}/64`, 'dev', 'eth0', 'nodad')
    ip('-n', ns, '-6', 'addr', 'add', `${PUBLIC_HOST6}/128`, 'dev', 'eth0', 'nodad')
    ip('-n', ns, 'link', 'set', 'eth0', 'up')
    ip('-n', ns, 'link', 'set', 'lo', 'up')
    const js = `require('http').createServer((q, r) => r.end('hello from ' + q.socket.localAddress.replace(/^::ffff:/, '') + '\\n')).listen(80, '::')`
    server = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', js], { stdio: 'ignore' })
    // The host reaches all: a sandbox failing to is the firewall's doing.
    for (const h of [PRIVATE_HOST, PUBLIC_HOST, PRIVATE_HOST6, PUBLIC_HOST6]) {
      await waitFor(async () => (await fetch(`http://${url(h)}/`).then((r) => r.text()).catch(() => '')).includes(`hello from ${h}`), {
        timeoutMs: 10_000, what: `test host ${h} from the host`,
      })
    }
  })

  after(() => {
    if (server && server.exitCode === null) server.kill('SIGKILL')
    try { ip('link', 'del', hostIf) } catch {}
    try { ip('netns', 'del', ns) } catch {}
  })

  // url is a host as a URL's authority.
  const url = (h) => (h.includes(':') ? `[${h}]` : h)

  // reach returns which hosts the sandbox's curl got an answer from.
  async function reach(sbx, hosts = [PRIVATE_HOST, PUBLIC_HOST]) {
    const out = {}
    await Promise.all(hosts.map(async (h) => {
      const r = await sbx.commands.run(`curl -sS -g --max-time 3 http://${url(h)}/`).catch((e) => e)
      out[h] = (r.stdout ?? '').includes(`hello from ${h}`)
    }))
    return out
  }

  test('the default policy reaches a public host but not a private one; updateNetwork opens it', async () => {
    const sbx = await createSandbox()
    assert.deepEqual(await reach(sbx), { [PRIVATE_HOST]: false, [PUBLIC_HOST]: true })
    await sbx.updateNetwork({ allowOut: [PRIVATE_HOST] })
    assert.deepEqual(await reach(sbx), { [PRIVATE_HOST]: true, [PUBLIC_HOST]: true })
  })

  test('allowOut naming the private host opens it; denyOut ALL still closes the rest', async () => {
    const sbx = await createSandbox({ network: { allowOut: [PRIVATE_HOST] } })
    assert.deepEqual(await reach(sbx), { [PRIVATE_HOST]: true, [PUBLIC_HOST]: true })
    const only = await createSandbox({ network: { denyOut: [ALL_TRAFFIC], allowOut: [`${PRIVATE_HOST}/32`] } })
    assert.deepEqual(await reach(only), { [PRIVATE_HOST]: true, [PUBLIC_HOST]: false })
  })

  test('IPv6: the default policy reaches a public IPv6 host but not a unique-local one; allowOut opens it; ALL_TRAFFIC closes IPv6', async (t) => {
    const sbx = await createSandbox()
    const inet6 = await sbx.commands.run('cat /proc/net/if_inet6')
    // A global-scope address (scope 00) on eth0: the server gives sandboxes IPv6.
    if (!/ 00 [0-9a-f]{2}\s+eth0$/m.test(inet6.stdout)) {
      t.skip('the server gives sandboxes no IPv6 (--sandbox-ipv6, or no IPv6 default route on the host)')
      return
    }
    const v6 = [PRIVATE_HOST6, PUBLIC_HOST6]
    assert.deepEqual(await reach(sbx, v6), { [PRIVATE_HOST6]: false, [PUBLIC_HOST6]: true })
    await sbx.updateNetwork({ allowOut: [`${PRIVATE_HOST6}/128`] })
    assert.deepEqual(await reach(sbx, v6), { [PRIVATE_HOST6]: true, [PUBLIC_HOST6]: true })
    const closed = await createSandbox({ allowInternetAccess: false })
    assert.deepEqual(await reach(closed, v6), { [PRIVATE_HOST6]: false, [PUBLIC_HOST6]: false })
    const denied = await createSandbox({ network: { denyOut: [PUBLIC_HOST6] } })
    assert.deepEqual(await reach(denied, [...v6, PUBLIC_HOST]), { [PRIVATE_HOST6]: false, [PUBLIC_HOST6]: false, [PUBLIC_HOST]: true })
  })
})
