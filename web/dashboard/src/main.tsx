import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { ApiError, errMsg, onUnauthorized, req, setCsrf, type Session } from './api';
import { OverviewPage } from './overview';
import { SandboxesPage } from './sandboxes';
import { SandboxPage } from './sandbox';
import { TemplatesPage } from './templates';
import { ConfirmHost, Toast } from './ui';
import { useRoute, type Route } from './util';
import './style.css';

type Auth =
  | { s: 'loading' }
  | { s: 'out'; note?: string }
  | { s: 'unreachable'; error: string }
  | { s: 'in'; keyHint: string };

function SignIn({ note, onDone }: { note?: string; onDone: (s: Session) => void }) {
  const [key, setKey] = useState('');
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const s = await req<Session>('POST', 'session', { body: { apiKey: key.trim() }, no401: true });
      onDone(s);
    } catch (err) {
      setError(errMsg(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <div class="signin">
      <form class="signin-box" onSubmit={submit}>
        <h1>Airlock</h1>
        <p class="muted">Sign in with an API key of this server.</p>
        {note && <p class="note">{note}</p>}
        <label for="signin-key">API key</label>
        <input
          id="signin-key"
          data-testid="signin-key"
          type="password"
          autocomplete="off"
          spellcheck={false}
          placeholder="e2b_…"
          value={key}
          onInput={(e) => setKey((e.target as HTMLInputElement).value)}
          autofocus
        />
        <button type="submit" class="primary" data-testid="signin-submit" disabled={busy}>
          {busy ? 'Signing in…' : 'Sign in'}
        </button>
        {error && (
          <div class="error-line" role="alert" data-testid="signin-error">
            {error}
          </div>
        )}
      </form>
    </div>
  );
}

function Nav({ route, keyHint, onSignOut }: { route: Route; keyHint: string; onSignOut: () => void }) {
  const cur = route.page === 'sandbox' ? 'sandboxes' : route.page;
  const link = (page: string, label: string) => (
    <a href={'#/' + page} data-testid={'nav-' + page} class={cur === page ? 'active' : ''}>
      {label}
    </a>
  );
  return (
    <header class="topbar">
      <span class="brand">Airlock</span>
      <nav>
        {link('overview', 'Overview')}
        {link('sandboxes', 'Sandboxes')}
        {link('templates', 'Templates')}
      </nav>
      <span class="spacer" />
      <span class="key-hint" title="Signed in with this API key">
        {keyHint}
      </span>
      <button type="button" data-testid="signout" onClick={onSignOut}>
        Sign out
      </button>
    </header>
  );
}

function App() {
  const [auth, setAuth] = useState<Auth>({ s: 'loading' });
  const route = useRoute();

  const check = async () => {
    setAuth({ s: 'loading' });
    try {
      const s = await req<Session>('GET', 'session', { no401: true });
      setCsrf(s.csrfToken);
      setAuth({ s: 'in', keyHint: s.keyHint });
    } catch (e) {
      if (e instanceof ApiError && e.status === 401) setAuth({ s: 'out' });
      else setAuth({ s: 'unreachable', error: errMsg(e) });
    }
  };

  useEffect(() => {
    onUnauthorized(() => {
      setCsrf('');
      setAuth((a) => (a.s === 'in' ? { s: 'out', note: 'Your session has ended; sign in again.' } : a));
    });
    void check();
  }, []);

  const signOut = async () => {
    try {
      await req('DELETE', 'session', { no401: true });
    } catch {
      // signed out either way
    }
    setCsrf('');
    setAuth({ s: 'out' });
  };

  let body;
  if (auth.s === 'loading') body = <div class="center muted">Loading…</div>;
  else if (auth.s === 'unreachable')
    body = (
      <div class="center">
        <div class="error-line" role="alert">
          {auth.error}
        </div>
        <button type="button" onClick={() => void check()}>
          Retry
        </button>
      </div>
    );
  else if (auth.s === 'out')
    body = (
      <SignIn
        note={auth.note}
        onDone={(s) => {
          setCsrf(s.csrfToken);
          setAuth({ s: 'in', keyHint: s.keyHint });
        }}
      />
    );
  else
    body = (
      <>
        <Nav route={route} keyHint={auth.keyHint} onSignOut={() => void signOut()} />
        <main class="page">
          {route.page === 'overview' && <OverviewPage />}
          {route.page === 'sandboxes' && <SandboxesPage />}
          {route.page === 'sandbox' && <SandboxPage key={route.id} id={route.id} tab={route.tab} />}
          {route.page === 'templates' && <TemplatesPage />}
        </main>
      </>
    );
  return (
    <>
      {body}
      <Toast />
      <ConfirmHost />
    </>
  );
}

// The server serves the app for any path under /dashboard/: a path such as
// /dashboard/sandboxes/<id> becomes the hash route #/sandboxes/<id>.
{
  const base = import.meta.env.BASE_URL;
  const rest = location.pathname.startsWith(base) ? location.pathname.slice(base.length) : '';
  if (rest && rest !== 'index.html' && !location.hash) history.replaceState(null, '', base + '#/' + rest);
}

render(<App />, document.getElementById('app')!);
