#!/usr/bin/env node
// DEV MOCK ONLY — not the real server, not used by any test or by the build.
// A throwaway fake of the dashboard JSON API in ../API.md, with made-up data,
// for looking at the UI before/without the Go backend:
//
//   npm run build && node dev/mock-server.mjs [port]     (default 5199, 127.0.0.1)
//
// Sign in with the key below. Sandbox "sbx-gone" answers 404 gone:true.
import http from 'node:http';
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const KEY = 'e2b_0123456789abcdef0123456789abcdef01234567';
const PORT = Number(process.argv[2] || 5199);
const DIST = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../internal/dashboard/dist');

const sessions = new Map(); // cookie -> csrf
const now = () => Date.now();
const iso = (ms) => new Date(ms).toISOString();

// ---- fake data ----
let seq = 0;
const templates = ['base', 'python', 'node', 'my-tpl'];
const sandboxes = [];
function mkSandbox(ageMs) {
  const id = 'sbx' + (++seq).toString(36).padStart(6, '0') + crypto.randomBytes(3).toString('hex');
  const t = templates[seq % templates.length];
  const started = now() - ageMs;
  sandboxes.unshift({
    sandboxID: id,
    templateID: t === 'my-tpl' ? 'tpl_abc123' : t,
    alias: t,
    state: seq % 5 === 0 ? 'paused' : 'running',
    startedAt: iso(started),
    endAt: iso(started + 3600e3),
    cpuCount: 2,
    memoryMB: 512,
    diskSizeMB: 1024,
    metadata: seq % 3 === 0 ? { team: 'ml', run: String(seq) } : seq % 3 === 1 ? { user: 'alice' } : {},
    usage:
      seq % 7 === 0
        ? null
        : { at: iso(now()), cpuUsedPct: (seq * 7.3) % 100, memUsed: (seq % 50) * 7e6 + 30e6, memTotal: 512 * 1048576, diskUsed: (seq % 30) * 2e7 + 1e8, diskTotal: 1024 * 1048576 },
  });
}
for (let i = 0; i < 1000; i++) mkSandbox((1000 - i) * 30e3);
// a new sandbox every 5 s, so the list is live
setInterval(() => mkSandbox(0), 5000);

const creates = () => {
  const m = Math.floor(now() / 60e3) * 60e3;
  return Array.from({ length: 60 }, (_, i) => ({ minute: iso(m - (59 - i) * 60e3), count: Math.round(5 + 4 * Math.sin(i / 5) + (i % 7)) }));
};

const events = (sb) => [
  { id: 'e3', type: 'sandbox.lifecycle.resumed', timestamp: iso(Date.parse(sb.startedAt) + 120e3), eventData: null },
  { id: 'e2', type: 'sandbox.lifecycle.paused', timestamp: iso(Date.parse(sb.startedAt) + 60e3), eventData: { reason: 'api' } },
  { id: 'e1', type: 'sandbox.lifecycle.created', timestamp: sb.startedAt, eventData: { templateID: sb.templateID } },
];
const goneEvents = [
  { id: 'g2', type: 'sandbox.lifecycle.killed', timestamp: iso(now() - 300e3), eventData: { by: 'api' } },
  { id: 'g1', type: 'sandbox.lifecycle.created', timestamp: iso(now() - 900e3), eventData: null },
];

const fsTree = {
  '/home/user': [
    { name: 'project', type: 'dir', size: 4096 },
    { name: '.bashrc', type: 'file', size: 3771 },
    { name: 'notes.txt', type: 'file', size: 1234567 },
    { name: 'link', type: 'symlink', size: 7 },
  ],
  '/home/user/project': [{ name: 'main.py', type: 'file', size: 842 }],
};
const logStart = now() - 600e3;

