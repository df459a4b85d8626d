package interp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/go-zeromq/zmq4"
)

// A Jupyter kernel (ipykernel, IRkernel, …) driven over ZeroMQ by the pure-Go zmq4 client.
// The kernel process runs as the context's user in its own process group; the Go side owns
// the connection file (free loopback ports, random HMAC-SHA256 key).

const (
	jupyterReadyTimeout   = 60 * time.Second // upper bound for kernel start → kernel_info answered on iopub
	jupyterInterruptGrace = 5 * time.Second  // after ctx ends: how long to wait for the interrupted cell to finish
)

// Heartbeat period and the silence after which a kernel whose process is still there counts
// as dead (hung, or stopped). Generous: the machine may be loaded, and process exit is the
// fast path. Variables so tests can shorten them.
var (
	jupyterHeartbeatEvery = 2 * time.Second
	jupyterHeartbeatLimit = 15 * time.Second
)

// jupyterKernelSpec is the part of kernel.json we use.
type jupyterKernelSpec struct {
	Argv          []string          `json:"argv"`
	Env           map[string]string `json:"env"`
	Language      string            `json:"language"`
	InterruptMode string            `json:"interrupt_mode"`
}

// kernelspecDirs are searched in order for <name>/kernel.json.
var kernelspecDirs = []string{"/usr/local/share/jupyter/kernels", "/usr/share/jupyter/kernels"}

// readKernelspec loads a kernelspec by name; a missing one is ErrUnavailable.
func readKernelspec(name string) (*jupyterKernelSpec, error) {
	for _, dir := range kernelspecDirs {
		data, err := os.ReadFile(dir + "/" + name + "/kernel.json")
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read kernelspec %s: %w", name, err)
		}
		var spec jupyterKernelSpec
		if err := json.Unmarshal(data, &spec); err != nil {
			return nil, fmt.Errorf("parse kernelspec %s: %w", name, err)
		}
		if len(spec.Argv) == 0 {
			return nil, fmt.Errorf("kernelspec %s has an empty argv", name)
		}
		return &spec, nil
	}
	return nil, fmt.Errorf("jupyter kernelspec %q: %w", name, ErrUnavailable)
}

// StartKernelspec returns a Starter for an installed Jupyter kernelspec. Per-execution env
// vars are not applied for such kernels (no generic way); a language backend (r.go) passes
// its own jupyterEnvCode to startJupyter instead.
func StartKernelspec(name string) Starter {
	return func(ctx context.Context, opts Options) (Kernel, error) {
		spec, err := readKernelspec(name)
		if err != nil {
			return nil, err
		}
		var env []string
		for k, v := range spec.Env {
			env = append(env, k+"="+v)
		}
		return startJupyter(ctx, opts, name, spec.Argv, env, jupyterFlavor{})
	}
}

type jupyterEnvCode func(env map[string]string) (apply, restore string, err error)

// jupyterFlavor is what a language backend tells the generic client about its kernel.
type jupyterFlavor struct {
	// envCode sets and restores an execution's env; nil: the env is not applied.
	envCode jupyterEnvCode
	// captureFDs forwards what is written to the kernel process's fd 1 and 2 (child
	// processes, writes that bypass the kernel's own capture) as the current execution's
	// stdout and stderr, which ipykernel does itself and IRkernel does not.
	captureFDs bool
	// busyHeartbeat: the kernel answers heartbeats only between requests (IRkernel polls
	// its heartbeat socket in its main loop), so silence while it executes is no sign of
	// death.
	busyHeartbeat bool
	// interruptOnceStarted: SIGINT is sent only once the kernel announced the cell
	// (execute_input); outside a cell the kernel may not survive one.
	interruptOnceStarted bool
}

// jupyterRaw is a piece of what the kernel process wrote to fd 1 or 2, or one of the
// marks the client writes into the same pipes after a cell (mark > 0).
type jupyterRaw struct {
	stream string
	text   string
	mark   uint64
}

