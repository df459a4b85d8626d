package interp

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// The Java kernel is a JVM running templates/code-interpreter-v1/java-kernel
// (AirlockKernel.java, compiled into javaKernelDir by that template's
// Dockerfile): cells evaluated with the JDK's JShell API in the kernel's own
// JVM, so state persists and a trivial cell costs milliseconds (JShell's
// default engine, a second JVM driven over JDI, costs ~400 ms per cell; notes
// part B3). E2B runs IJava, which is not packaged in Debian; the behaviour
// follows IJava's (see the Java file's header) with E2B's env-vars-as-system-
// properties contract.
//
// The protocol is the kernel's own, not Jupyter's: requests as JSON lines on
// fd 3, events as JSON lines on fd 4, stdin /dev/null, and fd 1/2 raw (the
// code's System.out/err and its child processes), each closed per cell by a
// random end marker, as in the node kernel.
//
// Interrupt: an interrupt request for the cell; the kernel stops the cell's
// thread (Thread.stop, as JShell's own local engine does) and answers whether
// the cell was running, and then the process group gets SIGINT so that the
// child processes the cell waits for end too (^C semantics). The JVM ignores
// SIGINT itself. A cell that does not end within javaInterruptGrace (it caught
// ThreadDeath, or sits in native code) gets the kernel killed.

func init() { Register("java", startJava) }

const (
	// javaKernelDir is where code-interpreter-v1 compiles the kernel.
	javaKernelDir = "/usr/local/lib/airlock/java-kernel"
	// javaKernelClass is the kernel's main class, in javaKernelDir.
	javaKernelClass = "airlock.kernel.AirlockKernel"
	// javaStartTimeout bounds the wait for ready: the JVM starts in ~0.1 s,
	// but warming javac up (the default imports) takes ~1 s, more on a
	// loaded machine.
	javaStartTimeout = 60 * time.Second
	// javaInterruptGrace is how long an interrupted cell may take to end
	// before the kernel is declared stuck and killed.
	javaInterruptGrace = 5 * time.Second
	// javaInterruptRepeat is how often the interrupt is sent again while the
	// cell runs: code may catch one ThreadDeath.
	javaInterruptRepeat = 500 * time.Millisecond
	// javaSyncTimeout bounds the wait for the end markers after done; they
	// only fail to come if the code closed fd 1 or 2.
	javaSyncTimeout = 2 * time.Second
)

// javaArgs are the JVM's options. The opens let the kernel use inherited fds
// 3/4 and edit the map behind System.getenv(); the incubator module lets it
// call libc's setenv so child processes see an execution's env (the kernel
// does without it on a JDK that lacks it). SerialGC: one context's JVM has
// no use for parallel GC threads, and it keeps the footprint small.
// -UsePerfData: no hsperfdata file in /tmp.
var javaArgs = []string{
	"-XX:+UseSerialGC",
	"-XX:-UsePerfData",
	"-Dfile.encoding=UTF-8",
	"--add-opens", "java.base/java.io=ALL-UNNAMED",
	"--add-opens", "java.base/java.util=ALL-UNNAMED",
	"--add-modules", "jdk.incubator.foreign",
	"--enable-native-access=ALL-UNNAMED",
}

func startJava(ctx context.Context, opts Options) (Kernel, error) {
	return startJavaWith(ctx, opts, javaKernelDir)
}

type javaMsg struct {
	ID        int    `json:"id"`
	T         string `json:"t"`
	Text      string `json:"text"`
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
	Count     int    `json:"count"`
	Running   bool   `json:"running"`
	Sigint    bool   `json:"sigint"`
	Message   string `json:"message"`
}

type javaKernel struct {
	cmd      *exec.Cmd
	requests io.WriteCloser // fd 3
	events   chan javaMsg   // fd 4; closed at its EOF
	raw      chan rawMsg    // fd 1 and 2
	exited   chan struct{}  // closed once the process has been waited for
	quit     chan struct{}  // closed by Close, releases the readers
	waitErr  error
	sigint   bool // the JVM ignores SIGINT, so the group may get one

	nextID int
	synced [2]int // end markers seen per stream since ready
	dead   bool

	closeOnce sync.Once
}

