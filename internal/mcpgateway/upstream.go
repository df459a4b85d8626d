package mcpgateway

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Restart backoff of a server that exited: first retry after restartMin,
// doubling to restartMax; a run that lasted stableRun starts over at
// restartMin, so a server that crashes once a day restarts at once.
var (
	restartMin = 100 * time.Millisecond
	restartMax = 5 * time.Second
	stableRun  = 30 * time.Second
)

// maxLineLength bounds one JSON-RPC message from a server. The SDK's default
// (16 MiB) would end the session on a bigger tool result; the gateway reads
// it whole and cuts it to Options.MaxResultBytes instead.
const maxLineLength = 256 << 20

// exitSettle is how long a server whose session failed may take to exit
// before the failure is described without its exit status.
const exitSettle = 500 * time.Millisecond

// stopGrace is how long a server has to exit after its stdin closes (the
// stdio transport's orderly shutdown) before its process group is killed.
const stopGrace = 2 * time.Second

// Server states, as /health reports them.
const (
	stateStarting   = "starting"
	stateReady      = "ready"
	stateRestarting = "restarting"
	stateStopped    = "stopped"
)

// upstream is one configured MCP server: its process, the gateway's client
// session to it over its stdin/stdout, and the supervisor that restarts it
// when it exits.
type upstream struct {
	g      *Gateway
	spec   *serverSpec
	log    *slog.Logger
	client *mcp.Client

	mu       sync.Mutex
	state    string
	cur      *running // nil while down
	down     string   // why it is down (its last exit), for calls meanwhile
	restarts int
	closed   bool

	refreshMu sync.Mutex   // one refresh of the server's features at a time
	features  featureNames // what is registered for it on the gateway's server (written under refreshMu and mu)

	ctx    context.Context // canceled by close: ends a start under way
	cancel context.CancelFunc
	stop   chan struct{} // closed by close
	done   chan struct{} // closed (finish) once nothing of the server runs
	finish func()
	// launched: startFirst ran, so it or the supervisor closes done.
	launched bool
}

// running is one process of a server and its session.
type running struct {
	cmd     *exec.Cmd
	sess    *mcp.ClientSession
	started time.Time
	exited  chan struct{} // closed when cmd.Wait returned; waitErr set then
	waitErr error
	stderr  *tail
}

func newUpstream(g *Gateway, spec *serverSpec) *upstream {
	u := &upstream{
		g: g, spec: spec,
		log:   g.log.With("server", spec.Key),
		state: stateStarting,
		stop:  make(chan struct{}),
		done:  make(chan struct{}),
	}
	u.ctx, u.cancel = context.WithCancel(context.Background())
	u.finish = sync.OnceFunc(func() { close(u.done) })
	u.client = mcp.NewClient(&mcp.Implementation{Name: "airlock-mcp-gateway", Version: Version}, &mcp.ClientOptions{
		// No roots: the filesystem server, for one, replaces the paths it
		// was started with by a client's roots.
		Capabilities:                &mcp.ClientCapabilities{},
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) { g.forwardProgress(req.Params) },
		ToolListChangedHandler:      func(context.Context, *mcp.ToolListChangedRequest) { go u.refreshCurrent() },
		PromptListChangedHandler:    func(context.Context, *mcp.PromptListChangedRequest) { go u.refreshCurrent() },
		ResourceListChangedHandler:  func(context.Context, *mcp.ResourceListChangedRequest) { go u.refreshCurrent() },
		LoggingMessageHandler: func(_ context.Context, req *mcp.LoggingMessageRequest) {
			u.log.Info("server log message", "level", req.Params.Level, "logger", req.Params.Logger, "data", req.Params.Data)
		},
	})
	return u
}

// session returns the live session, or nil and why the server is down.
func (u *upstream) session() (*mcp.ClientSession, string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.cur != nil {
		return u.cur.sess, ""
	}
	if u.closed {
		return nil, fmt.Sprintf("MCP server %q is stopped (the gateway is shutting down)", u.spec.Key)
	}
	if u.down == "" {
		return nil, fmt.Sprintf("MCP server %q is starting; try again shortly", u.spec.Key)
	}
	return nil, fmt.Sprintf("MCP server %q is restarting (%s); try again shortly", u.spec.Key, u.down)
}

