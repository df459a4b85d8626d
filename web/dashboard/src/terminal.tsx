import { useEffect, useRef, useState } from 'preact/hooks';
import type { Terminal } from '@xterm/xterm';
import type { FitAddon } from '@xterm/addon-fit';
import { ApiError, BASE, enc, getCsrf, signalUnauthorized } from './api';
import { goneText, type SbCtx } from './sandbox';

type Status = { s: 'loading' } | { s: 'idle' } | { s: 'connecting' } | { s: 'open' } | { s: 'closed'; text: string; code: number };

// xterm.js is loaded on first use (a chunk of its own).
async function loadXterm() {
  const [x, f] = await Promise.all([import('@xterm/xterm'), import('@xterm/addon-fit'), import('@xterm/xterm/css/xterm.css')]);
  return { Terminal: x.Terminal, FitAddon: f.FitAddon };
}

function closeText(code: number, reason: string): string {
  const why = reason ? reason.charAt(0).toUpperCase() + reason.slice(1) : '';
  switch (code) {
    case 1000:
      return `${why || 'The shell exited'}.`;
    case 4404:
      return `${why || 'The sandbox is gone'}.`;
    case 4401:
      return `Not signed in${why ? ': ' + why : ''}.`;
    case 1006:
      return `The connection was lost${why ? ': ' + why : ''}.`;
    default:
      return `Connection closed (code ${code})${why ? ': ' + why : ''}.`;
  }
}