const tpls = [
  { templateID: 'base', aliases: ['base'], builtin: true, public: true, ready: true, sizeBytes: 310e6, layers: 4, createdAt: iso(now() - 30 * 864e5), builtAt: iso(now() - 30 * 864e5), buildID: 'b-base', cpuCount: 2, memoryMB: 512, diskSizeMB: 1024, mine: false, builds: [{ buildID: 'b-base', status: 'ready', createdAt: iso(now() - 30 * 864e5), finishedAt: iso(now() - 30 * 864e5 + 60e3) }] },
  { templateID: 'tpl_abc123', aliases: ['my-tpl'], builtin: false, public: false, ready: true, sizeBytes: 812e6, layers: 9, createdAt: iso(now() - 2 * 864e5), builtAt: iso(now() - 3600e3), buildID: 'b2', cpuCount: 4, memoryMB: 2048, diskSizeMB: 4096, mine: true, builds: [
    { buildID: 'b3', status: 'building', createdAt: iso(now() - 20e3), finishedAt: null },
    { buildID: 'b2', status: 'ready', createdAt: iso(now() - 3700e3), finishedAt: iso(now() - 3600e3) },
    { buildID: 'b1', status: 'error', createdAt: iso(now() - 2 * 864e5), finishedAt: iso(now() - 2 * 864e5 + 30e3) },
  ] },
  { templateID: 'tpl_unused', aliases: [], builtin: false, public: false, ready: false, sizeBytes: 0, layers: 0, createdAt: iso(now() - 600e3), builtAt: null, buildID: '', cpuCount: 1, memoryMB: 256, diskSizeMB: 512, mine: true, builds: [] },
];
const buildStart = now();

// ---- helpers ----
const send = (res, code, body, headers = {}) => {
  res.writeHead(code, { 'content-type': 'application/json', ...headers });
  res.end(body === undefined ? '' : JSON.stringify(body));
};
const err = (res, code, message, extra = {}) => send(res, code, { code, message, ...extra });
const cookieOf = (req) => /(?:^|;\s*)airlock_dashboard=([^;]+)/.exec(req.headers.cookie || '')?.[1];
const readBody = (req) => new Promise((r) => { const c = []; req.on('data', (d) => c.push(d)); req.on('end', () => r(Buffer.concat(c))); });

function serveStatic(req, res, p) {
  let f = path.join(DIST, p.replace(/^\/dashboard\/?/, ''));
  if (!f.startsWith(DIST) || !fs.existsSync(f) || fs.statSync(f).isDirectory()) f = path.join(DIST, 'index.html');
  const ext = path.extname(f);
  const type = { '.html': 'text/html', '.js': 'text/javascript', '.css': 'text/css' }[ext] || 'application/octet-stream';
  res.writeHead(200, { 'content-type': type });
  fs.createReadStream(f).pipe(res);
}

