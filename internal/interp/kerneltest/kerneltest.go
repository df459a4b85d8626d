// Package kerneltest is the conformance suite every interpreter backend passes,
// as runtimetest is for runtime backends: each language backend's test gives a
// Harness (how to start its kernel, and a few snippets of code in its language)
// and calls Run. The suite checks the interp.Kernel contract the core relies on;
// what only one language has (Python's rich results, TypeScript, bash's exit
// statuses) stays in that backend's own tests.
//
// # The life of a kernel
//
// A kernel is one context's language runtime: a process (or process group) of
// its own, started by the backend's interp.Starter, and used by one context at
// a time.
//
//  1. Start. The Starter starts the kernel with interp.Options: it runs as
//     Options.UID/GID with the given groups, in Options.Cwd, with Options.Env
//     (the sandbox's env). The start's context bounds the start only; the
//     kernel lives until Close.
//  2. Execute, any number of times, one at a time. Each call runs one cell.
//     What a cell defines (variables, functions, imports) is there for the
//     next. Output is emitted while the cell runs, not when it ends: stdout
//     and stderr text in order within each stream and in whole UTF-8
//     characters, including what child processes write to the kernel's own
//     fd 1 and 2; none of it is ever attributed to another cell. An exception
//     in the code (a command's failure, for bash) is an error event, not an
//     error return: the kernel lives on. The env given to Execute applies to
//     that cell and the processes it starts, and is gone afterwards. Execute
//     returns the execution count, one more for every cell. The code's stdin
//     is empty, so nothing it starts can read what the kernel reads.
//  3. Interrupt. There is no Interrupt method: ending Execute's context is the
//     interrupt (the client went away, or timed out), and it may come at any
//     moment, even before the kernel has started the cell. The kernel stops
//     the cell as ^C would (the processes it waits for too), returns
//     ctx.Err(), keeps its state, and the next Execute runs normally.
//  4. Death. When the kernel's process goes (the code exited it, or it
//     crashed), Execute returns an error wrapping interp.ErrKernelDied, and so
//     does every later Execute. The core then closes the kernel and starts a
//     new one (empty state) on the context's next use.
//  5. Close. It stops the kernel and every process the code started. It may
//     be called while a cell runs (the context was deleted or restarted): that
//     Execute then returns promptly with an error wrapping ErrKernelDied.
//
// The suite starts a kernel of its own for each contract point (subtests are
// named after them), so a failure names what broke. It needs root only for
// RunsAsUser. It asserts no durations: waits are bounded only so that a hang
// fails instead of stalling the run.
package kerneltest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/internal/interp"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// Harness tells the suite how to start a backend's kernel and how to say a few
// things in its language.
//
// The suite joins snippets with "\n" into one cell, so each must be complete
// statements at the top level of a cell. Text the suite passes to a snippet is
// printable (it may hold quotes, spaces, '$' and non-ASCII letters): quote it
// as a string literal of the language.
type Harness struct {
	// Language is the normalised language name the core would start the
	// backend for (interp.Options.Language).
	Language string
	// Start starts the backend's kernel: its registered Starter, or the
	// backend's own start function.
	Start interp.Starter
	// Env is added to the environment the suite starts kernels with (PATH,
	// HOME, LANG and a variable of its own); a later entry wins.
	Env []string

	// Print writes text and a newline to stdout through the language's own
	// output (print, console.log, printf).
	Print func(text string) string
	// PrintErr writes text and a newline to stderr.
	PrintErr func(text string) string
	// Repeat writes s n times, then a newline, to stdout, without putting the
	// whole output in the code (s holds no % and no backslash).
	Repeat func(s string, n int) string
	// Set assigns the string value to a top-level variable called name (a
	// valid identifier in every language). It writes nothing.
	Set func(name, value string) string
	// PrintVar writes the value of the variable called name and a newline.
	PrintVar func(name string) string
	// PrintEnv writes the value of the environment variable called name and a
	// newline, or just the newline when it is unset.
	PrintEnv func(name string) string
	// PrintCwd writes the working directory and a newline.
	PrintCwd string
	// PrintFile writes the contents of the file at path.
	PrintFile func(path string) string
	// Shell runs `/bin/sh -c cmd` as a child process that writes to the
	// kernel's own fd 1 and 2, and waits for it to exit.
	Shell func(cmd string) string
	// Sleep waits (a sleep, a timer) far longer than any test runs.
	Sleep string
	// Spin loops forever without waiting for anything.
	Spin string
	// Exit ends the kernel's process from inside, as user code can.
	Exit string
	// Raise, as the last statement of a cell, fails the way user code fails
	// (an exception; a command's non-zero status in a shell).
	Raise string
	// RaiseName and RaiseValue are the error event Raise gives.
	RaiseName, RaiseValue string

	// DeathKeepsOutput says the kernel delivers what a cell wrote before the
	// kernel's process exited. The contract does not promise it (the Python
	// backends may lose such output, which races the exit); a backend that
	// keeps it says so, and the suite checks it.
	DeathKeepsOutput bool
	// NoExecutionEnv, if set, says why the backend cannot apply an execution's
	// env (a Jupyter kernel started from its kernelspec, which the core cannot
	// tell how to set variables); the suite then skips EnvPerExecution.
	NoExecutionEnv string
	// KnownBugs maps a contract point (a subtest's name) that the backend
	// does not meet yet to the bug, which the suite reports as the reason it
	// skips that point. An entry goes with the fix.
	KnownBugs map[string]string
}

