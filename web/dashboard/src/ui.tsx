import type { ComponentChildren } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';

// ---- toast: one element (data-testid=toast) showing the latest message ----

type ToastMsg = { id: number; text: string; kind: 'ok' | 'error' };
let toastSeq = 0;
let toastListener: ((t: ToastMsg | null) => void) | null = null;

export function toast(text: string, kind: 'ok' | 'error' = 'ok') {
  toastListener?.({ id: ++toastSeq, text, kind });
}
// clearToast hides the current message (an action starting: its answer
// is the next toast, not the last one's).
export function clearToast() {
  toastListener?.(null);
}
export function toastError(text: string) {
  toast(text, 'error');
}

export function Toast() {
  const [t, setT] = useState<ToastMsg | null>(null);
  useEffect(() => {
    toastListener = setT;
    return () => {
      toastListener = null;
    };
  }, []);
  useEffect(() => {
    if (!t) return;
    const h = setTimeout(() => setT(null), t.kind === 'error' ? 12000 : 7000);
    return () => clearTimeout(h);
  }, [t]);
  if (!t) return null;
  return (
    <div
      class={'toast toast-' + t.kind}
      data-testid="toast"
      data-kind={t.kind}
      role={t.kind === 'error' ? 'alert' : 'status'}
      onClick={() => setT(null)}
      title="Click to dismiss"
    >
      {t.text}
    </div>
  );
}

// ---- confirm dialog: confirmDialog(...) resolves true on confirm-ok ----

type ConfirmReq = { title: string; message: string; ok: string; danger: boolean; resolve: (v: boolean) => void };
let confirmListener: ((r: ConfirmReq) => void) | null = null;

export function confirmDialog(title: string, message: string, ok = 'OK', danger = true): Promise<boolean> {
  return new Promise((resolve) => {
    if (!confirmListener) return resolve(window.confirm(message));
    confirmListener({ title, message, ok, danger, resolve });
  });
}

export function ConfirmHost() {
  const [r, setR] = useState<ConfirmReq | null>(null);
  const okRef = useRef<HTMLButtonElement>(null);
  useEffect(() => {
    confirmListener = (n) => {
      setR((old) => {
        old?.resolve(false);
        return n;
      });
    };
    return () => {
      confirmListener = null;
    };
  }, []);
  useEffect(() => {
    if (!r) return;
    okRef.current?.focus();
    const onKey = (e: KeyboardEvent) => {
      if (e.key === 'Escape') done(false);
    };
    window.addEventListener('keydown', onKey);
    return () => window.removeEventListener('keydown', onKey);
  }, [r]);
  const done = (v: boolean) => {
    r?.resolve(v);
    setR(null);
  };
  if (!r) return null;
  return (
    <div class="modal-back" onClick={(e) => e.target === e.currentTarget && done(false)}>
      <div class="modal" role="dialog" aria-modal="true" aria-labelledby="confirm-title" data-testid="confirm-dialog">
        <h3 id="confirm-title">{r.title}</h3>
        <p>{r.message}</p>
        <div class="modal-actions">
          <button type="button" data-testid="confirm-cancel" onClick={() => done(false)}>
            Cancel
          </button>
          <button
            type="button"
            ref={okRef}
            class={r.danger ? 'danger' : 'primary'}
            data-testid="confirm-ok"
            onClick={() => done(true)}
          >
            {r.ok}
          </button>
        </div>
      </div>
    </div>
  );
}

// ---- small pieces ----

export function StateBadge({ state, testid }: { state: string; testid?: string }) {
  return (
    <span class={'badge st-' + state} data-testid={testid}>
      {state}
    </span>
  );
}

export function Bar({ used, total, label }: { used: number; total: number; label?: ComponentChildren }) {
  const pct = total > 0 ? Math.min(100, Math.max(0, (used / total) * 100)) : 0;
  const cls = pct > 90 ? 'bar-fill hot' : pct > 70 ? 'bar-fill warm' : 'bar-fill';
  return (
    <div class="bar-wrap">
      <div class="bar">
        <div class={cls} style={{ width: pct.toFixed(1) + '%' }} />
      </div>
      {label !== undefined && <div class="bar-label">{label}</div>}
    </div>
  );
}

export function ErrorLine({ error }: { error: string | null }) {
  if (!error) return null;
  return (
    <div class="error-line" role="alert">
      {error}
    </div>
  );
}
