// Package dashboard serves Airlock's web dashboard on the API listener: the
// single-page app under /dashboard/ (built from web/dashboard and embedded
// here, so serving needs no Node.js) and the JSON API it calls under
// /dashboard/api/ (web/dashboard/API.md is the contract).
//
// The lifecycle of a browser's visit:
//
//  1. The app asks GET /dashboard/api/session; 401 shows the sign-in form.
//  2. POST /dashboard/api/session with an API key: the key is checked with
//     the server's own Authenticate and kept in a server-side session; the
//     browser gets only an opaque id in an httpOnly, SameSite=Strict cookie
//     and a CSRF token that every non-GET request must echo in a header.
//  3. Each API route finds the session and asks again who its key is (a
//     revoked key's session ends there), then acts as that key: sandbox
//     routes answer 404 for a sandbox of another team, exactly as for one
//     that never existed,
//     actions go through the E2B REST handler in-process with the session's
//     key (so validation, limits and metrics are the API's own), and envd
//     work (files, processes, the terminal) goes through the sandbox proxy
//     with the sandbox's access token, which never reaches the browser.
//  4. Sessions live in memory: a restart signs every browser out.
package dashboard

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/tplbuild"
)

// Prefix is where the dashboard is served on the API listener.
const Prefix = "/dashboard/"

//go:embed all:dist
var distFS embed.FS

// Sandboxes is what the dashboard reads of the sandbox manager directly:
// the listing, which the E2B API cannot scope to one key, and the samples.
type Sandboxes interface {
	List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Info, error)
	Get(ctx context.Context, id string) (sandbox.Info, error)
	Metrics(ctx context.Context, id string, start, end time.Time) ([]sandbox.Metric, error)
}

// Templates is what the dashboard reads of the template store.
type Templates interface {
	// List returns every template, built-ins not built yet included.
	List() ([]template.Template, error)
	// Builds returns the builds of a template the store keeps.
	Builds(idOrAlias string) ([]template.Template, error)
}

// BuildRecords lists API builds (tplbuild.Service): a template's, and an
// owner's of every template.
type BuildRecords interface {
	Builds(templateID string) ([]tplbuild.BuildInfo, error)
	OwnedBy(owner string) ([]tplbuild.BuildInfo, error)
}

// Options wires the dashboard to the server.
type Options struct {
	// Identify returns who an API key is (the server's keys and teams); a
	// session asks at every request, so a revoked key's session ends at
	// its next request.
	Identify func(apiKey string) (apikey.Principal, error)
	// API is the E2B REST handler; actions are served by calling it
	// in-process as the session's key.
	API       http.Handler
	Sandboxes Sandboxes
	Events    lifecycle.Reader
	Templates Templates
	// Builds may be nil (no API builds to list).
	Builds BuildRecords
	// Envd returns a client of the server's own API and sandbox proxy
	// acting as apiKey, for envd work (files, processes, terminal).
	Envd func(apiKey string) *e2bclient.Client
	// Grants: the proxy takes the keys' grants (internal/grant), not the
	// sandboxes' own tokens, as the E2B handler's Options.Grants says.
	Grants bool
	// DataDir is where the host's disk headroom is read.
	DataDir string
	Logger  *slog.Logger
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time
}

// Dashboard is the dashboard's HTTP handler; mount it at Prefix.
type Dashboard struct {
	o        Options
	log      *slog.Logger
	mux      *http.ServeMux
	sessions *sessions
	static   fs.FS
	index    []byte
}

// New returns the dashboard handler.
func New(o Options) (*Dashboard, error) {
	if o.Identify == nil || o.API == nil || o.Sandboxes == nil || o.Envd == nil {
		return nil, errors.New("dashboard: Identify, API, Sandboxes and Envd are required")
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	static, err := fs.Sub(distFS, "dist")
	if err != nil {
		return nil, fmt.Errorf("dashboard assets: %w", err)
	}
	index, err := fs.ReadFile(static, "index.html")
	if err != nil {
		return nil, fmt.Errorf("dashboard assets: %w", err)
	}
	d := &Dashboard{o: o, log: o.Logger, mux: http.NewServeMux(), sessions: newSessions(o.Now), static: static, index: index}
	d.routes()
	return d, nil
}

func (d *Dashboard) routes() {
	const api = "/dashboard/api/"
	d.mux.HandleFunc("POST "+api+"session", d.signIn)
	d.mux.HandleFunc("GET "+api+"session", d.signedIn(d.session))
	d.mux.HandleFunc("DELETE "+api+"session", d.signedIn(d.signOut))

	d.mux.HandleFunc("GET "+api+"overview", d.signedIn(d.overview))
	d.mux.HandleFunc("GET "+api+"sandboxes", d.signedIn(d.listSandboxes))
	sbx := api + "sandboxes/{id}"
	d.mux.HandleFunc("GET "+sbx, d.signedIn(d.owned(d.getSandbox)))
	d.mux.HandleFunc("GET "+sbx+"/metrics", d.signedIn(d.owned(d.sandboxMetrics)))
	// Events and logs outlive the sandbox: the owner check is theirs.
	d.mux.HandleFunc("GET "+sbx+"/events", d.signedIn(d.sandboxEvents))
	d.mux.HandleFunc("GET "+sbx+"/logs", d.signedIn(d.sandboxLogs))
	d.mux.HandleFunc("POST "+sbx+"/kill", d.signedIn(d.owned(d.kill)))
	d.mux.HandleFunc("POST "+sbx+"/pause", d.signedIn(d.owned(d.pause)))
	d.mux.HandleFunc("POST "+sbx+"/resume", d.signedIn(d.owned(d.resume)))
	d.mux.HandleFunc("POST "+sbx+"/timeout", d.signedIn(d.owned(d.setTimeout)))
	d.mux.HandleFunc("POST "+sbx+"/snapshot", d.signedIn(d.owned(d.snapshot)))
	d.mux.HandleFunc("POST "+sbx+"/fork", d.signedIn(d.owned(d.fork)))
	d.mux.HandleFunc("GET "+sbx+"/processes", d.signedIn(d.running(d.processes)))
	d.mux.HandleFunc("POST "+sbx+"/processes/{pid}/kill", d.signedIn(d.running(d.killProcess)))
	d.mux.HandleFunc("GET "+sbx+"/dir", d.signedIn(d.running(d.listDir)))
	d.mux.HandleFunc("GET "+sbx+"/files", d.signedIn(d.running(d.download)))
	d.mux.HandleFunc("POST "+sbx+"/files", d.signedIn(d.running(d.upload)))
	d.mux.HandleFunc("GET "+sbx+"/terminal", d.terminal)

	d.mux.HandleFunc("GET "+api+"templates", d.signedIn(d.listTemplates))
	d.mux.HandleFunc("GET "+api+"templates/{id}/builds/{buildID}/log", d.signedIn(d.buildLog))
	d.mux.HandleFunc("DELETE "+api+"templates/{id}", d.signedIn(d.deleteTemplate))

	d.mux.HandleFunc(api, func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no dashboard route for %s %s", r.Method, r.URL.Path))
	})
	d.mux.HandleFunc("/dashboard/", d.serveStatic)
	d.mux.HandleFunc("GET /dashboard", func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, Prefix, http.StatusFound)
	})
}

