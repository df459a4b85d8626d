package interp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	_ "embed"
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
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
)

// The JavaScript/TypeScript kernel is a Node process running js/driver.js: a
// JSON-lines driver over vm.runInThisContext (see the script's header for the
// cell rewrites). Measured in notes part B3 against tslab and ijavascript: it
// needs nothing in the sandbox but node (and the TypeScript compiler for TS),
// starts in ~0.25 s and runs a trivial cell in ~1 ms.

//go:embed js/driver.js
var nodeDriver []byte

func init() {
	Register("javascript", startJavaScript)
	Register("typescript", startTypeScript)
}

// typeScriptDirs are where a template may have the TypeScript compiler: the
// Debian node-typescript package (code-interpreter-v1) and npm's global dirs.
var typeScriptDirs = []string{
	"/usr/share/nodejs/typescript",
	"/usr/lib/node_modules/typescript",
	"/usr/local/lib/node_modules/typescript",
}

const (
	// nodeStartTimeout bounds the wait for the driver's ready message (a cold
	// node with the TypeScript compiler loads in well under a second).
	nodeStartTimeout = 30 * time.Second
	// nodeInterruptGrace is how long an interrupted execution may take to
	// finish after SIGINT before the kernel is declared stuck and killed.
	nodeInterruptGrace = 3 * time.Second
	// nodeSyncTimeout bounds the wait for the end markers on fd 1/2 after the
	// driver said done; they only fail to come if the code closed those fds.
	nodeSyncTimeout = 2 * time.Second
)

func startJavaScript(ctx context.Context, opts Options) (Kernel, error) {
	return startNode(ctx, opts, nodeConfig{})
}

func startTypeScript(ctx context.Context, opts Options) (Kernel, error) {
	return startNode(ctx, opts, nodeConfig{typeScript: true})
}

// nodeConfig holds what the registered starters find themselves; tests set
// typeScriptDir to use a template's compiler from the host.
type nodeConfig struct {
	typeScript    bool
	typeScriptDir string // default: the first of typeScriptDirs that exists
}

// lookPath finds the first of names in the PATH of env (the sandbox's, not
// envd's), or "".
func lookPath(env []string, names ...string) string {
	for _, name := range names {
		if p, err := unixuser.LookPath(name, env, "/", envdapi.DefaultPath); err == nil {
			return p
		}
	}
	return ""
}

type nodeMsg struct {
	ID         int            `json:"id"`
	T          string         `json:"t"`
	Text       string         `json:"text"`
	Data       map[string]any `json:"data"`
	Main       bool           `json:"main"`
	Name       string         `json:"name"`
	Value      string         `json:"value"`
	Traceback  string         `json:"traceback"`
	Count      int            `json:"count"`
	Message    string         `json:"message"`
	TypeScript string         `json:"typescript"`
}

// rawMsg is a piece of what the process wrote to fd 1 or 2 (stream 0 or 1),
// or, with sync set, the end marker of one execution on that stream.
type rawMsg struct {
	stream int
	text   string
	sync   bool
}

type nodeKernel struct {
	lang    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	events  chan nodeMsg // closed when fd 3 reaches EOF
	raw     chan rawMsg
	exited  chan struct{} // closed once the process has been waited for
	quit    chan struct{} // closed by Close, releases the readers
	waitErr error

	nextID int
	synced [2]int // end markers seen per stream
	dead   bool

	closeOnce sync.Once
}

