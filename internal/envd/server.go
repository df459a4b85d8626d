// Package envd is the in-sandbox agent: it serves the E2B envd protocol (docs/E2B-WIRE.md §3)
// — Connect RPC process and filesystem services plus /files, /health, /envs and
// /metrics — over the listeners the host asks for.
//
// The host starts cmd/envd as a sandbox's pid 1 and writes a envdapi.Config to its stdin.
// As pid 1, envd forks before Go starts and pid 1 only reaps orphans, in C
// (cmd/envd/pid1.c); the child runs a Server. Design points worth knowing
// before changing anything here:
//
//   - Processes outlive the streams that started them. A Start stream is one
//     subscriber of the process's output; Connect adds more. Output is never
//     buffered without bound: a subscriber that stops reading is throttled for
//     a short while, then loses output (output.go).
//   - Connect-Timeout-Ms on Start is the process's lifetime, not the stream's.
//   - Users come from the sandbox's own /etc/passwd and /etc/group (internal/unixuser),
//     never from the host's, and files envd creates are chowned to them.
//   - A warm-pool envd (envdapi.Config.AwaitInit) serves nothing but /health until the
//     host's POST /init over the unix socket gives it its token (init.go).
package envd

import (
	"context"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/sandboxlog"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
)

// maxRPCMessage bounds a single Connect request message (SendInput payloads are
// the only large ones); anything bigger is refused rather than buffered.
const maxRPCMessage = 32 << 20

// Server is one envd instance: the state of the processes and watchers it started
// and the HTTP handler that exposes them.
type Server struct {
	cfg   envdapi.Config
	log   *slog.Logger
	users unixuser.UserDB

	id identity

	procs    *processManager
	watchers *watcherRegistry
	metrics  cpuSampler

	handler http.Handler
	ready   chan struct{}
	interp  *interpHost
	// socks are the servers on the unix sockets, which Quiesce closes and
	// Wake opens again (quiesce.go).
	socks socketServers

	defaultUserOnce sync.Once

	// sblog is the sandbox log (sblog.go); nil when envd logs nowhere.
	sblog *sandboxlog.Writer
}

// Option adjusts a Server at construction.
type Option func(*Server)

// WithUserDB replaces the sandbox's /etc/passwd and /etc/group as the source of
// users; tests use it to describe accounts that do not exist on the host.
func WithUserDB(db unixuser.UserDB) Option {
	return func(s *Server) { s.users = db }
}

// NewServer builds an envd server. It does no I/O beyond what the options need, so
// a sandbox reaches its listening state as early as possible.
func NewServer(cfg envdapi.Config, logger *slog.Logger, opts ...Option) (*Server, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		cfg:      cfg,
		log:      logger,
		procs:    newProcessManager(),
		watchers: newWatcherRegistry(),
		ready:    make(chan struct{}),
	}
	for _, o := range opts {
		o(s)
	}
	if s.sblog = newSandboxLog(cfg.LogPath); s.sblog != nil {
		s.log = slog.New(&teeHandler{Handler: s.log.Handler(), w: s.sblog})
	}
	if s.users == nil {
		s.users = &unixuser.EtcUserDB{Root: "/"}
	}
	env, err := buildSandboxEnv(cfg, cfg.EnvVars)
	if err != nil {
		return nil, err
	}
	s.id.token, s.id.env, s.id.initialized = cfg.AccessToken, env, !cfg.AwaitInit
	for _, l := range cfg.Listen {
		if _, _, err := parseListen(l); err != nil {
			return nil, err
		}
	}
	for _, l := range cfg.InterpListen {
		if _, _, err := parseListen(l); err != nil {
			return nil, err
		}
	}
	s.handler = s.buildHandler()
	s.interp = s.newInterp()
	return s, nil
}

// Handler serves the whole envd protocol; tests mount it on httptest servers.
func (s *Server) Handler() http.Handler { return s.handler }