// downReason waits a moment for the supervisor to notice that the server
// behind sess went down, and says why; "" if sess is still its session.
func (u *upstream) downReason(sess *mcp.ClientSession) string {
	deadline := time.Now().Add(2 * exitSettle)
	for {
		cur, why := u.session()
		if cur != sess || time.Now().After(deadline) {
			return why
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// startFirst starts the server for the gateway's start: its process, its
// first initialize and its feature lists, bounded by ctx and InitTimeout.
// On success the supervisor takes over; on failure nothing of it is left.
func (u *upstream) startFirst(ctx context.Context) error {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		return fmt.Errorf("MCP server %q: the gateway is closing", u.spec.Key)
	}
	u.launched = true
	u.mu.Unlock()
	r, err := u.spawn(ctx)
	if err != nil {
		u.finish()
		return err
	}
	lctx, cancel := context.WithTimeout(ctx, u.g.opts.InitTimeout)
	defer cancel()
	if err := u.refresh(lctx, r.sess); err != nil {
		u.teardown(r)
		u.finish()
		return fmt.Errorf("MCP server %q: listing its features: %w%s", u.spec.Key, err, r.stderr.suffix())
	}
	u.mu.Lock()
	u.cur, u.state = r, stateReady
	u.mu.Unlock()
	go u.supervise(r)
	return nil
}

// spawn starts the server's process and initializes a session with it.
// Failures say why: the exit status, or the bound, and the server's last
// stderr lines.
func (u *upstream) spawn(ctx context.Context) (*running, error) {
	s := u.spec
	if s.Dir != "" {
		// exec reports a missing directory as the program missing.
		if _, err := os.Stat(s.Dir); err != nil {
			return nil, fmt.Errorf("MCP server %q: its directory: %w", s.Key, err)
		}
	}
	// Our own pipes rather than exec's: the read ends are the gateway's
	// alone, so cmd.Wait never closes the session's stdout under it (a
	// result written just before the exit is still read), and never waits
	// for a grandchild that keeps stderr open.
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("MCP server %q: %w", s.Key, err)
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		closeAll(stdinR, stdinW)
		return nil, fmt.Errorf("MCP server %q: %w", s.Key, err)
	}
	stderrR, stderrW, err := os.Pipe()
	if err != nil {
		closeAll(stdinR, stdinW, stdoutR, stdoutW)
		return nil, fmt.Errorf("MCP server %q: %w", s.Key, err)
	}
	cmd := exec.Command(s.Argv[0], s.Argv[1:]...)
	cmd.Dir = s.Dir
	cmd.Env = append(u.g.baseEnv(), s.Env...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, stdoutW, stderrW
	// Its own process group: a shell's children (runCmd) go with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	closeAll(stdinR, stdoutW, stderrW)
	if err != nil {
		closeAll(stdinW, stdoutR, stderrR)
		return nil, fmt.Errorf("MCP server %q: starting %s: %w", s.Key, describeArgv(s), err)
	}
	r := &running{cmd: cmd, started: time.Now(), exited: make(chan struct{}), stderr: newTail(u.log, stderrR, "stderr")}
	go func() {
		r.waitErr = cmd.Wait()
		close(r.exited)
	}()
	u.log.Info("server started", "pid", cmd.Process.Pid, "cmd", describeArgv(s))

	cctx, cancel := context.WithTimeout(ctx, u.g.opts.InitTimeout)
	defer cancel()
	// A server that exits before it answers ends the wait at once.
	go func() {
		select {
		case <-r.exited:
			cancel()
		case <-cctx.Done():
		}
	}()
	sess, err := u.client.Connect(cctx, &mcp.IOTransport{Reader: stdoutR, Writer: stdinW, MaxLineLength: maxLineLength}, nil)
	if err != nil {
		closeAll(stdoutR, stdinW)
		// A server that dies ends its stdout a moment before exec sees it
		// exit: give it that moment, so the message has its exit status.
		exited := false
		select {
		case <-r.exited:
			exited = true
		case <-time.After(exitSettle):
		}
		u.kill(r)
		var why string
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			why = "did not answer initialize before the start's time ran out"
		case ctx.Err() != nil:
			why = "start interrupted: " + context.Cause(ctx).Error()
		case exited:
			why = "exited before it answered initialize: " + exitText(r.waitErr)
		case errors.Is(cctx.Err(), context.DeadlineExceeded):
			why = fmt.Sprintf("did not answer initialize within %s", u.g.opts.InitTimeout)
		default:
			why = fmt.Sprintf("initialize failed: %v", err)
		}
		u.log.Warn("server failed to start", "reason", why)
		return nil, fmt.Errorf("MCP server %q %s%s", s.Key, why, r.stderr.suffix())
	}
	r.sess = sess
	u.log.Info("server initialized", "pid", cmd.Process.Pid, "protocol", protocolOf(sess), "in", time.Since(r.started).Round(time.Millisecond))
	return r, nil
}

// supervise waits for the running server to exit (or its session to end,
// or Close) and restarts it with backoff until the gateway closes.
func (u *upstream) supervise(r *running) {
	defer u.finish()
	backoff := restartMin
	for {
		sessDone := make(chan struct{})
		go func(s *mcp.ClientSession) { _ = s.Wait(); close(sessDone) }(r.sess)
		select {
		case <-r.exited:
		case <-sessDone:
			// Its stdout ended: it is exiting, or it closed stdout and
			// lives on, which is as bad (teardown stops it).
			select {
			case <-r.exited:
			case <-time.After(exitSettle):
			}
		case <-u.stop:
		}
		why := "its session ended while it ran"
		select {
		case <-r.exited:
			why = "exited: " + exitText(r.waitErr)
		default:
		}
		u.mu.Lock()
		u.cur = nil
		closed := u.closed
		n := u.restarts
		if !closed {
			u.restarts++
			n = u.restarts
			u.state, u.down = stateRestarting, why
		}
		u.mu.Unlock()
		u.teardown(r)
		if closed {
			u.setState(stateStopped, "")
			u.log.Info("server stopped", "pid", r.cmd.Process.Pid)
			return
		}
		if time.Since(r.started) >= stableRun {
			backoff = restartMin
		}
		u.log.Warn("server exited; restarting", "pid", r.cmd.Process.Pid, "status", exitText(r.waitErr), "ran", time.Since(r.started).Round(time.Millisecond), "restart", n, "in", backoff, "stderr_tail", r.stderr.text())

		for {
			select {
			case <-u.stop:
				u.setState(stateStopped, "")
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, restartMax)
			next, err := u.spawn(u.ctx)
			if err != nil {
				u.setState(stateRestarting, err.Error())
				continue
			}
			lctx, cancel := context.WithTimeout(u.ctx, u.g.opts.InitTimeout)
			if err := u.refresh(lctx, next.sess); err != nil {
				// The old registrations stay; a list_changed or the next
				// restart refreshes them.
				u.log.Warn("listing the restarted server's features failed", "err", err)
			}
			cancel()
			r = next
			break
		}
		u.mu.Lock()
		if u.closed {
			u.mu.Unlock()
			continue // the select above sees u.stop
		}
		u.cur, u.state, u.down = r, stateReady, ""
		u.mu.Unlock()
		u.log.Info("server restarted", "pid", r.cmd.Process.Pid, "restart", n)
	}
}

func (u *upstream) setState(state, down string) {
	u.mu.Lock()
	u.state, u.down = state, down
	u.mu.Unlock()
}

// teardown ends a running server: closing the session closes its stdin (the
// stdio transport's orderly stop); a server still alive after stopGrace, and
// whatever else is left in its process group, is killed.
func (u *upstream) teardown(r *running) {
	if r.sess != nil {
		_ = r.sess.Close()
	}
	select {
	case <-r.exited:
	case <-time.After(stopGrace):
		_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-r.exited:
		case <-time.After(stopGrace):
		}
	}
	u.kill(r)
}