type jupyterInbound struct {
	channel string // "shell", "iopub", "control"
	msg     *jupyterMsg
}

type jupyterWaiter struct {
	ch   chan jupyterInbound
	done chan struct{}
}

type jupyterKernel struct {
	name     string
	cmd      *exec.Cmd
	waitDone chan struct{}
	connFile string
	signer   jupyterSigner
	session  string
	flavor   jupyterFlavor
	output   *tailBuffer // the kernel process's own stdout/stderr, for death reports

	// With flavor.captureFDs: the write ends of the kernel's fd 1 and 2 (kept to write the
	// end-of-cell marks), the chunks read from them while an execution is active, and the
	// token that starts a mark.
	rawOut, rawErr *os.File
	raw            chan jupyterRaw
	active         atomic.Bool
	markToken      []byte
	markSeq        atomic.Uint64
	// busy is the kernel's last execution_state on iopub, whichever request it was for
	// (busyHeartbeat).
	busy atomic.Bool

	sockCancel                   context.CancelFunc
	shell, iopub, control, hbeat zmq4.Socket
	shellMu                      sync.Mutex // zmq4 sockets are not safe for concurrent Send

	mu      sync.Mutex
	waiters map[string]*jupyterWaiter

	dead      chan struct{}
	deadOnce  sync.Once
	deadErr   error
	lastBeat  atomic.Int64
	hbEvery   time.Duration // jupyterHeartbeatEvery/Limit when the kernel started
	hbLimit   time.Duration
	closeOnce sync.Once
	closeErr  error
}

