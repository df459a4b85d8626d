package e2b

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"golang.org/x/time/rate"
	"io"
	"log/slog"
	"net/http"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

// Defaults for Options fields left zero.
const (
	DefaultTimeout     = 300 * time.Second
	DefaultMaxTimeout  = 24 * time.Hour
	DefaultMaxBodySize = 1 << 20
	// DefaultClientID fills the deprecated clientID field when the manager has
	// none: the Python SDK raises KeyError without it, and nothing reads it.
	DefaultClientID = "airlock"
)

// Options configures the control-plane handler.
type Options struct {
	// Identify returns who an API key is: its team (the owner of what it
	// makes and all it may see) and its scopes; an error for an unknown,
	// revoked or malformed key. It sees the key from X-API-KEY or from
	// "Authorization: Bearer".
	Identify func(apiKey string) (apikey.Principal, error)
	// Authenticate, used when Identify is nil, reports whether a key is
	// valid; each key is then its own team with every scope. With neither,
	// every request is refused: an API left open by a forgotten option is
	// worse than one that visibly refuses.
	Authenticate func(apiKey string) bool
	// DefaultTimeout is the sandbox lifetime when the v2 create or connect
	// body names none (the SDKs' own default is 300 s).
	DefaultTimeout time.Duration
	// MaxTimeout caps every requested timeout; upstream enforces a per-team
	// maximum the same way (400 "Timeout cannot be greater than N hours").
	MaxTimeout time.Duration
	// Domain is returned as the sandbox "domain"; empty means JSON null, which
	// the SDKs accept when E2B_SANDBOX_URL routes traffic instead of DNS.
	Domain string
	// DomainFor, when set, gives the domain for one request instead (""
	// keeps Domain): the one the client reached the API under, port
	// included, so that the SDK's sandbox URLs go where its API calls went.
	DomainFor func(r *http.Request) string
	// EnvdVersion is reported when the manager's Info has no version. The SDKs
	// gate features on it and kill sandboxes that report less than 0.1.0, so
	// an empty field on the wire would break every client.
	EnvdVersion string
	// MaxBodySize bounds request bodies (413 beyond it). Default 1 MiB.
	MaxBodySize int64
	// Limits are the per-API-key rate limits (429 with Retry-After beyond
	// them). The zero value limits nothing; servers pass DefaultLimits.
	Limits Limits
	// Templates serves the template endpoints (templates.go); nil makes them
	// answer 404 with a JSON message.
	Templates TemplateCatalog
	// Builds runs template builds (tplbuild.go); nil makes the build
	// endpoints answer 501.
	Builds TemplateBuilds
	// Events reads the sandboxes' lifecycle events (events.go); nil makes
	// the events endpoints answer 501.
	Events lifecycle.Reader
	// Webhooks keeps the lifecycle webhooks (webhooks.go); nil makes their
	// endpoints answer 501. WebhookAllowPrivate accepts webhook URLs at
	// loopback, private and link-local addresses (serve
	// --webhook-allow-private).
	Webhooks            WebhookStore
	WebhookAllowPrivate bool
	// Volumes keeps the volumes (volumes.go); nil (no disk pool) makes
	// their endpoints answer 501.
	Volumes VolumeService
	// Secrets keeps the secrets (secrets.go); nil makes their endpoints
	// answer 501.
	Secrets SecretService
	// Keys manages teams and API keys (keys.go: /api-keys, /teams); nil
	// makes the key routes answer 501.
	Keys KeyService
	// Audit keeps the audit log: every request that changes something, and
	// every request refused for its key, is written to it; nil keeps none.
	Audit AuditLog
	// Buckets, when set, keeps the rate limits' token buckets where every
	// replica of the control plane takes from the same ones (the store);
	// nil keeps them in this process (one box).
	Buckets TokenBuckets
	// TeamRate, when set, gives a team's own rate of requests per second
	// (0: Limits.Requests'); its bursts are as large as a second of it.
	TeamRate func(team string) float64
	// Grants makes the envd access tokens and volume tokens the API hands
	// out the grants of the request's key (internal/grant) rather than the
	// resource's own token: the sandbox proxy and the volume content API
	// must then check them (they do when the daemon wires them).
	Grants bool
	// TeamMetrics answers GET /teams/{teamID}/metrics; nil: 501.
	TeamMetrics TeamMetrics
	Logger      *slog.Logger
}

// Handler serves the E2B control-plane REST API (docs/E2B-WIRE.md §2) over a Manager.
type Handler struct {
	m    Manager
	opts Options
	log  *slog.Logger
	mux  *http.ServeMux
	// requests and creates are the per-key token buckets (nil: no limit).
	requests, creates *keyLimiters
	// teamRates are the buckets of the teams with a rate of their own.
	teamMu    sync.Mutex
	teamRates map[string]*rate.Limiter
	// uploadKey signs template file upload URLs; per process, so a URL
	// outlives neither the server nor a restart.
	uploadKey []byte
}

