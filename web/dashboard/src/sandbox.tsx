import { useCallback, useMemo, useRef, useState } from 'preact/hooks';
import { ApiError, enc, errMsg, req, type Metric, type Sandbox, type SbEvent } from './api';
import { Chart } from './chart';
import { FilesTab } from './files';
import { EventsTable, EventsTab, LogsTab, ProcessesTab } from './tabs';
import { TerminalTab } from './terminal';
import { clearToast, confirmDialog, ErrorLine, StateBadge, toast, toastError } from './ui';
import { fmtAbs, fmtBytes, fmtMB, fmtPct, fmtRel, go, parseTime, sandboxHref, useNow, usePoll } from './util';

export type Gone = { message: string; events: SbEvent[] | null };

// SbCtx is what the tabs get from the page: the id, whether the sandbox is
// gone, and fail(), which turns a "gone" answer into the gone state.
export type SbCtx = { id: string; gone: Gone | null; fail: (e: unknown) => boolean };

const TABS = [
  ['terminal', 'Terminal'],
  ['files', 'Files'],
  ['processes', 'Processes'],
  ['events', 'Events'],
  ['logs', 'Logs'],
] as const;

export function goneText(g: Gone): string {
  const ev = g.events?.[0];
  if (ev) {
    const what = ev.type.split('.').pop() || ev.type;
    const t = fmtAbs(ev.timestamp);
    return `This sandbox is gone: ${what} at ${t} (${fmtRel(ev.timestamp)}).`;
  }
  if (/\bgone\b/i.test(g.message)) return g.message.replace(/^Sandbox \S+ is gone/i, 'This sandbox is gone') + '.';
  return `This sandbox is gone or does not exist (${g.message}).`;
}