// ready: the sandbox is known to exist and is running (a paused one refuses
// a terminal; it connects once resumed).
export function TerminalTab({ ctx, active, ready, paused }: { ctx: SbCtx; active: boolean; ready: boolean; paused: boolean }) {
  const { id, gone, fail } = ctx;
  const host = useRef<HTMLDivElement>(null);
  const term = useRef<Terminal | null>(null);
  const fit = useRef<FitAddon | null>(null);
  const ws = useRef<WebSocket | null>(null);
  const [status, setStatus] = useState<Status>({ s: 'loading' });
  const [loadErr, setLoadErr] = useState<string | null>(null);
  const [session, setSession] = useState(0);
  const activeRef = useRef(active);
  activeRef.current = active;

  const doFit = () => {
    const el = host.current;
    if (!fit.current || !el || !activeRef.current || el.clientWidth === 0 || el.clientHeight === 0) return;
    try {
      fit.current.fit();
    } catch {
      // not laid out yet
    }
  };

  // Make the terminal once.
  useEffect(() => {
    if (gone) return;
    let dead = false;
    let ro: ResizeObserver | null = null;
    loadXterm()
      .then(({ Terminal, FitAddon }) => {
        if (dead || !host.current) return;
        const t = new Terminal({
          cursorBlink: true,
          fontFamily: 'ui-monospace, SFMono-Regular, Menlo, Consolas, "DejaVu Sans Mono", monospace',
          fontSize: 13,
          scrollback: 5000,
          theme: { background: '#1e1e1e', foreground: '#e5e5e5' },
        });
        const f = new FitAddon();
        t.loadAddon(f);
        t.open(host.current);
        term.current = t;
        fit.current = f;
        doFit();
        t.onData((d) => {
          const s = ws.current;
          if (s && s.readyState === WebSocket.OPEN) s.send(JSON.stringify({ type: 'input', data: d }));
        });
        t.onBinary((d) => {
          const s = ws.current;
          if (s && s.readyState === WebSocket.OPEN) s.send(JSON.stringify({ type: 'input', data: d }));
        });
        t.onResize(({ cols, rows }) => {
          const s = ws.current;
          if (s && s.readyState === WebSocket.OPEN) s.send(JSON.stringify({ type: 'resize', cols, rows }));
        });
        ro = new ResizeObserver(() => doFit());
        ro.observe(host.current);
        setStatus({ s: 'idle' });
        setSession(1);
      })
      .catch((e) => setLoadErr('Could not load the terminal: ' + (e instanceof Error ? e.message : String(e))));
    return () => {
      dead = true;
      ro?.disconnect();
      ws.current?.close(1000, 'page closed');
      ws.current = null;
      term.current?.dispose();
      term.current = null;
      fit.current = null;
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, []);

  // One WebSocket per session number (Reconnect makes a new one).
  useEffect(() => {
    const t = term.current;
    // Connect only once the sandbox is known to exist (and not gone).
    if (!session || !t || gone || !ready) return;
    doFit();
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const url =
      `${proto}//${location.host}${BASE}sandboxes/${enc(id)}/terminal` +
      `?cols=${t.cols}&rows=${t.rows}&csrf=${enc(getCsrf())}`;
    setStatus({ s: 'connecting' });
    const s = new WebSocket(url);
    s.binaryType = 'arraybuffer';
    ws.current = s;
    s.onopen = () => {
      setStatus({ s: 'open' });
      s.send(JSON.stringify({ type: 'resize', cols: t.cols, rows: t.rows }));
      if (activeRef.current) t.focus();
    };
    s.onmessage = (ev) => {
      if (typeof ev.data === 'string') t.write(ev.data);
      else t.write(new Uint8Array(ev.data as ArrayBuffer));
    };
    s.onclose = (ev) => {
      if (ws.current !== s) return;
      ws.current = null;
      const text = closeText(ev.code, ev.reason);
      t.write(`\r\n\x1b[1;31m[${text}]\x1b[0m\r\n`);
      setStatus({ s: 'closed', text, code: ev.code });
      if (ev.code === 4404) fail(new ApiError(404, ev.reason || 'The sandbox is gone.', true));
      if (ev.code === 4401) {
        // Like any call answering 401: back to the sign-in form.
        signalUnauthorized();
      }
    };
    return () => {
      s.onclose = null;
      if (s.readyState === WebSocket.OPEN || s.readyState === WebSocket.CONNECTING) {
        s.close(1000, 'reconnect');
        t.write('\r\n\x1b[2m[disconnected]\x1b[0m\r\n');
      }
      if (ws.current === s) ws.current = null;
      setStatus({ s: 'idle' });
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [session, id, ready]);

  // When gone, close the socket: nothing more will come.
  useEffect(() => {
    if (gone && ws.current) {
      ws.current.close(1000, 'sandbox gone');
      ws.current = null;
    }
  }, [gone]);

  useEffect(() => {
    if (active) {
      doFit();
      term.current?.focus();
    }
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [active]);

  const statusLine =
    gone ? null : loadErr ? (
      <span class="error-text">{loadErr}</span>
    ) : paused && status.s !== 'open' ? (
      'The sandbox is paused: resume it to use the terminal.'
    ) : status.s === 'loading' || status.s === 'idle' ? (
      'Loading terminal…'
    ) : status.s === 'connecting' ? (
      'Connecting…'
    ) : status.s === 'open' ? (
      <span class="ok-text">Connected</span>
    ) : (
      <>
        <span class="error-text" data-testid="terminal-closed">
          {status.text}
        </span>{' '}
        {status.code !== 4404 && status.code !== 4401 && (
          <button type="button" onClick={() => setSession((n) => n + 1)}>
            Reconnect
          </button>
        )}
      </>
    );

  return (
    <div class="term-tab" style={{ display: active ? undefined : 'none' }}>
      {gone ? (
        <div class="gone-inline">{goneText(gone)}</div>
      ) : (
        <div class="term-status" data-testid="terminal-status">
          {statusLine}
        </div>
      )}
      <div
        class="term-host"
        data-testid="terminal"
        ref={host}
        // Gone before any connection: nothing to show but the message.
        style={{ display: gone && (status.s === 'loading' || status.s === 'idle' || status.s === 'connecting') ? 'none' : undefined }}
      />
    </div>
  );
}