const server = http.createServer(async (req, res) => {
  const u = new URL(req.url, 'http://x');
  const p = u.pathname;
  if (p === '/') return send(res, 302, undefined, { location: '/dashboard/' });
  if (!p.startsWith('/dashboard/api/')) return serveStatic(req, res, p);
  const route = p.slice('/dashboard/api/'.length);
  const body = await readBody(req);
  const ck = cookieOf(req);
  const csrf = ck && sessions.get(ck);

  if (route === 'session') {
    if (req.method === 'POST') {
      let j = {};
      try { j = JSON.parse(body.toString() || '{}'); } catch {}
      if (!j.apiKey) return err(res, 400, 'apiKey is required');
      if (j.apiKey !== KEY) return err(res, 401, 'Invalid API key');
      const c = crypto.randomBytes(16).toString('hex');
      const t = crypto.randomBytes(16).toString('hex');
      sessions.set(c, t);
      return send(res, 200, { csrfToken: t, keyHint: 'e2b_…4567' }, { 'set-cookie': `airlock_dashboard=${c}; Path=/dashboard; HttpOnly; SameSite=Strict` });
    }
    if (!csrf) return err(res, 401, 'Not signed in');
    if (req.method === 'GET') return send(res, 200, { csrfToken: csrf, keyHint: 'e2b_…4567' });
    if (req.method === 'DELETE') { sessions.delete(ck); res.writeHead(204); return res.end(); }
  }
  if (!csrf) return err(res, 401, 'Not signed in');
  if (req.method !== 'GET' && req.headers['x-airlock-csrf'] !== csrf) return err(res, 403, 'Missing or wrong CSRF token');

  if (route === 'overview') {
    return send(res, 200, {
      running: sandboxes.filter((s) => s.state === 'running').length,
      paused: sandboxes.filter((s) => s.state === 'paused').length,
      createsPerMinute: creates(),
      host: { cpus: 2, load1: 0.4 + Math.random() * 0.2, memoryTotalBytes: 24 * 2 ** 30, memoryAvailableBytes: 17.3 * 2 ** 30, diskTotalBytes: 200 * 2 ** 30, diskFreeBytes: 41 * 2 ** 30 },
    });
  }
  if (route === 'sandboxes') {
    let l = sandboxes;
    const st = u.searchParams.get('state');
    if (st) l = l.filter((s) => s.state === st);
    const t = u.searchParams.get('template');
    if (t) l = l.filter((s) => s.templateID === t || s.alias === t);
    const md = u.searchParams.get('metadata');
    if (md) {
      const kv = new URLSearchParams(md);
      l = l.filter((s) => [...kv].every(([k, v]) => s.metadata?.[k] === v));
    }
    const off = Number(u.searchParams.get('offset') || 0);
    const lim = Number(u.searchParams.get('limit') || 100);
    return send(res, 200, { total: l.length, sandboxes: l.slice(off, off + lim) });
  }
  let m;
  if ((m = /^templates\/([^/]+)\/builds\/([^/]+)\/log$/.exec(route))) {
    const off = Number(u.searchParams.get('offset') || 0);
    const isLive = m[2] === 'b3';
    const total = isLive ? Math.min(60, Math.floor((now() - buildStart) / 500)) : 25;
    const lines = [];
    for (let i = off; i < total; i++) lines.push(`#${i} step ${i}: RUN echo line ${i}`);
    return send(res, 200, { status: isLive ? (total >= 60 ? 'ready' : 'building') : m[2] === 'b1' ? 'error' : 'ready', lines, nextOffset: total });
  }
  if (route === 'templates') return send(res, 200, { templates: tpls });
  if ((m = /^templates\/([^/]+)$/.exec(route)) && req.method === 'DELETE') {
    if (m[1] === 'tpl_abc123') return err(res, 409, 'template tpl_abc123 is in use by 3 sandboxes');
    const i = tpls.findIndex((t) => t.templateID === m[1]);
    if (i < 0) return err(res, 404, 'no such template');
    if (tpls[i].builtin) return err(res, 403, 'built-in templates cannot be deleted');
    tpls.splice(i, 1);
    res.writeHead(204); return res.end();
  }
  if ((m = /^sandboxes\/([^/]+)(?:\/(.*))?$/.exec(route))) {
    const id = decodeURIComponent(m[1]);
    const sub = m[2] || '';
    const sb = sandboxes.find((s) => s.sandboxID === id);
    if (id === 'sbx-gone' && sub === 'events') return send(res, 200, { events: goneEvents });
    if (!sb) return err(res, 404, `sandbox ${id} was killed`, id === 'sbx-gone' ? { gone: true } : {});
    if (sub === '') return send(res, 200, sb);
    if (sub === 'metrics') {
      const st = Date.parse(sb.startedAt);
      const out = [];
      for (let t = st; t < now(); t += 5000) {
        const k = (t - st) / 5000;
        out.push({ at: iso(t), cpuCount: 2, cpuUsedPct: 20 + 15 * Math.sin(k / 8) + (k % 5), memUsed: 100e6 + 40e6 * Math.sin(k / 20) + k * 1e4, memTotal: 512 * 1048576, diskUsed: 200e6 + k * 1e5, diskTotal: 1024 * 1048576 });
      }
      return send(res, 200, { metrics: out.slice(-1000) });
    }
    if (sub === 'events') return send(res, 200, { events: events(sb) });
    if (sub === 'logs') {
      const cursor = Number(u.searchParams.get('cursor') || 0);
      const lim = Number(u.searchParams.get('limit') || 200);
      const out = [];
      for (let t = logStart; t < now() && out.length < lim; t += 1500) {
        if (t < cursor) continue;
        out.push({ timestamp: iso(t), level: (t / 1500) % 13 === 0 ? 'error' : 'info', message: `envd: handled request ${(t - logStart) / 1500}`, fields: { path: '/process.Start' } });
      }
      return send(res, 200, { logs: out });
    }
    if (sub === 'processes') return send(res, 200, { processes: [{ pid: 12, cmd: '/bin/bash', args: ['-l'], cwd: '/home/user', tag: '', pty: true }, { pid: 40, cmd: 'python3', args: ['-m', 'http.server'], cwd: '/home/user/project', tag: 'web', pty: false }] });
    if ((m = /^processes\/(\d+)\/kill$/.exec(sub))) { res.writeHead(204); return res.end(); }
    if (sub === 'dir') {
      const d = u.searchParams.get('path');
      const es = fsTree[d];
      if (!es) return err(res, 404, `${d}: no such directory`);
      return send(res, 200, { path: d, entries: es.map((e) => ({ ...e, path: d + '/' + e.name, modifiedTime: iso(now() - 3600e3), permissions: e.type === 'dir' ? 'drwxr-xr-x' : '-rw-r--r--' })) });
    }
    if (sub === 'files' && req.method === 'GET') {
      res.writeHead(200, { 'content-type': 'application/octet-stream', 'content-disposition': 'attachment' });
      return res.end('hello from ' + u.searchParams.get('path') + '\n');
    }
    if (sub === 'files' && req.method === 'POST') {
      const fp = u.searchParams.get('path');
      const dir = fp.slice(0, fp.lastIndexOf('/'));
      (fsTree[dir] ||= []).push({ name: fp.slice(fp.lastIndexOf('/') + 1), type: 'file', size: body.length });
      res.writeHead(204); return res.end();
    }
    if (sub === 'kill') { sandboxes.splice(sandboxes.indexOf(sb), 1); res.writeHead(204); return res.end(); }
    if (sub === 'pause') { if (sb.state === 'paused') return err(res, 409, 'sandbox is already paused'); sb.state = 'paused'; res.writeHead(204); return res.end(); }
    if (sub === 'resume') { sb.state = 'running'; res.writeHead(204); return res.end(); }
    if (sub === 'timeout') { const j = JSON.parse(body.toString() || '{}'); sb.endAt = iso(now() + j.timeout * 1000); res.writeHead(204); return res.end(); }
    if (sub === 'snapshot') { const j = JSON.parse(body.toString() || '{}'); return send(res, 200, { snapshotID: 'snap_' + crypto.randomBytes(4).toString('hex'), names: j.name ? [j.name] : [] }); }
    if (sub === 'fork') { const j = JSON.parse(body.toString() || '{}'); const out = []; for (let i = 0; i < j.count; i++) { mkSandbox(0); out.push({ sandboxID: sandboxes[0].sandboxID }); } return send(res, 200, { sandboxes: out }); }
  }
  err(res, 404, 'no such route: ' + route);
});

