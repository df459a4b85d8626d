// The Kubernetes backend as clients see it (tests/sdk/run-kube.sh runs it;
// it needs AIRLOCK_KUBE_NAMESPACE and KUBECTL): each sandbox is a Pod with
// the gVisor RuntimeClass, its limits and labels; a Pod deleted behind
// Airlock's back is a killed sandbox with an event saying so, never one
// that silently stops answering; a timeout ends sandbox and Pod; what the
// backend cannot do answers 501 naming it; two replicas serve one
// sandbox alike.

import assert from 'node:assert/strict'
import { execFileSync } from 'node:child_process'
import { createHash, randomBytes } from 'node:crypto'
import http from 'node:http'
import { describe, test } from 'node:test'
import { Sandbox } from 'e2b'
import { API_KEY, api, createSandbox, meta, sleep, track, trackCleanup, waitFor } from './helpers.mjs'

const NS = process.env.AIRLOCK_KUBE_NAMESPACE
const KUBECTL = process.env.KUBECTL || 'kubectl'
const REPLICAS = JSON.parse(process.env.AIRLOCK_KUBE_REPLICAS || '[]')
const skip = !NS && 'not against the kubernetes backend (tests/sdk/run-kube.sh)'

trackCleanup()

function kubectl(...args) {
  return execFileSync(KUBECTL, ['-n', NS, ...args], { encoding: 'utf8' })
}

function podOf(id) {
  const out = kubectl('get', 'pods', '-l', `airlock.dev/sandbox=${id}`, '-o', 'json')
  return JSON.parse(out).items[0]
}

async function eventsOf(id) {
  const res = await api('GET', `/events/sandboxes/${id}?orderAsc=true&limit=100`)
  assert.equal(res.status, 200, res.text)
  return res.json
}

