// Go's net package opens TCP sockets as MPTCP by default, and CRIU cannot
// checkpoint an MPTCP socket ("Unsupported proto 262"): envd's listeners and
// the connections they accept must be plain TCP for a sandbox to pause with
// its memory.
//go:debug multipathtcp=0

// Command envd is the in-sandbox agent. The host starts it as the sandbox's first
// process and writes one JSON envdapi.Config object to its stdin (or, in a
// Kubernetes Pod, names a file holding it: envd --config-file PATH). As pid 1 it
// forks before Go starts (pid1.c): pid 1 stays a reaper written in C, and the
// child is the Go server.
//
// It is a multi-call binary: the host also binds it over /usr/bin/sudo, and
// invoked as `sudo` it is an unprivileged client that has the agent run the
// command (internal/sudo), so sudo works without setuid.
//
// Invoked as `mcp-gateway` it is the in-sandbox MCP gateway E2B's SDK
// starts for Sandbox.create({mcp: ...}) (internal/mcpgateway).
//
// `envd step` is another mode: the first process of a template build's
// sandbox, which runs one build step (internal/buildstep).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/buildstep"
	"github.com/airlock-sandbox/airlock/internal/envd"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/mcpgateway"
	"github.com/airlock-sandbox/airlock/internal/sudo"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
	"github.com/airlock-sandbox/airlock/internal/usercgroup"
)

// init keeps the main goroutine on the main thread, so that no other
// goroutine ever runs there. internal/usercgroup readies each user process's
// fork on a thread it locks for good and lets end; Go never ends the main
// thread (a goroutine exiting locked to it parks it instead), and the main
// thread is the thread group leader, whose v1 memory cgroup the whole
// process is charged to: it must never be moved into a user's leaf, keep a
// user tree's seccomp filter, or lose envd's CAP_SYS_PTRACE.
func init() { runtime.LockOSThread() }

func main() {
	// Dispatch on the name before anything else: the shim must not touch
	// stdin (the agent reads its config there) or log like the agent.
	if name := filepath.Base(os.Args[0]); name == "sudo" || name == "sudoedit" {
		os.Exit(sudo.RunShim(name, os.Args[1:]))
	} else if name == "mcp-gateway" {
		// The host binds envd at /usr/local/bin/mcp-gateway: E2B's SDK runs
		// it to start the in-sandbox MCP gateway (internal/mcpgateway).
		os.Exit(mcpgateway.Main(os.Args[1:]))
	}
	// `envd step`: the first process of a template build's sandbox (one RUN
	// step), not the agent.
	if len(os.Args) > 1 && os.Args[1] == "step" {
		os.Exit(buildstep.Run(os.Stdin, slog.New(slog.NewTextHandler(os.Stderr, nil))))
	}
	os.Exit(run())
}

func run() int {
	level := slog.LevelInfo
	if strings.EqualFold(os.Getenv("ENVD_LOG_LEVEL"), "debug") {
		level = slog.LevelDebug
	}
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	// Packages without a logger of their own (internal/sysinfo) log here too.
	slog.SetDefault(logger)

	if len(os.Args) > 1 && (os.Args[1] == "-version" || os.Args[1] == "--version") {
		fmt.Println(envdapi.Version)
		return 0
	}

	// Decode exactly one JSON value rather than reading to EOF: startup then does
	// not depend on when the host closes the pipe. A Pod has no host to write
	// to its stdin: the Kubernetes backend mounts the config as a file and
	// names it with --config-file.
	var raw json.RawMessage
	from, in := "stdin", io.Reader(os.Stdin)
	if len(os.Args) == 3 && os.Args[1] == "--config-file" {
		f, err := os.Open(os.Args[2])
		if err != nil {
			logger.Error("opening the config file", "err", err)
			return 2
		}
		from, in = os.Args[2], f
		defer f.Close()
	}
	if err := json.NewDecoder(io.LimitReader(in, 4<<20)).Decode(&raw); err != nil {
		logger.Error("reading config from "+from, "err", err)
		return 2
	}
	if err := redirectStdio(raw); err != nil {
		logger.Error("redirecting stdio", "err", err)
		return 2
	}

	// Inside gVisor the sandbox's cgroups are envd's to build (the linux
	// runtime builds them on the host), before anything else runs.
	envd.StartTaskLimit(logger)

	var cfg envdapi.Config
	if err := json.Unmarshal(raw, &cfg); err != nil {
		logger.Error("parsing config", "err", err)
		return 2
	}
	srv, err := envd.NewServer(cfg, logger)
	if err != nil {
		logger.Error("invalid config", "err", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// The sudo socket only where the shim is installed (or a test asks for it):
	// envd run on a host must not create /run/envd there.
	sudoDone := make(chan struct{})
	if sock := sudo.SocketPath(); sock != "" {
		l, err := sudo.Listen(sock)
		if err != nil {
			// The sandbox is still useful without sudo; say why it fails.
			logger.Error("sudo socket; sudo will not work in this sandbox", "err", err)
			close(sudoDone)
		} else {
			go func() {
				defer close(sudoDone)
				sudoSrv := &sudo.Server{Users: &unixuser.EtcUserDB{Root: "/"}, Log: logger}
				if err := sudoSrv.Serve(ctx, l); err != nil {
					logger.Error("sudo socket; sudo stops working in this sandbox", "err", err)
				}
			}()
		}
	} else {
		close(sudoDone)
	}
	defer func() { stop(); <-sudoDone }()
	// Places the first spare thread in a user leaf now, off the path of the
	// first command (a warm-pool sandbox's first command comes right after
	// its claim).
	go usercgroup.Enabled()
	// Registered before Serve: the host signals only an envd that answered.
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, envdapi.QuiesceSignal, envdapi.WakeSignal)
	go quiesceOnSignal(ctx, srv, sigs, logger)
	if err := srv.Serve(ctx); err != nil {
		logger.Error("serve", "err", err)
		return 1
	}
	return 0
}

// quiesceOnSignal quiesces and wakes srv as the host asks around a checkpoint
// (envdapi.QuiesceSignal and WakeSignal, passed on by pid 1), one after
// the other in the order they come.
func quiesceOnSignal(ctx context.Context, srv *envd.Server, sigs <-chan os.Signal, logger *slog.Logger) {
	select {
	case <-srv.Ready():
	case <-ctx.Done():
		return
	}
	for {
		select {
		case <-ctx.Done():
			return
		case sig := <-sigs:
			var err error
			if sig == envdapi.QuiesceSignal {
				err = srv.Quiesce()
			} else {
				err = srv.Wake()
			}
			if err != nil {
				logger.Error("envd: "+sig.String(), "err", err)
			}
		}
	}
}

// redirectStdio points stdin at /dev/null and, when the config names a log
// file (envdapi.Config.LogPath), stdout and stderr at it: nothing envd (or
// pid 1, which drops its own) holds open then refers to a file outside the
// sandbox, so a checkpoint can save it. Children inherit the result.
func redirectStdio(raw json.RawMessage) error {
	var cfg struct {
		LogPath string `json:"logPath"`
	}
	_ = json.Unmarshal(raw, &cfg)
	null, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer null.Close()
	if err := unix.Dup3(int(null.Fd()), 0, 0); err != nil {
		return fmt.Errorf("stdin: %w", err)
	}
	if cfg.LogPath == "" {
		return nil
	}
	f, err := os.OpenFile(cfg.LogPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	for _, fd := range []int{1, 2} {
		if err := unix.Dup3(int(f.Fd()), fd, 0); err != nil {
			return fmt.Errorf("fd %d: %w", fd, err)
		}
	}
	return nil
}
