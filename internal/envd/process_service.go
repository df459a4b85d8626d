package envd

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	pb "github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
	"github.com/airlock-sandbox/airlock/internal/usercgroup"
)

// defaultKeepalive applies when a streaming request has no Keepalive-Ping-Interval.
const defaultKeepalive = 90 * time.Second

type processService struct {
	srv *Server
}

var _ processconnect.ProcessHandler = (*processService)(nil)

func keepaliveInterval(h http.Header) time.Duration {
	if v := h.Get("Keepalive-Ping-Interval"); v != "" {
		if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
			return time.Duration(min(n, 24*3600)) * time.Second
		}
	}
	return defaultKeepalive
}

// ctxError turns the end of a stream's context into the Connect error the SDKs map
// to TimeoutError.
func ctxError(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("deadline exceeded"))
	}
	return connect.NewError(connect.CodeCanceled, ctx.Err())
}

// processEnv builds the environment in the order of docs/E2B-WIRE.md §3.4: identity first, then
// sandbox-level variables, then the request's own, later entries winning.
func (s *Server) processEnv(u *unixuser.User, reqEnv map[string]string) []string {
	vals := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := vals[k]; !ok {
			order = append(order, k)
		}
		vals[k] = v
	}
	path := os.Getenv("PATH")
	if path == "" {
		path = envdapi.DefaultPath
	}
	set("PATH", path)
	set("HOME", u.Home)
	set("USER", u.Name)
	set("LOGNAME", u.Name)
	for _, kv := range s.id.sandboxEnv() {
		set(kv[0], kv[1])
	}
	keys := make([]string, 0, len(reqEnv))
	for k := range reqEnv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.Contains(reqEnv[k], "\x00") {
			continue
		}
		set(k, reqEnv[k])
	}
	env := make([]string, 0, len(order))
	for _, k := range order {
		env = append(env, k+"="+vals[k])
	}
	return env
}

// startUserProcess runs start, which forks a user's process with sys as its
// SysProcAttr, so that the
// process lives in a cgroup of its own under the sandbox's "user" cgroup, apart
// from envd's reserve (internal/usercgroup). A failed placement is logged and
// the process starts anyway: a sandbox without the cgroups is still usable.
func (s *Server) startUserProcess(sys *syscall.SysProcAttr, start func() error) error {
	err, placeErr := usercgroup.Start(sys, start)
	if placeErr != nil {
		s.log.Warn("placing a user process in its own cgroup", "err", placeErr)
	}
	return err
}