// ---- the terminal WebSocket: a fake shell that echoes what is typed ----
function frame(op, payload) {
  const n = payload.length;
  const head = n < 126 ? Buffer.from([0x80 | op, n]) : n < 65536 ? Buffer.from([0x80 | op, 126, n >> 8, n & 255]) : null;
  return Buffer.concat([head, payload]);
}
server.on('upgrade', (req, sock) => {
  const u = new URL(req.url, 'http://x');
  const m = /^\/dashboard\/api\/sandboxes\/([^/]+)\/terminal$/.exec(u.pathname);
  const ck = cookieOf(req);
  const accept = crypto.createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  sock.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
  const close = (code, reason) => {
    const r = Buffer.from(reason);
    sock.end(frame(8, Buffer.concat([Buffer.from([code >> 8, code & 255]), r])));
  };
  if (!ck || u.searchParams.get('csrf') !== sessions.get(ck)) return close(4401, 'session not valid');
  const id = m && decodeURIComponent(m[1]);
  if (!m || !sandboxes.find((s) => s.sandboxID === id)) return close(4404, `sandbox ${id} is gone`);
  const out = (s) => sock.write(frame(2, Buffer.from(s)));
  out(`\x1b[32muser@${id}\x1b[0m:~$ `);
  let buf = Buffer.alloc(0);
  let line = '';
  sock.on('data', (d) => {
    buf = Buffer.concat([buf, d]);
    while (buf.length >= 2) {
      const op = buf[0] & 15;
      let len = buf[1] & 127;
      let off = 2;
      if (len === 126) { len = buf.readUInt16BE(2); off = 4; }
      if (buf.length < off + 4 + len) return;
      const mask = buf.subarray(off, off + 4);
      const data = Buffer.from(buf.subarray(off + 4, off + 4 + len)).map((b, i) => b ^ mask[i % 4]);
      buf = buf.subarray(off + 4 + len);
      if (op === 8) return sock.end(frame(8, Buffer.from([3, 232])));
      if (op !== 1) continue;
      const msg = JSON.parse(data.toString());
      if (msg.type === 'resize') out(`\r\n[resized to ${msg.cols}x${msg.rows}]\r\n$ `);
      if (msg.type === 'input') {
        for (const ch of msg.data) {
          if (ch === '\r') {
            if (line === 'exit') return close(1000, 'shell exited with code 0');
            out(`\r\n${line ? 'you typed: ' + line + '\r\n' : ''}$ `);
            line = '';
          } else if (ch === '\x7f') { if (line) { line = line.slice(0, -1); out('\b \b'); } }
          else { line += ch; out(ch); }
        }
      }
    }
  });
  sock.on('error', () => {});
});

server.listen(PORT, '127.0.0.1', () => console.log(`dev mock: http://127.0.0.1:${PORT}/dashboard/  key ${KEY}`));
