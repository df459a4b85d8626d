import { Fragment } from 'preact';
import { useLayoutEffect, useRef, useState } from 'preact/hooks';
import { enc, errMsg, req, type Build, type BuildLog, type Template } from './api';
import { clearToast, confirmDialog, ErrorLine, StateBadge, toast, toastError } from './ui';
import { fmtAbs, fmtBytes, fmtMB, fmtRel, useNow, usePoll } from './util';

const LIVE = (s: string) => s === 'waiting' || s === 'building';

export function TemplatesPage() {
  const [tpls, setTpls] = useState<Template[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [open, setOpen] = useState<string | null>(null);
  const [build, setBuild] = useState<{ tpl: string; build: string } | null>(null);
  const [bump, setBump] = useState(0);
  const [deleting, setDeleting] = useState<string | null>(null);
  const now = useNow(10000);

  usePoll(
    async (alive) => {
      try {
        const r = await req<{ templates: Template[] | null }>('GET', 'templates');
        if (!alive()) return;
        setTpls(r.templates ?? []);
        setError(null);
      } catch (e) {
        if (alive()) setError(errMsg(e));
      }
    },
    5000,
    [bump],
  );

  const del = async (t: Template) => {
    const name = t.aliases?.[0] || t.templateID;
    if (!(await confirmDialog('Delete template', `Delete template ${name}? This cannot be undone.`, 'Delete')))
      return;
    clearToast();
    setDeleting(t.templateID);
    try {
      await req('DELETE', `templates/${enc(t.templateID)}`);
      toast(`Template ${name} deleted.`);
      if (open === t.templateID) setOpen(null);
    } catch (e) {
      toastError(`Cannot delete ${name}: ${errMsg(e)}`);
    } finally {
      setDeleting(null);
      setBump((b) => b + 1);
    }
  };

  return (
    <div>
      <h2>Templates</h2>
      <ErrorLine error={error} />
      <div class="table-wrap">
        <table class="grid templates">
          <thead>
            <tr>
              <th />
              <th>Template</th>
              <th>Kind</th>
              <th>Ready</th>
              <th class="num">Size</th>
              <th class="num">Layers</th>
              <th>CPU / memory / disk</th>
              <th>Created</th>
              <th>Built</th>
              <th />
            </tr>
          </thead>
          <tbody>
            {(tpls ?? []).map((t) => {
              const isOpen = open === t.templateID;
              const builds = t.builds ?? [];
              return (
                <Fragment key={t.templateID}>
                  <tr
                    class={'clickable' + (isOpen ? ' open' : '')}
                    data-testid="template-row"
                    data-template-id={t.templateID}
                    onClick={(e) => {
                      if ((e.target as HTMLElement).closest('button')) return;
                      setOpen(isOpen ? null : t.templateID);
                    }}
                  >
                    <td class="caret">{isOpen ? '▾' : '▸'}</td>
                    <td>
                      <div class="mono">{t.templateID}</div>
                      {t.aliases && t.aliases.length > 0 && (
                        <div class="aliases">
                          {t.aliases.map((a) => (
                            <span class="chip" key={a}>
                              {a}
                            </span>
                          ))}
                        </div>
                      )}
                    </td>
                    <td>
                      {t.builtin ? <span class="tag">built-in</span> : null}
                      {t.mine ? <span class="tag tag-mine">mine</span> : null}
                      {t.public && !t.builtin ? <span class="tag">public</span> : null}
                    </td>
                    <td>{t.ready ? <span class="ok-text">ready</span> : <span class="muted">not ready</span>}</td>
                    <td class="num">{t.sizeBytes ? fmtBytes(t.sizeBytes) : '—'}</td>
                    <td class="num">{t.layers || '—'}</td>
                    <td class="nowrap">
                      {t.cpuCount} vCPU · {fmtMB(t.memoryMB)} · {fmtMB(t.diskSizeMB)}
                    </td>
                    <td title={fmtAbs(t.createdAt)} class="nowrap">
                      {fmtRel(t.createdAt, now)}
                    </td>
                    <td title={fmtAbs(t.builtAt)} class="nowrap">
                      {fmtRel(t.builtAt, now)}
                    </td>
                    <td>
                      {t.mine && !t.builtin && (
                        <button
                          type="button"
                          class="small danger"
                          data-testid="template-delete"
                          disabled={deleting !== null}
                          onClick={() => del(t)}
                        >
                          {deleting === t.templateID ? 'Deleting…' : 'Delete'}
                        </button>
                      )}
                    </td>
                  </tr>
                  {isOpen && (
                    <tr class="sub">
                      <td />
                      <td colSpan={9}>
                        <Builds
                          tpl={t}
                          builds={builds}
                          now={now}
                          selected={build && build.tpl === t.templateID ? build.build : null}
                          select={(b) => setBuild(b ? { tpl: t.templateID, build: b } : null)}
                        />
                      </td>
                    </tr>
                  )}
                </Fragment>
              );
            })}
          </tbody>
        </table>
        {tpls && tpls.length === 0 && <div class="empty muted">No templates.</div>}
        {!tpls && !error && <div class="empty muted">Loading…</div>}
      </div>
    </div>
  );
}

function Builds({
  tpl,
  builds,
  now,
  selected,
  select,
}: {
  tpl: Template;
  builds: Build[];
  now: number;
  selected: string | null;
  select: (b: string | null) => void;
}) {
  if (!builds.length) return <div class="muted">No builds recorded.</div>;
  return (
    <div class="builds">
      <table class="grid inner">
        <thead>
          <tr>
            <th>Build</th>
            <th>Status</th>
            <th>Started</th>
            <th>Finished</th>
          </tr>
        </thead>
        <tbody>
          {builds.map((b) => (
            <tr
              key={b.buildID}
              class={'clickable' + (selected === b.buildID ? ' open' : '')}
              data-testid="build-row"
              data-build-id={b.buildID}
              onClick={() => select(selected === b.buildID ? null : b.buildID)}
            >
              <td class="mono">{b.buildID}</td>
              <td>
                <StateBadge state={b.status} />
              </td>
              <td title={fmtAbs(b.createdAt)}>{fmtRel(b.createdAt, now)}</td>
              <td title={fmtAbs(b.finishedAt)}>{b.finishedAt ? fmtRel(b.finishedAt, now) : '—'}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {selected && <BuildLogView key={selected} tpl={tpl.templateID} build={selected} />}
    </div>
  );
}

function BuildLogView({ tpl, build }: { tpl: string; build: string }) {
  const [lines, setLines] = useState<string[]>([]);
  const [status, setStatus] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [reason, setReason] = useState<string | null>(null);
  const [done, setDone] = useState(false);
  const offset = useRef(0);
  const pre = useRef<HTMLPreElement>(null);
  const stick = useRef(true);

  usePoll(
    async (alive) => {
      try {
        // A live build's status route holds its answer up to a second for
        // news, so this loop is a long poll while lines keep coming.
        let st = '';
        let atEnd = false;
        for (let i = 0; i < 50; i++) {
          const r = await req<BuildLog>(
            'GET',
            `templates/${enc(tpl)}/builds/${enc(build)}/log?offset=${offset.current}`,
          );
          if (!alive()) return;
          const got = r.lines ?? [];
          const more = r.nextOffset > offset.current && got.length > 0;
          offset.current = Math.max(offset.current, r.nextOffset);
          if (got.length) setLines((old) => [...old, ...got]);
          st = r.status;
          setStatus(r.status);
          if (r.reason) setReason(r.reason);
          if (!more) {
            atEnd = true;
            break;
          }
        }
        setError(null);
        // Polling stops once the status is final and the log read to its end.
        if (atEnd && !LIVE(st)) setDone(true);
      } catch (e) {
        if (alive()) setError(errMsg(e));
      }
    },
    1500,
    [tpl, build],
    !done,
  );

  useLayoutEffect(() => {
    const el = pre.current;
    if (el && stick.current) el.scrollTop = el.scrollHeight;
  }, [lines]);

  return (
    <div class="build-log-wrap">
      <div class="toolbar">
        <span>
          Log of build <span class="mono">{build}</span>
        </span>
        {status && <StateBadge state={status} />}
        {status && LIVE(status) && <span class="muted">live…</span>}
      </div>
      <ErrorLine error={error} />
      {reason && <div class="error-line">Build failed: {reason.split('\n')[0]}</div>}
      <pre
        class="build-log"
        data-testid="build-log"
        ref={pre}
        onScroll={(e) => {
          const el = e.currentTarget as HTMLPreElement;
          stick.current = el.scrollTop + el.clientHeight >= el.scrollHeight - 8;
        }}
      >
        {lines.length ? lines.join('\n') : status === null ? 'Loading…' : '(no log lines)'}
      </pre>
    </div>
  );
}
