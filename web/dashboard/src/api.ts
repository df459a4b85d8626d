// The dashboard's JSON API (see ../API.md). Every call goes through req(),
// which adds the CSRF header to non-GET requests, turns error bodies
// ({"code","message","gone"?}) into ApiError, and reports a 401 to the app
// so that it shows the sign-in form.

export const BASE = import.meta.env.BASE_URL.replace(/\/?$/, '/') + 'api/';

export class ApiError extends Error {
  status: number;
  gone: boolean;
  constructor(status: number, message: string, gone = false) {
    super(message);
    this.status = status;
    this.gone = gone;
  }
}

let csrfToken = '';
export function setCsrf(t: string) {
  csrfToken = t;
}
export function getCsrf() {
  return csrfToken;
}

let unauthorized: (() => void) | null = null;
export function onUnauthorized(fn: () => void) {
  unauthorized = fn;
}

// signalUnauthorized is for answers that do not come through req() (the
// terminal's WebSocket closing with 4401).
export function signalUnauthorized() {
  unauthorized?.();
}

export type ReqOpts = {
  body?: unknown;
  form?: FormData;
  // The sign-in call itself handles its 401 (wrong key).
  no401?: boolean;
};

export async function req<T = unknown>(method: string, path: string, opts: ReqOpts = {}): Promise<T> {
  const headers: Record<string, string> = {};
  let body: BodyInit | undefined;
  if (opts.form) {
    body = opts.form;
  } else if (opts.body !== undefined) {
    headers['content-type'] = 'application/json';
    body = JSON.stringify(opts.body);
  }
  if (method !== 'GET' && method !== 'HEAD' && csrfToken) headers['X-Airlock-CSRF'] = csrfToken;
  let res: Response;
  try {
    res = await fetch(BASE + path, { method, headers, body, credentials: 'same-origin', cache: 'no-store' });
  } catch (e) {
    throw new ApiError(0, 'Cannot reach the server: ' + (e instanceof Error ? e.message : String(e)));
  }
  if (res.status === 204) return undefined as T;
  const text = await res.text();
  let data: unknown = undefined;
  if (text) {
    try {
      data = JSON.parse(text);
    } catch {
      data = undefined;
    }
  }
  if (!res.ok) {
    const d = (data ?? {}) as { message?: unknown; gone?: unknown };
    const msg =
      typeof d.message === 'string' && d.message
        ? d.message
        : `${res.status} ${res.statusText || 'error'}${text && data === undefined ? ': ' + text.slice(0, 200) : ''}`;
    const err = new ApiError(res.status, msg, d.gone === true);
    if (res.status === 401 && !opts.no401 && unauthorized) unauthorized();
    throw err;
  }
  return data as T;
}

export function errMsg(e: unknown): string {
  if (e instanceof Error) return e.message;
  return String(e);
}

export const enc = encodeURIComponent;

// ---- shapes ----

export type Session = { csrfToken: string; keyHint: string };

export type Overview = {
  running: number;
  paused: number;
  createsPerMinute: { minute: string; count: number }[];
  host: {
    cpus: number;
    load1: number;
    memoryTotalBytes: number;
    memoryAvailableBytes: number;
    diskTotalBytes: number;
    diskFreeBytes: number;
  };
};

export type Usage = {
  at: string;
  cpuUsedPct: number;
  memUsed: number;
  memTotal: number;
  diskUsed: number;
  diskTotal: number;
};

export type Sandbox = {
  sandboxID: string;
  templateID: string;
  alias?: string;
  state: string;
  startedAt: string;
  endAt: string;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  metadata?: Record<string, string> | null;
  usage?: Usage | null;
};

export type SandboxList = { total: number; sandboxes: Sandbox[] };

export type Metric = {
  at: string;
  cpuCount: number;
  cpuUsedPct: number;
  memUsed: number;
  memTotal: number;
  diskUsed: number;
  diskTotal: number;
};

export type SbEvent = { id: string; type: string; timestamp: string; eventData?: Record<string, unknown> | null };

export type LogLine = { timestamp: string; level: string; message: string; fields?: Record<string, unknown> | null };

export type Proc = { pid: number; cmd: string; args?: string[] | null; cwd?: string; tag?: string; pty?: boolean };

export type Entry = {
  name: string;
  path: string;
  type: 'file' | 'dir' | 'symlink' | string;
  size: number;
  modifiedTime: string;
  permissions: string;
};

export type Build = { buildID: string; status: string; createdAt: string; finishedAt?: string | null };

export type Template = {
  templateID: string;
  aliases?: string[] | null;
  builtin: boolean;
  public: boolean;
  ready: boolean;
  sizeBytes: number;
  layers: number;
  createdAt: string;
  builtAt?: string | null;
  buildID?: string;
  cpuCount: number;
  memoryMB: number;
  diskSizeMB: number;
  mine: boolean;
  builds?: Build[] | null;
};

export type BuildLog = { status: string; lines: string[] | null; nextOffset: number; reason?: string };