// freeLoopbackPorts reserves n distinct ports by binding and releasing them. The kernel binds
// them right after; a race with another process is possible but unlikely in a sandbox.
func freeLoopbackPorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("reserve a loopback port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// jupyterPortTries bounds the starts of a kernel whose reserved ports were
// taken before it bound them (freeLoopbackPorts releases them to the kernel).
const jupyterPortTries = 3

// startJupyter starts a kernel, again on fresh ports when another process
// took one of its reserved ports in between (the kernel then dies at start
// with EADDRINUSE: likely only where many kernels start at once, as in tests).
func startJupyter(ctx context.Context, opts Options, name string, argv, env []string, flavor jupyterFlavor) (*jupyterKernel, error) {
	for try := 1; ; try++ {
		k, err := startJupyterOnce(ctx, opts, name, argv, env, flavor)
		if err == nil || try == jupyterPortTries || !strings.Contains(err.Error(), "Address already in use") || ctx.Err() != nil {
			return k, err
		}
	}
}

func startJupyterOnce(ctx context.Context, opts Options, name string, argv, env []string, flavor jupyterFlavor) (_ *jupyterKernel, err error) {
	if err := prepareRunDir(opts); err != nil {
		return nil, err
	}
	ports, err := freeLoopbackPorts(5)
	if err != nil {
		return nil, err
	}
	k := &jupyterKernel{
		name:     name,
		signer:   jupyterSigner{key: []byte(randomHex(32))},
		session:  randomHex(16),
		flavor:   flavor,
		waitDone: make(chan struct{}),
		dead:     make(chan struct{}),
		waiters:  map[string]*jupyterWaiter{},
		output:   &tailBuffer{max: 8 << 10},
		hbEvery:  jupyterHeartbeatEvery,
		hbLimit:  jupyterHeartbeatLimit,
	}
	conn, err := json.Marshal(map[string]any{
		"shell_port": ports[0], "iopub_port": ports[1], "stdin_port": ports[2],
		"control_port": ports[3], "hb_port": ports[4], "ip": "127.0.0.1",
		"key": string(k.signer.key), "transport": "tcp", "signature_scheme": "hmac-sha256",
		"kernel_name": name,
	})
	if err != nil {
		return nil, fmt.Errorf("encode connection file: %w", err)
	}
	k.connFile, err = writeKernelFile(opts, "kernel-"+k.session+".json", conn, 0o600)
	if err != nil {
		return nil, err
	}
	args := make([]string, len(argv))
	for i, a := range argv {
		args[i] = strings.ReplaceAll(a, "{connection_file}", k.connFile)
	}
	k.cmd = kernelCmd(opts, args, env...)
	k.cmd.Stdout, k.cmd.Stderr = k.output, k.output
	var outR, errR *os.File
	if flavor.captureFDs {
		if outR, k.rawOut, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("kernel stdout pipe: %w", err)
		}
		if errR, k.rawErr, err = os.Pipe(); err != nil {
			outR.Close()
			k.rawOut.Close()
			return nil, fmt.Errorf("kernel stderr pipe: %w", err)
		}
		k.cmd.Stdout, k.cmd.Stderr = k.rawOut, k.rawErr
		k.raw = make(chan jupyterRaw, 64)
		k.markToken = []byte("\x1eairlock-mark-" + randomHex(16) + ":")
	}
	if err := startKernel(k.cmd); err != nil {
		os.Remove(k.connFile)
		if flavor.captureFDs {
			for _, f := range []*os.File{outR, errR, k.rawOut, k.rawErr} {
				f.Close()
			}
		}
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("start %s kernel: %w: %w", name, ErrUnavailable, err)
		}
		return nil, fmt.Errorf("start %s kernel: %w", name, err)
	}
	if flavor.captureFDs {
		go k.readRaw(outR, "stdout")
		go k.readRaw(errR, "stderr")
	}
	go func() {
		werr := k.cmd.Wait()
		close(k.waitDone)
		k.markDead(fmt.Errorf("kernel process exited (%v)", werr))
	}()
	defer func() {
		if err != nil {
			k.Close()
		}
	}()

	sctx, cancel := context.WithCancel(context.Background())
	k.sockCancel = cancel
	dialOpts := []zmq4.Option{zmq4.WithDialerRetry(50 * time.Millisecond), zmq4.WithDialerMaxRetries(int(jupyterReadyTimeout / (50 * time.Millisecond)))}
	ep := func(port int) string { return fmt.Sprintf("tcp://127.0.0.1:%d", port) }
	k.shell = zmq4.NewDealer(sctx, append(dialOpts, zmq4.WithID(zmq4.SocketIdentity(k.session)))...)
	k.iopub = zmq4.NewSub(sctx, dialOpts...)
	k.control = zmq4.NewDealer(sctx, append(dialOpts, zmq4.WithID(zmq4.SocketIdentity(k.session+"-c")))...)
	k.hbeat = zmq4.NewReq(sctx, dialOpts...)

	// Dialling retries until the kernel has bound its ports; do it off this goroutine so a
	// kernel that dies while starting is noticed at once.
	dialed := make(chan error, 1)
	go func() {
		for _, d := range []struct {
			s    zmq4.Socket
			port int
			what string
		}{{k.shell, ports[0], "shell"}, {k.iopub, ports[1], "iopub"}, {k.control, ports[3], "control"}, {k.hbeat, ports[4], "heartbeat"}} {
			if err := d.s.Dial(ep(d.port)); err != nil {
				dialed <- fmt.Errorf("dial %s socket: %w", d.what, err)
				return
			}
		}
		dialed <- k.iopub.SetOption(zmq4.OptionSubscribe, "")
	}()
	select {
	case err := <-dialed:
		if err != nil {
			return nil, err
		}
	case <-k.dead:
		return nil, k.diedErr()
	case <-ctx.Done():
		return nil, fmt.Errorf("start %s kernel: %w", name, ctx.Err())
	}
	go k.read(k.shell, "shell")
	go k.read(k.iopub, "iopub")
	go k.read(k.control, "control")
	if err := k.waitReady(ctx); err != nil {
		return nil, err
	}
	k.lastBeat.Store(time.Now().UnixNano())
	go k.heartbeat()
	return k, nil
}