const (
	// patience bounds every wait of the suite. It is no performance
	// assertion: it turns a hang into a failure on a loaded machine.
	patience = 2 * time.Minute
	// baseEnv is in every kernel's env (value "base"), so the suite can tell
	// an execution's env is restored rather than merely unset.
	baseEnv = "AIRLOCK_KERNELTEST_BASE"
	// nobody is the user RunsAsUser starts kernels as.
	nobody = 65534
)

// A point is one point of the contract, a subtest of Run.
type point struct {
	name string
	test func(*testing.T, Harness)
}

var points = []point{
	{"StatePersists", testStatePersists},
	{"ExecutionCount", testExecutionCount},
	{"StdoutAndStderr", testStdoutAndStderr},
	{"OutputStreamsWhileRunning", testStreamsWhileRunning},
	{"ChildProcessOutput", testChildProcessOutput},
	{"ChildStdinIsEmpty", testChildStdinIsEmpty},
	{"LargeOutput", testLargeOutput},
	{"ErrorIsAnEvent", testErrorIsAnEvent},
	{"EnvPerExecution", testEnvPerExecution},
	{"Cwd", testCwd},
	{"InterruptKeepsState", testInterruptKeepsState},
	{"InterruptReachesChildProcesses", testInterruptReachesChildren},
	{"InterruptBeforeTheCellRuns", testInterruptBeforeTheCellRuns},
	{"ExitIsDeathThenRestart", testExitIsDeath},
	{"CloseDuringExecute", testCloseDuringExecute},
	{"CloseEndsChildProcesses", testCloseEndsChildren},
	{"RunsAsUser", testRunsAsUser},
}

// Run runs the conformance suite against h.
func Run(t *testing.T, h Harness) {
	h.validate(t)
	for _, p := range points {
		t.Run(p.name, func(t *testing.T) {
			if bug, ok := h.KnownBugs[p.name]; ok {
				t.Skipf("known bug of this backend: %s", bug)
			}
			p.test(t, h)
		})
	}
}

func (h Harness) validate(t *testing.T) {
	t.Helper()
	var lack []string
	for name, missing := range map[string]bool{
		"Language": h.Language == "", "Start": h.Start == nil,
		"Print": h.Print == nil, "PrintErr": h.PrintErr == nil, "Repeat": h.Repeat == nil,
		"Set": h.Set == nil, "PrintVar": h.PrintVar == nil, "PrintEnv": h.PrintEnv == nil,
		"PrintCwd": h.PrintCwd == "", "PrintFile": h.PrintFile == nil, "Shell": h.Shell == nil,
		"Sleep": h.Sleep == "", "Spin": h.Spin == "", "Exit": h.Exit == "", "Raise": h.Raise == "",
	} {
		if missing {
			lack = append(lack, name)
		}
	}
	if len(lack) > 0 {
		sort.Strings(lack)
		t.Fatalf("kerneltest: the harness lacks %s", strings.Join(lack, ", "))
	}
	for name := range h.KnownBugs {
		if !slices.ContainsFunc(points, func(p point) bool { return p.name == name }) {
			t.Fatalf("kerneltest: KnownBugs names %q, which is no contract point of the suite", name)
		}
	}
}

