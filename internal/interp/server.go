package interp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// DefaultKeepalive is how long a stream may stay silent before a keepalive line
// (docs/E2B-WIRE.md §4.1: every 5 s of silence).
const DefaultKeepalive = 5 * time.Second

// interruptGrace bounds how long the core waits for a kernel to honour an
// interrupt (client gone) before it gives up on the kernel and restarts it on the
// next use: a kernel that ignores SIGINT must not hold its context forever.
const interruptGrace = 10 * time.Second

// Config wires the core to its host (envd).
type Config struct {
	// Defaults returns the options a new kernel starts with: the default user's
	// identity, its home as Cwd, the sandbox env and a RunDir root. It is called
	// at every kernel start, so env given to a pooled sandbox at claim is seen.
	Defaults func(ctx context.Context) (Options, error)
	// Authorize checks a /execute request's X-Access-Token (envd's token rule);
	// nil accepts everything.
	Authorize func(r *http.Request) bool
	// Keepalive overrides DefaultKeepalive (tests use a short one).
	Keepalive time.Duration
	Log       *slog.Logger
}

// Server is the code-interpreter core: contexts, their kernels and the HTTP
// protocol of docs/E2B-WIRE.md §4.
type Server struct {
	cfg      Config
	contexts *contextSet
	mux      *http.ServeMux
}

// NewServer returns a core with no contexts yet.
func NewServer(cfg Config) *Server {
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	if cfg.Keepalive <= 0 {
		cfg.Keepalive = DefaultKeepalive
	}
	s := &Server{cfg: cfg, contexts: newContextSet(cfg)}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { writeJSON(w, http.StatusOK, "OK") })
	mux.HandleFunc("POST /execute", s.handleExecute)
	mux.HandleFunc("POST /contexts", s.handleCreateContext)
	mux.HandleFunc("GET /contexts", s.handleListContexts)
	mux.HandleFunc("DELETE /contexts/{id}", s.handleDeleteContext)
	mux.HandleFunc("POST /contexts/{id}/restart", s.handleRestartContext)
	s.mux = mux
	return s
}

// Handler serves docs/E2B-WIRE.md §4.
func (s *Server) Handler() http.Handler { return s.mux }

// Prewarm starts the default context of each language in the background, so the
// first /execute finds a running kernel (it waits for a start still under way
// rather than starting another). Unknown languages are logged and skipped.
func (s *Server) Prewarm(languages []string) {
	for _, l := range languages {
		lang := NormalizeLanguage(l)
		if _, ok := Lookup(lang); !ok {
			s.cfg.Log.Warn("interp: prewarm of an unsupported language skipped", "language", l)
			continue
		}
		c := s.contexts.defaultFor(lang)
		go func() {
			if err := c.ensureStarted(context.Background()); err != nil {
				s.cfg.Log.Warn("interp: prewarm failed", "language", lang, "err", err)
			}
		}()
	}
}

// Refresh restarts the default contexts of languages in the background, after
// any start in progress: Prewarm's kernels got the environment of their start,
// and a pooled sandbox learns its client's env vars only when claimed.
func (s *Server) Refresh(languages []string) {
	for _, l := range languages {
		lang := NormalizeLanguage(l)
		if _, ok := Lookup(lang); !ok {
			continue
		}
		c := s.contexts.defaultFor(lang)
		go func() {
			if err := c.refresh(context.Background()); err != nil {
				s.cfg.Log.Warn("interp: restarting a prewarmed kernel failed", "language", lang, "err", err)
			}
		}()
	}
}

// Close stops every kernel.
func (s *Server) Close() { s.contexts.closeAll() }

// NormalizeLanguage applies the upstream rules: lower case, js → javascript,
// ts → typescript, empty → python.
func NormalizeLanguage(l string) string {
	l = strings.ToLower(strings.TrimSpace(l))
	switch l {
	case "":
		return "python"
	case "js":
		return "javascript"
	case "ts":
		return "typescript"
	}
	return l
}