func (k *jupyterKernel) read(s zmq4.Socket, channel string) {
	for {
		raw, err := s.Recv()
		if err != nil {
			return // socket closed (Close) or connection lost (the process watcher reports it)
		}
		msg, err := k.signer.decode(raw)
		if err != nil {
			continue // unsigned or malformed: ignore, as Jupyter clients do
		}
		if channel == "iopub" && msg.Header.MsgType == "status" {
			var st struct {
				State string `json:"execution_state"`
			}
			if json.Unmarshal(msg.Content, &st) == nil {
				k.busy.Store(st.State == "busy")
			}
		}
		k.mu.Lock()
		w := k.waiters[msg.Parent.MsgID]
		k.mu.Unlock()
		if w == nil {
			continue
		}
		select {
		case w.ch <- jupyterInbound{channel, msg}:
		case <-w.done:
		}
	}
}

func (k *jupyterKernel) wait(msgID string) *jupyterWaiter {
	w := &jupyterWaiter{ch: make(chan jupyterInbound, 256), done: make(chan struct{})}
	k.mu.Lock()
	k.waiters[msgID] = w
	k.mu.Unlock()
	return w
}

func (k *jupyterKernel) unwait(msgID string, w *jupyterWaiter) {
	k.mu.Lock()
	delete(k.waiters, msgID)
	k.mu.Unlock()
	close(w.done)
}

// send signs and sends a request on the shell or control socket; the waiter is registered
// before sending so no reply can be missed.
func (k *jupyterKernel) send(s zmq4.Socket, msgType string, content any) (string, *jupyterWaiter, error) {
	m, id, err := k.signer.encode(k.session, msgType, content)
	if err != nil {
		return "", nil, err
	}
	w := k.wait(id)
	k.shellMu.Lock()
	err = s.Send(m)
	k.shellMu.Unlock()
	if err != nil {
		k.unwait(id, w)
		return "", nil, fmt.Errorf("send %s: %w", msgType, err)
	}
	return id, w, nil
}

// waitReady sends kernel_info_request until the kernel answers on iopub: the SUB socket only
// receives once its subscription reached the kernel (ZeroMQ's slow joiner), so an iopub
// status message for our request proves the whole output path works.
func (k *jupyterKernel) waitReady(ctx context.Context) error {
	deadline := time.NewTimer(jupyterReadyTimeout)
	defer deadline.Stop()
	for {
		id, w, err := k.send(k.shell, "kernel_info_request", map[string]any{})
		if err != nil {
			return err
		}
		retry := time.NewTimer(200 * time.Millisecond)
		for ready := false; !ready; {
			select {
			case in := <-w.ch:
				if in.channel == "iopub" {
					k.unwait(id, w)
					retry.Stop()
					return nil
				}
			case <-retry.C:
				ready = true
			case <-k.dead:
				k.unwait(id, w)
				return k.diedErr()
			case <-ctx.Done():
				k.unwait(id, w)
				return fmt.Errorf("wait for %s kernel: %w", k.name, ctx.Err())
			case <-deadline.C:
				k.unwait(id, w)
				return fmt.Errorf("%s kernel not ready after %v: %s", k.name, jupyterReadyTimeout, k.output.String())
			}
		}
		k.unwait(id, w)
	}
}

func (k *jupyterKernel) heartbeat() {
	go func() {
		t := time.NewTicker(k.hbEvery)
		defer t.Stop()
		for {
			select {
			case <-k.dead:
				return
			case <-t.C:
				if k.flavor.busyHeartbeat && k.busy.Load() {
					// Executing: the kernel answers the ping when the cell ends.
					k.lastBeat.Store(time.Now().UnixNano())
					continue
				}
				if time.Since(time.Unix(0, k.lastBeat.Load())) > k.hbLimit {
					k.markDead(fmt.Errorf("no heartbeat for %v", k.hbLimit))
					// A kernel that stopped answering is useless: end it so nothing lingers.
					_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
					return
				}
			}
		}
	}()
	for {
		if err := k.hbeat.Send(zmq4.NewMsgString("ping")); err != nil {
			return
		}
		if _, err := k.hbeat.Recv(); err != nil {
			return
		}
		k.lastBeat.Store(time.Now().UnixNano())
		select {
		case <-k.dead:
			return
		case <-time.After(k.hbEvery):
		}
	}
}