describe('kubernetes backend', { skip }, () => {
  test('a sandbox is a Pod: gVisor, its limits, labels; commands run in it', async () => {
    const sbx = await createSandbox({ metadata: { role: 'pod' } })
    const pod = podOf(sbx.sandboxId)
    assert.ok(pod, 'no Pod labelled with the sandbox')
    assert.equal(pod.spec.runtimeClassName, 'gvisor')
    assert.equal(pod.metadata.labels['airlock.dev/template'], 'base')
    const c = pod.spec.containers[0]
    const info = await sbx.getInfo()
    assert.equal(c.resources.limits.cpu, String(info.cpuCount))
    assert.equal(c.resources.limits.memory, `${info.memoryMB}Mi`)
    const r = await sbx.commands.run('dmesg 2>/dev/null | head -1; hostname')
    assert.match(r.stdout, /gVisor|Starting/i, 'the kernel is gVisor\'s')
    assert.equal(pod.spec.automountServiceAccountToken, false)
  })

  test('a Pod deleted behind Airlock\'s back: a killed sandbox, with the reason in its event', async () => {
    const sbx = await createSandbox()
    const id = sbx.sandboxId
    kubectl('delete', 'pod', `airlock-${id}`, '--wait=false')
    await waitFor(async () => !(await Sandbox.list({ query: { metadata: meta() } }).nextItems()).some((s) => s.sandboxId === id),
      { timeoutMs: 30_000, what: 'the sandbox gone from the list' })
    const res = await api('GET', `/sandboxes/${id}`)
    assert.equal(res.status, 404, res.text)
    const evs = await waitFor(async () => {
      const e = await eventsOf(id)
      return e.some((x) => x.type === 'sandbox.lifecycle.killed') && e
    }, { timeoutMs: 30_000, what: 'a killed event' })
    assert.deepEqual(evs.map((e) => e.type), ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed'])
    const killed = evs[1]
    assert.equal(killed.eventData.kill_reason, 'pod_lost')
    assert.match(killed.eventData.kill_detail, /deleted \(not by Airlock\)/)
    assert.equal(killed.sandboxExecutionId, evs[0].sandboxExecutionId)
  })

  test('a timeout ends the sandbox and its Pod, with a killed event (timeout)', async () => {
    const sbx = await Sandbox.create('base', { timeoutMs: 3_000, metadata: meta() })
    const id = track(sbx.sandboxId)
    await waitFor(async () => (await api('GET', `/sandboxes/${id}`)).status === 404, { timeoutMs: 30_000, what: 'the sandbox ended' })
    await waitFor(() => {
      const out = kubectl('get', 'pods', '-l', `airlock.dev/sandbox=${id}`, '-o', 'name')
      return out.trim() === ''
    }, { timeoutMs: 60_000, what: 'its Pod gone' })
    const evs = await eventsOf(id)
    assert.equal(evs.at(-1).type, 'sandbox.lifecycle.killed')
    assert.equal(evs.at(-1).eventData.kill_reason, 'timeout')
  })

  test('kill: killed event (request), no Pod left', async () => {
    const sbx = await createSandbox()
    const id = sbx.sandboxId
    await sbx.kill()
    const evs = await eventsOf(id)
    assert.equal(evs.at(-1).eventData.kill_reason, 'request')
    await waitFor(() => kubectl('get', 'pods', '-l', `airlock.dev/sandbox=${id}`, '-o', 'name').trim() === '',
      { timeoutMs: 60_000, what: 'its Pod gone' })
  })

  test('a warm Pod is claimed: its envd takes the create\'s token and env, the pool is refilled', async () => {
    const warmOf = () => JSON.parse(kubectl('get', 'pods', '-l', 'airlock.dev/warm=base', '-o', 'json')).items
      .filter((p) => !p.metadata.deletionTimestamp && p.status.conditions?.some((c) => c.type === 'Ready' && c.status === 'True'))
    const before = await waitFor(() => warmOf().length >= 1 && warmOf(), { timeoutMs: 60_000, what: 'a ready warm Pod of base' })
    const warmIDs = before.map((p) => p.metadata.labels['airlock.dev/sandbox'])
    const sbx = await createSandbox({ envs: { FROM_CREATE: 'yes' } })
    assert.ok(warmIDs.includes(sbx.sandboxId), `the sandbox ${sbx.sandboxId} is one of the warm Pods ${warmIDs}`)
    const pod = podOf(sbx.sandboxId)
    assert.equal(pod.metadata.labels['airlock.dev/warm'], undefined, 'claimed: no longer warm')
    assert.ok(pod.metadata.labels['airlock.dev/team'], 'claimed: the team named')
    const r = await sbx.commands.run('echo $FROM_CREATE $E2B_SANDBOX_ID; ls /run/airlock-config')
    assert.equal(r.stdout, `yes ${sbx.sandboxId}\nconfig.json\n`, 'the create\'s env, and no init key among the sandbox\'s files')
    // The claim's token is the only one: a wrong one is refused.
    const wrong = await fetch(`${process.env.E2B_SANDBOX_URL}/envs`, { headers: { 'E2b-Sandbox-Id': sbx.sandboxId, 'E2b-Sandbox-Port': '49983', 'X-Access-Token': 'wrong' } })
    assert.equal(wrong.status, 401)
    await waitFor(() => warmOf().filter((p) => !warmIDs.includes(p.metadata.labels['airlock.dev/sandbox'])).length >= 1,
      { timeoutMs: 60_000, what: 'the pool refilled' })
  })

  test('templates: the served ones listed, read only', async () => {
    const list = await api('GET', '/templates')
    assert.equal(list.status, 200, list.text)
    const ids = list.json.map((t) => t.templateID)
    assert.ok(ids.includes('base') && ids.includes('code-interpreter-v1'), `listed: ${ids}`)
    assert.ok(!ids.includes('python3'), 'a template the replicas do not serve is not listed')
    const one = await api('GET', '/templates/base')
    assert.equal(one.status, 200, one.text)
    const del = await api('DELETE', '/templates/base')
    assert.equal(del.status, 501, del.text)
    assert.match(del.json.message, /read only/)
  })

  test('the egress policy: the node agent judges a Pod by the policy in its annotation; updates reach the running Pod', async () => {
    // The node itself is closed to every sandbox Pod whatever its policy:
    // a listener of the test's on every host address, at the node's
    // address on the Pods' bridge (the .1 of the Pod's /24 on the test
    // cluster), answers the Pod only when the agent is not there.
    const server = http.createServer((_, res) => res.end('node'))
    await new Promise((r) => server.listen(0, '0.0.0.0', r))
    try {
      const port = server.address().port
      const open = await createSandbox()
      const pod = podOf(open.sandboxId)
      assert.equal(pod.metadata.annotations['airlock.dev/network'], '{}')
      assert.ok(pod.metadata.annotations['airlock.dev/network-applied'], 'the agent did not acknowledge the policy')
      const gw = pod.status.podIP.replace(/\.\d+$/, '.1')
      const probe = `timeout 3 bash -c 'exec 3<>/dev/tcp/${gw}/${port}' 2>/dev/null && echo open || echo closed`
      assert.equal((await open.commands.run(probe)).stdout.trim(), 'closed', 'a sandbox Pod reached its node')

      const closed = await createSandbox({ allowInternetAccess: false, network: { allowOut: ['1.1.1.1'] } })
      const policy = JSON.parse(podOf(closed.sandboxId).metadata.annotations['airlock.dev/network'])
      assert.deepEqual(policy, { allowOut: ['1.1.1.1'], denyOut: ['0.0.0.0/0'] })
      // Its DNS goes to the agent's filter, which resolves no name its
      // policy does not allow.
      const dns = await closed.commands.run('getent hosts example.com || echo unresolved')
      assert.equal(dns.stdout.trim(), 'unresolved')

      await open.updateNetwork({ allowOut: ['example.org'], denyOut: ['0.0.0.0/0'] })
      const after = podOf(open.sandboxId).metadata.annotations
      assert.deepEqual(JSON.parse(after['airlock.dev/network']), { allowOut: ['example.org'], denyOut: ['0.0.0.0/0'] })
      assert.equal((await open.commands.run('getent hosts example.com || echo unresolved')).stdout.trim(), 'unresolved')
      assert.ok(after['airlock.dev/network-applied'])
      const events = await eventsOf(open.sandboxId)
      assert.ok(events.some((e) => e.type === 'sandbox.lifecycle.updated' && e.eventData?.network_egress), 'no updated event with the policy')

      // Rules need the box's egress proxy.
      const rules = await api('POST', '/sandboxes', { body: { templateID: 'base', metadata: meta(),
        network: { rules: { 'api.example.com': [{ transform: { headers: { 'X-A': 'b' } } }] } } } })
      assert.equal(rules.status, 501, rules.text)
      assert.match(rules.json.message, /network rules/)
    } finally {
      server.close()
    }
  })

  test('what the backend cannot do answers 501 naming it', async () => {
    const sbx = await createSandbox()
    const res = await api('POST', `/sandboxes/${sbx.sandboxId}/pause`)
    assert.equal(res.status, 501, res.text)
    assert.match(res.json.message, /kubernetes backend/)
    const snap = await api('POST', `/sandboxes/${sbx.sandboxId}/snapshots`, { body: {} })
    assert.equal(snap.status, 501, snap.text)
    const auto = await api('POST', '/sandboxes', { body: { templateID: 'base', autoPause: true, metadata: meta() } })
    assert.equal(auto.status, 501, auto.text)
    assert.match(auto.json.message, /autoPause/)
  })

  test('webhooks: a sandbox made through one replica and killed through the other, each event delivered once, signed', { skip: REPLICAS.length < 2 && 'one replica' }, async () => {
    const [a, b] = REPLICAS
    const secret = 'whsec_' + randomBytes(24).toString('base64')
    const got = []
    const server = http.createServer((req, res) => {
      const chunks = []
      req.on('data', (c) => chunks.push(c))
      req.on('end', () => {
        const raw = Buffer.concat(chunks).toString('utf8')
        const sig = createHash('sha256').update(secret + raw).digest('base64').replace(/\+/g, '-').replace(/\//g, '_').replace(/=+$/, '')
        got.push({ ok: req.headers['e2b-signature'] === sig, event: JSON.parse(raw) })
        res.writeHead(200).end()
      })
    })
    await new Promise((r) => server.listen(0, '127.0.0.1', r))
    const reg = await fetch(`${a.api}/events/webhooks`, {
      method: 'POST', headers: { 'X-API-Key': API_KEY, 'Content-Type': 'application/json' },
      body: JSON.stringify({ name: 'kube', url: `http://127.0.0.1:${server.address().port}/hook`, enabled: true,
        events: ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed'], signatureSecret: secret }),
    })
    const regText = await reg.text()
    assert.equal(reg.status, 201, regText)
    const hook = JSON.parse(regText)
    try {
      const sbx = await Sandbox.create('base', { apiUrl: a.api, sandboxUrl: a.sandbox, metadata: meta({ role: 'webhook' }) })
      track(sbx.sandboxId)
      await Sandbox.kill(sbx.sandboxId, { apiUrl: b.api })
      const mine = () => got.filter((g) => g.event.sandboxId === sbx.sandboxId)
      await waitFor(() => mine().length >= 2, { timeoutMs: 60_000, what: 'the created and killed deliveries' })
      await new Promise((r) => setTimeout(r, 2_000)) // a duplicate would come now
      assert.deepEqual(mine().map((g) => g.event.type), ['sandbox.lifecycle.created', 'sandbox.lifecycle.killed'])
      assert.ok(mine().every((g) => g.ok), 'every delivery signed with the secret')
    } finally {
      await fetch(`${a.api}/events/webhooks/${hook.id}`, { method: 'DELETE', headers: { 'X-API-Key': API_KEY } })
      await new Promise((r) => server.close(r))
    }
  })

  test('the dashboard on a replica: sign-in, the key\'s sandboxes with their samples, the served templates', { skip: REPLICAS.length < 2 && 'one replica' }, async () => {
    const [a] = REPLICAS
    const page = await fetch(`${a.api}/dashboard/`)
    assert.equal(page.status, 200)
    assert.match(await page.text(), /<html/i)
    const signIn = await fetch(`${a.api}/dashboard/api/session`, {
      method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify({ apiKey: API_KEY }),
    })
    const signText = await signIn.text()
    assert.equal(signIn.status, 200, signText)
    const cookie = signIn.headers.get('set-cookie').split(';')[0]
    const get = async (path) => {
      const res = await fetch(`${a.api}/dashboard/api${path}`, { headers: { Cookie: cookie } })
      const text = await res.text()
      assert.equal(res.status, 200, `${path}: ${text}`)
      return JSON.parse(text)
    }
    const sbx = await createSandbox({ metadata: { role: 'dashboard' } })
    const list = await get(`/sandboxes?metadata=${encodeURIComponent('role=dashboard')}`)
    assert.ok(list.sandboxes.some((s) => s.sandboxID === sbx.sandboxId), JSON.stringify(list))
    const one = await get(`/sandboxes/${sbx.sandboxId}`)
    assert.equal(one.state, 'running')
    const samples = await waitFor(async () => {
      const m = await get(`/sandboxes/${sbx.sandboxId}/metrics`)
      return m.metrics.length > 0 && m.metrics
    }, { timeoutMs: 20_000, what: 'a metrics sample on the dashboard' })
    assert.ok(samples[0].memTotal > 0)
    const templates = await get('/templates')
    const ids = (templates.templates ?? templates).map((t) => t.templateID ?? t.id)
    assert.ok(ids.includes('base') && !ids.includes('python3'), `templates: ${JSON.stringify(ids)}`)
  })

  test('rate limits are shared by the replicas: a team allowed 2 requests a second gets 2 in a burst through both together', { skip: REPLICAS.length < 2 && 'one replica' }, async () => {
    const [a, b] = REPLICAS
    const team = `rate-${randomBytes(4).toString('hex')}`
    const made = await api('POST', '/api-keys', { body: { name: 'rate', team } })
    assert.equal(made.status, 201, made.text)
    const key = made.json.key
    const quota = await api('PATCH', `/teams/${made.json.teamID}`, { body: { quotas: { requestsPerSecond: 2 } } })
    assert.equal(quota.status, 200, quota.text)
    // Both replicas know the team's quota once their keys are reloaded
    // (every 2 s): a request answers 429 naming the team's quota.
    const burst = async () => {
      const urls = [a.api, b.api, a.api, b.api, a.api, b.api, a.api, b.api]
      return Promise.all(urls.map((u) => fetch(`${u}/sandboxes`, { headers: { 'X-API-Key': key } }).then((r) => r.status)))
    }
    await waitFor(async () => {
      const statuses = await burst()
      const viaA = statuses.filter((_, i) => i % 2 === 0)
      const viaB = statuses.filter((_, i) => i % 2 === 1)
      return !statuses.includes(401) && viaA.includes(429) && viaB.includes(429)
    }, { timeoutMs: 15_000, intervalMs: 500, what: 'both replicas knowing the key and applying the team quota' })
    await sleep(1500) // the bucket full again
    const statuses = await burst()
    assert.equal(statuses.filter((s) => s === 200).length, 2, `statuses through both replicas: ${statuses}`)
    assert.equal(statuses.filter((s) => s === 429).length, 6, `statuses through both replicas: ${statuses}`)
  })

  test('two replicas serve one sandbox alike: made by one, changed and read through the other', { skip: REPLICAS.length < 2 && 'one replica' }, async () => {
    const [a, b] = REPLICAS
    const sbx = await Sandbox.create('base', { apiUrl: a.api, sandboxUrl: a.sandbox, metadata: meta({ role: 'replicas' }) })
    track(sbx.sandboxId)
    await sbx.files.write('/home/user/by-a.txt', 'written through replica a')
    const viaB = await Sandbox.connect(sbx.sandboxId, { apiUrl: b.api, sandboxUrl: b.sandbox })
    assert.equal(await viaB.files.read('/home/user/by-a.txt'), 'written through replica a')
    await Sandbox.setTimeout(sbx.sandboxId, 600_000, { apiUrl: b.api })
    const infoA = await Sandbox.getInfo(sbx.sandboxId, { apiUrl: a.api })
    assert.ok(infoA.endAt.getTime() > Date.now() + 500_000, `replica a sees replica b's timeout: ${infoA.endAt}`)
    const listedB = await Sandbox.list({ apiUrl: b.api, query: { metadata: meta({ role: 'replicas' }) } }).nextItems()
    assert.deepEqual(listedB.map((s) => s.sandboxId), [sbx.sandboxId])
    await Sandbox.kill(sbx.sandboxId, { apiUrl: b.api })
    const res = await fetch(`${a.api}/sandboxes/${sbx.sandboxId}`, { headers: { 'X-API-Key': API_KEY } })
    assert.equal(res.status, 404)
  })
})