// InterpHandler serves the code interpreter (docs/E2B-WIRE.md §4); tests mount it on
// httptest servers.
func (s *Server) InterpHandler() http.Handler { return s.interpHandler() }

// Ready is closed once Serve has bound every listener.
func (s *Server) Ready() <-chan struct{} { return s.ready }

func parseListen(addr string) (network, address string, err error) {
	network, address, ok := strings.Cut(addr, ":")
	if !ok || address == "" || (network != "unix" && network != "tcp") {
		return "", "", fmt.Errorf("invalid listen address %q (want unix:/path or tcp:host:port)", addr)
	}
	return network, address, nil
}

func listen(addr string) (net.Listener, error) {
	network, address, err := parseListen(addr)
	if err != nil {
		return nil, err
	}
	if network == "unix" {
		// A socket left by a previous envd (a restarted sandbox) would make bind fail.
		if fi, err := os.Lstat(address); err == nil && fi.Mode()&os.ModeSocket != 0 {
			_ = os.Remove(address)
		}
		if err := os.MkdirAll(filepath.Dir(address), 0o755); err != nil {
			return nil, fmt.Errorf("creating socket dir: %w", err)
		}
		// Only root (envd, and the host through the mount) may talk to envd directly:
		// sandbox users reach it over TCP like on E2B, with the access token. The
		// umask makes the socket private from the moment it exists; nothing else
		// runs yet at startup, so changing it process-wide is safe.
		old := syscall.Umask(0o177)
		l, err := net.Listen("unix", address)
		syscall.Umask(old)
		if err != nil {
			return nil, err
		}
		if err := os.Chmod(address, 0o600); err != nil {
			l.Close()
			return nil, fmt.Errorf("chmod socket: %w", err)
		}
		return l, nil
	}
	return net.Listen("tcp", address)
}