func (k *jupyterKernel) markDead(err error) {
	k.deadOnce.Do(func() {
		k.deadErr = err
		close(k.dead)
	})
}

func (k *jupyterKernel) diedErr() error {
	out := strings.TrimSpace(k.output.String())
	if out != "" {
		return fmt.Errorf("%s %w: %v; kernel output: %s", k.name, ErrKernelDied, k.deadErr, out)
	}
	return fmt.Errorf("%s %w: %v", k.name, ErrKernelDied, k.deadErr)
}

type executeReply struct {
	Status         string `json:"status"`
	ExecutionCount int    `json:"execution_count"`
}

// runSilent executes helper code without output or history (used for per-execution env)
// and waits for its reply, or until ctx ends (the kernel may still be busy with an abandoned
// cell; the request then stays queued and runs after it).
func (k *jupyterKernel) runSilent(ctx context.Context, code string) error {
	id, w, err := k.send(k.shell, "execute_request", map[string]any{
		"code": code, "silent": true, "store_history": false, "user_expressions": map[string]any{},
		"allow_stdin": false, "stop_on_error": false,
	})
	if err != nil {
		return err
	}
	defer k.unwait(id, w)
	for {
		select {
		case in := <-w.ch:
			if in.channel == "shell" && in.msg.Header.MsgType == "execute_reply" {
				var r executeReply
				if err := json.Unmarshal(in.msg.Content, &r); err != nil {
					return fmt.Errorf("decode execute_reply: %w", err)
				}
				if r.Status != "ok" {
					return fmt.Errorf("kernel helper code failed (%s)", r.Status)
				}
				return nil
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-k.dead:
			return k.diedErr()
		}
	}
}

func (k *jupyterKernel) Execute(ctx context.Context, code string, env map[string]string, emit func(Event)) (int, error) {
	select {
	case <-k.dead:
		return 0, k.diedErr()
	default:
	}
	if k.flavor.captureFDs {
		k.startCapture()
		defer k.active.Store(false)
	}
	abandoned := false // gave up on a cell that ignores interrupts: it still runs
	if len(env) > 0 && k.flavor.envCode != nil {
		apply, restore, err := k.flavor.envCode(env)
		if err != nil {
			return 0, err
		}
		applyErr := k.runSilent(ctx, apply)
		// Restore even when waiting for apply failed: it may still run (queued).
		defer func() {
			// Restore even after an interrupt (a dead kernel has nothing to restore). Behind
			// an abandoned cell it is only queued (it runs when the cell ends): Execute
			// must return promptly.
			wait := jupyterInterruptGrace
			if abandoned {
				wait = 0
			}
			rctx, cancel := context.WithTimeout(context.Background(), wait)
			defer cancel()
			_ = k.runSilent(rctx, restore)
		}()
		if applyErr != nil {
			return 0, fmt.Errorf("apply execution env: %w", applyErr)
		}
	}
	id, w, err := k.send(k.shell, "execute_request", map[string]any{
		"code": code, "silent": false, "store_history": true, "user_expressions": map[string]any{},
		"allow_stdin": false, "stop_on_error": false,
	})
	if err != nil {
		return 0, err
	}
	defer k.unwait(id, w)

	var (
		idle, replied bool
		started       = !k.flavor.interruptOnceStarted // the kernel announced the cell
		count         int
		ctxDone       = ctx.Done()
		interruptErr  error
		interruptDue  bool // ctx ended before the cell started: signal once it has
		grace         <-chan time.Time
		resignal      *time.Ticker
		resignalC     <-chan time.Time
		raw           <-chan jupyterRaw // the fd 1/2 capture, if any
		mark          uint64            // the end-of-cell mark being waited for
		marksLeft     = 0
	)
	if k.flavor.captureFDs {
		raw = k.raw
	}
	defer func() {
		if resignal != nil {
			resignal.Stop()
		}
	}()
	interruptNow := func() {
		interruptDue = false
		k.interrupt()
		resignal = time.NewTicker(time.Second)
		resignalC = resignal.C
	}
	for !idle || !replied || marksLeft > 0 {
		select {
		case in := <-w.ch:
			if in.channel == "shell" && in.msg.Header.MsgType == "execute_reply" {
				var r executeReply
				if err := json.Unmarshal(in.msg.Content, &r); err != nil {
					return 0, fmt.Errorf("decode execute_reply: %w", err)
				}
				count, replied = r.ExecutionCount, true
			} else if in.channel == "iopub" {
				switch in.msg.Header.MsgType {
				case "status":
					var st struct {
						State string `json:"execution_state"`
					}
					if json.Unmarshal(in.msg.Content, &st) == nil && st.State == "idle" {
						idle = true
					}
				case "execute_input":
					started = true
					if interruptDue {
						interruptNow()
					}
				default:
					// After ctx ended the client is gone: outputs (e.g. the KeyboardInterrupt)
					// are drained but not emitted.
					if ev, ok := jupyterEvent(in.msg); ok && interruptErr == nil {
						emit(ev)
					}
				}
			}
			if idle && replied && raw != nil && mark == 0 {
				// The cell is over, so whatever it (and the processes it waited for) wrote
				// to fd 1 and 2 is in the pipes: a mark written after it ends the cell's part.
				mark, marksLeft = k.writeMarks(), 2
			}
		case c := <-raw:
			if c.mark != 0 {
				if c.mark == mark {
					marksLeft--
				}
				continue
			}
			if interruptErr == nil {
				emit(Event{Type: c.stream, Text: c.text})
			}
		case <-ctxDone:
			interruptErr = ctx.Err()
			ctxDone = nil
			grace = time.After(jupyterInterruptGrace)
			if idle && replied {
				continue // only the marks are left: nothing to interrupt
			}
			if started {
				interruptNow()
			} else {
				interruptDue = true
			}
		case <-resignalC:
			// Code that caught the first KeyboardInterrupt (or was in C code) gets another.
			k.interrupt()
		case <-grace:
			if idle && replied {
				// The marks are late (a pipe kept full by a background process): the cell
				// is over all the same.
				return count, interruptErr
			}
			// The cell ignores interrupts; give up waiting but leave the kernel running (its
			// state is kept and it stays busy until the cell ends).
			abandoned = true
			return 0, fmt.Errorf("%s kernel did not stop after interrupt: %w", k.name, interruptErr)
		case <-k.dead:
			return 0, k.diedErr()
		}
	}
	if interruptErr != nil {
		return count, interruptErr
	}
	return count, nil
}

// startCapture makes the fd 1/2 capture deliver to the execution that starts. Chunks left
// in the channel belong to no execution (written between cells, or after an execution
// gave up on its cell): they go to the death-report tail only.
func (k *jupyterKernel) startCapture() {
	for {
		select {
		case <-k.raw:
			continue
		default:
		}
		break
	}
	k.active.Store(true)
}

// writeMarks writes a new end-of-cell mark into the kernel's fd 1 and 2 pipes and returns
// its number. The writes run in the background: a pipe kept full blocks them until the
// reader, which Execute drains, has made room.
func (k *jupyterKernel) writeMarks() uint64 {
	seq := k.markSeq.Add(1)
	m := fmt.Appendf(append([]byte(nil), k.markToken...), "%016x", seq)
	for _, f := range []*os.File{k.rawOut, k.rawErr} {
		go func() { _, _ = f.Write(m) }()
	}
	return seq
}

// readRaw reads one of the kernel's fd 1/2 pipes until it closes (every writer gone),
// splitting out the marks and never splitting a UTF-8 character between chunks.
func (k *jupyterKernel) readRaw(r *os.File, stream string) {
	defer r.Close()
	markLen := len(k.markToken) + 16
	buf := make([]byte, 32<<10)
	var pending []byte
	for {
		n, err := r.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.Index(pending, k.markToken)
			if i < 0 || len(pending) < i+markLen {
				break
			}
			k.deliverRaw(jupyterRaw{stream: stream, text: string(pending[:i])})
			if seq, perr := strconv.ParseUint(string(pending[i+len(k.markToken):i+markLen]), 16, 64); perr == nil {
				k.deliverRaw(jupyterRaw{stream: stream, mark: seq})
			}
			pending = pending[i+markLen:]
		}
		if err != nil {
			k.deliverRaw(jupyterRaw{stream: stream, text: string(pending)})
			return
		}
		// Hold back a mark whose number has not all arrived, the start of a mark, or an
		// incomplete character.
		keep := heldBack(pending, k.markToken)
		if i := bytes.Index(pending, k.markToken); i >= 0 {
			keep = len(pending) - i
		}
		k.deliverRaw(jupyterRaw{stream: stream, text: string(pending[:len(pending)-keep])})
		pending = append(pending[:0:0], pending[len(pending)-keep:]...)
	}
}

