package envd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"sort"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"

	pb "github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/internal/sandboxlog"
)

const (
	// exitedRetention is how long a finished process stays connectable (docs/E2B-WIRE.md §3.4).
	exitedRetention = 30 * time.Second
	// exitDrainGrace bounds how long the end event waits for output still in the
	// pipes after the process exited. A background grandchild that inherited stdout
	// keeps the pipe open indefinitely; without a bound `cmd &` would never end.
	exitDrainGrace = 100 * time.Millisecond
	maxExitDrain   = subscriberStall + 3*time.Second
	// inputWriteTimeout bounds a stdin write to a process that does not read, when
	// the RPC itself carries no deadline.
	inputWriteTimeout = 60 * time.Second
)

// proc is one process started through Start.
type proc struct {
	pid     uint32
	tag     *string
	config  *pb.ProcessConfig
	started time.Time
	cmd     *exec.Cmd
	log     *slog.Logger

	tty *os.File // pty master; nil for pipe processes

	inMu  sync.Mutex
	stdin *os.File // write end of the stdin pipe; nil when disabled or closed

	mu    sync.Mutex
	subs  map[*subscriber]struct{}
	end   *pb.ProcessEvent_EndEvent
	done  chan struct{}
	timer *time.Timer // lifetime limit from Connect-Timeout-Ms

	timedOut atomic.Bool // killed for exceeding the lifetime limit

	// The sandbox log (sblog.go): its writer (nil: none), the level of
	// this process's entries, its user, and its output's copy there (a
	// template's start command only).
	sblog *sandboxlog.Writer
	level string
	user  string
	out   *outputLog
}

func (p *proc) running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end == nil
}

// subscribe attaches a stream. A process that already ended hands the new
// subscriber its retained end event at once, so late Connects still terminate.
func (p *proc) subscribe() *subscriber {
	s := newSubscriber()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		s.pushEnd(p.end)
		return s
	}
	p.subs[s] = struct{}{}
	return s
}