// kill ends the server's process group and waits for its process and its
// stderr (bounded: a grandchild outside the group may hold stderr).
func (u *upstream) kill(r *running) {
	_ = syscall.Kill(-r.cmd.Process.Pid, syscall.SIGKILL)
	<-r.exited
	r.stderr.wait(time.Second)
}

// refreshCurrent refreshes the features of the live session, after a
// list_changed notification.
func (u *upstream) refreshCurrent() {
	sess, _ := u.session()
	if sess == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), u.g.opts.InitTimeout)
	defer cancel()
	if err := u.refresh(ctx, sess); err != nil {
		u.log.Warn("refreshing the server's features failed", "err", err)
	}
}

// close stops the supervisor and the server, and waits for both.
func (u *upstream) close() {
	u.mu.Lock()
	if u.closed {
		u.mu.Unlock()
		<-u.done
		return
	}
	u.closed = true
	launched := u.launched
	u.mu.Unlock()
	u.cancel()
	close(u.stop)
	if !launched {
		u.finish()
	}
	<-u.done
}

// exitText describes how a process ended.
func exitText(err error) string {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return "exit status 0"
	case errors.As(err, &ee):
		return ee.ProcessState.String()
	default:
		return err.Error()
	}
}

func protocolOf(s *mcp.ClientSession) string {
	if r := s.InitializeResult(); r != nil {
		return r.ProtocolVersion
	}
	return ""
}

func describeArgv(s *serverSpec) string {
	if s.custom() {
		return s.Argv[len(s.Argv)-1]
	}
	return strings.Join(s.Argv, " ")
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}