// cell joins snippets into the code of one cell.
func cell(snippets ...string) string { return strings.Join(snippets, "\n") }

// options returns Options for a kernel running as uid/gid, with a cwd, home
// and run directory of its own that the user can reach.
func (h Harness) options(t *testing.T, uid, gid uint32, groups []uint32) interp.Options {
	t.Helper()
	// Not t.TempDir: its parent is private to the test's user, and a kernel
	// may run as another.
	root, err := os.MkdirTemp("", "airlock-kerneltest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{}
	for _, name := range []string{"cwd", "home", "run"} {
		d := filepath.Join(root, name)
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if os.Geteuid() == 0 {
			if err := os.Chown(d, int(uid), int(gid)); err != nil {
				t.Fatal(err)
			}
		}
		dirs[name] = d
	}
	env := []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=" + dirs["home"], "LANG=C.UTF-8", baseEnv + "=base"}
	return interp.Options{
		Language: h.Language,
		Cwd:      dirs["cwd"],
		UID:      uid,
		GID:      gid,
		Groups:   groups,
		Home:     dirs["home"],
		Env:      append(env, h.Env...),
		RunDir:   dirs["run"],
	}
}

// kernel is a started kernel that the test's cleanup closes unless the test
// did: the contract does not say Close may be called twice.
type kernel struct {
	interp.Kernel
	once sync.Once
	err  error
}

func (k *kernel) Close() error {
	k.once.Do(func() { k.err = k.Kernel.Close() })
	return k.err
}

func (h Harness) startWith(t *testing.T, opts interp.Options) *kernel {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	k, err := h.Start(ctx, opts)
	if err != nil {
		t.Fatalf("start %s kernel: %v", h.Language, err)
	}
	kk := &kernel{Kernel: k}
	t.Cleanup(func() {
		closed := make(chan error, 1)
		go func() { closed <- kk.Close() }()
		select {
		case err := <-closed:
			if err != nil {
				t.Errorf("Close: %v", err)
			}
		case <-time.After(patience):
			// Say so rather than hang the test binary (a Close that waits
			// for an Execute which never returns).
			t.Errorf("Close did not return within %v", patience)
		}
	})
	return kk
}

// start starts a kernel as the test's own user.
func (h Harness) start(t *testing.T) (*kernel, interp.Options) {
	t.Helper()
	opts := h.options(t, uint32(os.Getuid()), uint32(os.Getgid()), nil)
	return h.startWith(t, opts), opts
}

// result is what one Execute gave.
type result struct {
	mu     sync.Mutex // the events of an execution still running are being appended
	events []interp.Event
	count  int
	err    error
}

func (r *result) emit(e interp.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, e)
}

func (r *result) text(typ string) string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	for _, e := range r.events {
		if e.Type == typ {
			b.WriteString(e.Text)
		}
	}
	return b.String()
}

func (r *result) stdout() string { return r.text("stdout") }
func (r *result) stderr() string { return r.text("stderr") }

func (r *result) errors() []*interp.ExecError {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []*interp.ExecError
	for _, e := range r.events {
		if e.Type == "error" {
			out = append(out, e.Error)
		}
	}
	return out
}

func (r *result) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "count %d, err %v, events [", r.count, r.err)
	for i, e := range r.events {
		if i > 0 {
			b.WriteString(" ")
		}
		switch e.Type {
		case "stdout", "stderr":
			fmt.Fprintf(&b, "%s:%.200q", e.Type, e.Text)
		case "error":
			fmt.Fprintf(&b, "error:%q/%q", e.Error.Name, e.Error.Value)
		default:
			fmt.Fprintf(&b, "%s:%v", e.Type, e.Data["text/plain"])
		}
	}
	b.WriteString("]")
	return b.String()
}

