import { useMemo, useState } from 'preact/hooks';
import { errMsg, req, type Overview } from './api';
import { Chart } from './chart';
import { Bar, ErrorLine } from './ui';
import { fmtBytes, parseTime, usePoll } from './util';

export function OverviewPage() {
  const [ov, setOv] = useState<Overview | null>(null);
  const [error, setError] = useState<string | null>(null);

  usePoll(
    async (alive) => {
      try {
        const o = await req<Overview>('GET', 'overview');
        if (!alive()) return;
        setOv(o);
        setError(null);
      } catch (e) {
        if (alive()) setError(errMsg(e));
      }
    },
    3000,
    [],
  );

  const creates = useMemo(() => {
    const pts = ov?.createsPerMinute ?? [];
    const xs: number[] = [];
    const ys: number[] = [];
    for (const p of pts) {
      const t = parseTime(p.minute);
      if (t === null) continue;
      xs.push(t / 1000);
      ys.push(p.count);
    }
    return [xs, ys];
  }, [ov]);

  const h = ov?.host;
  const total = ov ? ov.createsPerMinute.reduce((a, p) => a + p.count, 0) : 0;
  return (
    <div>
      <h2>Overview</h2>
      <ErrorLine error={error} />
      <div class="cards">
        <a class="card" href="#/sandboxes">
          <div class="card-label">Running</div>
          <div class="card-value" data-testid="overview-running">
            {ov ? ov.running : '…'}
          </div>
        </a>
        <a class="card" href="#/sandboxes">
          <div class="card-label">Paused</div>
          <div class="card-value" data-testid="overview-paused">
            {ov ? ov.paused : '…'}
          </div>
        </a>
        <div class="card">
          <div class="card-label">Created, last hour</div>
          <div class="card-value">{ov ? total : '…'}</div>
        </div>
      </div>
      <div class="grid2">
        <section class="panel">
          <h3>Sandboxes created per minute (last 60 min)</h3>
          <Chart
            testid="chart-creates"
            series={[{ label: 'created', stroke: '#2563eb', fill: 'rgba(37,99,235,0.35)', bars: true }]}
            data={creates}
            fmt={(v) => (Number.isInteger(v) ? String(v) : v.toFixed(1))}
            height={200}
          />
        </section>
        <section class="panel" data-testid="host-headroom">
          <h3>Host headroom</h3>
          {h ? (
            <table class="kv">
              <tbody>
                <Headroom name="CPU" used={h.load1} total={h.cpus} label={`load ${h.load1.toFixed(2)} on ${h.cpus} CPU${h.cpus === 1 ? '' : 's'}`} />
                <Headroom
                  name="Memory"
                  used={h.memoryTotalBytes - h.memoryAvailableBytes}
                  total={h.memoryTotalBytes}
                  label={`${fmtBytes(h.memoryAvailableBytes)} available of ${fmtBytes(h.memoryTotalBytes)}`}
                />
                <Headroom
                  name="Disk"
                  used={h.diskTotalBytes - h.diskFreeBytes}
                  total={h.diskTotalBytes}
                  label={`${fmtBytes(h.diskFreeBytes)} free of ${fmtBytes(h.diskTotalBytes)}`}
                />
              </tbody>
            </table>
          ) : (
            <div class="muted">{error ? '—' : 'Loading…'}</div>
          )}
        </section>
      </div>
    </div>
  );
}

// One row of the host's headroom: a bar of what is used and its caption.
function Headroom(p: { name: string; used: number; total: number; label: string }) {
  return (
    <tr>
      <th>{p.name}</th>
      <td>
        <Bar used={p.used} total={p.total} label={p.label} />
      </td>
    </tr>
  );
}