export function SandboxPage({ id, tab }: { id: string; tab: string }) {
  const [sb, setSb] = useState<Sandbox | null>(null);
  const [gone, setGone] = useState<Gone | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [metrics, setMetrics] = useState<Metric[]>([]);
  const [bump, setBump] = useState(0);
  const goneRef = useRef(false);
  const now = useNow(5000);
  // Tabs stay mounted once opened (the terminal keeps its session).
  const openedRef = useRef<Set<string>>(new Set());
  openedRef.current.add(tab);
  const opened = openedRef.current;

  const markGone = useCallback(
    (message: string) => {
      if (goneRef.current) return;
      goneRef.current = true;
      setGone({ message, events: null });
      req<{ events: SbEvent[] }>('GET', `sandboxes/${enc(id)}/events`)
        .then((r) => setGone({ message, events: r.events ?? [] }))
        .catch(() => setGone({ message, events: [] }));
    },
    [id],
  );

  const fail = useCallback(
    (e: unknown) => {
      if (e instanceof ApiError && e.gone) {
        markGone(e.message);
        return true;
      }
      return false;
    },
    [markGone],
  );

  usePoll(
    async (alive) => {
      try {
        const s = await req<Sandbox>('GET', `sandboxes/${enc(id)}`);
        if (!alive()) return;
        setSb(s);
        setError(null);
      } catch (e) {
        if (!alive()) return;
        if (e instanceof ApiError && e.status === 404) markGone(e.message);
        else setError(errMsg(e));
      }
    },
    2000,
    [id, bump],
    !gone,
  );

  usePoll(
    async (alive) => {
      try {
        const r = await req<{ metrics: Metric[] | null }>('GET', `sandboxes/${enc(id)}/metrics`);
        if (alive()) setMetrics(r.metrics ?? []);
      } catch (e) {
        if (alive()) fail(e);
      }
    },
    5000,
    [id],
    !gone,
  );

  const charts = useMemo(() => {
    const xs: number[] = [];
    const cpu: number[] = [];
    const memU: number[] = [];
    const memT: number[] = [];
    const diskU: number[] = [];
    const diskT: number[] = [];
    for (const m of metrics) {
      const t = parseTime(m.at);
      if (t === null) continue;
      xs.push(t / 1000);
      cpu.push(m.cpuUsedPct);
      memU.push(m.memUsed);
      memT.push(m.memTotal);
      diskU.push(m.diskUsed);
      diskT.push(m.diskTotal);
    }
    return { cpu: [xs, cpu], mem: [xs, memU, memT], disk: [xs, diskU, diskT] };
  }, [metrics]);

  const ctx: SbCtx = { id, gone, fail };
  const u = sb?.usage ?? null;
  const state = gone ? 'gone' : sb?.state ?? '…';
  const md = sb?.metadata ? Object.entries(sb.metadata) : [];

  return (
    <div>
      <div class="crumbs">
        <a href="#/sandboxes">Sandboxes</a> /
      </div>
      <div class="sb-head">
        <h2 class="mono" data-testid="sandbox-title">
          {id}
        </h2>
        <StateBadge state={state} testid="sandbox-state" />
      </div>
      {sb && (
        <div class="sb-facts">
          <span>
            <b>Template</b> <span title={sb.templateID}>{sb.alias || sb.templateID}</span>
          </span>
          <span title={fmtAbs(sb.startedAt)}>
            <b>Started</b> {fmtRel(sb.startedAt, now)}
          </span>
          <span title={fmtAbs(sb.endAt)}>
            <b>{gone ? 'Was to end' : 'Ends'}</b> {fmtRel(sb.endAt, now)}
          </span>
          <span>
            <b>Size</b> {sb.cpuCount} vCPU · {fmtMB(sb.memoryMB)} RAM · {fmtMB(sb.diskSizeMB)} disk
          </span>
          {u && !gone && (
            <span>
              <b>Now</b> CPU {fmtPct(u.cpuUsedPct)} · mem {fmtBytes(u.memUsed)} / {fmtBytes(u.memTotal)} · disk{' '}
              {fmtBytes(u.diskUsed)} / {fmtBytes(u.diskTotal)}
            </span>
          )}
          {md.map(([k, v]) => (
            <span class="chip" key={k}>
              {k}={v}
            </span>
          ))}
        </div>
      )}
      {gone && (
        <div class="gone" data-testid="sandbox-gone" role="status">
          <div class="gone-msg">{goneText(gone)}</div>
          {gone.events === null ? (
            <div class="muted">Loading its events…</div>
          ) : gone.events.length > 0 ? (
            <EventsTable events={gone.events.slice(0, 10)} />
          ) : null}
        </div>
      )}
      <ErrorLine error={error} />
      {!gone && <Actions sb={sb} id={id} fail={fail} refresh={() => setBump((b) => b + 1)} />}
      <div class="charts3">
        <Chart
          testid="chart-cpu"
          title="CPU"
          series={[{ label: 'CPU used', stroke: '#2563eb', fill: 'rgba(37,99,235,0.12)' }]}
          data={charts.cpu}
          fmt={(v) => fmtPct(v)}
          yMax={100}
        />
        <UsageChart testid="chart-mem" title="Memory" color="#16a34a" fill="rgba(22,163,74,0.12)" data={charts.mem} />
        <UsageChart testid="chart-disk" title="Disk" color="#b45309" fill="rgba(180,83,9,0.12)" data={charts.disk} />
      </div>
      <div class="tabs" role="tablist">
        {TABS.map(([t, label]) => (
          <a
            key={t}
            role="tab"
            aria-selected={tab === t}
            class={tab === t ? 'tab active' : 'tab'}
            href={sandboxHref(id, t)}
            data-testid={'tab-' + t}
          >
            {label}
          </a>
        ))}
      </div>
      <div class="tab-body">
        {opened.has('terminal') && <TerminalTab
            ctx={ctx}
            active={tab === 'terminal'}
            ready={sb !== null && sb.state === 'running'}
            paused={sb !== null && sb.state !== 'running'}
          />}
        {tab === 'files' && <FilesTab ctx={ctx} />}
        {tab === 'processes' && <ProcessesTab ctx={ctx} />}
        {tab === 'events' && <EventsTab ctx={ctx} />}
        {opened.has('logs') && <LogsTab ctx={ctx} active={tab === 'logs'} />}
      </div>
    </div>
  );
}