// run executes code and returns what it gave, whatever that was.
func run(t *testing.T, k interp.Kernel, code string, env map[string]string) *result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), patience)
	defer cancel()
	r := &result{}
	r.count, r.err = k.Execute(ctx, code, env, r.emit)
	if errors.Is(r.err, context.DeadlineExceeded) {
		t.Fatalf("execute %q: no end after %v: %v", code, patience, r.err)
	}
	return r
}

// mustRun executes code that must succeed: no error returned, no error event.
func mustRun(t *testing.T, k interp.Kernel, code string, env map[string]string) *result {
	t.Helper()
	r := run(t, k, code, env)
	if r.err != nil || len(r.errors()) > 0 {
		t.Fatalf("execute %q: %v", code, r)
	}
	return r
}

// runUntil executes code in the background and, once its stdout contains
// seen, calls then (which must end the execution: an interrupt or a Close),
// and returns what the execution gave. Output seen while the cell still runs
// proves it is streamed.
func runUntil(t *testing.T, ctx context.Context, k interp.Kernel, code, seen string, then func()) *result {
	t.Helper()
	r := &result{}
	saw := make(chan struct{})
	var sawOnce sync.Once
	var out strings.Builder // touched by emit only, which Execute calls from one goroutine
	done := make(chan struct{})
	go func() {
		defer close(done)
		n, err := k.Execute(ctx, code, nil, func(e interp.Event) {
			r.emit(e)
			if e.Type == "stdout" {
				out.WriteString(e.Text)
				if strings.Contains(out.String(), seen) {
					sawOnce.Do(func() { close(saw) })
				}
			}
		})
		r.mu.Lock()
		r.count, r.err = n, err
		r.mu.Unlock()
	}()
	select {
	case <-saw:
	case <-done:
		t.Fatalf("execute %q ended before writing %q: %v", code, seen, r)
	case <-time.After(patience):
		t.Fatalf("execute %q: %q not seen within %v while the cell runs (output must stream as it is written): %v", code, seen, patience, r)
	}
	then()
	select {
	case <-done:
	case <-time.After(patience):
		t.Fatalf("execute %q did not return within %v of being ended: %v", code, patience, r)
	}
	return r
}

// A cell's definitions are there for the next cell, and a cell that writes
// nothing emits nothing.
func testStatePersists(t *testing.T, h Harness) {
	k, _ := h.start(t)
	r := mustRun(t, k, h.Set("airlock_state", "kept"), nil)
	if len(r.events) != 0 {
		t.Errorf("a cell that writes nothing emitted events: %v", r)
	}
	if got := mustRun(t, k, h.PrintVar("airlock_state"), nil).stdout(); got != "kept\n" {
		t.Errorf("the variable set by the previous cell reads %q, want %q", got, "kept\n")
	}
}

// Each cell, failed ones included, counts once.
func testExecutionCount(t *testing.T, h Harness) {
	k, _ := h.start(t)
	var counts []int
	for _, code := range []string{h.Print("one"), h.Raise, h.Print("three")} {
		r := run(t, k, code, nil)
		if r.err != nil {
			t.Fatalf("execute %q: %v", code, r)
		}
		counts = append(counts, r.count)
	}
	if counts[0] < 1 || counts[1] != counts[0]+1 || counts[2] != counts[1]+1 {
		t.Errorf("execution counts %v, want n, n+1, n+2 with n >= 1", counts)
	}
}

// stdout and stderr are told apart, each whole and in order.
func testStdoutAndStderr(t *testing.T, h Harness) {
	k, _ := h.start(t)
	r := mustRun(t, k, cell(h.Print("out-1"), h.PrintErr("err-1"), h.Print("out-2 ünïcode"), h.PrintErr("err-2 'quoted' $HOME")), nil)
	if got, want := r.stdout(), "out-1\nout-2 ünïcode\n"; got != want {
		t.Errorf("stdout %q, want %q", got, want)
	}
	if got, want := r.stderr(), "err-1\nerr-2 'quoted' $HOME\n"; got != want {
		t.Errorf("stderr %q, want %q", got, want)
	}
}