func startNode(ctx context.Context, opts Options, cfg nodeConfig) (Kernel, error) {
	lang := "javascript"
	if cfg.typeScript {
		lang = "typescript"
	}
	node := lookPath(opts.Env, "node", "nodejs")
	if node == "" {
		return nil, fmt.Errorf("%s: no node in this sandbox's PATH (the base, node and code-interpreter-v1 templates have it): %w", lang, ErrUnavailable)
	}
	tsDir := ""
	if cfg.typeScript {
		dirs := typeScriptDirs
		if cfg.typeScriptDir != "" {
			dirs = []string{cfg.typeScriptDir}
		}
		for _, d := range dirs {
			if _, err := os.Stat(filepath.Join(d, "package.json")); err == nil {
				tsDir = d
				break
			}
		}
		if tsDir == "" {
			return nil, fmt.Errorf("typescript: no TypeScript compiler in this sandbox (looked in %s); the code-interpreter-v1 template has it: %w", strings.Join(dirs, ", "), ErrUnavailable)
		}
	}
	if opts.RunDir == "" {
		return nil, errors.New("node kernel: no run directory")
	}
	script := filepath.Join(opts.RunDir, "airlock-node-driver.js")
	// 0644: the kernel may run as a user other than envd's.
	if err := os.WriteFile(script, nodeDriver, 0o644); err != nil {
		return nil, fmt.Errorf("node kernel: write driver: %w", err)
	}
	var tok [12]byte
	if _, err := rand.Read(tok[:]); err != nil {
		return nil, fmt.Errorf("node kernel: marker: %w", err)
	}
	// The marker cannot occur in ordinary output by accident: random and
	// framed by ASCII record separators.
	marker := "\x1eairlock-end-" + hex.EncodeToString(tok[:]) + "\x1e"

	args := []string{"--expose-internals", script, marker}
	if tsDir != "" {
		args = append(args, tsDir)
	}
	cmd := exec.Command(node, args...)
	cmd.Dir = opts.Cwd
	cmd.Env = opts.Env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 || opts.UID != uint32(os.Getuid()) || opts.GID != uint32(os.Getgid()) {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: opts.UID, Gid: opts.GID, Groups: opts.Groups}
	}
	evR, evW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("node kernel: %w", err)
	}
	cmd.ExtraFiles = []*os.File{evW} // fd 3
	stdin, err := cmd.StdinPipe()
	if err != nil {
		evR.Close()
		evW.Close()
		return nil, fmt.Errorf("node kernel: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		evR.Close()
		evW.Close()
		return nil, fmt.Errorf("node kernel: %w", err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		evR.Close()
		evW.Close()
		return nil, fmt.Errorf("node kernel: %w", err)
	}
	if err := startKernel(cmd); err != nil {
		evR.Close()
		evW.Close()
		return nil, fmt.Errorf("node kernel: start %s: %w", node, err)
	}
	evW.Close()

	k := &nodeKernel{
		lang:   lang,
		cmd:    cmd,
		stdin:  stdin,
		events: make(chan nodeMsg, 64),
		raw:    make(chan rawMsg, 64),
		exited: make(chan struct{}),
		quit:   make(chan struct{}),
	}
	go k.readEvents(evR)
	go forwardRaw(0, stdout, []byte(marker), k.raw, k.quit)
	go forwardRaw(1, stderr, []byte(marker), k.raw, k.quit)
	go func() {
		k.waitErr = cmd.Wait()
		close(k.exited)
	}()

	timer := time.NewTimer(nodeStartTimeout)
	defer timer.Stop()
	var stderrText strings.Builder
	for {
		select {
		case m, ok := <-k.events:
			if !ok {
				k.Close()
				return nil, fmt.Errorf("%s kernel exited before it was ready: %s", lang, strings.TrimSpace(stderrText.String()))
			}
			switch m.T {
			case "ready":
				return k, nil
			case "fatal":
				k.Close()
				return nil, fmt.Errorf("%s kernel: %s", lang, m.Message)
			}
		case r := <-k.raw:
			if stderrText.Len() < 4096 {
				stderrText.WriteString(r.text)
			}
		case <-ctx.Done():
			k.Close()
			return nil, fmt.Errorf("%s kernel start: %w", lang, ctx.Err())
		case <-timer.C:
			k.Close()
			return nil, fmt.Errorf("%s kernel not ready after %s: %s", lang, nodeStartTimeout, strings.TrimSpace(stderrText.String()))
		}
	}
}

func (k *nodeKernel) readEvents(r *os.File) {
	defer close(k.events)
	defer r.Close()
	sc := bufio.NewScanner(r)
	// Results can carry images: allow lines up to 256 MiB.
	sc.Buffer(make([]byte, 64*1024), 256<<20)
	for sc.Scan() {
		var m nodeMsg
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			continue // not from the driver: ignore rather than die
		}
		select {
		case k.events <- m:
		case <-k.quit:
			return
		}
	}
}

// forwardRaw forwards to out what a kernel process writes to fd 1 or 2
// (stream 0 or 1), split at the end markers, never cutting a UTF-8 sequence or
// a possible marker in two, until r ends or quit is closed. The node and java
// kernels share it.
func forwardRaw(stream int, r io.Reader, marker []byte, out chan<- rawMsg, quit <-chan struct{}) {
	send := func(m rawMsg) bool {
		select {
		case out <- m:
			return true
		case <-quit:
			return false
		}
	}
	buf := make([]byte, 32*1024)
	var pending []byte
	for {
		n, err := r.Read(buf)
		pending = append(pending, buf[:n]...)
		for {
			i := bytes.Index(pending, marker)
			if i < 0 {
				break
			}
			if i > 0 && !send(rawMsg{stream: stream, text: string(pending[:i])}) {
				return
			}
			if !send(rawMsg{stream: stream, sync: true}) {
				return
			}
			pending = pending[i+len(marker):]
		}
		keep := 0
		if err == nil {
			keep = heldBack(pending, marker)
		}
		if len(pending) > keep {
			if !send(rawMsg{stream: stream, text: string(pending[:len(pending)-keep])}) {
				return
			}
			pending = append([]byte(nil), pending[len(pending)-keep:]...)
		}
		if err != nil {
			return
		}
	}
}

