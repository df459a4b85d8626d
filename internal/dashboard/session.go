package dashboard

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
)

const (
	// cookieName holds the session id; the key itself stays on the server.
	cookieName = "airlock_dashboard"
	// csrfHeader carries the session's CSRF token on every request that
	// changes something.
	csrfHeader = "X-Airlock-CSRF"
	// sessionIdle signs a browser out after this long without a request;
	// sessionMax after this long whatever it does.
	sessionIdle = 12 * time.Hour
	sessionMax  = 7 * 24 * time.Hour
	// maxSessions bounds the memory sign-ins can take; the oldest go first.
	maxSessions = 10000
)

// session is one signed-in browser.
type session struct {
	id, csrf string
	key      string // the API key it acts as
	created  time.Time
	seen     time.Time
	// owner (the key's team) and who are filled at each request from the
	// key's current record, never kept from the sign-in.
	owner string
	who   apikey.Principal
}

// sessions keeps the signed-in browsers in memory.
type sessions struct {
	now func() time.Time
	mu  sync.Mutex
	m   map[string]*session
}

func newSessions(now func() time.Time) *sessions {
	return &sessions{now: now, m: map[string]*session{}}
}

func randomToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b) // never fails on Linux
	return base64.RawURLEncoding.EncodeToString(b)
}

func (s *sessions) create(key string) *session {
	now := s.now()
	ss := &session{id: randomToken(), csrf: randomToken(), key: key, created: now, seen: now}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.m) >= maxSessions {
		s.pruneLocked(now)
	}
	for len(s.m) >= maxSessions { // still full: drop the least recently seen
		var oldest *session
		for _, o := range s.m {
			if oldest == nil || o.seen.Before(oldest.seen) {
				oldest = o
			}
		}
		delete(s.m, oldest.id)
	}
	s.m[ss.id] = ss
	return ss
}

func (s *sessions) pruneLocked(now time.Time) {
	for id, o := range s.m {
		if s.expired(o, now) {
			delete(s.m, id)
		}
	}
}

func (s *sessions) expired(o *session, now time.Time) bool {
	return now.Sub(o.seen) > sessionIdle || now.Sub(o.created) > sessionMax
}

// get returns the live session id names and marks it seen.
func (s *sessions) get(id string) *session {
	now := s.now()
	s.mu.Lock()
	defer s.mu.Unlock()
	o := s.m[id]
	if o == nil {
		return nil
	}
	if s.expired(o, now) {
		delete(s.m, id)
		return nil
	}
	o.seen = now
	cp := *o
	return &cp
}

func (s *sessions) remove(id string) {
	s.mu.Lock()
	delete(s.m, id)
	s.mu.Unlock()
}

type sessionKey struct{}

func sessionFrom(ctx context.Context) *session {
	s, _ := ctx.Value(sessionKey{}).(*session)
	return s
}

// sessionOf returns the request's session, with who its key is now; nil
// when there is none, or its key no longer works (the session ends then).
func (d *Dashboard) sessionOf(r *http.Request) *session {
	c, err := r.Cookie(cookieName)
	if err != nil || c.Value == "" {
		return nil
	}
	s := d.sessions.get(c.Value)
	if s == nil {
		return nil
	}
	p, err := d.o.Identify(s.key)
	if err != nil {
		d.sessions.remove(s.id)
		return nil
	}
	s.who, s.owner = p, p.Team
	return s
}

// signedIn serves next for a signed-in browser only; a request that
// changes something must also carry the session's CSRF token and, when the
// browser says where it comes from, come from this origin.
func (d *Dashboard) signedIn(next http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		s := d.sessionOf(r)
		if s == nil {
			writeError(w, http.StatusUnauthorized, "Not signed in: sign in with an API key")
			return
		}
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			if !sameOrigin(r) {
				writeError(w, http.StatusForbidden, "Cross-origin request refused")
				return
			}
			if subtle.ConstantTimeCompare([]byte(r.Header.Get(csrfHeader)), []byte(s.csrf)) != 1 {
				writeError(w, http.StatusForbidden, "Missing or wrong "+csrfHeader+" header: reload the page")
				return
			}
		}
		next(w, r.WithContext(context.WithValue(r.Context(), sessionKey{}, s)))
	}
}

// sameOrigin reports whether the request's Origin, when it has one, is the
// host it was sent to.
func sameOrigin(r *http.Request) bool {
	o := r.Header.Get("Origin")
	if o == "" {
		return true // not a browser's cross-origin request: those carry Origin
	}
	u, err := url.Parse(o)
	return err == nil && strings.EqualFold(u.Host, r.Host)
}

// sessionJSON is what the app learns of its session.
type sessionJSON struct {
	CSRFToken string `json:"csrfToken"`
	KeyHint   string `json:"keyHint"`
}

// keyHint shows enough of a key to tell which one is signed in.
func keyHint(key string) string {
	if len(key) <= 8 {
		return "…"
	}
	prefix := ""
	if i := strings.IndexByte(key, '_'); i >= 0 && i < 8 {
		prefix = key[:i+1]
	}
	return prefix + "…" + key[len(key)-4:]
}

func (d *Dashboard) signIn(w http.ResponseWriter, r *http.Request) {
	if !sameOrigin(r) {
		writeError(w, http.StatusForbidden, "Cross-origin request refused")
		return
	}
	var body struct {
		APIKey string `json:"apiKey"`
	}
	if err := readJSON(r, &body); err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	key := strings.TrimSpace(body.APIKey)
	if key == "" {
		writeError(w, http.StatusBadRequest, "Enter an API key")
		return
	}
	p, err := d.o.Identify(key)
	if err != nil {
		msg := "Invalid API key"
		switch {
		case errors.Is(err, apikey.ErrRevoked):
			msg = "Invalid API key: it was revoked"
		case errors.Is(err, apikey.ErrMalformed):
			msg = "Malformed API key: a key is 8-200 letters, digits, _ and -"
		}
		writeError(w, http.StatusUnauthorized, msg)
		return
	}
	if !p.Has(apikey.SandboxesRead) {
		writeError(w, http.StatusForbidden, fmt.Sprintf("This API key (%s) lacks the scope %s, which the dashboard needs", p.KeyName, apikey.SandboxesRead))
		return
	}
	s := d.sessions.create(key)
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: s.id, Path: strings.TrimSuffix(Prefix, "/"),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil,
		MaxAge: int(sessionMax / time.Second),
	})
	writeJSON(w, http.StatusOK, sessionJSON{CSRFToken: s.csrf, KeyHint: keyHint(key)})
}

func (d *Dashboard) session(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r.Context())
	writeJSON(w, http.StatusOK, sessionJSON{CSRFToken: s.csrf, KeyHint: keyHint(s.key)})
}

func (d *Dashboard) signOut(w http.ResponseWriter, r *http.Request) {
	d.sessions.remove(sessionFrom(r.Context()).id)
	http.SetCookie(w, &http.Cookie{
		Name: cookieName, Value: "", Path: strings.TrimSuffix(Prefix, "/"),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil, MaxAge: -1,
	})
	w.WriteHeader(http.StatusNoContent)
}
