package mcpgateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The daemon's inherited descriptors (exec.Cmd.ExtraFiles start at 3).
const (
	readyFD = 3 // write end of the readiness pipe: one JSON report, then closed
	lockFD  = 4 // the lock file, flocked by the command that started it
)

// readyReport is the daemon's one message to the command that started it.
type readyReport struct {
	Error   string         `json:"error,omitempty"`
	PID     int            `json:"pid,omitempty"`
	Addr    string         `json:"addr,omitempty"`
	Servers []ServerHealth `json:"servers,omitempty"`
}

// lockInfo is what the lock file holds while a gateway runs, for the
// message that refuses a second one (and for tests, which find the daemon
// and its port there).
type lockInfo struct {
	PID  int    `json:"pid"`
	Addr string `json:"addr"`
}

// runDaemon is the gateway itself, started detached (its own session, its
// output on the log) by the foreground command. It listens, readies and
// starts every server, reports ready (or the first failure, and exits) over
// the pipe, then serves until SIGTERM or SIGINT.
func runDaemon(o *Options, deadline time.Time) int {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ready := os.NewFile(readyFD, "ready")
	lock := os.NewFile(lockFD, "lock")
	if ready == nil || lock == nil {
		fmt.Fprintln(os.Stderr, "mcp-gateway daemon: started without its descriptors; run `mcp-gateway --config ...` instead")
		return 2
	}
	// The lock is held while this descriptor is open: keep it to the end.
	defer lock.Close()
	var once sync.Once
	report := func(r readyReport) {
		once.Do(func() {
			b, _ := json.Marshal(r)
			_, _ = ready.Write(append(b, '\n'))
			_ = ready.Close()
		})
	}
	fail := func(err error) int {
		log.Error("gateway failed to start", "err", err)
		report(readyReport{Error: err.Error()})
		return 1
	}
	_ = os.Chdir("/")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	raw, err := os.ReadFile(o.configFile())
	if err != nil {
		return fail(fmt.Errorf("reading the config: %w", err))
	}
	specs, err := parseConfig(raw, o)
	if err != nil {
		return fail(err)
	}
	token, err := os.ReadFile(o.tokenFile())
	if err != nil || len(strings.TrimSpace(string(token))) == 0 {
		return fail(fmt.Errorf("reading the token %s: %w", o.tokenFile(), errors.Join(err, errors.New("empty"))))
	}
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fail(fmt.Errorf("listening on %s: %w", o.Listen, err))
	}
	addr := ln.Addr().String()
	info, _ := json.Marshal(lockInfo{PID: os.Getpid(), Addr: addr})
	_ = lock.Truncate(0)
	_, _ = lock.WriteAt(append(info, '\n'), 0)

	names := make([]string, len(specs))
	for i, s := range specs {
		names[i] = s.Key
	}
	log.Info("gateway starting", "pid", os.Getpid(), "addr", addr, "servers", strings.Join(names, ","))
	g := NewGateway(specs, o, log)
	srv := &http.Server{Handler: g.Handler(strings.TrimSpace(string(token))), ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	shutdown := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
		g.Close()
	}

	sctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	// On failure the report goes first: the user waits for it, not for
	// the shutdown (the command still waits for this process to end).
	if err := prepareAll(sctx, specs, o, g.baseEnv(), log); err != nil {
		code := fail(boundErr(sctx, err, o))
		shutdown()
		return code
	}
	if err := g.Start(sctx); err != nil {
		code := fail(boundErr(sctx, err, o))
		shutdown()
		return code
	}
	h := g.Health()
	report(readyReport{PID: os.Getpid(), Addr: addr, Servers: h.Servers})
	log.Info("gateway ready", "addr", addr, "servers", len(h.Servers))

	select {
	case <-ctx.Done():
		log.Info("gateway stopping", "signal", "received")
	case err := <-served:
		log.Error("HTTP server ended", "err", err)
	}
	shutdown()
	log.Info("gateway stopped")
	return 0
}

// prepareAll readies every custom server at once (clone, installCmd); the
// first failure is returned.
func prepareAll(ctx context.Context, specs []*serverSpec, o *Options, env []string, log *slog.Logger) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var (
		mu    sync.Mutex
		first error
		wg    sync.WaitGroup
	)
	for _, s := range specs {
		if !s.custom() {
			continue
		}
		wg.Go(func() {
			if err := prepare(ctx, s, o, env, log); err != nil {
				mu.Lock()
				if first == nil {
					first = err
					cancel(errors.New("another MCP server failed to prepare"))
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return first
}

// boundErr says that the start's time ran out, when it did.
func boundErr(ctx context.Context, err error, o *Options) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("the gateway did not start within %s: %w", o.Timeout, err)
	}
	return err
}