func plain(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func unsupported(lang string) string {
	return fmt.Sprintf("Language %q is not supported; supported languages: %s", lang, strings.Join(Languages(), ", "))
}

func (s *Server) handleExecute(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Authorize != nil && !s.cfg.Authorize(r) {
		plain(w, http.StatusUnauthorized, "unauthorized access, please provide a valid access token")
		return
	}
	var req e2bwire.ExecuteRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 64<<20)).Decode(&req); err != nil {
		plain(w, http.StatusBadRequest, fmt.Sprintf("Invalid request body: %v", err))
		return
	}
	// JS omits unset keys, Python sends nulls; an empty string counts as unset too.
	hasCtx := req.ContextID != nil && *req.ContextID != ""
	hasLang := req.Language != nil && *req.Language != ""
	if hasCtx && hasLang {
		plain(w, http.StatusBadRequest, "Only one of context_id or language can be provided")
		return
	}
	for k, v := range req.EnvVars {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(v, "\x00") {
			plain(w, http.StatusBadRequest, fmt.Sprintf("Invalid environment variable %q", k))
			return
		}
	}
	var c *kctx
	if hasCtx {
		var ok bool
		if c, ok = s.contexts.get(*req.ContextID); !ok {
			plain(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", *req.ContextID))
			return
		}
	} else {
		lang := "python"
		if hasLang {
			lang = NormalizeLanguage(*req.Language)
		}
		if _, ok := Lookup(lang); !ok {
			// As for a language the sandbox lacks: a stream error the SDK shows
			// (execution.error), where a 400's body would be dropped.
			st := newStream(w, s.cfg.Keepalive)
			st.send(errorLine(&ExecError{Name: "UnknownLanguage", Value: unsupported(lang)}))
			st.send(map[string]any{"type": "end_of_execution"})
			st.close()
			return
		}
		c = s.contexts.defaultFor(lang)
	}

	ctx := r.Context()
	// One execution at a time per context: wait for the slot, or for the client
	// to give up.
	if err := c.acquire(ctx); err != nil {
		return
	}
	defer c.release()
	k, startErr := c.kernelLocked(ctx)
	if startErr != nil && !errors.Is(startErr, ErrUnavailable) {
		if ctx.Err() != nil {
			return
		}
		plain(w, http.StatusInternalServerError, fmt.Sprintf("Failed to start the %s kernel: %v", c.language, startErr))
		return
	}

	st := newStream(w, s.cfg.Keepalive)
	defer st.close()
	if startErr != nil {
		// A language the server knows but this sandbox lacks (no node, say): an
		// error line rather than a status code, because the SDKs show a stream's
		// error to the user but drop the body of a non-404 status.
		st.send(errorLine(&ExecError{Name: "LanguageUnavailable", Value: startErr.Error()}))
		st.send(map[string]any{"type": "end_of_execution"})
		return
	}

	type outcome struct {
		count int
		err   error
	}
	done := make(chan outcome, 1)
	go func() {
		n, err := k.Execute(ctx, req.Code, req.EnvVars, func(e Event) { st.send(eventLine(e)) })
		done <- outcome{n, err}
	}()
	var out outcome
	select {
	case out = <-done:
	case <-ctx.Done():
		// The client went away: the kernel interrupts the code and returns.
		// One that does not return in time is dropped; the context restarts
		// on its next use.
		select {
		case out = <-done:
		case <-time.After(interruptGrace):
			s.cfg.Log.Warn("interp: kernel ignored an interrupt; restarting it", "context", c.id, "language", c.language)
			c.dropKernelLocked(k)
			return
		}
	}
	switch {
	case out.err == nil:
		st.send(map[string]any{"type": "number_of_executions", "execution_count": out.count})
	case ctx.Err() != nil:
		// Interrupted because the client left: no one to tell.
		return
	case errors.Is(out.err, ErrKernelDied):
		c.dropKernelLocked(k)
		st.send(errorLine(&ExecError{Name: "KernelDied", Value: fmt.Sprintf("The %s kernel died during the execution and will be restarted on the next one: %v", c.language, out.err)}))
	default:
		// Anything else leaves the kernel in an unknown state: restart it.
		c.dropKernelLocked(k)
		st.send(errorLine(&ExecError{Name: "UnexpectedEndOfExecution", Value: out.err.Error()}))
	}
	st.send(map[string]any{"type": "end_of_execution"})
}

// eventLine maps a kernel Event to its NDJSON object (docs/E2B-WIRE.md §4.1).
func eventLine(e Event) map[string]any {
	switch e.Type {
	case "stdout", "stderr":
		return map[string]any{"type": e.Type, "text": e.Text, "timestamp": time.Now().UTC().Format(time.RFC3339Nano)}
	case "error":
		if e.Error == nil {
			return errorLine(&ExecError{Name: "Error"})
		}
		return errorLine(e.Error)
	case "result":
		return resultLine(e.Data, e.IsMainResult)
	}
	return map[string]any{"type": e.Type}
}

