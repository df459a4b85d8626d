import { useEffect, useRef, useState } from 'preact/hooks';
import { BASE, enc, errMsg, req, type Entry } from './api';
import type { SbCtx } from './sandbox';
import { clearToast, ErrorLine, toast, toastError } from './ui';
import { fmtAbs, fmtBytes, fmtRel } from './util';

const HOME = '/home/user';

function parent(p: string): string {
  const t = p.replace(/\/+$/, '');
  const i = t.lastIndexOf('/');
  return i <= 0 ? '/' : t.slice(0, i);
}

function join(dir: string, name: string): string {
  return (dir.endsWith('/') ? dir : dir + '/') + name;
}

export function FilesTab({ ctx }: { ctx: SbCtx }) {
  const { id, gone, fail } = ctx;
  const [path, setPath] = useState(HOME);
  const [entries, setEntries] = useState<Entry[] | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [loading, setLoading] = useState(false);
  const [uploading, setUploading] = useState<string | null>(null);
  const [bump, setBump] = useState(0);
  const [goto, setGoto] = useState('');
  const upRef = useRef<HTMLInputElement>(null);

  useEffect(() => {
    if (gone) return;
    let alive = true;
    setLoading(true);
    req<{ path: string; entries: Entry[] | null }>('GET', `sandboxes/${enc(id)}/dir?path=${enc(path)}`)
      .then((r) => {
        if (!alive) return;
        const es = [...(r.entries ?? [])].sort((a, b) =>
          (a.type === 'dir') !== (b.type === 'dir') ? (a.type === 'dir' ? -1 : 1) : a.name.localeCompare(b.name),
        );
        setEntries(es);
        setError(null);
      })
      .catch((e) => {
        if (!alive) return;
        if (!fail(e)) setError(`Cannot list ${path}: ${errMsg(e)}`);
      })
      .finally(() => alive && setLoading(false));
    return () => {
      alive = false;
    };
  }, [id, path, bump, gone]);

  const open = (e: Entry) => {
    if (e.type === 'dir' || e.type === 'symlink') {
      setEntries(null);
      setPath(e.path || join(path, e.name));
    }
  };

  const upload = async (ev: Event) => {
    const input = ev.target as HTMLInputElement;
    const files = input.files ? Array.from(input.files) : [];
    if (!files.length) return;
    const dir = path;
    let ok = 0;
    clearToast();
    for (const f of files) {
      setUploading(f.name);
      const form = new FormData();
      form.append('file', f, f.name);
      try {
        await req('POST', `sandboxes/${enc(id)}/files?path=${enc(join(dir, f.name))}`, { form });
        ok++;
      } catch (e) {
        if (fail(e)) break;
        toastError(`Upload of ${f.name} failed: ${errMsg(e)}`);
      }
    }
    setUploading(null);
    input.value = '';
    if (ok) toast(ok === 1 ? `Uploaded ${files[0].name} to ${dir}.` : `Uploaded ${ok} files to ${dir}.`);
    setBump((b) => b + 1);
  };

  if (gone) return <div class="muted">The sandbox is gone; its files are no longer available.</div>;

  return (
    <div class="files">
      <div class="toolbar">
        <span class="muted">Directory</span>
        <span class="mono path" data-testid="file-path">
          {path}
        </span>
        <form
          class="inline"
          onSubmit={(e) => {
            e.preventDefault();
            const p = goto.trim();
            if (p.startsWith('/')) {
              setEntries(null);
              setPath(p);
              setGoto('');
            }
          }}
        >
          <input class="w-name" placeholder="go to /path" value={goto} onInput={(e) => setGoto((e.target as HTMLInputElement).value)} />
        </form>
        <button type="button" onClick={() => setBump((b) => b + 1)} disabled={loading}>
          Refresh
        </button>
        <span class="spacer" />
        <label class="upload">
          {uploading ? `Uploading ${uploading}…` : 'Upload to this directory:'}{' '}
          <input type="file" multiple data-testid="file-upload" ref={upRef} onChange={upload} disabled={!!uploading} />
        </label>
      </div>
      <ErrorLine error={error} />
      <table class="grid">
        <thead>
          <tr>
            <th>Name</th>
            <th class="num">Size</th>
            <th>Modified</th>
            <th>Permissions</th>
            <th />
          </tr>
        </thead>
        <tbody>
          {path !== '/' && (
            <tr class="clickable" data-testid="file-row" data-name=".." onClick={() => (setEntries(null), setPath(parent(path)))}>
              <td class="mono">
                ..
              </td>
              <td />
              <td />
              <td />
              <td />
            </tr>
          )}
          {(entries ?? []).map((e) => {
            const full = e.path || join(path, e.name);
            const href = `${BASE}sandboxes/${enc(id)}/files?path=${enc(full)}`;
            const isDir = e.type === 'dir';
            return (
              <tr
                key={e.name}
                class={isDir || e.type === 'symlink' ? 'clickable' : ''}
                data-testid="file-row"
                data-name={e.name}
                data-type={e.type}
                onClick={(ev) => {
                  if ((ev.target as HTMLElement).closest('a')) return;
                  open(e);
                }}
              >
                <td class="mono">
                  {isDir ? (
                    <span class="dir-name">{e.name}/</span>
                  ) : e.type === 'symlink' ? (
                    <span title="symbolic link">{e.name} →</span>
                  ) : (
                    <a href={href} download={e.name}>
                      {e.name}
                    </a>
                  )}
                </td>
                <td class="num">{isDir ? '' : fmtBytes(e.size)}</td>
                <td title={fmtAbs(e.modifiedTime)}>{fmtRel(e.modifiedTime)}</td>
                <td class="mono">{e.permissions}</td>
                <td>
                  {!isDir && (
                    <a href={href} download={e.name} data-testid="file-download">
                      download
                    </a>
                  )}
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
      {entries && entries.length === 0 && <div class="empty muted">Empty directory.</div>}
      {!entries && !error && <div class="empty muted">Loading…</div>}
    </div>
  );
}
