package interp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// The bash backend: one long-lived `bash --noprofile --norc` per context, fed on
// its stdin. Debian has no bash_kernel (and PyPI is out of reach), and a shell
// with a sentinel is all bash_kernel does anyway (it drives bash through
// pexpect).
//
// Each cell is written to a file and sourced with stdin from /dev/null, so a
// command that reads stdin (cat, read) gets EOF instead of eating the driver's
// next lines. After it, the shell prints a marker line with "$?" on stdout and a
// marker line on stderr; the execution is complete when both have arrived, so
// no output of the cell is mixed into the next one.
//
// Semantics, matched to bash_kernel (what E2B runs): variables, functions, cwd
// persist; stdout and stderr stream as they come (bash_kernel merges them into
// stdout through its pty; we keep them apart, which the protocol allows); a
// non-zero exit status of the cell's last command is an error event with an
// empty name and the status as value, as bash_kernel reports it; `exit` kills
// the kernel (the core restarts it on next use).
//
// Interrupt: SIGINT to the shell's process group (the shell and the cell's
// foreground commands; background jobs of a non-interactive shell ignore
// SIGINT, as in a terminal). The shell traps INT with `return`, which leaves
// the sourced cell and keeps the shell and its state.

func init() { Register("bash", startBash) }

// bashInit is written once at start: between cells the shell ignores SIGINT.
// Each cell line sets `trap 'return 130' INT` (leave the sourced cell) and
// resets it to ignore afterwards. The reset matters: bash 5.2 stops running
// an INT trap whose `return` fired while it waited for a child (an
// interrupted sleep) until the trap is set again, so a later builtin-only loop
// could not be interrupted.
const bashInit = "trap '' INT\n"

var shellName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

type bashKernel struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	marker string
	dir    string // where cells are written
	ownDir bool   // dir was made by the kernel (no RunDir given)
	uid    int
	gid    int

	stdout <-chan []byte
	stderr <-chan []byte
	dead   chan struct{} // closed when the shell has exited

	mu    sync.Mutex // one Execute at a time (the core serialises too) and Close
	count int
}

func startBash(ctx context.Context, opts Options) (Kernel, error) {
	bin := lookPath(opts.Env, "bash")
	if bin == "" {
		return nil, fmt.Errorf("%w: bash not found in PATH", ErrUnavailable)
	}
	var mb [12]byte
	_, _ = rand.Read(mb[:])
	k := &bashKernel{marker: "__airlock_cell_end_" + hex.EncodeToString(mb[:]), dir: opts.RunDir, uid: int(opts.UID), gid: int(opts.GID), dead: make(chan struct{})}
	var err error
	if k.dir == "" {
		if k.dir, err = os.MkdirTemp("", "airlock-bash-"); err != nil {
			return nil, fmt.Errorf("bash kernel dir: %w", err)
		}
		k.ownDir = true
		if os.Geteuid() == 0 {
			_ = os.Chown(k.dir, k.uid, k.gid)
		}
	}
	cmd := exec.Command(bin, "--noprofile", "--norc")
	cmd.Dir = opts.Cwd
	cmd.Env = opts.Env
	// Its own process group, so an interrupt reaches the cell's foreground
	// commands and Close can end everything the shell started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: opts.UID, Gid: opts.GID, Groups: opts.Groups}
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, fmt.Errorf("bash stdin: %w", err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("bash stdout: %w", err)
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, fmt.Errorf("bash stderr: %w", err)
	}
	cmd.Stdout, cmd.Stderr = outW, errW
	if err := startKernel(cmd); err != nil {
		outR.Close()
		outW.Close()
		errR.Close()
		errW.Close()
		if k.ownDir {
			os.RemoveAll(k.dir)
		}
		return nil, fmt.Errorf("starting bash: %w", err)
	}
	outW.Close()
	errW.Close()
	k.cmd, k.stdin = cmd, stdin
	k.stdout, k.stderr = pump(outR), pump(errR)
	go func() {
		_ = cmd.Wait()
		close(k.dead)
	}()
	if _, err := io.WriteString(stdin, bashInit); err != nil {
		k.Close()
		return nil, fmt.Errorf("bash init: %w", err)
	}
	return k, nil
}