func errorLine(e *ExecError) map[string]any {
	return map[string]any{"type": "error", "name": e.Name, "value": e.Value, "traceback": e.Traceback}
}

// mimeKeys maps the MIME types of a bundle to E2B's result keys.
var mimeKeys = map[string]string{
	"text/plain":             "text",
	"text/html":              "html",
	"text/markdown":          "markdown",
	"image/svg+xml":          "svg",
	"image/png":              "png",
	"image/jpeg":             "jpeg",
	"application/pdf":        "pdf",
	"text/latex":             "latex",
	"application/json":       "json",
	"application/javascript": "javascript",
	"e2b/data":               "data",
	"e2b/chart":              "chart",
}

// resultLine turns a MIME bundle into a result line. text/plain loses one level
// of surrounding quotes, as upstream does (a Python string's repr, '…').
// Unknown MIME types go to extra, which is always present as upstream sends it.
func resultLine(bundle map[string]any, main bool) map[string]any {
	out := map[string]any{"type": "result", "is_main_result": main}
	extra := map[string]any{}
	for mime, v := range bundle {
		key, ok := mimeKeys[mime]
		if !ok {
			extra[mime] = v
			continue
		}
		if s, ok := v.(string); ok {
			switch key {
			case "text":
				v = stripQuotes(s)
			case "png", "jpeg", "pdf":
				// ipykernel's base64 ends in a newline, the other kernels'
				// does not: one form whichever kernel made it.
				v = strings.TrimRight(s, "\n")
			}
		}
		out[key] = v
	}
	out["extra"] = extra
	return out
}

func stripQuotes(s string) string {
	if len(s) >= 2 && (s[0] == '\'' && s[len(s)-1] == '\'' || s[0] == '"' && s[len(s)-1] == '"') {
		return s[1 : len(s)-1]
	}
	return s
}

type contextInfo struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) handleCreateContext(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Language *string `json:"language"`
		Cwd      *string `json:"cwd"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil && !errors.Is(err, io.EOF) {
		plain(w, http.StatusBadRequest, fmt.Sprintf("Invalid request body: %v", err))
		return
	}
	lang := "python"
	if req.Language != nil {
		lang = NormalizeLanguage(*req.Language)
	}
	if _, ok := Lookup(lang); !ok {
		plain(w, http.StatusBadRequest, unsupported(lang))
		return
	}
	cwd := ""
	if req.Cwd != nil && *req.Cwd != "" {
		var err error
		if cwd, err = s.usableCwd(r.Context(), *req.Cwd); err != nil {
			plain(w, http.StatusBadRequest, fmt.Sprintf("Cannot create a %s context in %q: %v", lang, *req.Cwd, err))
			return
		}
	}
	c := s.contexts.create(lang, cwd)
	// Start now, as upstream creates the kernel with the context: a broken
	// language fails here rather than at the first execution.
	if err := c.ensureStarted(r.Context()); err != nil {
		s.contexts.remove(c.id)
		status := http.StatusInternalServerError
		if errors.Is(err, ErrUnavailable) {
			status = http.StatusBadRequest
		}
		plain(w, status, fmt.Sprintf("Failed to create a %s context: %v", lang, err))
		return
	}
	writeJSON(w, http.StatusOK, c.info())
}

// usableCwd checks that a context's cwd is a directory, as the kernel's chdir
// would (kernels run as root, so any directory is enterable), resolving a
// relative one from the default cwd, where a kernel would start.
func (s *Server) usableCwd(ctx context.Context, cwd string) (string, error) {
	if !filepath.IsAbs(cwd) {
		def, err := s.cfg.Defaults(ctx)
		if err != nil {
			return "", fmt.Errorf("kernel options: %w", err)
		}
		cwd = filepath.Join(def.Cwd, cwd)
	}
	fi, err := os.Stat(cwd)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", cwd)
	}
	return filepath.Clean(cwd), nil
}

func (s *Server) handleListContexts(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.contexts.list())
}

func (s *Server) handleDeleteContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c, ok := s.contexts.remove(id)
	if !ok {
		plain(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", id))
		return
	}
	c.shutdown()
	writeJSON(w, http.StatusOK, nil)
}

func (s *Server) handleRestartContext(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	c, ok := s.contexts.get(id)
	if !ok {
		plain(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", id))
		return
	}
	if err := c.restart(r.Context()); err != nil {
		plain(w, http.StatusInternalServerError, fmt.Sprintf("Failed to restart context %s: %v", id, err))
		return
	}
	writeJSON(w, http.StatusOK, nil)
}