// Output is emitted as the cell writes it, not when the cell ends. (The cell
// is ended by Close, whose outcome CloseDuringExecute checks.)
func testStreamsWhileRunning(t *testing.T, h Harness) {
	k, _ := h.start(t)
	runUntil(t, context.Background(), k, cell(h.Print("early"), h.Sleep), "early", func() {
		go k.Close()
	})
}

// What child processes write to the kernel's fd 1 and 2 belongs to the cell
// that started them, and nothing of a cell reaches the next one.
func testChildProcessOutput(t *testing.T, h Harness) {
	k, _ := h.start(t)
	r := mustRun(t, k, h.Shell("echo child-out; echo child-err >&2"), nil)
	if got := r.stdout(); got != "child-out\n" {
		t.Errorf("stdout %q, want the child's %q", got, "child-out\n")
	}
	if got := r.stderr(); got != "child-err\n" {
		t.Errorf("stderr %q, want the child's %q", got, "child-err\n")
	}
	r = mustRun(t, k, h.Print("next"), nil)
	if r.stdout() != "next\n" || r.stderr() != "" {
		t.Errorf("the next cell: %v, want only stdout %q", r, "next\n")
	}
}

// The code's stdin is empty: a child process that reads it gets EOF at once,
// and cannot take what the kernel reads (a driver's requests).
func testChildStdinIsEmpty(t *testing.T, h Harness) {
	k, _ := h.start(t)
	r := mustRun(t, k, h.Shell("cat; echo after-cat"), nil)
	if got := r.stdout(); got != "after-cat\n" {
		t.Errorf("stdout %q, want %q", got, "after-cat\n")
	}
	if got := mustRun(t, k, h.Print("next"), nil).stdout(); got != "next\n" {
		t.Errorf("the next cell wrote %q, want %q", got, "next\n")
	}
}

// Output far larger than a pipe's buffer arrives whole, each event in whole
// UTF-8 characters.
func testLargeOutput(t *testing.T, h Harness) {
	k, _ := h.start(t)
	const unit, n = "aé", 100_000 // 300 kB: many pipe buffers; "é" straddles some boundaries
	r := mustRun(t, k, h.Repeat(unit, n), nil)
	want := strings.Repeat(unit, n) + "\n"
	if got := r.stdout(); got != want {
		t.Errorf("stdout: %d bytes, want %d (ends %q)", len(got), len(want), got[max(0, len(got)-8):])
	}
	for i, e := range r.events {
		if !utf8.ValidString(e.Text) {
			t.Errorf("event %d (%s, %d bytes) is not valid UTF-8: a character was split", i, e.Type, len(e.Text))
		}
	}
}

// An exception is an error event; the kernel and its state live on.
func testErrorIsAnEvent(t *testing.T, h Harness) {
	k, _ := h.start(t)
	mustRun(t, k, h.Set("airlock_state", "kept"), nil)
	r := run(t, k, cell(h.Print("before"), h.Raise), nil)
	if r.err != nil {
		t.Fatalf("a failing cell is not a failed Execute: %v", r)
	}
	if got := r.stdout(); got != "before\n" {
		t.Errorf("stdout %q, want %q", got, "before\n")
	}
	errs := r.errors()
	if len(errs) != 1 {
		t.Fatalf("%d error events, want 1: %v", len(errs), r)
	}
	if errs[0].Name != h.RaiseName || errs[0].Value != h.RaiseValue {
		t.Errorf("error %q: %q, want %q: %q", errs[0].Name, errs[0].Value, h.RaiseName, h.RaiseValue)
	}
	if got := mustRun(t, k, h.PrintVar("airlock_state"), nil).stdout(); got != "kept\n" {
		t.Errorf("after the error the variable reads %q, want %q", got, "kept\n")
	}
}

