// Egress rules, secrets and a bring-your-own SOCKS5 proxy through the
// official SDK: Secret.fill markers in network.rules reach an HTTPS server
// filled in by Airlock's egress (never inside the sandbox), updateNetwork
// changes them for a connection already open, and egressProxy tunnels the
// sandbox's TCP through a SOCKS5 server of the test's own.
//
// The servers run in a network namespace this file creates (never a real
// network): 198.18.247.2 (the benchmarking range, public to the sandbox
// policy) behind a /30 of its own on the host, with an HTTPS server whose
// certificate comes from the run's test CA (run.sh makes it and passes
// --egress-upstream-ca), a plain HTTP server and a SOCKS5 server. Each
// prints a JSON line per request it gets, which is what the tests check.

import assert from 'node:assert/strict'
import { execFileSync, spawn } from 'node:child_process'
import { randomBytes } from 'node:crypto'
import { mkdtempSync, rmSync } from 'node:fs'
import { tmpdir } from 'node:os'
import { join } from 'node:path'
import { createInterface } from 'node:readline'
import { after, before, describe, test } from 'node:test'
import { Secret } from 'e2b'
import { API_URL, createSandbox, trackCleanup, uniq, waitFor } from './helpers.mjs'

trackCleanup()

const HOST = '198.18.247.2'
const LINK_HOST = '192.168.247.2' // the namespace's end of the /30: private, closed by default
const SOCKS_USER = 'sdk-user'
const SOCKS_PASS = `sdk-pass-${randomBytes(6).toString('hex')}`
const CA_DIR = process.env.AIRLOCK_SDK_EGRESS_CA_DIR
const localServer = /^http:\/\/(127\.0\.0\.1|localhost)[:/]/.test(API_URL)
const skip = !(process.getuid?.() === 0 && localServer) ? 'needs root and a local server'
  : !CA_DIR ? 'run.sh made no egress test CA' : false

// The servers, in one node process inside the namespace.
const serverJS = `
const fs = require('fs'), https = require('https'), http = require('http'), net = require('net')
const log = (o) => process.stdout.write(JSON.stringify(o) + '\\n')
https.createServer({ key: fs.readFileSync(process.argv[1]), cert: fs.readFileSync(process.argv[2]) }, (q, r) => {
  log({ kind: 'https', path: q.url, auth: q.headers.authorization || '', sni: q.socket.servername || '' })
  r.end('recorded ' + q.url + '\\n') // never echo header values back into the sandbox
}).listen(443, '0.0.0.0')
http.createServer((q, r) => { log({ kind: 'http', path: q.url }); r.end('hello from ' + q.socket.localAddress + '\\n') }).listen(80, '0.0.0.0')
// SOCKS5 (RFC 1928 CONNECT, RFC 1929 user/password), recording each CONNECT.
net.createServer((c) => {
  let buf = Buffer.alloc(0), stage = 0
  c.on('error', () => {})
  c.on('data', function onData(d) {
    buf = Buffer.concat([buf, d])
    if (stage === 0 && buf.length >= 2 && buf.length >= 2 + buf[1]) {
      const methods = buf.subarray(2, 2 + buf[1]); buf = buf.subarray(2 + buf[1])
      if (!methods.includes(2)) { c.end(Buffer.from([5, 0xff])); return }
      c.write(Buffer.from([5, 2])); stage = 1
    }
    if (stage === 1 && buf.length >= 2) {
      const ul = buf[1]; if (buf.length < 3 + ul) return
      const pl = buf[2 + ul]; if (buf.length < 3 + ul + pl) return
      const user = buf.subarray(2, 2 + ul).toString(), pass = buf.subarray(3 + ul, 3 + ul + pl).toString()
      buf = buf.subarray(3 + ul + pl)
      if (user !== process.argv[3] || pass !== process.argv[4]) { log({ kind: 'socks-auth-failed', user }); c.end(Buffer.from([1, 1])); return }
      c.write(Buffer.from([1, 0])); stage = 2
    }
    if (stage === 2 && buf.length >= 5) {
      let host, off
      if (buf[3] === 1) { if (buf.length < 10) return; host = [...buf.subarray(4, 8)].join('.'); off = 8 }
      else if (buf[3] === 3) { const n = buf[4]; if (buf.length < 7 + n) return; host = buf.subarray(5, 5 + n).toString(); off = 5 + n }
      else { c.destroy(); return }
      const port = buf.readUInt16BE(off); buf = buf.subarray(off + 2); stage = 3
      log({ kind: 'socks', user: process.argv[3], target: host + ':' + port })
      c.removeListener('data', onData)
      const up = net.connect(port, host, () => {
        c.write(Buffer.from([5, 0, 0, 1, 0, 0, 0, 0, 0, 0]))
        if (buf.length) up.write(buf)
        c.pipe(up); up.pipe(c)
      })
      up.on('error', () => c.destroy())
    }
  })
}).listen(1080, '0.0.0.0')
`