// ServeHTTP sets the headers every dashboard answer carries and routes.
func (d *Dashboard) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	// xterm.js and uPlot set element styles, hence 'unsafe-inline' for
	// styles only; scripts come from this origin alone.
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data: blob:; style-src 'self' 'unsafe-inline'; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'")
	d.mux.ServeHTTP(w, r)
}

// RedirectRoot sends a browser asking for / to the dashboard; anything
// else (an SDK, curl) gets next, so the E2B API's answers do not change.
func RedirectRoot(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/" && (r.Method == http.MethodGet || r.Method == http.MethodHead) &&
			strings.Contains(r.Header.Get("Accept"), "text/html") {
			http.Redirect(w, r, Prefix, http.StatusFound)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// serveStatic serves the app's files; any other path under the prefix is
// the app itself, which routes on the client.
func (d *Dashboard) serveStatic(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s", r.Method, r.URL.Path))
		return
	}
	name := strings.TrimPrefix(path.Clean(r.URL.Path), "/dashboard")
	name = strings.TrimPrefix(name, "/")
	if name != "" && name != "index.html" {
		if f, err := d.static.Open(name); err == nil {
			st, err := f.Stat()
			f.Close()
			if err == nil && !st.IsDir() {
				if strings.HasPrefix(name, "assets/") { // content-hashed names
					w.Header().Set("Cache-Control", "public, max-age=31536000, immutable")
				}
				http.ServeFileFS(w, r, d.static, name)
				return
			}
		}
	}
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write(d.index)
}

// writeJSON writes v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// apiError is the dashboard's error body: the E2B API's shape, plus gone
// for a sandbox that existed and ended.
type apiError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	Gone    bool   `json:"gone,omitempty"`
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

// readJSON decodes a small request body into v; an empty body leaves v.
func readJSON(r *http.Request, v any) error {
	b, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		return fmt.Errorf("read body: %w", err)
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return nil
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("the body is not the JSON expected: %w", err)
	}
	return nil
}

// callAPI serves one request of the E2B REST API in-process as key and
// returns its status and body.
func (d *Dashboard) callAPI(ctx context.Context, key, method, target string, body any) (int, []byte) {
	var rd io.Reader = http.NoBody
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, target, rd)
	if err != nil {
		b, _ := json.Marshal(apiError{Code: http.StatusBadRequest, Message: err.Error()})
		return http.StatusBadRequest, b
	}
	req.Header.Set(e2bwire.HeaderAPIKey, key)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	rec := httptest.NewRecorder()
	d.o.API.ServeHTTP(rec, req)
	return rec.Code, rec.Body.Bytes()
}

// relay writes an E2B API answer to the browser: errors as they are (the
// same {"code","message"} shape), successes as 204 unless keep.
func relay(w http.ResponseWriter, status int, body []byte, keep bool) {
	if status >= 300 || keep {
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(status)
		_, _ = w.Write(body)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// EnvdClients is an Options.Envd over the server's own API and sandbox
// proxy: one client per API key, made on first use and kept.
func EnvdClients(apiURL, sandboxURL string) func(apiKey string) *e2bclient.Client {
	var clients sync.Map // API key → *e2bclient.Client
	return func(key string) *e2bclient.Client {
		if c, ok := clients.Load(key); ok {
			return c.(*e2bclient.Client)
		}
		c, _ := clients.LoadOrStore(key, e2bclient.New(e2bclient.Config{APIURL: apiURL, SandboxURL: sandboxURL, APIKey: key}))
		return c.(*e2bclient.Client)
	}
}