// Serve listens on every envdapi.Config.Listen address and serves until ctx ends. Running
// processes are killed on the way out: a stopping envd means a stopping sandbox.
func (s *Server) Serve(ctx context.Context) error {
	if len(s.cfg.Listen) == 0 {
		return errors.New("no listen addresses configured")
	}
	var listeners, interpListeners []net.Listener
	// The unix sockets are served apart (socketServers), so that Quiesce
	// can close them and every connection made to them, and nothing else.
	var unixListeners, unixInterpListeners []net.Listener
	closeAll := func() {
		for _, l := range append(append(append(listeners, interpListeners...), unixListeners...), unixInterpListeners...) {
			l.Close()
		}
	}
	for _, addr := range s.cfg.Listen {
		l, err := listen(addr)
		if err != nil {
			closeAll()
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		if isUnix(addr) {
			unixListeners = append(unixListeners, l)
		} else {
			listeners = append(listeners, l)
		}
	}
	for _, addr := range s.cfg.InterpListen {
		l, err := listen(addr)
		if err != nil {
			closeAll()
			return fmt.Errorf("listen %s: %w", addr, err)
		}
		if isUnix(addr) {
			unixInterpListeners = append(unixInterpListeners, l)
		} else {
			interpListeners = append(interpListeners, l)
		}
	}
	srv, isrv := s.httpServer(), s.interpServer()
	errc := make(chan error, len(listeners)+len(interpListeners)+len(unixListeners)+len(unixInterpListeners))
	for _, l := range listeners {
		go func(l net.Listener) { errc <- srv.Serve(l) }(l)
	}
	for _, l := range interpListeners {
		go func(l net.Listener) { errc <- isrv.Serve(l) }(l)
	}
	s.socks.start(s, unixListeners, unixInterpListeners, errc)
	close(s.ready)
	s.startKernels()
	s.log.Info("envd ready", "version", envdapi.Version, "listen", s.cfg.Listen, "pid", os.Getpid())

	var err error
	select {
	case <-ctx.Done():
	case err = <-errc:
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdownCtx)
	s.socks.stop(shutdownCtx)
	srv.Close()
	isrv.Close()
	s.interp.close()
	s.procs.killAll()
	s.watchers.closeAll()
	for _, addr := range append(append([]string(nil), s.cfg.Listen...), s.cfg.InterpListen...) {
		if network, address, _ := parseListen(addr); network == "unix" {
			_ = os.Remove(address)
		}
	}
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// httpServer is an HTTP server of envd's protocol, for one set of listeners.
func (s *Server) httpServer() *http.Server {
	return &http.Server{
		Handler:           s.handler,
		Protocols:         serverProtocols(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
		ConnContext:       connContext,
	}
}

// interpServer is an HTTP server of the code interpreter. The interpreter
// has servers of its own: its handler differs, and its streams must not be
// cut by envd's limits.
func (s *Server) interpServer() *http.Server {
	return &http.Server{
		Handler:           s.interpHandler(),
		Protocols:         serverProtocols(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       5 * time.Minute,
		MaxHeaderBytes:    1 << 20,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
}

// serverProtocols are HTTP/1.1 and HTTP/2 without TLS (h2c, prior
// knowledge), which net/http does itself: that spares the binary the x/net
// copy of the HTTP/2 stack.
func serverProtocols() *http.Protocols {
	p := new(http.Protocols)
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	return p
}

// compressMinBytes is the smallest RPC message envd compresses for a client
// that accepts compression.
const compressMinBytes = 1024

func (s *Server) buildHandler() http.Handler {
	opts := []connect.HandlerOption{
		connect.WithInterceptors(authInterceptor{id: &s.id}, legacyClientInterceptor{}),
		connect.WithReadMaxBytes(maxRPCMessage),
		// A process's start and end events are tens of bytes: gzip makes
		// them no smaller, and setting up its encoder for each (about 1 MiB
		// of state to clear) cost a command round trip more CPU than
		// starting the command. Output chunks worth compressing still are.
		connect.WithCompressMinBytes(compressMinBytes),
		connect.WithRecover(func(ctx context.Context, spec connect.Spec, _ http.Header, v any) error {
			s.log.Error("rpc handler panicked", "procedure", spec.Procedure, "panic", v, "stack", string(debug.Stack()))
			return connect.NewError(connect.CodeInternal, errors.New("internal error"))
		}),
	}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(&processService{srv: s}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{srv: s}, opts...))
	mux.HandleFunc("/health", s.handleHealth)
	mux.HandleFunc("/init", s.handleInit)
	mux.HandleFunc("/files", s.handleFiles)
	mux.Handle("/envs", s.requireToken(http.HandlerFunc(s.handleEnvs)))
	mux.Handle("/metrics", s.requireToken(http.HandlerFunc(s.handleMetrics)))
	mux.Handle("/", s.requireToken(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSONError(w, http.StatusNotFound, "not found")
	})))
	return s.recoverHTTP(cors(s.awaitInit(mux)))
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) handleEnvs(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet {
		writeJSONError(w, http.StatusMethodNotAllowed, "method not allowed")
		return
	}
	env := s.id.sandboxEnv()
	out := make(map[string]string, len(env))
	for _, kv := range env {
		out[kv[0]] = kv[1]
	}
	writeJSON(w, http.StatusOK, out)
}

// recoverHTTP keeps a bug in a plain-HTTP handler from taking envd (and with it
// the sandbox) down.
func (s *Server) recoverHTTP(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					panic(v)
				}
				s.log.Error("http handler panicked", "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
				writeJSONError(w, http.StatusInternalServerError, "internal error")
			}
		}()
		next.ServeHTTP(w, r)
	})
}