// startJavaWith starts the kernel whose classes are in classDir (tests compile
// the template's source into a directory of their own).
func startJavaWith(ctx context.Context, opts Options, classDir string) (Kernel, error) {
	java := lookPath(opts.Env, "java")
	if java == "" {
		return nil, fmt.Errorf("java: no java in this sandbox's PATH (the code-interpreter-v1 template has it): %w", ErrUnavailable)
	}
	main := filepath.Join(classDir, filepath.FromSlash(strings.ReplaceAll(javaKernelClass, ".", "/"))+".class")
	if _, err := os.Stat(main); err != nil {
		return nil, fmt.Errorf("java: Airlock's Java kernel is not in this sandbox (%s; the code-interpreter-v1 template has it): %w", main, ErrUnavailable)
	}
	var tok [12]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, fmt.Errorf("java kernel: marker: %w", err)
	}
	// Random and framed by ASCII record separators: never ordinary output.
	marker := "\x1eairlock-end-" + hex.EncodeToString(tok[:]) + "\x1e"

	args := append(append([]string(nil), javaArgs...), "-cp", classDir, javaKernelClass, marker)
	cmd := exec.Command(java, args...)
	cmd.Dir = opts.Cwd
	cmd.Env = opts.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 || opts.UID != uint32(os.Getuid()) || opts.GID != uint32(os.Getgid()) {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: opts.UID, Gid: opts.GID, Groups: opts.Groups}
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("java kernel: %w", err)
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		reqR.Close()
		reqW.Close()
		return nil, fmt.Errorf("java kernel: %w", err)
	}
	closeAll := func() {
		for _, f := range []*os.File{reqR, reqW, evR, evW} {
			f.Close()
		}
	}
	cmd.ExtraFiles = []*os.File{reqR, evW} // fd 3, fd 4
	// cmd.Stdin stays nil: /dev/null.
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("java kernel: %w", err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		closeAll()
		return nil, fmt.Errorf("java kernel: %w", err)
	}
	if err := startKernel(cmd); err != nil {
		closeAll()
		return nil, fmt.Errorf("java kernel: start %s: %w", java, err)
	}
	reqR.Close()
	evW.Close()

	k := &javaKernel{
		cmd:      cmd,
		requests: reqW,
		events:   make(chan javaMsg, 64),
		raw:      make(chan rawMsg, 64),
		exited:   make(chan struct{}),
		quit:     make(chan struct{}),
	}
	go k.readEvents(evR)
	go forwardRaw(0, stdout, []byte(marker), k.raw, k.quit)
	go forwardRaw(1, stderr, []byte(marker), k.raw, k.quit)
	go func() {
		k.waitErr = cmd.Wait()
		close(k.exited)
	}()

	timer := time.NewTimer(javaStartTimeout)
	defer timer.Stop()
	var said strings.Builder // what the JVM wrote while starting, for errors
	ready := false
	for !ready || k.synced[0] < 1 || k.synced[1] < 1 {
		select {
		case m, ok := <-k.events:
			if !ok {
				k.Close()
				return nil, fmt.Errorf("java kernel exited before it was ready: %s", strings.TrimSpace(said.String()))
			}
			switch m.T {
			case "ready":
				ready = true
				k.sigint = m.Sigint
			case "fatal":
				k.Close()
				return nil, fmt.Errorf("java kernel: %s", m.Message)
			}
		case r := <-k.raw:
			if r.sync {
				k.synced[r.stream]++
			} else if said.Len() < 4096 {
				said.WriteString(r.text)
			}
		case <-ctx.Done():
			k.Close()
			return nil, fmt.Errorf("java kernel start: %w", ctx.Err())
		case <-timer.C:
			k.Close()
			return nil, fmt.Errorf("java kernel not ready after %s: %s", javaStartTimeout, strings.TrimSpace(said.String()))
		}
	}
	k.synced = [2]int{}
	return k, nil
}

func (k *javaKernel) readEvents(r *os.File) {
	defer close(k.events)
	defer r.Close()
	sc := bufio.NewScanner(r)
	// A result or traceback may be long (a big collection's toString).
	sc.Buffer(make([]byte, 64*1024), 256<<20)
	for sc.Scan() {
		var m javaMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			continue // not from the kernel: ignore rather than die
		}
		select {
		case k.events <- m:
		case <-k.quit:
			return
		}
	}
}

func (k *javaKernel) send(req map[string]any) error {
	b, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("java kernel: encode request: %w", err)
	}
	if _, err := k.requests.Write(append(b, '\n')); err != nil {
		return fmt.Errorf("java kernel: write request: %w", err)
	}
	return nil
}