// An execution's env is seen by the cell and its child processes, and only by
// that execution: a variable it overrode has its old value again after.
func testEnvPerExecution(t *testing.T, h Harness) {
	if h.NoExecutionEnv != "" {
		t.Skip(h.NoExecutionEnv)
	}
	k, _ := h.start(t)
	const one = "AIRLOCK_KERNELTEST_ONE"
	env := map[string]string{one: "it's \"one\" $HOME é", baseEnv: "over"}
	printBoth := cell(h.PrintEnv(one), h.PrintEnv(baseEnv))
	child := h.Shell(`printf '%s|%s\n' "$` + one + `" "$` + baseEnv + `"`)

	if got, want := mustRun(t, k, printBoth, env).stdout(), env[one]+"\nover\n"; got != want {
		t.Errorf("with the execution's env: %q, want %q", got, want)
	}
	if got, want := mustRun(t, k, child, env).stdout(), env[one]+"|over\n"; got != want {
		t.Errorf("a child process with the execution's env: %q, want %q", got, want)
	}
	if got, want := mustRun(t, k, printBoth, nil).stdout(), "\nbase\n"; got != want {
		t.Errorf("the next execution: %q, want %q (the env restored)", got, want)
	}
	if got, want := mustRun(t, k, child, nil).stdout(), "|base\n"; got != want {
		t.Errorf("a child process of the next execution: %q, want %q", got, want)
	}
}

// The kernel runs in Options.Cwd.
func testCwd(t *testing.T, h Harness) {
	k, opts := h.start(t)
	want, err := filepath.EvalSymlinks(opts.Cwd)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, k, h.PrintCwd, nil).stdout(); got != want+"\n" {
		t.Errorf("cwd %q, want %q", got, want+"\n")
	}
}

// Ending Execute's context stops a cell whether it waits or spins; the state
// is kept and the next cell runs. The kinds alternate on one kernel: a shell
// once stopped running its interrupt trap for a loop after an interrupted
// sleep.
func testInterruptKeepsState(t *testing.T, h Harness) {
	k, _ := h.start(t)
	mustRun(t, k, h.Set("airlock_state", "kept"), nil)
	for i, c := range []struct{ kind, code string }{{"spin", h.Spin}, {"sleep", h.Sleep}, {"spin", h.Spin}} {
		ctx, cancel := context.WithCancel(context.Background())
		started := fmt.Sprintf("started-%d", i)
		r := runUntil(t, ctx, k, cell(h.Print(started), c.code, h.Print("not-reached")), started, cancel)
		cancel()
		if !errors.Is(r.err, context.Canceled) {
			t.Fatalf("interrupted %s: %v, want context.Canceled", c.kind, r)
		}
		if strings.Contains(r.stdout(), "not-reached") {
			t.Errorf("interrupted %s: the cell went on: %v", c.kind, r)
		}
		if got := mustRun(t, k, h.PrintVar("airlock_state"), nil).stdout(); got != "kept\n" {
			t.Fatalf("after interrupting a %s the variable reads %q, want %q", c.kind, got, "kept\n")
		}
	}
}