func (p *proc) unsubscribe(s *subscriber) {
	s.detach()
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// publish hands a chunk to every subscriber. Subscribers with room get it at once;
// only then does the reader wait, outside the process lock, for those that are
// full (bounded by subscriberStall).
func (p *proc) publish(k outKind, data []byte) {
	var full []*subscriber
	p.mu.Lock()
	if p.end != nil {
		p.mu.Unlock()
		return
	}
	for s := range p.subs {
		if !s.tryPush(k, data) {
			full = append(full, s)
		}
	}
	p.mu.Unlock()
	for _, s := range full {
		s.pushWait(k, data)
	}
}

// signal targets the whole process group so children of a shell die with it.
func (p *proc) signal(sig syscall.Signal) error {
	err := syscall.Kill(-int(p.pid), sig)
	if errors.Is(err, syscall.ESRCH) {
		err = syscall.Kill(int(p.pid), sig)
	}
	return err
}

// readOutput copies one output stream into the subscribers until EOF or error.
// progress and busy let wait() tell a reader that is still delivering output from
// one blocked on a pipe that a background grandchild holds open.
func (p *proc) readOutput(r *os.File, k outKind, progress *atomic.Int64, busy *atomic.Int32) {
	buf := make([]byte, chunkLimit(k))
	for {
		n, err := r.Read(buf)
		if n > 0 {
			busy.Add(1)
			progress.Add(1)
			chunk := make([]byte, n)
			copy(chunk, buf[:n])
			p.publish(k, chunk)
			if p.out != nil {
				p.out.write(k.streamName(), chunk)
			}
			busy.Add(-1)
		}
		if err != nil {
			return
		}
	}
}

// unread is how many bytes wait in the readers' pipes (or terminal) for
// their readers (TIOCINQ, FIONREAD's Linux name; a file it cannot ask counts none).
func unread(readers []*os.File) int {
	total := 0
	for _, r := range readers {
		rc, err := r.SyscallConn()
		if err != nil {
			continue
		}
		_ = rc.Control(func(fd uintptr) {
			if n, err := unix.IoctlGetInt(int(fd), unix.TIOCINQ); err == nil && n > 0 {
				total += n
			}
		})
	}
	return total
}

// wait reaps the process, lets the readers drain what it wrote, then publishes the
// single end event and schedules the process's removal.
func (p *proc) wait(readers []*os.File, kinds []outKind, m *processManager) {
	var (
		wg       sync.WaitGroup
		progress atomic.Int64
		busy     atomic.Int32
	)
	for i, r := range readers {
		wg.Add(1)
		go func(r *os.File, k outKind) {
			defer wg.Done()
			defer func() {
				if v := recover(); v != nil {
					p.log.Error("output reader panicked", "pid", p.pid, "panic", v)
				}
			}()
			p.readOutput(r, k, &progress, &busy)
		}(r, kinds[i])
	}
	err := p.cmd.Wait()
	drained := make(chan struct{})
	go func() { wg.Wait(); close(drained) }()
	// Keep waiting while output is still flowing; stop once the readers sit idle
	// on pipes that only a background grandchild still holds open. What an exited
	// process left behind is at most a pipe buffer, so maxExitDrain only cuts off
	// a grandchild that keeps writing.
	drainDeadline := time.Now().Add(maxExitDrain)
	for {
		before := progress.Load()
		select {
		case <-drained:
		case <-time.After(exitDrainGrace):
			// Output still in a pipe counts as flowing too: on a loaded
			// machine (a 2-core node starting Pods) a reader may not have run
			// at all in the grace, and its stream's last bytes must not be
			// cut off for it.
			if (busy.Load() > 0 || progress.Load() != before || unread(readers) > 0) && time.Now().Before(drainDeadline) {
				continue
			}
		}
		break
	}
	end := endEvent(p.cmd.ProcessState, err)
	p.logEnded(end)

	p.mu.Lock()
	p.end = end
	if p.timer != nil {
		p.timer.Stop()
	}
	for s := range p.subs {
		if d := s.droppedBytes(); d > 0 {
			p.log.Warn("a client stopped reading process output; some output was not delivered to it", "pid", p.pid, "dropped_bytes", d)
			s.pushEnd(withDropNotice(end, d))
			continue
		}
		s.pushEnd(end)
	}
	p.subs = nil
	close(p.done)
	p.mu.Unlock()

	p.inMu.Lock()
	if p.stdin != nil {
		p.stdin.Close()
		p.stdin = nil
	}
	p.inMu.Unlock()
	if p.tty != nil {
		// The session leader is gone; closing the master also unblocks the reader.
		p.tty.Close()
	}
	// Readers of pipes held open by background grandchildren keep draining (and
	// discarding) until those exit, then close their end.
	go func() {
		<-drained
		for _, r := range readers {
			if r != p.tty {
				r.Close()
			}
		}
	}()
	p.log.Debug("process ended", "pid", p.pid, "status", end.GetStatus())
	time.AfterFunc(exitedRetention, func() { m.remove(p) })
}

func endEvent(st *os.ProcessState, waitErr error) *pb.ProcessEvent_EndEvent {
	if st == nil {
		msg := "process state unknown"
		if waitErr != nil {
			msg = waitErr.Error()
		}
		return &pb.ProcessEvent_EndEvent{ExitCode: -1, Status: msg, Error: proto.String(msg)}
	}
	ev := &pb.ProcessEvent_EndEvent{
		ExitCode: int32(st.ExitCode()),
		Exited:   st.Exited(),
		Status:   st.String(),
	}
	if !st.Success() {
		ev.Error = proto.String(st.String())
	}
	return ev
}

// withDropNotice is the end event for a stream that lost output: the exit
// status is unchanged, and the error field (which the SDKs surface as the
// command result's error) says the output is incomplete and why, so a client
// never mistakes truncated output for the whole of it.
func withDropNotice(end *pb.ProcessEvent_EndEvent, dropped int64) *pb.ProcessEvent_EndEvent {
	ev := proto.Clone(end).(*pb.ProcessEvent_EndEvent)
	notice := fmt.Sprintf("output incomplete: %d bytes were dropped because this client stopped reading for more than %s", dropped, subscriberStall)
	if ev.Error != nil && *ev.Error != "" {
		notice = *ev.Error + "; " + notice
	}
	ev.Error = proto.String(notice)
	return ev
}

// writeInput delivers input to the process's stdin pipe or terminal.
func (p *proc) writeInput(ctx context.Context, in *pb.ProcessInput) error {
	var data []byte
	switch v := in.GetInput().(type) {
	case *pb.ProcessInput_Pty:
		if p.tty == nil {
			return errNoPTY
		}
		data = v.Pty
	case *pb.ProcessInput_Stdin:
		data = v.Stdin
	default:
		return nil
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	var w *os.File
	if p.tty != nil {
		if !p.running() {
			return errStdinClosed
		}
		w = p.tty
	} else {
		w = p.stdin
	}
	if w == nil {
		return errStdinClosed
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(inputWriteTimeout)
	}
	_ = w.SetWriteDeadline(deadline)
	_, err := w.Write(data)
	_ = w.SetWriteDeadline(time.Time{})
	if err != nil {
		return fmt.Errorf("writing input: %w", err)
	}
	return nil
}

func (p *proc) closeStdin() error {
	if p.tty != nil {
		return errCloseStdinPTY
	}
	p.inMu.Lock()
	defer p.inMu.Unlock()
	if p.stdin == nil {
		return errStdinClosed
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

func (p *proc) resize(cols, rows uint32) error {
	if p.tty == nil {
		return errNoPTY
	}
	return pty.Setsize(p.tty, &pty.Winsize{Cols: uint16(min(cols, 0xffff)), Rows: uint16(min(rows, 0xffff))})
}

var (
	errNoPTY         = errors.New("process has no pty")
	errStdinClosed   = errors.New("stdin not enabled or closed")
	errCloseStdinPTY = errors.New("cannot close stdin of a pty process; send EOT (ctrl-d) instead")
)

// processManager indexes live and recently ended processes.
type processManager struct {
	mu    sync.Mutex
	byPID map[uint32]*proc
}

func newProcessManager() *processManager {
	return &processManager{byPID: map[uint32]*proc{}}
}

func (m *processManager) add(p *proc) {
	m.mu.Lock()
	m.byPID[p.pid] = p
	m.mu.Unlock()
}

func (m *processManager) remove(p *proc) {
	m.mu.Lock()
	if m.byPID[p.pid] == p {
		delete(m.byPID, p.pid)
	}
	m.mu.Unlock()
}

// find resolves a selector. Ended processes count only when includeEnded (Connect);
// acting on a dead process is reported as not found, which the SDK's kill() maps
// to false.
func (m *processManager) find(sel *pb.ProcessSelector, includeEnded bool) (*proc, error) {
	if sel == nil || sel.GetSelector() == nil {
		return nil, errSelectorMissing
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch s := sel.GetSelector().(type) {
	case *pb.ProcessSelector_Pid:
		p := m.byPID[s.Pid]
		if p == nil || (!includeEnded && !p.running()) {
			return nil, fmt.Errorf("process with pid %d not found", s.Pid)
		}
		return p, nil
	case *pb.ProcessSelector_Tag:
		// Several processes may share a tag; the newest running one wins, then the
		// newest ended one.
		var best *proc
		bestRunning := false
		for _, p := range m.byPID {
			if p.tag == nil || *p.tag != s.Tag {
				continue
			}
			r := p.running()
			if !r && !includeEnded {
				continue
			}
			if best == nil || (r && !bestRunning) || (r == bestRunning && p.started.After(best.started)) {
				best, bestRunning = p, r
			}
		}
		if best == nil {
			return nil, fmt.Errorf("process with tag %q not found", s.Tag)
		}
		return best, nil
	}
	return nil, errSelectorMissing
}

var errSelectorMissing = errors.New("process selector (pid or tag) is required")

func (m *processManager) list() []*pb.ProcessInfo {
	m.mu.Lock()
	procs := make([]*proc, 0, len(m.byPID))
	for _, p := range m.byPID {
		if p.running() {
			procs = append(procs, p)
		}
	}
	m.mu.Unlock()
	sort.Slice(procs, func(i, j int) bool { return procs[i].started.Before(procs[j].started) })
	out := make([]*pb.ProcessInfo, 0, len(procs))
	for _, p := range procs {
		out = append(out, &pb.ProcessInfo{Config: p.config, Pid: p.pid, Tag: p.tag})
	}
	return out
}

// killAll ends every running process group; used when envd shuts down.
func (m *processManager) killAll() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, p := range m.byPID {
		if p.running() {
			_ = p.signal(syscall.SIGKILL)
		}
	}
}