// deliverRaw hands a chunk to the active execution; what is written when none is active
// (start-up messages, a background process) only goes to the death-report tail. Everything
// goes there too, so a death report has the kernel's last words.
func (k *jupyterKernel) deliverRaw(c jupyterRaw) {
	if c.mark == 0 {
		if c.text == "" {
			return
		}
		k.output.Write([]byte(c.text))
	}
	if !k.active.Load() {
		return
	}
	select {
	case k.raw <- c:
	case <-k.dead:
	}
}

// interrupt sends SIGINT to the kernel's process group (interrupt_mode "signal", as
// jupyter_client does), which also reaches the code's child processes.
func (k *jupyterKernel) interrupt() {
	_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGINT)
}

// jupyterEvent maps an iopub output message to an Event.
func jupyterEvent(m *jupyterMsg) (Event, bool) {
	switch m.Header.MsgType {
	case "stream":
		var c struct{ Name, Text string }
		if json.Unmarshal(m.Content, &c) != nil {
			return Event{}, false
		}
		if c.Name != "stderr" {
			c.Name = "stdout"
		}
		return Event{Type: c.Name, Text: c.Text}, true
	case "execute_result", "display_data", "update_display_data":
		var c struct {
			Data map[string]any `json:"data"`
		}
		if json.Unmarshal(m.Content, &c) != nil || len(c.Data) == 0 {
			return Event{}, false
		}
		return Event{Type: "result", Data: c.Data, IsMainResult: m.Header.MsgType == "execute_result"}, true
	case "error":
		var c struct {
			Ename     string   `json:"ename"`
			Evalue    string   `json:"evalue"`
			Traceback []string `json:"traceback"`
		}
		if json.Unmarshal(m.Content, &c) != nil {
			return Event{}, false
		}
		return Event{Type: "error", Error: &ExecError{Name: c.Ename, Value: c.Evalue, Traceback: strings.Join(c.Traceback, "\n")}}, true
	}
	return Event{}, false
}

func (k *jupyterKernel) Close() error {
	k.closeOnce.Do(func() {
		k.markDead(errors.New("kernel closed"))
		// No shutdown_request: the kernel's state is thrown away anyway, and SIGKILL to the
		// group also ends whatever the user's code started.
		k.closeErr = killGroup(k.cmd, k.waitDone)
		if k.sockCancel != nil {
			k.sockCancel()
			for _, s := range []zmq4.Socket{k.shell, k.iopub, k.control, k.hbeat} {
				if s != nil {
					s.Close()
				}
			}
		}
		if k.rawOut != nil {
			// The readers end once the processes the kernel started are gone too.
			k.rawOut.Close()
			k.rawErr.Close()
		}
		if err := os.Remove(k.connFile); err != nil && !errors.Is(err, os.ErrNotExist) && k.closeErr == nil {
			k.closeErr = fmt.Errorf("remove connection file: %w", err)
		}
	})
	return k.closeErr
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > t.max {
		t.buf = append([]byte(nil), t.buf[len(t.buf)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