// An interrupt reaches the processes the cell waits for, as ^C in a terminal
// reaches the foreground job, so a cell blocked on a child ends too.
func testInterruptReachesChildren(t *testing.T, h Harness) {
	k, _ := h.start(t)
	mustRun(t, k, h.Set("airlock_state", "kept"), nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// The child writes the mark itself: the interrupt comes while it runs.
	r := runUntil(t, ctx, k, cell(h.Shell("echo started; sleep 3600"), h.Print("not-reached")), "started", cancel)
	if !errors.Is(r.err, context.Canceled) {
		t.Fatalf("interrupted: %v, want context.Canceled", r)
	}
	if strings.Contains(r.stdout(), "not-reached") {
		t.Errorf("the cell went on: %v", r)
	}
	if got := mustRun(t, k, h.PrintVar("airlock_state"), nil).stdout(); got != "kept\n" {
		t.Errorf("after the interrupt the variable reads %q, want %q", got, "kept\n")
	}
}

// An interrupt may land at any moment, also before the kernel has started the
// cell (a client that gives up at once): the kernel still answers, and the
// next cell runs. Whether the interrupted cell ran is not defined.
func testInterruptBeforeTheCellRuns(t *testing.T, h Harness) {
	k, _ := h.start(t)
	mustRun(t, k, h.Set("airlock_state", "kept"), nil)
	// A few rounds: where the interrupt lands varies from one to the next.
	for i := range 5 {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r := &result{}
		r.count, r.err = k.Execute(ctx, h.Print("maybe"), nil, r.emit)
		if r.err != nil && !errors.Is(r.err, context.Canceled) {
			t.Fatalf("round %d: execute with its context ended: %v, want context.Canceled or no error", i, r)
		}
		if got := mustRun(t, k, h.PrintVar("airlock_state"), nil).stdout(); got != "kept\n" {
			t.Fatalf("round %d: the next cell read the variable as %q, want %q", i, got, "kept\n")
		}
	}
}

// A kernel whose process exited is dead for good; a new one starts.
func testExitIsDeath(t *testing.T, h Harness) {
	k, _ := h.start(t)
	r := run(t, k, cell(h.Print("bye"), h.Exit), nil)
	if !errors.Is(r.err, interp.ErrKernelDied) {
		t.Fatalf("exit: %v, want ErrKernelDied", r)
	}
	if h.DeathKeepsOutput && r.stdout() != "bye\n" {
		t.Errorf("output before the exit: %q, want %q", r.stdout(), "bye\n")
	}
	if r := run(t, k, h.Print("again"), nil); !errors.Is(r.err, interp.ErrKernelDied) {
		t.Errorf("execute after death: %v, want ErrKernelDied", r)
	}
	if err := k.Close(); err != nil {
		t.Errorf("Close of a dead kernel: %v", err)
	}
	// What the core does next: a new kernel for the same context.
	k2, _ := h.start(t)
	if got := mustRun(t, k2, h.Print("restarted"), nil).stdout(); got != "restarted\n" {
		t.Errorf("the next kernel wrote %q", got)
	}
}

// Close during an execution ends it promptly with ErrKernelDied; the kernel is
// dead after.
func testCloseDuringExecute(t *testing.T, h Harness) {
	k, _ := h.start(t)
	closed := make(chan error, 1)
	// Close from another goroutine, as the core does: a backend may block
	// emit while it holds what Close needs.
	r := runUntil(t, context.Background(), k, cell(h.Print("started"), h.Sleep), "started", func() {
		go func() { closed <- k.Close() }()
	})
	if !errors.Is(r.err, interp.ErrKernelDied) {
		t.Errorf("execute during Close: %v, want ErrKernelDied", r)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(patience):
		t.Fatalf("Close did not return within %v", patience)
	}
	if r := run(t, k, h.Print("again"), nil); !errors.Is(r.err, interp.ErrKernelDied) {
		t.Errorf("execute after Close: %v, want ErrKernelDied", r)
	}
}

// Close ends the processes the code started, even those it left running.
func testCloseEndsChildren(t *testing.T, h Harness) {
	k, _ := h.start(t)
	r := mustRun(t, k, h.Shell("sleep 3600 </dev/null >/dev/null 2>&1 & echo $!"), nil)
	pid, err := strconv.Atoi(strings.TrimSpace(r.stdout()))
	if err != nil || pid <= 0 {
		t.Fatalf("background child's pid: %v", r)
	}
	if err := k.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	deadline := time.Now().Add(patience)
	for testenv.Alive(pid) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("child %d still runs %v after Close", pid, patience)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The kernel runs as Options.UID/GID with Options.Groups: every id of the
// process (real, effective, saved, filesystem), and no other group.
func testRunsAsUser(t *testing.T, h Harness) {
	testenv.NeedRoot(t)
	opts := h.options(t, nobody, nobody, []uint32{nobody})
	k := h.startWith(t, opts)
	status := mustRun(t, k, h.PrintFile("/proc/self/status"), nil).stdout()
	ids := strconv.Itoa(nobody)
	all := strings.Join([]string{ids, ids, ids, ids}, "\t")
	for field, want := range map[string]string{"Uid": all, "Gid": all, "Groups": ids} {
		var got string
		for _, line := range strings.Split(status, "\n") {
			if v, ok := strings.CutPrefix(line, field+":"); ok {
				got = strings.TrimSpace(v)
			}
		}
		if got != want {
			t.Errorf("%s: %q, want %q", field, got, want)
		}
	}
	want, err := filepath.EvalSymlinks(opts.Cwd)
	if err != nil {
		t.Fatal(err)
	}
	if got := mustRun(t, k, h.PrintCwd, nil).stdout(); got != want+"\n" {
		t.Errorf("cwd as the user: %q, want %q", got, want+"\n")
	}
}
