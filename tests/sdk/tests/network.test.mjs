// Sandbox network through the official SDK: user ports reached through the
// sandbox proxy by the host name getHost(port) gives, allowPublicTraffic and
// the traffic access token, and the network options of create and
// updateNetwork as getInfo reports them. Egress enforcement itself needs a
// network to egress to; the Go test internal/sandbox/network_test.go covers
// it against a stand-in internet.

import assert from 'node:assert/strict'
import http from 'node:http'
import { describe, test } from 'node:test'
import { ALL_TRAFFIC } from 'e2b'
import { SANDBOX_URL, createSandbox, trackCleanup, waitFor } from './helpers.mjs'

trackCleanup()

// get sends GET / to the sandbox proxy with the given Host header (fetch may
// not set Host, node:http may).
function get(host, headers = {}) {
  const u = new URL(SANDBOX_URL)
  return new Promise((resolve, reject) => {
    const req = http.request(
      { hostname: u.hostname, port: u.port, path: '/', method: 'GET', headers: { ...headers, host } },
      (res) => {
        let body = ''
        res.setEncoding('utf8')
        res.on('data', (c) => { body += c })
        res.on('end', () => resolve({ status: res.statusCode, body }))
      },
    )
    req.on('error', reject)
    req.setTimeout(10_000, () => req.destroy(new Error('timeout')))
    req.end()
  })
}

async function startServer(sbx, port) {
  await sbx.commands.run(`cd /tmp && python3 -m http.server ${port}`, { background: true })
  await waitFor(async () => (await get(sbx.getHost(port))).status === 200, {
    timeoutMs: 15_000, what: `http.server on ${port} through the proxy`,
  })
}

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
