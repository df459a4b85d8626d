package envd

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/interp"
)

// interpHost wires the code interpreter (internal/interp) into envd: kernels run
// as root in the default user's home, as E2B's code interpreter runs them (its
// Jupyter server is root's, its contexts start in /home/user), with the sandbox
// env; /execute takes the same X-Access-Token as envd's own endpoints. Like
// every process envd starts as root, a kernel has neither envd's
// CAP_SYS_PTRACE nor its cgroup (usercgroup.Start).
type interpHost struct {
	srv     *interp.Server
	runOnce sync.Once
	runDir  string
	runErr  error
	prewarm sync.Once
}

func (s *Server) newInterp() *interpHost {
	h := &interpHost{}
	h.srv = interp.NewServer(interp.Config{
		Defaults: s.interpDefaults,
		Authorize: func(r *http.Request) bool {
			token := s.id.accessToken()
			return token == "" || tokenMatches(r.Header.Get("X-Access-Token"), token)
		},
		Log: s.log,
	})
	return h
}

// interpDefaults are the options every kernel starts with. Called per kernel
// start, so the env a pooled sandbox receives at /init is seen.
func (s *Server) interpDefaults(ctx context.Context) (interp.Options, error) {
	u, err := s.lookupUser("")
	if err != nil {
		return interp.Options{}, fmt.Errorf("default user: %w", err)
	}
	root, err := s.lookupUser("root")
	if err != nil {
		return interp.Options{}, fmt.Errorf("kernel user: %w", err)
	}
	h := s.interp
	// Kernel support files live in a fresh private directory: a name chosen
	// by envd at random, so nothing in the sandbox can plant it beforehand.
	h.runOnce.Do(func() {
		h.runDir, h.runErr = os.MkdirTemp("", "airlock-interp-")
		if h.runErr == nil {
			// Each kernel has its own 0700 subdirectory: the root may be
			// crossed, not listed.
			h.runErr = os.Chmod(h.runDir, 0o711)
		}
	})
	if h.runErr != nil {
		return interp.Options{}, fmt.Errorf("interpreter run dir: %w", h.runErr)
	}
	return interp.Options{
		Cwd: u.Home, UID: root.UID, GID: root.GID, Groups: root.Groups, Home: root.Home,
		Env:    s.processEnv(root, nil),
		RunDir: h.runDir,
	}, nil
}

// startKernels prewarms envdapi.Config.Kernels at boot, pooled sandboxes included: a
// claim then finds them running. Kernels take the sandbox env of their start;
// refreshKernels restarts them when a claim changes it.
func (s *Server) startKernels() {
	if len(s.cfg.Kernels) == 0 || len(s.cfg.InterpListen) == 0 {
		return
	}
	s.interp.prewarm.Do(func() { s.interp.srv.Prewarm(s.cfg.Kernels) })
}

// refreshKernels restarts the prewarmed kernels of a pooled sandbox whose
// claim brought env vars the kernels did not start with.
func (s *Server) refreshKernels() {
	if len(s.cfg.Kernels) == 0 || len(s.cfg.InterpListen) == 0 {
		return
	}
	s.interp.srv.Refresh(s.cfg.Kernels)
}

// interpHandler gates the interpreter like envd: nothing but /health before a
// pooled sandbox is claimed.
func (s *Server) interpHandler() http.Handler {
	next := s.interp.srv.Handler()
	return s.recoverHTTP(cors(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.id.ready() && r.URL.Path != "/health" {
			http.Error(w, "sandbox is not ready", http.StatusServiceUnavailable)
			return
		}
		next.ServeHTTP(w, r)
	})))
}

func (h *interpHost) close() {
	h.srv.Close()
	if h.runDir != "" {
		_ = os.RemoveAll(h.runDir)
	}
}