describe('egress rules, secrets and egress proxy', { concurrency: true, skip }, () => {
  const tag = randomBytes(3).toString('hex')
  const ns = `airlock-egr-${tag}`
  const hostIf = `lke${tag}` // not a server's veth prefix: its firewall ignores it
  const ip = (...args) => execFileSync('ip', args, { stdio: ['ignore', 'ignore', 'pipe'] })
  const records = []
  let server, certDir

  before(async () => {
    certDir = mkdtempSync(join(tmpdir(), 'airlock-egress-cert-'))
    const ssl = (...args) => execFileSync('openssl', args, { stdio: ['ignore', 'ignore', 'pipe'] })
    ssl('req', '-new', '-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes',
      '-keyout', join(certDir, 'srv.key'), '-out', join(certDir, 'srv.csr'),
      '-subj', `/CN=${HOST}`, '-addext', `subjectAltName=IP:${HOST}`)
    ssl('x509', '-req', '-in', join(certDir, 'srv.csr'), '-CA', join(CA_DIR, 'ca.crt'), '-CAkey', join(CA_DIR, 'ca.key'),
      '-CAcreateserial', '-CAserial', join(certDir, 'ca.srl'), '-days', '1', '-copy_extensions', 'copy', '-out', join(certDir, 'srv.crt'))
    ip('netns', 'add', ns)
    ip('link', 'add', hostIf, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns)
    ip('addr', 'add', '192.168.247.1/30', 'dev', hostIf)
    ip('link', 'set', hostIf, 'up')
    ip('route', 'add', `${HOST}/32`, 'via', LINK_HOST, 'dev', hostIf)
    ip('-n', ns, 'addr', 'add', `${LINK_HOST}/30`, 'dev', 'eth0')
    ip('-n', ns, 'addr', 'add', `${HOST}/32`, 'dev', 'eth0')
    ip('-n', ns, 'link', 'set', 'eth0', 'up')
    ip('-n', ns, 'link', 'set', 'lo', 'up')
    server = spawn('ip', ['netns', 'exec', ns, process.execPath, '-e', serverJS,
      join(certDir, 'srv.key'), join(certDir, 'srv.crt'), SOCKS_USER, SOCKS_PASS], { stdio: ['ignore', 'pipe', 'inherit'] })
    createInterface({ input: server.stdout }).on('line', (l) => { try { records.push(JSON.parse(l)) } catch {} })
    await waitFor(async () => (await fetch(`http://${HOST}/`).then((r) => r.text()).catch(() => '')).includes(`hello from ${HOST}`), {
      timeoutMs: 10_000, what: 'the test servers from the host',
    })
  })

  after(() => {
    if (server && server.exitCode === null) server.kill('SIGKILL')
    try { ip('link', 'del', hostIf) } catch {}
    try { ip('netns', 'del', ns) } catch {}
    if (certDir) rmSync(certDir, { recursive: true, force: true })
  })

  const rule = (header) => ({ [HOST]: [{ transform: { headers: { Authorization: header } } }] })
  const seen = (path) => records.filter((r) => r.kind === 'https' && r.path === path)

  test('a rule fills a secret into requests to its host on the host side; getInfo shows the marker, never the value', async () => {
    const name = uniq('tok')
    const value = `sv-${randomBytes(12).toString('hex')}`
    await Secret.create(name, value)
    const sbx = await createSandbox({ network: { rules: rule(`Bearer ${Secret.fill(name)}`) } })
    const r = await sbx.commands.run(`curl -sS --max-time 5 https://${HOST}/filled-${tag}`)
    assert.match(r.stdout, /recorded/)
    const got = seen(`/filled-${tag}`)
    assert.equal(got.length, 1)
    assert.equal(got[0].auth, `Bearer ${value}`)
    const info = await sbx.getInfo()
    assert.equal(info.network?.rules?.[HOST]?.[0]?.transform?.headers?.Authorization, `Bearer \${e2b.secrets.${name}}`, JSON.stringify(info.network))
    assert.ok(!JSON.stringify(info).includes(value), 'getInfo carries the value')
    // Not in the sandbox's environment, nor in its trust store or logs it can read.
    const env = await sbx.commands.run('env; cat /etc/ssl/certs/ca-certificates.crt')
    assert.ok(!env.stdout.includes(value), 'the value is inside the sandbox')
    assert.match(env.stdout, /Airlock egress CA/)
  })

  test('updateNetwork changes the rule for the next request on a connection already open', async () => {
    const name = uniq('tok')
    const [v1, v2] = [`one-${randomBytes(8).toString('hex')}`, `two-${randomBytes(8).toString('hex')}`]
    await Secret.create(name, v1)
    const sbx = await createSandbox({ network: { rules: rule(`Bearer ${Secret.fill(name)}`) } })
    const script = `import http.client, os, ssl, time
c = http.client.HTTPSConnection("${HOST}", context=ssl.create_default_context())
c.request("GET", "/ka1-${tag}"); r = c.getresponse(); r.read(); print(r.status, flush=True)
for _ in range(300):
    if os.path.exists("/tmp/go"): break
    time.sleep(0.05)
c.request("GET", "/ka2-${tag}"); r = c.getresponse(); r.read(); print(r.status, flush=True)
`
    await sbx.files.write('/tmp/ka.py', script)
    const proc = await sbx.commands.run('python3 /tmp/ka.py', { background: true })
    await waitFor(async () => seen(`/ka1-${tag}`).length === 1, { timeoutMs: 15_000, what: 'the first request' })
    await Secret.update(name, v2) // the next request reads the current value too
    await sbx.updateNetwork({ rules: rule(`Token ${Secret.fill(name)}`) })
    await sbx.commands.run('touch /tmp/go')
    const done = await proc.wait()
    assert.equal(done.stdout, '200\n200\n')
    assert.equal(seen(`/ka1-${tag}`)[0].auth, `Bearer ${v1}`)
    assert.equal(seen(`/ka2-${tag}`)[0].auth, `Token ${v2}`)
    assert.deepEqual((await sbx.getInfo()).network?.rules?.[HOST]?.[0]?.transform?.headers, { Authorization: `Token \${e2b.secrets.${name}}` })
  })

  test('bad rules are a 400 naming what is wrong', async () => {
    await assert.rejects(createSandbox({ network: { rules: rule(Secret.fill(uniq('missing'))) } }), /does not exist/)
    await assert.rejects(createSandbox({ network: { rules: { [HOST]: [{ transform: { headers: { 'Content-Length': '1' } } }] } } }), /cannot be set by a rule/)
    await assert.rejects(createSandbox({ network: { allowOut: ['example.com'], denyOut: ['0.0.0.0/0'], rules: rule('x') } }), /not reachable under this policy/)
    const sbx = await createSandbox()
    await assert.rejects(sbx.updateNetwork({ rules: rule(Secret.fill(uniq('missing'))) }), /does not exist/)
  })

  test('egressProxy tunnels TCP through the SOCKS5 server; getInfo shows no password; a bad proxy is refused or fails closed', async () => {
    const sbx = await createSandbox({ network: { egressProxy: { address: `${HOST}:1080`, username: SOCKS_USER, password: SOCKS_PASS } } })
    const before = records.filter((r) => r.kind === 'socks').length
    const r = await sbx.commands.run(`curl -sS --max-time 5 http://${HOST}/via-socks-${tag}`)
    assert.match(r.stdout, new RegExp(`hello from ${HOST}`))
    const socks = records.filter((x) => x.kind === 'socks').slice(before)
    assert.ok(socks.some((x) => x.target === `${HOST}:80` && x.user === SOCKS_USER), JSON.stringify(socks))
    const info = await sbx.getInfo()
    assert.deepEqual(info.network?.egressProxy, { address: `${HOST}:1080`, username: SOCKS_USER })
    const env = await sbx.commands.run('env')
    assert.ok(!env.stdout.includes(SOCKS_PASS))
    // A proxy on the host or a closed private address: refused at create.
    await assert.rejects(createSandbox({ network: { egressProxy: { address: '127.0.0.1:1080' } } }), /address of the host/)
    await assert.rejects(createSandbox({ network: { egressProxy: { address: `${LINK_HOST}:1080` } } }), /private address/)
    // The wrong password: the connection fails, it never goes direct.
    const wrong = await createSandbox({ network: { egressProxy: { address: `${HOST}:1080`, username: SOCKS_USER, password: 'wrong' } } })
    const w = await wrong.commands.run(`curl -sS --max-time 5 http://${HOST}/direct-${tag}`).catch((e) => e)
    assert.notEqual(w.exitCode, 0)
    assert.ok(!records.some((x) => x.kind === 'http' && x.path === `/direct-${tag}`), 'the connection went direct')
  })
})