func (ps *processService) Start(ctx context.Context, req *connect.Request[pb.StartRequest], stream *connect.ServerStream[pb.StartResponse]) error {
	s := ps.srv
	u, err := s.requestUser(req.Header())
	if err != nil {
		return err
	}
	cfg := req.Msg.GetProcess()
	if cfg == nil || cfg.GetCmd() == "" {
		return connect.NewError(connect.CodeInvalidArgument, errors.New("process.cmd is required"))
	}
	cwd := s.resolvePath(cfg.GetCwd(), u)
	if fi, err := os.Stat(cwd); err != nil {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' does not exist", cwd))
	} else if !fi.IsDir() {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("cwd '%s' is not a directory", cwd))
	}
	env := s.processEnv(u, cfg.GetEnvs())
	path, err := unixuser.LookPath(cfg.GetCmd(), env, cwd, "")
	if err != nil {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	cmd := &exec.Cmd{
		Path: path,
		Args: append([]string{cfg.GetCmd()}, cfg.GetArgs()...),
		Env:  env,
		Dir:  cwd,
	}
	p := &proc{
		tag:     req.Msg.Tag,
		config:  cfg,
		started: time.Now(),
		cmd:     cmd,
		log:     s.log,
		subs:    map[*subscriber]struct{}{},
		done:    make(chan struct{}),
		sblog:   s.sblog,
		level:   procLevel(req.Header()),
		user:    u.Name,
	}
	sub := newSubscriber()
	p.subs[sub] = struct{}{}

	var readers []*os.File
	var kinds []outKind
	if req.Msg.Pty != nil {
		var ws *pty.Winsize
		if sz := req.Msg.GetPty().GetSize(); sz != nil && sz.GetCols() > 0 && sz.GetRows() > 0 {
			ws = &pty.Winsize{Cols: uint16(min(sz.GetCols(), 0xffff)), Rows: uint16(min(sz.GetRows(), 0xffff))}
		}
		// A new session gives the shell its own controlling terminal and makes it a
		// process group leader, so group signals reach its children.
		attrs := &syscall.SysProcAttr{Setsid: true, Setctty: true, Credential: unixuser.Credential(u)}
		var tty *os.File
		err := s.startUserProcess(attrs, func() (err error) {
			tty, err = pty.StartWithAttrs(cmd, ws, attrs)
			return err
		})
		if err != nil {
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("starting process: %w", err))
		}
		p.tty = tty
		readers, kinds = []*os.File{tty}, []outKind{outPTY}
	} else {
		outR, outW, err := os.Pipe()
		if err != nil {
			return connect.NewError(connect.CodeInternal, err)
		}
		errR, errW, err := os.Pipe()
		if err != nil {
			outR.Close()
			outW.Close()
			return connect.NewError(connect.CodeInternal, err)
		}
		childEnds := []*os.File{outW, errW}
		cmd.Stdout, cmd.Stderr = outW, errW
		if req.Msg.Stdin == nil || req.Msg.GetStdin() {
			inR, inW, err := os.Pipe()
			if err != nil {
				for _, f := range []*os.File{outR, outW, errR, errW} {
					f.Close()
				}
				return connect.NewError(connect.CodeInternal, err)
			}
			cmd.Stdin = inR
			p.stdin = inW
			childEnds = append(childEnds, inR)
		}
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: unixuser.Credential(u)}
		err = s.startUserProcess(cmd.SysProcAttr, cmd.Start)
		for _, f := range childEnds {
			f.Close()
		}
		if err != nil {
			outR.Close()
			errR.Close()
			if p.stdin != nil {
				p.stdin.Close()
			}
			return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("starting process: %w", err))
		}
		readers, kinds = []*os.File{outR, errR}, []outKind{outStdout, outStderr}
	}
	p.pid = uint32(cmd.Process.Pid)
	if deadline, ok := ctx.Deadline(); ok {
		// The stream's deadline is the process's lifetime limit (docs/E2B-WIRE.md §3.4); it holds
		// even after the client detaches.
		p.mu.Lock()
		p.timer = time.AfterFunc(time.Until(deadline), func() {
			if p.running() {
				p.timedOut.Store(true)
				s.log.Info("process exceeded its time limit; killing", "pid", p.pid)
				_ = p.signal(syscall.SIGKILL)
			}
		})
		p.mu.Unlock()
	}
	if p.sblog != nil && p.tag != nil && *p.tag == startCmdTag {
		p.out = newOutputLog(p.sblog, p.pid, startCmdTag)
	}
	s.procs.add(p)
	p.logStarted()
	go p.wait(readers, kinds, s.procs)
	s.log.Debug("process started", "pid", p.pid, "cmd", cfg.GetCmd(), "user", u.Name, "pty", p.tty != nil)

	defer p.unsubscribe(sub)
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.StartResponse{Event: ev}) }
	if err := send(startEvent(p.pid)); err != nil {
		return err
	}
	// A process killed for exceeding its lifetime ends the stream with
	// deadline_exceeded (the SDK's TimeoutError), not with an ordinary end event;
	// the lifetime timer and the stream's context race to notice first.
	timedOut := func() error {
		if p.timedOut.Load() {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("process exceeded its time limit and was killed"))
		}
		return nil
	}
	err = pump(ctx, sub, keepaliveInterval(req.Header()), send, timedOut)
	if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) && p.running() {
		p.timedOut.Store(true)
		_ = p.signal(syscall.SIGKILL)
	}
	return err
}

func startEvent(pid uint32) *pb.ProcessEvent {
	return &pb.ProcessEvent{Event: &pb.ProcessEvent_Start{Start: &pb.ProcessEvent_StartEvent{Pid: pid}}}
}

// pump forwards a subscriber's events to a stream until the end event, sending
// keepalives whenever the stream was otherwise silent for the interval.
// endErr, when it returns an error, replaces the end event.
func pump(ctx context.Context, sub *subscriber, keepalive time.Duration, send func(*pb.ProcessEvent) error, endErr func() error) error {
	t := time.NewTimer(keepalive)
	defer t.Stop()
	for {
		select {
		case <-sub.notify:
			for _, ev := range sub.take() {
				var msg *pb.ProcessEvent
				if ev.end != nil {
					if endErr != nil {
						if err := endErr(); err != nil {
							return err
						}
					}
					msg = &pb.ProcessEvent{Event: &pb.ProcessEvent_End{End: ev.end}}
				} else {
					d := &pb.ProcessEvent_DataEvent{}
					switch ev.kind {
					case outStdout:
						d.Output = &pb.ProcessEvent_DataEvent_Stdout{Stdout: ev.data}
					case outStderr:
						d.Output = &pb.ProcessEvent_DataEvent_Stderr{Stderr: ev.data}
					default:
						d.Output = &pb.ProcessEvent_DataEvent_Pty{Pty: ev.data}
					}
					msg = &pb.ProcessEvent{Event: &pb.ProcessEvent_Data{Data: d}}
				}
				if err := send(msg); err != nil {
					return err
				}
				if ev.end != nil {
					return nil
				}
			}
			t.Reset(keepalive)
		case <-t.C:
			if err := send(&pb.ProcessEvent{Event: &pb.ProcessEvent_Keepalive{Keepalive: &pb.ProcessEvent_KeepAlive{}}}); err != nil {
				return err
			}
			t.Reset(keepalive)
		case <-ctx.Done():
			return ctxError(ctx)
		}
	}
}