// NewHandler returns the API handler. Mount it at the root of the API
// listener: the SDKs build paths from E2B_API_URL without a prefix.
func NewHandler(m Manager, opts Options) *Handler {
	if opts.DefaultTimeout <= 0 {
		opts.DefaultTimeout = DefaultTimeout
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = DefaultMaxTimeout
	}
	if opts.MaxBodySize <= 0 {
		opts.MaxBodySize = DefaultMaxBodySize
	}
	if opts.EnvdVersion == "" {
		opts.EnvdVersion = envdapi.Version
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	h := &Handler{
		m: m, opts: opts, log: opts.Logger, mux: http.NewServeMux(),
		requests:  newKeyLimiters("requests", opts.Limits.Requests, opts.Buckets, opts.Logger),
		teamRates: map[string]*rate.Limiter{},
		creates:   newKeyLimiters("creates", opts.Limits.Creates, opts.Buckets, opts.Logger),
		uploadKey: make([]byte, 32),
	}
	_, _ = rand.Read(h.uploadKey) // crypto/rand.Read never fails on Linux

	h.mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	h.handleCreate("POST /sandboxes", h.createV1)
	h.handleCreate("POST /v2/sandboxes", h.createV2)
	h.handle("GET /sandboxes", h.listV1)
	h.handle("GET /v2/sandboxes", h.listV2)
	h.handle("GET /sandboxes/{sandboxID}", h.get)
	h.handle("DELETE /sandboxes/{sandboxID}", h.kill)
	h.handle("POST /sandboxes/{sandboxID}/connect", h.connect)
	h.handle("POST /v2/sandboxes/{sandboxID}/connect", h.connect)
	h.handle("POST /sandboxes/{sandboxID}/resume", h.resume)
	h.handle("POST /sandboxes/{sandboxID}/timeout", h.setTimeout)
	h.handle("POST /sandboxes/{sandboxID}/refreshes", h.refresh)
	h.handle("POST /sandboxes/{sandboxID}/pause", h.pause)
	// A fork starts sandboxes, so it spends a create token like create does.
	h.handleCreate("POST /sandboxes/{sandboxID}/fork", h.fork)
	h.handle("POST /sandboxes/{sandboxID}/snapshots", h.createSnapshot)
	h.handle("GET /snapshots", h.listSnapshots)
	h.handle("GET /sandboxes/{sandboxID}/metrics", h.metrics)
	h.handle("GET /sandboxes/{sandboxID}/logs", h.logsV1)
	h.handle("GET /v2/sandboxes/{sandboxID}/logs", h.logsV2)
	h.handle("PUT /sandboxes/{sandboxID}/network", h.updateNetwork)
	h.routeTemplates()
	h.routeEvents()
	h.routeWebhooks()
	h.routeVolumes()
	h.routeSecrets()
	h.routeKeys()
	return h
}

// apiHandler returns an error instead of writing one so that every failure
// goes through the same mapping to {"code","message"}.
type apiHandler func(w http.ResponseWriter, r *http.Request) error

// handle serves an authenticated route: the key must hold the route's
// scope (scopeFor). Handlers reach sandboxes through h.sbx, which shows the
// key's team its own only.
func (h *Handler) handle(pattern string, fn apiHandler) {
	h.mux.Handle(pattern, h.authenticated(pattern, h.serveAPI(fn)))
}

// handleCreate is handle for the sandbox-creating routes, which also spend a
// token of the key's create bucket.
func (h *Handler) handleCreate(pattern string, fn apiHandler) {
	serve := h.serveAPI(fn)
	h.mux.Handle(pattern, h.authenticated(pattern, func(w http.ResponseWriter, r *http.Request) {
		if ok, wait := h.creates.take(r.Context(), ownerFrom(r.Context()), time.Now()); !ok {
			tooManyRequests(w, "sandbox creations", h.opts.Limits.Creates, wait)
			return
		}
		serve(w, r)
	}))
}

func (h *Handler) serveAPI(fn apiHandler) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if err := fn(w, r); err != nil {
			h.writeErr(w, r, err)
		}
	}
}