// pump turns a pipe into a channel of chunks, closed at EOF.
func pump(r *os.File) <-chan []byte {
	ch := make(chan []byte, 64)
	go func() {
		defer close(ch)
		defer r.Close()
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				ch <- bytes.Clone(buf[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	return ch
}

func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// splitter finds the end marker in one output stream while passing everything
// before it through as soon as it is known not to be part of the marker.
type splitter struct {
	marker []byte // the cell's end marker, right after its last output
	buf    []byte
	found  bool
	status string // the text after the marker up to its newline (the exit status on stdout)
}

// feed adds data and returns what can be emitted now.
func (s *splitter) feed(data []byte) []byte {
	if s.found {
		return nil // nothing of this cell comes after its marker
	}
	s.buf = append(s.buf, data...)
	if i := bytes.Index(s.buf, s.marker); i >= 0 {
		rest := s.buf[i+len(s.marker):]
		nl := bytes.IndexByte(rest, '\n')
		if nl < 0 {
			// The marker's line is not complete yet: emit what precedes it.
			out := bytes.Clone(s.buf[:i])
			s.buf = s.buf[i:]
			return out
		}
		s.found = true
		s.status = strings.TrimSpace(string(rest[:nl]))
		out := s.buf[:i]
		s.buf = nil
		return out
	}
	// Hold back a tail that may be the start of the marker, and an incomplete
	// UTF-8 sequence, so text events are whole characters.
	hold := 0
	for n := min(len(s.marker)-1, len(s.buf)); n > 0; n-- {
		if bytes.HasPrefix(s.marker, s.buf[len(s.buf)-n:]) {
			hold = n
			break
		}
	}
	cut := len(s.buf) - hold
	for back := 0; back < utf8.UTFMax && cut-back > 0; back++ {
		r := s.buf[cut-back-1]
		if r < utf8.RuneSelf {
			break
		}
		if utf8.RuneStart(r) {
			if !utf8.FullRune(s.buf[cut-back-1 : cut]) {
				cut = cut - back - 1
			}
			break
		}
	}
	out := bytes.Clone(s.buf[:cut])
	s.buf = s.buf[cut:]
	return out
}

func (k *bashKernel) Execute(ctx context.Context, code string, env map[string]string, emit func(Event)) (int, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	select {
	case <-k.dead:
		return 0, fmt.Errorf("%w: bash exited", ErrKernelDied)
	default:
	}
	k.count++
	cell := filepath.Join(k.dir, "cell.sh")
	if err := os.WriteFile(cell, []byte(code), 0o644); err != nil {
		return 0, fmt.Errorf("writing cell: %w", err)
	}
	var line strings.Builder
	line.WriteString("trap 'return 130' INT; ")
	// Assignments before `.` last for the cell only and are exported to its
	// commands (bash outside POSIX mode): per-execution env, restored after.
	for name, v := range env {
		if shellName.MatchString(name) {
			line.WriteString(name + "=" + shellQuote(v) + " ")
		}
	}
	// The markers start where the cell's output ends, with no newline of their
	// own in front: a newline the cell wrote last is then plainly its own and is
	// never held back as a possible start of the marker (which split "bar\n"
	// into "bar" and "\n" whenever the marker came in a later read).
	fmt.Fprintf(&line, ". %s </dev/null; printf '%%s %%d\\n' %s \"$?\"; trap '' INT; printf '%%s\\n' %s >&2\n",
		shellQuote(cell), k.marker, k.marker)
	if _, err := io.WriteString(k.stdin, line.String()); err != nil {
		return 0, fmt.Errorf("%w: writing to bash: %v", ErrKernelDied, err)
	}

	out := &splitter{marker: []byte(k.marker + " ")}
	errs := &splitter{marker: []byte(k.marker)}
	stdout, stderr := k.stdout, k.stderr
	var interrupt <-chan time.Time
	ctxDone := ctx.Done()
	for !out.found || !errs.found {
		select {
		case b, ok := <-stdout:
			if !ok {
				stdout = nil
				continue
			}
			if t := out.feed(b); len(t) > 0 {
				emit(Event{Type: "stdout", Text: string(t)})
			}
		case b, ok := <-stderr:
			if !ok {
				stderr = nil
				continue
			}
			if t := errs.feed(b); len(t) > 0 {
				emit(Event{Type: "stderr", Text: string(t)})
			}
		case <-ctxDone:
			ctxDone = nil
			k.interrupt()
			// Repeat: the first SIGINT may land before the shell entered the
			// cell, where the trap does nothing.
			t := time.NewTicker(300 * time.Millisecond)
			defer t.Stop()
			interrupt = t.C
		case <-interrupt:
			k.interrupt()
		case <-k.dead:
			// Drain what the shell wrote before dying.
			for b := range drain(stdout) {
				if t := out.feed(b); len(t) > 0 {
					emit(Event{Type: "stdout", Text: string(t)})
				}
			}
			for b := range drain(stderr) {
				if t := errs.feed(b); len(t) > 0 {
					emit(Event{Type: "stderr", Text: string(t)})
				}
			}
			return 0, fmt.Errorf("%w: bash exited (%v)", ErrKernelDied, k.cmd.ProcessState)
		}
	}
	if ctx.Err() != nil {
		return 0, ctx.Err()
	}
	if out.status != "0" {
		if _, err := strconv.Atoi(out.status); err != nil {
			return 0, fmt.Errorf("bash: unexpected end marker %q", out.status)
		}
		emit(Event{Type: "error", Error: &ExecError{Name: "", Value: out.status}})
	}
	return k.count, nil
}

// drain returns the chunks already buffered in ch (briefly waiting for the pipe's
// end, which follows the shell's exit unless a background job holds it open).
func drain(ch <-chan []byte) func(func([]byte) bool) {
	return func(yield func([]byte) bool) {
		if ch == nil {
			return
		}
		deadline := time.After(100 * time.Millisecond)
		for {
			select {
			case b, ok := <-ch:
				if !ok || !yield(b) {
					return
				}
			case <-deadline:
				return
			}
		}
	}
}

func (k *bashKernel) interrupt() {
	_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGINT)
}

// Close kills the shell's process group and waits for the shell to go.
func (k *bashKernel) Close() error {
	_ = k.stdin.Close()
	_ = syscall.Kill(-k.cmd.Process.Pid, syscall.SIGKILL)
	select {
	case <-k.dead:
	case <-time.After(5 * time.Second):
		return errors.New("bash kernel did not exit after SIGKILL")
	}
	if k.ownDir {
		_ = os.RemoveAll(k.dir)
	}
	return nil
}
