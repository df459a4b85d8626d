import { useEffect, useRef, useState } from 'preact/hooks';

// ---- formatting ----

const UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

export function fmtBytes(n: number | null | undefined): string {
  if (n === null || n === undefined || !isFinite(n)) return '—';
  if (n < 0) return '-' + fmtBytes(-n);
  let i = 0;
  let v = n;
  while (v >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i++;
  }
  let s = i === 0 ? String(Math.round(v)) : v >= 100 ? v.toFixed(0) : v >= 10 ? v.toFixed(1) : v.toFixed(2);
  if (s.includes('.')) s = s.replace(/\.?0+$/, '');
  return s + ' ' + UNITS[i];
}

export function fmtMB(mb: number | null | undefined): string {
  if (mb === null || mb === undefined) return '—';
  return fmtBytes(mb * 1024 * 1024);
}

export function fmtPct(p: number | null | undefined): string {
  if (p === null || p === undefined || !isFinite(p)) return '—';
  return (p >= 10 ? p.toFixed(0) : p.toFixed(1)) + ' %';
}

export function parseTime(s: string | null | undefined): number | null {
  if (!s) return null;
  const t = Date.parse(s);
  if (isNaN(t) || t <= 0) return null;
  return t;
}

function span(sec: number): string {
  if (sec < 45) return `${Math.max(0, Math.round(sec))} s`;
  const m = sec / 60;
  if (m < 60) return `${Math.round(m)} min`;
  const h = m / 60;
  if (h < 24) return h < 10 ? `${Math.floor(h)} h ${Math.round(m % 60)} min` : `${Math.round(h)} h`;
  const d = h / 24;
  return d < 10 ? `${Math.floor(d)} d ${Math.round(h % 24)} h` : `${Math.round(d)} d`;
}

export function fmtRel(s: string | null | undefined, now = Date.now()): string {
  const t = parseTime(s);
  if (t === null) return '—';
  const d = (t - now) / 1000;
  if (Math.abs(d) < 1.5) return d <= 0 ? 'just now' : 'now';
  return d < 0 ? `${span(-d)} ago` : `in ${span(d)}`;
}

export function fmtAbs(s: string | null | undefined): string {
  const t = parseTime(s);
  if (t === null) return '';
  const d = new Date(t);
  const p = (n: number) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${p(d.getMonth() + 1)}-${p(d.getDate())} ${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

export function fmtClock(ms: number): string {
  const d = new Date(ms);
  const p = (n: number) => String(n).padStart(2, '0');
  return `${p(d.getHours())}:${p(d.getMinutes())}:${p(d.getSeconds())}`;
}

// ---- metadata filter: "k=v&k2=v2" or "k=v, k2=v2" -> "k=v&k2=v2" ----

export function normMetadata(s: string): string {
  return s
    .split(/[&,]/)
    .map((p) => p.trim())
    .filter((p) => p !== '')
    .join('&');
}

// ---- hooks ----

// usePoll runs fn now and then every `ms` (a run taking longer is followed
// by the next at once, never overlapped), while enabled.
// fn gets alive(): false once deps changed or the component unmounted, so a
// late answer does not overwrite newer state.
export function usePoll(fn: (alive: () => boolean) => Promise<unknown>, ms: number, deps: unknown[], enabled = true) {
  const ref = useRef(fn);
  ref.current = fn;
  useEffect(() => {
    if (!enabled) return;
    let stopped = false;
    let timer: ReturnType<typeof setTimeout> | undefined;
    const alive = () => !stopped;
    const tick = async () => {
      const t0 = Date.now();
      try {
        await ref.current(alive);
      } catch {
        // fn shows its own errors
      }
      if (!stopped) timer = setTimeout(tick, Math.max(100, ms - (Date.now() - t0)));
    };
    void tick();
    return () => {
      stopped = true;
      if (timer) clearTimeout(timer);
    };
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [...deps, ms, enabled]);
}

export function useDebounced<T>(v: T, ms: number): T {
  const [d, setD] = useState(v);
  useEffect(() => {
    const t = setTimeout(() => setD(v), ms);
    return () => clearTimeout(t);
  }, [v, ms]);
  return d;
}

// useNow re-renders every `ms` so relative times stay fresh.
export function useNow(ms = 5000): number {
  const [now, setNow] = useState(Date.now());
  useEffect(() => {
    const t = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(t);
  }, [ms]);
  return now;
}

// ---- hash routing: #/overview, #/sandboxes, #/sandboxes/<id>[/<tab>], #/templates ----

export type Route =
  | { page: 'overview' }
  | { page: 'sandboxes' }
  | { page: 'sandbox'; id: string; tab: string }
  | { page: 'templates' };

export function parseHash(h: string): Route {
  const parts = h.replace(/^#\/?/, '').split('/').filter(Boolean).map(decodeURIComponent);
  if (parts[0] === 'sandboxes' && parts[1]) return { page: 'sandbox', id: parts[1], tab: parts[2] || 'terminal' };
  if (parts[0] === 'sandboxes') return { page: 'sandboxes' };
  if (parts[0] === 'templates') return { page: 'templates' };
  return { page: 'overview' };
}

export function useRoute(): Route {
  const [r, setR] = useState(() => parseHash(location.hash));
  useEffect(() => {
    const f = () => setR(parseHash(location.hash));
    window.addEventListener('hashchange', f);
    return () => window.removeEventListener('hashchange', f);
  }, []);
  return r;
}

export function go(hash: string) {
  if (location.hash !== hash) location.hash = hash;
}

export function sandboxHref(id: string, tab?: string) {
  return '#/sandboxes/' + encodeURIComponent(id) + (tab ? '/' + tab : '');
}