// heldBack is how many trailing bytes of b must wait for more input: a prefix
// of the marker, or an incomplete UTF-8 sequence.
func heldBack(b, marker []byte) int {
	for k := min(len(marker)-1, len(b)); k > 0; k-- {
		if bytes.Equal(b[len(b)-k:], marker[:k]) {
			return k
		}
	}
	for k := 1; k <= 3 && k <= len(b); k++ {
		c := b[len(b)-k]
		if utf8.RuneStart(c) {
			if !utf8.FullRune(b[len(b)-k:]) {
				return k
			}
			break
		}
	}
	return 0
}

func (k *nodeKernel) died() error {
	k.dead = true
	select {
	case <-k.exited:
	case <-time.After(time.Second):
	}
	// Children of the kernel are of no use without it.
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
	return fmt.Errorf("%s kernel (%s): %w", k.lang, status, ErrKernelDied)
}

func (k *nodeKernel) Execute(ctx context.Context, code string, env map[string]string, emit func(Event)) (int, error) {
	if k.dead {
		return 0, fmt.Errorf("%s kernel: %w", k.lang, ErrKernelDied)
	}
	k.nextID++
	id := k.nextID
	req, err := json.Marshal(map[string]any{"id": id, "code": code, "ts": k.lang == "typescript", "env": env})
	if err != nil {
		return 0, fmt.Errorf("%s kernel: encode request: %w", k.lang, err)
	}
	if _, err := k.stdin.Write(append(req, '\n')); err != nil {
		return 0, k.died()
	}

	ctxDone := ctx.Done()
	var grace, syncWait <-chan time.Time
	var interruptTick *time.Ticker
	var tick <-chan time.Time
	defer func() {
		if interruptTick != nil {
			interruptTick.Stop()
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
				continue // output of an earlier, abandoned execution or of an idle timer
			}
			switch m.T {
			case "done":
				doneCount = m.Count
				events = nil
				syncWait = time.After(nodeSyncTimeout)
			case "stdout", "stderr":
				if !interrupted {
					emit(Event{Type: m.T, Text: m.Text})
				}
			case "result":
				if !interrupted {
					emit(Event{Type: "result", Data: m.Data, IsMainResult: m.Main})
				}
			case "error":
				if !interrupted {
					emit(Event{Type: "error", Error: &ExecError{Name: m.Name, Value: m.Value, Traceback: m.Traceback}})
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
			// The client went away or timed out: interrupt like ^C, keep the
			// state, and give the cell a moment to unwind.
			ctxDone = nil
			interrupted = true
			_ = k.cmd.Process.Signal(syscall.SIGINT)
			grace = time.After(nodeInterruptGrace)
			// Repeat: a SIGINT landing between two statements of the driver
			// (before the cell's script started) is only recorded.
			interruptTick = time.NewTicker(200 * time.Millisecond)
			tick = interruptTick.C
		case <-tick:
			if doneCount < 0 {
				_ = k.cmd.Process.Signal(syscall.SIGINT)
			}
		case <-grace:
			// The cell ignores SIGINT (e.g. a busy native call): a stuck kernel
			// would block every later execution, so it is killed.
			_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
			k.dead = true
			return 0, ctx.Err()
		case <-k.exited:
			if doneCount >= 0 {
				return doneCount, nil
			}
			// Drain what the process managed to say before it went. fd 3 may
			// stay open in a background child (libuv does not close inherited
			// fds), so the drain is bounded rather than waiting for EOF.
			drain := time.After(100 * time.Millisecond)
		drainLoop:
			for {
				select {
				case m, ok := <-events:
					if !ok {
						break drainLoop
					}
					if m.ID == id && !interrupted {
						switch m.T {
						case "stdout", "stderr":
							emit(Event{Type: m.T, Text: m.Text})
						case "error":
							emit(Event{Type: "error", Error: &ExecError{Name: m.Name, Value: m.Value, Traceback: m.Traceback}})
						}
					}
				case <-drain:
					break drainLoop
				}
			}
			return 0, k.died()
		}
	}
}

// Close stops the kernel: stdin closed, then the whole process group killed.
func (k *nodeKernel) Close() error {
	k.closeOnce.Do(func() {
		k.dead = true
		_ = k.stdin.Close()
		_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
		close(k.quit)
		<-k.exited
	})
	return nil
}