// cors lets browser SDKs talk to envd directly (docs/E2B-WIRE.md §3.7).
func cors(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Access-Control-Allow-Origin", "*")
		h.Set("Access-Control-Expose-Headers", strings.Join([]string{
			"Connect-Protocol-Version", "Connect-Timeout-Ms", "Connect-Content-Encoding",
			"Connect-Accept-Encoding", "Grpc-Status", "Grpc-Message", "Grpc-Status-Details-Bin",
			"Content-Encoding", "Content-Disposition", "Content-Length", "X-Envd-Version",
		}, ", "))
		if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
			h.Set("Access-Control-Allow-Methods", "HEAD, GET, POST, PUT, PATCH, DELETE")
			if req := r.Header.Get("Access-Control-Request-Headers"); req != "" {
				h.Set("Access-Control-Allow-Headers", req)
			} else {
				h.Set("Access-Control-Allow-Headers", "*")
			}
			h.Set("Access-Control-Max-Age", "7200")
			w.WriteHeader(http.StatusNoContent)
			return
		}
		next.ServeHTTP(w, r)
	})
}

const unauthorizedMessage = "unauthorized access, please provide a valid access token or method signing if supported"

func tokenMatches(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

func (s *Server) requireToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if token := s.id.accessToken(); token != "" && !tokenMatches(r.Header.Get("X-Access-Token"), token) {
			writeJSONError(w, http.StatusUnauthorized, unauthorizedMessage)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authInterceptor checks the access token on RPCs so that failures are Connect
// errors (code unauthenticated) rather than plain-HTTP 401 bodies.
type authInterceptor struct{ id *identity }

func (a authInterceptor) check(h http.Header) error {
	if token := a.id.accessToken(); token == "" || tokenMatches(h.Get("X-Access-Token"), token) {
		return nil
	}
	return connect.NewError(connect.CodeUnauthenticated, errors.New(unauthorizedMessage))
}

func (a authInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := a.check(req.Header()); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (a authInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (a authInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := a.check(conn.RequestHeader()); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// defaultUserName is the account used when a request names none.
func (s *Server) defaultUserName() string {
	if s.cfg.DefaultUser != "" {
		return s.cfg.DefaultUser
	}
	return "root"
}

// lookupUser resolves a user name, empty meaning the default user. A configured
// default user missing from the rootfs falls back to root so a custom image
// without the E2B "user" account still works.
func (s *Server) lookupUser(name string) (*unixuser.User, error) {
	if name != "" {
		return s.users.LookupUser(name)
	}
	u, err := s.users.LookupUser(s.defaultUserName())
	if err == nil || s.defaultUserName() == "root" {
		return u, err
	}
	s.defaultUserOnce.Do(func() {
		s.log.Warn("default user not found; using root", "user", s.defaultUserName(), "err", err)
	})
	return s.users.LookupUser("root")
}

// requestUser reads the user selected by an RPC's Basic authorization header.
func (s *Server) requestUser(h http.Header) (*unixuser.User, error) {
	name := ""
	if auth := h.Get("Authorization"); auth != "" {
		scheme, cred, _ := strings.Cut(auth, " ")
		if !strings.EqualFold(scheme, "Basic") {
			return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("unsupported authorization scheme; expected Basic"))
		}
		raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
		if err != nil {
			return nil, connect.NewError(connect.CodeUnauthenticated, errors.New("malformed basic authorization header"))
		}
		name, _, _ = strings.Cut(string(raw), ":")
	}
	u, err := s.lookupUser(name)
	if err != nil {
		return nil, connect.NewError(connect.CodeUnauthenticated, fmt.Errorf("error looking up user '%s': %w", name, err))
	}
	return u, nil
}

// resolvePath applies docs/E2B-WIRE.md §3.6: "~" is the home directory, relative paths are
// relative to it, and an empty path means the default workdir.
func (s *Server) resolvePath(p string, u *unixuser.User) string {
	switch {
	case p == "":
		if s.cfg.DefaultWorkdir != "" {
			return filepath.Clean(s.cfg.DefaultWorkdir)
		}
		return filepath.Clean(u.Home)
	case p == "~":
		return filepath.Clean(u.Home)
	case strings.HasPrefix(p, "~/"):
		return filepath.Join(u.Home, p[2:])
	case filepath.IsAbs(p):
		return filepath.Clean(p)
	default:
		return filepath.Join(u.Home, p)
	}
}

type httpError struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, httpError{Code: status, Message: msg})
}