func (k *javaKernel) died() error {
	k.dead = true
	select {
	case <-k.exited:
	case <-time.After(time.Second):
	}
	// What the code started is of no use without the kernel.
	_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
	status := "unknown status"
	select {
	case <-k.exited:
		if k.waitErr != nil {
			status = k.waitErr.Error()
		} else {
			status = "exit status 0"
		}
	default:
	}
	return fmt.Errorf("java kernel (%s): %w", status, ErrKernelDied)
}

func (k *javaKernel) Execute(ctx context.Context, code string, env map[string]string, emit func(Event)) (int, error) {
	if k.dead {
		return 0, fmt.Errorf("java kernel: %w", ErrKernelDied)
	}
	k.nextID++
	id := k.nextID
	if env == nil {
		env = map[string]string{}
	}
	if err := k.send(map[string]any{"t": "exec", "id": id, "code": code, "env": env}); err != nil {
		if errors.Is(err, syscall.EPIPE) || errors.Is(err, os.ErrClosed) {
			return 0, k.died()
		}
		return 0, err
	}

	ctxDone := ctx.Done()
	var grace, syncWait <-chan time.Time
	var repeat *time.Ticker
	var tick <-chan time.Time
	defer func() {
		if repeat != nil {
			repeat.Stop()
		}
	}()
	interrupted := false
	doneCount := -1
	events := k.events
	for {
		if doneCount >= 0 && k.synced[0] >= id && k.synced[1] >= id {
			if interrupted {
				return doneCount, ctx.Err()
			}
			return doneCount, nil
		}
		select {
		case m, ok := <-events:
			if !ok {
				return 0, k.died()
			}
			if m.ID != id {
				continue // an answer about an earlier, abandoned execution
			}
			switch m.T {
			case "done":
				doneCount = m.Count
				events = nil
				syncWait = time.After(javaSyncTimeout)
			case "result":
				if !interrupted {
					emit(Event{Type: "result", Data: map[string]any{"text/plain": m.Text}, IsMainResult: true})
				}
			case "error":
				if !interrupted {
					emit(Event{Type: "error", Error: &ExecError{Name: m.Name, Value: m.Value, Traceback: m.Traceback}})
				}
			case "interrupting":
				// The cell's thread is being stopped: now ^C its child
				// processes. The JVM ignores SIGINT (else it would exit).
				if m.Running && k.sigint {
					_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGINT)
				}
			}
		case r := <-k.raw:
			if r.sync {
				k.synced[r.stream]++
				continue
			}
			// Output before the previous execution's marker belongs to it.
			if k.synced[r.stream] >= id-1 && !interrupted {
				typ := "stdout"
				if r.stream == 1 {
					typ = "stderr"
				}
				emit(Event{Type: typ, Text: r.text})
			}
		case <-syncWait:
			// The code closed fd 1 or 2: no marker will come.
			k.synced = [2]int{id, id}
		case <-ctxDone:
			// The client went away or timed out: stop the cell, keep the state.
			ctxDone = nil
			interrupted = true
			_ = k.send(map[string]any{"t": "interrupt", "id": id})
			grace = time.After(javaInterruptGrace)
			repeat = time.NewTicker(javaInterruptRepeat)
			tick = repeat.C
		case <-tick:
			if doneCount < 0 {
				_ = k.send(map[string]any{"t": "interrupt", "id": id})
			}
		case <-grace:
			// The cell will not stop: a stuck kernel would block every later
			// execution, so it is killed.
			_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
			k.dead = true
			return 0, ctx.Err()
		case <-k.exited:
			if doneCount >= 0 {
				return doneCount, nil
			}
			// Deliver what the kernel said before it went (System.exit in
			// the cell); fd 4 can outlive it in a background child, so the
			// wait is bounded.
			drain := time.After(100 * time.Millisecond)
		drainLoop:
			for {
				select {
				case m, ok := <-events:
					if !ok {
						break drainLoop
					}
					if m.ID == id && m.T == "error" && !interrupted {
						emit(Event{Type: "error", Error: &ExecError{Name: m.Name, Value: m.Value, Traceback: m.Traceback}})
					}
				case r := <-k.raw:
					if !r.sync && k.synced[r.stream] >= id-1 && !interrupted {
						typ := "stdout"
						if r.stream == 1 {
							typ = "stderr"
						}
						emit(Event{Type: typ, Text: r.text})
					}
				case <-drain:
					break drainLoop
				}
			}
			return 0, k.died()
		}
	}
}

// Close stops the kernel: requests closed, then the whole process group killed.
func (k *javaKernel) Close() error {
	k.closeOnce.Do(func() {
		k.dead = true
		_ = k.requests.Close()
		_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		close(k.quit)
		<-k.exited
	})
	return nil
}