func (h *Handler) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	var ae *apiError
	if !errors.As(err, &ae) {
		ae = managerError(err, "", "")
	}
	switch {
	case ae.retryAfter > 0:
		// A template still building: expected for minutes after a first start,
		// and the client is told when to come back; not a server fault.
		w.Header().Set("Retry-After", strconv.Itoa(int((ae.retryAfter+time.Second-1)/time.Second)))
		// Debug: an MCP tool retries every few seconds while it waits, and the
		// build's own progress is already on the terminal.
		h.log.Debug("e2b api: template not ready yet", "method", r.Method, "path", r.URL.Path, "status", ae.status, "reason", ae.message)
	// 501 is a client asking for what Airlock does not offer (template
	// builds through the API), and 507 a team's quota on disk (volumes'
	// total, paused sandboxes' disk): neither is a server fault.
	case ae.status >= 500 && ae.status != http.StatusNotImplemented && ae.status != http.StatusInsufficientStorage:
		h.log.Error("e2b api request failed", "method", r.Method, "path", r.URL.Path, "status", ae.status, "err", err)
	default:
		h.log.Debug("e2b api request rejected", "method", r.Method, "path", r.URL.Path, "status", ae.status, "err", err)
	}
	writeError(w, ae.status, ae.message)
}

// ServeHTTP resolves the route first so that unknown paths and methods get
// the same JSON error body as everything else (ServeMux writes plain text),
// and recovers panics into a 500 body so one bad request cannot take the
// listener's goroutine down silently.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rw := &statusWriter{ResponseWriter: w}
	defer func() {
		v := recover()
		if v == nil {
			return
		}
		if v == http.ErrAbortHandler { // net/http uses this panic to abort a response; it must reach the server
			panic(v)
		}
		h.log.Error("e2b api handler panicked", "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
		if !rw.wroteHeader {
			writeError(rw, http.StatusInternalServerError, fmt.Sprintf("internal error: %v", v))
		}
	}()

	if _, pattern := h.mux.Handler(r); pattern == "" {
		h.unrouted(rw, r)
		return
	}
	h.mux.ServeHTTP(rw, r)
}

// unrouted lets ServeMux decide between 404, 405 (with its Allow header) and
// a path-cleaning redirect, then replaces its plain-text body with JSON.
func (h *Handler) unrouted(w http.ResponseWriter, r *http.Request) {
	inner, _ := h.mux.Handler(r)
	cw := &captureWriter{header: w.Header()}
	inner.ServeHTTP(cw, r)
	status := cw.status
	if status == 0 {
		status = http.StatusNotFound
	}
	if status >= 300 && status < 400 {
		w.WriteHeader(status) // redirect: Location is already in the shared header map
		return
	}
	w.Header().Del("X-Content-Type-Options")
	msg := fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)
	if status == http.StatusMethodNotAllowed {
		msg = fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path)
	}
	writeError(w, status, msg)
}

// authenticated accepts the key from X-API-KEY (what the SDKs send) or from
// "Authorization: Bearer" (what the upstream CLI sends), and serves next
// when the key holds the route's scope (scopeFor). Requests that change
// something, and requests refused for their key, go to the audit log.
func (h *Handler) authenticated(pattern string, next http.HandlerFunc) http.Handler {
	scope := scopeFor(pattern)
	changes := !strings.HasPrefix(pattern, "GET ") && !strings.HasPrefix(pattern, "HEAD ")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get(e2bwire.HeaderAPIKey)
		if key == "" {
			if scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
				key = strings.TrimSpace(token)
			}
		}
		if key == "" {
			writeError(w, http.StatusUnauthorized, "Missing API key: send it in the X-API-KEY header")
			return
		}
		p, err := h.identify(key)
		if err != nil {
			msg := errorForKey(err)
			writeError(w, http.StatusUnauthorized, msg)
			h.audit(r, p, pattern, http.StatusUnauthorized, nil, msg)
			return
		}
		if ok, wait := h.takeRequest(r.Context(), p.Team, time.Now()); !ok {
			h.tooManyTeamRequests(w, p.Team, wait)
			return
		}
		if scope != noScope && !p.Has(scope) {
			missingScope(w, p, scope)
			h.audit(r, p, pattern, http.StatusForbidden, nil, "missing scope "+string(scope))
			return
		}
		ctx := withPrincipal(r.Context(), p)
		if !changes {
			next(w, r.WithContext(ctx))
			return
		}
		note := &auditNote{}
		sw := &statusWriter{ResponseWriter: w}
		next(sw, r.WithContext(context.WithValue(ctx, auditNoteKey{}, note)))
		h.audit(r, p, pattern, cmp.Or(sw.status, http.StatusOK), note, "")
	})
}

// statusWriter remembers whether the header went out, so the panic handler
// knows if it can still write an error body.
type statusWriter struct {
	http.ResponseWriter
	wroteHeader bool
	status      int // the first status written (0: none yet)
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wroteHeader {
		w.status = code
	}
	w.wroteHeader = true
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.status = http.StatusOK
	}
	w.wroteHeader = true
	return w.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer.
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// captureWriter records ServeMux's status for an unrouted request and drops
// its plain-text body.
type captureWriter struct {
	header http.Header
	status int
}

func (w *captureWriter) Header() http.Header { return w.header }
func (w *captureWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
}
func (w *captureWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return io.Discard.Write(b)
}