func (ps *processService) Connect(ctx context.Context, req *connect.Request[pb.ConnectRequest], stream *connect.ServerStream[pb.ConnectResponse]) error {
	s := ps.srv
	p, err := s.procs.find(req.Msg.GetProcess(), true)
	if err != nil {
		return selectorError(err)
	}
	sub := p.subscribe()
	defer p.unsubscribe(sub)
	send := func(ev *pb.ProcessEvent) error { return stream.Send(&pb.ConnectResponse{Event: ev}) }
	if err := send(startEvent(p.pid)); err != nil {
		return err
	}
	return pump(ctx, sub, keepaliveInterval(req.Header()), send, nil)
}

func selectorError(err error) error {
	if errors.Is(err, errSelectorMissing) {
		return connect.NewError(connect.CodeInvalidArgument, err)
	}
	return connect.NewError(connect.CodeNotFound, err)
}

func inputError(err error) error {
	switch {
	case errors.Is(err, errNoPTY):
		return connect.NewError(connect.CodeInvalidArgument, err)
	case errors.Is(err, errStdinClosed), errors.Is(err, errCloseStdinPTY):
		return connect.NewError(connect.CodeFailedPrecondition, err)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return connect.NewError(connect.CodeDeadlineExceeded, errors.New("process did not read its input in time"))
	}
	return connect.NewError(connect.CodeInternal, err)
}

func (ps *processService) List(ctx context.Context, req *connect.Request[pb.ListRequest]) (*connect.Response[pb.ListResponse], error) {
	return connect.NewResponse(&pb.ListResponse{Processes: ps.srv.procs.list()}), nil
}

func (ps *processService) Update(ctx context.Context, req *connect.Request[pb.UpdateRequest]) (*connect.Response[pb.UpdateResponse], error) {
	p, err := ps.srv.procs.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, selectorError(err)
	}
	if sz := req.Msg.GetPty().GetSize(); sz != nil {
		if err := p.resize(sz.GetCols(), sz.GetRows()); err != nil {
			return nil, inputError(err)
		}
	}
	return connect.NewResponse(&pb.UpdateResponse{}), nil
}

func (ps *processService) SendInput(ctx context.Context, req *connect.Request[pb.SendInputRequest]) (*connect.Response[pb.SendInputResponse], error) {
	p, err := ps.srv.procs.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, selectorError(err)
	}
	if err := p.writeInput(ctx, req.Msg.GetInput()); err != nil {
		return nil, inputError(err)
	}
	return connect.NewResponse(&pb.SendInputResponse{}), nil
}

func (ps *processService) StreamInput(ctx context.Context, stream *connect.ClientStream[pb.StreamInputRequest]) (*connect.Response[pb.StreamInputResponse], error) {
	var p *proc
	for stream.Receive() {
		switch ev := stream.Msg().GetEvent().(type) {
		case *pb.StreamInputRequest_Start:
			found, err := ps.srv.procs.find(ev.Start.GetProcess(), false)
			if err != nil {
				return nil, selectorError(err)
			}
			p = found
		case *pb.StreamInputRequest_Data:
			if p == nil {
				return nil, connect.NewError(connect.CodeFailedPrecondition, errors.New("the first message must be start"))
			}
			if err := p.writeInput(ctx, ev.Data.GetInput()); err != nil {
				return nil, inputError(err)
			}
		}
	}
	if err := stream.Err(); err != nil {
		return nil, err
	}
	return connect.NewResponse(&pb.StreamInputResponse{}), nil
}

func (ps *processService) SendSignal(ctx context.Context, req *connect.Request[pb.SendSignalRequest]) (*connect.Response[pb.SendSignalResponse], error) {
	var sig syscall.Signal
	switch req.Msg.GetSignal() {
	case pb.Signal_SIGNAL_SIGKILL:
		sig = syscall.SIGKILL
	case pb.Signal_SIGNAL_SIGTERM:
		sig = syscall.SIGTERM
	default:
		return nil, connect.NewError(connect.CodeUnimplemented, fmt.Errorf("signal %s is not supported", req.Msg.GetSignal()))
	}
	p, err := ps.srv.procs.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, selectorError(err)
	}
	if err := p.signal(sig); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("process with pid %d not found", p.pid))
		}
		return nil, connect.NewError(connect.CodeInternal, fmt.Errorf("sending %s: %w", sig, err))
	}
	return connect.NewResponse(&pb.SendSignalResponse{}), nil
}

func (ps *processService) CloseStdin(ctx context.Context, req *connect.Request[pb.CloseStdinRequest]) (*connect.Response[pb.CloseStdinResponse], error) {
	p, err := ps.srv.procs.find(req.Msg.GetProcess(), false)
	if err != nil {
		return nil, selectorError(err)
	}
	if err := p.closeStdin(); err != nil {
		return nil, inputError(err)
	}
	return connect.NewResponse(&pb.CloseStdinResponse{}), nil
}