function Actions({
  sb,
  id,
  fail,
  refresh,
}: {
  sb: Sandbox | null;
  id: string;
  fail: (e: unknown) => boolean;
  refresh: () => void;
}) {
  const [busy, setBusy] = useState<string | null>(null);
  const [timeout, setTimeoutS] = useState('300');
  const [snapName, setSnapName] = useState('');
  const [forkCount, setForkCount] = useState('1');
  const base = `sandboxes/${enc(id)}/`;

  const run = async (name: string, f: () => Promise<string | null>) => {
    clearToast();
    setBusy(name);
    try {
      const msg = await f();
      if (msg) toast(msg);
      refresh();
    } catch (e) {
      if (!fail(e)) toastError(`${name} failed: ${errMsg(e)}`);
      else toastError(errMsg(e));
    } finally {
      setBusy(null);
    }
  };

  const secs = () => {
    const n = Number(timeout);
    if (!Number.isFinite(n) || n <= 0) throw new Error('the timeout must be a positive number of seconds');
    return Math.round(n);
  };

  const kill = async () => {
    if (!(await confirmDialog('Kill sandbox', `Kill sandbox ${id}? Its processes and files are lost.`, 'Kill')))
      return;
    clearToast();
    setBusy('Kill');
    try {
      await req('POST', base + 'kill');
      toast(`Sandbox ${id} killed.`);
      go('#/sandboxes');
    } catch (e) {
      if (!fail(e)) toastError(`Kill failed: ${errMsg(e)}`);
      else toastError(errMsg(e));
    } finally {
      setBusy(null);
    }
  };

  const st = sb?.state;
  const dis = (n: string) => busy !== null && busy !== n;
  return (
    <div class="actions">
      <button
        type="button"
        data-testid="action-pause"
        disabled={dis('Pause') || busy === 'Pause' || st === 'paused'}
        onClick={() =>
          run('Pause', async () => {
            await req('POST', base + 'pause');
            return 'Sandbox paused.';
          })
        }
      >
        {busy === 'Pause' ? 'Pausing…' : 'Pause'}
      </button>
      <button
        type="button"
        data-testid="action-resume"
        title="Resume; it then ends after the timeout given beside Set timeout"
        disabled={dis('Resume') || busy === 'Resume' || st === 'running'}
        onClick={() =>
          run('Resume', async () => {
            await req('POST', base + 'resume', { body: { timeout: secs() } });
            return 'Sandbox resumed.';
          })
        }
      >
        {busy === 'Resume' ? 'Resuming…' : 'Resume'}
      </button>
      <span class="sep" />
      <label class="inline">
        <input
          type="number"
          min="1"
          class="w-num"
          data-testid="timeout-seconds"
          value={timeout}
          onInput={(e) => setTimeoutS((e.target as HTMLInputElement).value)}
          aria-label="Timeout in seconds from now"
        />{' '}
        s
      </label>
      <button
        type="button"
        data-testid="action-timeout"
        disabled={dis('Set timeout') || busy === 'Set timeout'}
        onClick={() =>
          run('Set timeout', async () => {
            const s = secs();
            await req('POST', base + 'timeout', { body: { timeout: s } });
            return `Timeout set: the sandbox ends in ${s} s.`;
          })
        }
      >
        Set timeout
      </button>
      <span class="sep" />
      <input
        class="w-name"
        placeholder="snapshot name (optional)"
        data-testid="snapshot-name"
        value={snapName}
        onInput={(e) => setSnapName((e.target as HTMLInputElement).value)}
        aria-label="Snapshot name"
      />
      <button
        type="button"
        data-testid="action-snapshot"
        disabled={dis('Snapshot') || busy === 'Snapshot'}
        onClick={() =>
          run('Snapshot', async () => {
            const name = snapName.trim();
            const r = await req<{ snapshotID: string; names?: string[] | null }>('POST', base + 'snapshot', {
              body: name ? { name } : {},
            });
            const other = (r.names ?? []).filter((n) => n !== r.snapshotID);
            const names = other.length ? ` (${other.join(', ')})` : '';
            return `Snapshot ${r.snapshotID}${names} taken.`;
          })
        }
      >
        {busy === 'Snapshot' ? 'Snapshotting…' : 'Snapshot'}
      </button>
      <span class="sep" />
      <label class="inline">
        ×{' '}
        <input
          type="number"
          min="1"
          max="100"
          class="w-small"
          data-testid="fork-count"
          value={forkCount}
          onInput={(e) => setForkCount((e.target as HTMLInputElement).value)}
          aria-label="Number of forks"
        />
      </label>
      <button
        type="button"
        data-testid="action-fork"
        disabled={dis('Fork') || busy === 'Fork'}
        onClick={() =>
          run('Fork', async () => {
            const n = Math.round(Number(forkCount));
            if (!Number.isFinite(n) || n < 1) throw new Error('the count must be at least 1');
            const r = await req<{ sandboxes: { sandboxID?: string; error?: string }[] }>('POST', base + 'fork', {
              body: { count: n },
            });
            const ok = r.sandboxes.filter((s) => s.sandboxID).map((s) => s.sandboxID);
            const bad = r.sandboxes.filter((s) => s.error).map((s) => s.error);
            let msg = ok.length ? `Forked: ${ok.join(', ')}.` : 'No fork made.';
            if (bad.length) msg += ` Errors: ${bad.join('; ')}`;
            if (!ok.length) throw new Error(bad.join('; ') || 'no sandbox made');
            return msg;
          })
        }
      >
        {busy === 'Fork' ? 'Forking…' : 'Fork'}
      </button>
      <span class="spacer" />
      <button type="button" class="danger" data-testid="action-kill" disabled={busy !== null} onClick={kill}>
        {busy === 'Kill' ? 'Killing…' : 'Kill'}
      </button>
    </div>
  );
}

// A bytes chart of used against total (memory, disk).
function UsageChart(p: { testid: string; title: string; color: string; fill: string; data: (number | null)[][] }) {
  return (
    <Chart
      testid={p.testid}
      title={p.title}
      series={[
        { label: 'used', stroke: p.color, fill: p.fill },
        { label: 'total', stroke: '#999', dash: [4, 4] },
      ]}
      data={p.data}
      fmt={fmtBytes}
      yFloor={64 * 1048576}
      binary
    />
  );
}
