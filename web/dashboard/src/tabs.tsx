import { useEffect, useLayoutEffect, useRef, useState } from 'preact/hooks';
import { enc, errMsg, req, type LogLine, type Proc, type SbEvent } from './api';
import type { SbCtx } from './sandbox';
import { clearToast, ErrorLine, toast, toastError } from './ui';
import { fmtAbs, fmtRel, parseTime, usePoll } from './util';

// ---- processes ----

export function ProcessesTab({ ctx }: { ctx: SbCtx }) {
  const { id, gone, fail } = ctx;
  const [procs, setProcs] = useState<Proc[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [bump, setBump] = useState(0);
  const [loading, setLoading] = useState(false);
  const [killing, setKilling] = useState<number | null>(null);

  useEffect(() => {
    if (gone) return;
    let alive = true;
    setLoading(true);
    req<{ processes: Proc[] | null }>('GET', `sandboxes/${enc(id)}/processes`)
      .then((r) => {
        if (!alive) return;
        setProcs(r.processes ?? []);
        setError(null);
      })
      .catch((e) => alive && !fail(e) && setError(errMsg(e)))
      .finally(() => alive && setLoading(false));
    return () => {
      alive = false;
    };
  }, [id, bump, gone]);

  const kill = async (p: Proc) => {
    clearToast();
    setKilling(p.pid);
    try {
      await req('POST', `sandboxes/${enc(id)}/processes/${p.pid}/kill`);
      toast(`Process ${p.pid} killed.`);
    } catch (e) {
      if (!fail(e)) toastError(`Kill of process ${p.pid} failed: ${errMsg(e)}`);
    } finally {
      setKilling(null);
      setBump((b) => b + 1);
    }
  };

  if (gone) return <div class="muted">The sandbox is gone; it has no processes.</div>;
  // pty is in the contract but not every server sends it: show it if any does.
  const hasPty = (procs ?? []).some((p) => p.pty !== undefined);
  return (
    <div>
      <div class="toolbar">
        <span class="muted">Processes started through envd (commands, terminals)</span>
        <span class="spacer" />
        <button type="button" data-testid="processes-refresh" onClick={() => setBump((b) => b + 1)} disabled={loading}>
          {loading ? 'Refreshing…' : 'Refresh'}
        </button>
      </div>
      <ErrorLine error={error} />
      <table class="grid">
        <thead>
          <tr>
            <th class="num">PID</th>
            <th>Command</th>
            <th>CWD</th>
            <th>Tag</th>
            {hasPty && <th>PTY</th>}
            <th />
          </tr>
        </thead>
        <tbody>
          {(procs ?? []).map((p) => (
            <tr key={p.pid} data-testid="process-row" data-pid={p.pid}>
              <td class="num mono">{p.pid}</td>
              <td class="mono">{[p.cmd, ...(p.args ?? [])].join(' ')}</td>
              <td class="mono">{p.cwd}</td>
              <td>{p.tag}</td>
              {hasPty && <td>{p.pty ? 'yes' : ''}</td>}
              <td>
                <button
                  type="button"
                  class="small danger"
                  data-testid="process-kill"
                  disabled={killing !== null}
                  onClick={() => kill(p)}
                >
                  {killing === p.pid ? 'Killing…' : 'Kill'}
                </button>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      {procs && procs.length === 0 && <div class="empty muted">No processes.</div>}
    </div>
  );
}

// ---- events ----

function dataText(d: Record<string, unknown> | null | undefined): string {
  if (!d) return '';
  const keys = Object.keys(d);
  if (!keys.length) return '';
  return keys.map((k) => `${k}=${typeof d[k] === 'string' ? d[k] : JSON.stringify(d[k])}`).join('  ');
}

export function EventsTable({ events }: { events: SbEvent[] }) {
  return (
    <table class="grid">
      <thead>
        <tr>
          <th>When</th>
          <th>Type</th>
          <th>Data</th>
        </tr>
      </thead>
      <tbody>
        {events.map((e) => (
          <tr key={e.id} data-testid="event-row" data-type={e.type}>
            <td title={fmtRel(e.timestamp)} class="nowrap">
              {fmtAbs(e.timestamp)}
            </td>
            <td class="mono">{e.type}</td>
            <td class="mono small-text">{dataText(e.eventData)}</td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

export function EventsTab({ ctx }: { ctx: SbCtx }) {
  const { id, gone } = ctx;
  const [events, setEvents] = useState<SbEvent[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  usePoll(
    async (alive) => {
      try {
        const r = await req<{ events: SbEvent[] | null }>('GET', `sandboxes/${enc(id)}/events`);
        if (!alive()) return;
        const es = [...(r.events ?? [])];
        // newest first, whatever order they came in
        es.sort((a, b) => (parseTime(b.timestamp) ?? 0) - (parseTime(a.timestamp) ?? 0));
        setEvents(es);
        setError(null);
      } catch (e) {
        if (alive()) setError(errMsg(e));
      }
    },
    5000,
    [id],
    !gone,
  );
  const shown = gone?.events ?? events;
  return (
    <div>
      <ErrorLine error={error} />
      {shown && <EventsTable events={shown} />}
      {shown && shown.length === 0 && <div class="empty muted">No events.</div>}
      {!shown && !error && <div class="empty muted">Loading…</div>}
    </div>
  );
}

// ---- logs ----

const LOG_LIMIT = 200;
const LOG_KEEP = 10000;

function logKey(l: LogLine) {
  return l.timestamp + '\u0000' + l.level + '\u0000' + l.message;
}

function fieldsText(f: Record<string, unknown> | null | undefined): string {
  return dataText(f);
}

export function LogsTab({ ctx, active }: { ctx: SbCtx; active: boolean }) {
  const { id, gone, fail } = ctx;
  const [lines, setLines] = useState<LogLine[]>([]);
  const [loaded, setLoaded] = useState(false);
  const [error, setError] = useState<string | null>(null);
  // cursor: the newest timestamp (unix ms) seen; atCursor: the lines seen at it,
  // so a cursor that is inclusive does not repeat them.
  const cursor = useRef<number | null>(null);
  const atCursor = useRef<Set<string>>(new Set());
  const box = useRef<HTMLDivElement>(null);
  const stick = useRef(true);

  usePoll(
    async (alive) => {
      const add: LogLine[] = [];
      try {
        for (let page = 0; page < 20; page++) {
          const q = `limit=${LOG_LIMIT}` + (cursor.current !== null ? `&cursor=${cursor.current}` : '');
          const r = await req<{ logs: LogLine[] | null }>('GET', `sandboxes/${enc(id)}/logs?${q}`);
          if (!alive()) return;
          const got = r.logs ?? [];
          let fresh = 0;
          for (const l of got) {
            const t = parseTime(l.timestamp) ?? 0;
            const c = cursor.current;
            if (c !== null && t < c) continue;
            const k = logKey(l);
            if (c !== null && t === c && atCursor.current.has(k)) continue;
            if (c === null || t > c) {
              cursor.current = t;
              atCursor.current = new Set();
            }
            atCursor.current.add(k);
            add.push(l);
            fresh++;
          }
          if (got.length < LOG_LIMIT || fresh === 0) break;
        }
        setError(null);
      } catch (e) {
        if (alive() && !fail(e)) setError(errMsg(e));
      }
      if (!alive()) return;
      setLoaded(true);
      if (add.length) setLines((old) => (old.length + add.length > LOG_KEEP ? [...old, ...add].slice(-LOG_KEEP) : [...old, ...add]));
    },
    2000,
    [id],
    // A gone sandbox's log is kept a while: read it once, then stop.
    active && !(gone && loaded),
  );

  useLayoutEffect(() => {
    const el = box.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  }, [lines, active]);

  return (
    <div style={{ display: active ? undefined : 'none' }}>
      <ErrorLine error={error} />
      <div
        class="logs-box"
        ref={box}
        onScroll={(e) => {
          const el = e.currentTarget as HTMLDivElement;
          stick.current = el.scrollTop + el.clientHeight >= el.scrollHeight - 8;
        }}
      >
        <table class="grid logs">
          <thead>
            <tr>
              <th>Time</th>
              <th>Level</th>
              <th>Message</th>
              <th>Fields</th>
            </tr>
          </thead>
          <tbody>
            {lines.map((l, i) => (
              <tr key={i} data-testid="log-row" class={'lvl-' + l.level}>
                <td class="nowrap mono" title={l.timestamp}>
                  {fmtAbs(l.timestamp)}
                </td>
                <td class={'lvl lvl-' + l.level}>{l.level}</td>
                <td class="mono msg">{l.message}</td>
                <td class="mono small-text">{fieldsText(l.fields)}</td>
              </tr>
            ))}
          </tbody>
        </table>
        {loaded && lines.length === 0 && <div class="empty muted">No log lines yet.</div>}
        {!loaded && !error && <div class="empty muted">Loading…</div>}
      </div>
      {gone && loaded && <div class="muted">The sandbox is gone; no new lines will come.</div>}
    </div>
  );
}
