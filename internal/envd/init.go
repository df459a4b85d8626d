package envd

import (
	"context"
	"crypto/subtle"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"

	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
)

// identity is the part of the configuration a warm-pool sandbox only learns when
// it is claimed (POST /init); everything that reads it goes through the lock.
type identity struct {
	mu          sync.RWMutex
	initialized bool // false only while envdapi.Config.AwaitInit waits for /init
	token       string
	env         [][2]string // ordered sandbox-level env vars, E2B_* last
}

func (id *identity) accessToken() string {
	id.mu.RLock()
	defer id.mu.RUnlock()
	return id.token
}

func (id *identity) sandboxEnv() [][2]string {
	id.mu.RLock()
	defer id.mu.RUnlock()
	return id.env
}

func (id *identity) ready() bool {
	id.mu.RLock()
	defer id.mu.RUnlock()
	return id.initialized
}

// buildSandboxEnv orders the sandbox-level variables: the create request's, sorted
// for stable output, then the E2B_* ones, which win.
func buildSandboxEnv(cfg envdapi.Config, vars map[string]string) ([][2]string, error) {
	keys := make([]string, 0, len(vars))
	for k := range vars {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(vars[k], "\x00") {
			return nil, fmt.Errorf("invalid sandbox env var %q", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	env := make([][2]string, 0, len(keys)+3)
	for _, k := range keys {
		env = append(env, [2]string{k, vars[k]})
	}
	return append(env,
		[2]string{"E2B_SANDBOX", "true"},
		[2]string{"E2B_SANDBOX_ID", cfg.SandboxID},
		[2]string{"E2B_TEMPLATE_ID", cfg.TemplateID},
	), nil
}

type connKey struct{}

// connContext records whether a connection came in over a unix socket: only the
// host can reach envd's socket, while the TCP listener is open to every process
// in the sandbox, so /init must not be accepted there.
func connContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c.LocalAddr().Network() == "unix")
}

func viaUnixSocket(r *http.Request) bool {
	v, _ := r.Context().Value(connKey{}).(bool)
	return v
}

func (s *Server) handleInit(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	if !s.cfg.AwaitInit || !(viaUnixSocket(r) || s.initKeyPresented(r)) {
		writeJSONError(w, http.StatusForbidden, "init is not accepted here")
		return
	}
	var req envdapi.InitRequest
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("invalid init body: %v", err))
		return
	}
	env, err := buildSandboxEnv(s.cfg, req.EnvVars)
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, err.Error())
		return
	}
	id := &s.id
	id.mu.Lock()
	if id.initialized {
		id.mu.Unlock()
		// The identity is set once; nothing may change the token afterwards.
		writeJSONError(w, http.StatusConflict, "already initialized")
		return
	}
	envChanged := !slices.Equal(id.env, env)
	id.token, id.env, id.initialized = req.AccessToken, env, true
	id.mu.Unlock()
	s.log.Info("envd initialized", "sandbox", s.cfg.SandboxID)
	// Kernels prewarmed at boot keep running when the claim left the env as it
	// was (the common case: no envVars beyond the template's); otherwise they
	// restart so they see the client's env.
	if envChanged {
		s.refreshKernels()
	}
	w.Header().Set("X-Envd-Version", envdapi.Version)
	w.WriteHeader(http.StatusNoContent)
}

// initKeyPresented reports whether r carries the config's InitKey as a
// bearer token (never, without one).
func (s *Server) initKeyPresented(r *http.Request) bool {
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	return s.cfg.InitKey != "" && ok && subtle.ConstantTimeCompare([]byte(got), []byte(s.cfg.InitKey)) == 1
}

// awaitInit answers everything but /health and /init with 503 until the sandbox
// has its identity, so a pooled sandbox can never serve under the wrong token.
// The one exception is the process service over the unix socket: the host runs
// the template's start and ready commands in a pooled sandbox before any client
// claims it. The socket is the host's (mode 0600, owned by the sandbox's root),
// and before the claim nothing runs in the sandbox but those commands.
func (s *Server) awaitInit(next http.Handler) http.Handler {
	if !s.cfg.AwaitInit {
		return next
	}
	processPrefix := "/" + processconnect.ProcessName + "/"
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" || r.URL.Path == "/init" || s.id.ready() ||
			(strings.HasPrefix(r.URL.Path, processPrefix) && viaUnixSocket(r)) {
			next.ServeHTTP(w, r)
			return
		}
		writeJSONError(w, http.StatusServiceUnavailable, "sandbox is not ready")
	})
}
