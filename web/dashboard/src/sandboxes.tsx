import { Component } from 'preact';
import { useState } from 'preact/hooks';
import { enc, errMsg, req, type Sandbox, type SandboxList } from './api';
import { ErrorLine, StateBadge } from './ui';
import { fmtAbs, fmtBytes, fmtMB, fmtPct, fmtRel, go, normMetadata, sandboxHref, useDebounced, usePoll } from './util';

const LIMIT = 100;

function usedOf(used: number | undefined, total: number | undefined, fallbackMB: number) {
  if (used === undefined) return <span class="muted">— / {fmtMB(fallbackMB)}</span>;
  return (
    <>
      {fmtBytes(used)} <span class="muted">/ {total ? fmtBytes(total) : fmtMB(fallbackMB)}</span>
    </>
  );
}

type RowProps = { sb: Sandbox; now: number; sig: string };

// A row re-renders only when its sandbox's JSON or the (5 s) clock changes.
class Row extends Component<RowProps> {
  shouldComponentUpdate(n: RowProps) {
    return n.sig !== this.props.sig || n.now !== this.props.now;
  }
  render({ sb, now }: RowProps) {
    const u = sb.usage ?? undefined;
    const md = sb.metadata ? Object.entries(sb.metadata) : [];
    return (
      <tr
        class="clickable"
        data-testid="sandbox-row"
        data-sandbox-id={sb.sandboxID}
        onClick={(e) => {
          if ((e.target as HTMLElement).closest('a')) return;
          go(sandboxHref(sb.sandboxID));
        }}
      >
        <td class="mono">
          <a href={sandboxHref(sb.sandboxID)}>{sb.sandboxID}</a>
        </td>
        <td title={sb.templateID}>{sb.alias || sb.templateID}</td>
        <td>
          <StateBadge state={sb.state} />
        </td>
        <td title={fmtAbs(sb.startedAt)}>{fmtRel(sb.startedAt, now)}</td>
        <td title={fmtAbs(sb.endAt)}>{fmtRel(sb.endAt, now)}</td>
        <td class="num">{u ? fmtPct(u.cpuUsedPct) : <span class="muted">—</span>}</td>
        <td class="num">{usedOf(u?.memUsed, u?.memTotal, sb.memoryMB)}</td>
        <td class="num">{usedOf(u?.diskUsed, u?.diskTotal, sb.diskSizeMB)}</td>
        <td class="md">
          {md.map(([k, v]) => (
            <span class="chip" key={k}>
              {k}={v}
            </span>
          ))}
        </td>
      </tr>
    );
  }
}

export function SandboxesPage() {
  const [state, setState] = useState('');
  const [template, setTemplate] = useState('');
  const [metadata, setMetadata] = useState('');
  const [offset, setOffset] = useState(0);
  const [list, setList] = useState<SandboxList | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [now, setNow] = useState(() => Math.floor(Date.now() / 5000) * 5000);
  const dTemplate = useDebounced(template.trim(), 250);
  const dMetadata = useDebounced(normMetadata(metadata), 250);

  usePoll(
    async (alive) => {
      const q = [`limit=${LIMIT}`, `offset=${offset}`];
      if (state) q.push('state=' + enc(state));
      if (dTemplate) q.push('template=' + enc(dTemplate));
      if (dMetadata) q.push('metadata=' + enc(dMetadata));
      try {
        const l = await req<SandboxList>('GET', 'sandboxes?' + q.join('&'));
        if (!alive()) return;
        setList(l);
        setError(null);
        setNow(Math.floor(Date.now() / 5000) * 5000);
        if (offset > 0 && offset >= l.total) setOffset(Math.max(0, Math.floor((l.total - 1) / LIMIT) * LIMIT));
      } catch (e) {
        if (alive()) setError(errMsg(e));
      }
    },
    1000,
    [state, dTemplate, dMetadata, offset],
  );

  const setFilter = (f: (v: string) => void) => (e: Event) => {
    f((e.target as HTMLInputElement).value);
    setOffset(0);
  };

  const total = list?.total ?? 0;
  const rows = list?.sandboxes ?? [];
  return (
    <div>
      <h2>Sandboxes</h2>
      <div class="filters">
        <label>
          State{' '}
          <select data-testid="filter-state" value={state} onChange={setFilter(setState)}>
            <option value="">all</option>
            <option value="running">running</option>
            <option value="paused">paused</option>
          </select>
        </label>
        <label>
          Template{' '}
          <input
            data-testid="filter-template"
            placeholder="id or alias"
            value={template}
            onInput={setFilter(setTemplate)}
          />
        </label>
        <label class="grow">
          Metadata{' '}
          <input
            data-testid="filter-metadata"
            placeholder="k=v, k2=v2"
            value={metadata}
            onInput={setFilter(setMetadata)}
          />
        </label>
        <span class="spacer" />
        <Pager offset={offset} total={total} shown={rows.length} setOffset={setOffset} />
      </div>
      <ErrorLine error={error} />
      <div class="table-wrap">
        <table class="grid sandboxes">
          <thead>
            <tr>
              <th>ID</th>
              <th>Template</th>
              <th>State</th>
              <th>Started</th>
              <th>Ends</th>
              <th class="num">CPU</th>
              <th class="num">Memory</th>
              <th class="num">Disk</th>
              <th>Metadata</th>
            </tr>
          </thead>
          <tbody>
            {rows.map((sb) => (
              <Row key={sb.sandboxID} sb={sb} now={now} sig={JSON.stringify(sb)} />
            ))}
          </tbody>
        </table>
        {list && rows.length === 0 && (
          <div class="empty">
            {state || dTemplate || dMetadata ? 'No sandbox matches these filters.' : 'No sandboxes yet.'}
          </div>
        )}
        {!list && !error && <div class="empty muted">Loading…</div>}
      </div>
    </div>
  );
}

function Pager({
  offset,
  total,
  shown,
  setOffset,
}: {
  offset: number;
  total: number;
  shown: number;
  setOffset: (n: number) => void;
}) {
  const from = shown ? offset + 1 : 0;
  const to = offset + shown;
  return (
    <div class="pager">
      <span data-testid="sandbox-total">
        {from}–{to} of {total}
      </span>
      <button type="button" disabled={offset === 0} onClick={() => setOffset(Math.max(0, offset - LIMIT))}>
        ‹ Prev
      </button>
      <button type="button" disabled={offset + LIMIT >= total} onClick={() => setOffset(offset + LIMIT)}>
        Next ›
      </button>
    </div>
  );
}
