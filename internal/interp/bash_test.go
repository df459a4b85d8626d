package interp

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
)

type collected struct {
	events []Event
}

func (c *collected) emit(e Event) { c.events = append(c.events, e) }

func (c *collected) text(typ string) string {
	var b strings.Builder
	for _, e := range c.events {
		if e.Type == typ {
			b.WriteString(e.Text)
		}
	}
	return b.String()
}

func (c *collected) errs() []*ExecError {
	var out []*ExecError
	for _, e := range c.events {
		if e.Type == "error" {
			out = append(out, e.Error)
		}
	}
	return out
}

func startTestBash(t *testing.T) Kernel {
	t.Helper()
	opts := Options{Language: "bash", Cwd: t.TempDir(), UID: uint32(os.Getuid()), GID: uint32(os.Getgid()),
		Env: []string{"PATH=" + os.Getenv("PATH"), "HOME=/tmp"}, RunDir: t.TempDir()}
	k, err := startBash(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { k.Close() })
	return k
}

func run(t *testing.T, k Kernel, code string, env map[string]string) (*collected, int) {
	t.Helper()
	c := &collected{}
	n, err := k.Execute(context.Background(), code, env, c.emit)
	if err != nil {
		t.Fatalf("execute %q: %v", code, err)
	}
	return c, n
}

func TestBashStateOutputAndExitStatus(t *testing.T) {
	k := startTestBash(t)
	c, n := run(t, k, "x=41; f() { echo \"f:$1\"; }; cd /", nil)
	if n != 1 || c.text("stdout") != "" || len(c.errs()) != 0 {
		t.Fatalf("first cell: n=%d events=%+v", n, c.events)
	}
	c, n = run(t, k, "echo $((x+1)); f hi; pwd; echo oops >&2; printf 'no newline'", nil)
	if n != 2 {
		t.Fatalf("count %d", n)
	}
	if got := c.text("stdout"); got != "42\nf:hi\n/\nno newline" {
		t.Fatalf("stdout %q", got)
	}
	if got := c.text("stderr"); got != "oops\n" {
		t.Fatalf("stderr %q", got)
	}
	// A failing last command: bash_kernel's error (empty name, status as value).
	c, _ = run(t, k, "ls /nonexistent-dir", nil)
	if e := c.errs(); len(e) != 1 || e[0].Name != "" || e[0].Value != "2" || !strings.Contains(c.text("stderr"), "nonexistent") {
		t.Fatalf("failing cell: %+v", c.events)
	}
	// stdin is /dev/null: cat must not eat the driver's lines.
	c, _ = run(t, k, "cat; echo after-cat", nil)
	if c.text("stdout") != "after-cat\n" {
		t.Fatalf("cat: %+v", c.events)
	}
}

func TestBashEnvVarsPerExecution(t *testing.T) {
	k := startTestBash(t)
	run(t, k, "export KEEP=base", nil)
	c, _ := run(t, k, `echo "$FOO $KEEP"; sh -c 'echo child:$FOO'`, map[string]string{"FOO": "it's here", "KEEP": "over"})
	if got := c.text("stdout"); got != "it's here over\nchild:it's here\n" {
		t.Fatalf("with env: %q", got)
	}
	c, _ = run(t, k, `echo "[${FOO-unset}] $KEEP"`, nil)
	if got := c.text("stdout"); got != "[unset] base\n" {
		t.Fatalf("env not restored: %q", got)
	}
}

func TestBashInterruptKeepsState(t *testing.T) {
	k := startTestBash(t)
	run(t, k, "y=7", nil)
	for _, code := range []string{"while :; do :; done", "echo start; sleep 30; echo not-reached", "while :; do :; done"} {
		ctx, cancel := context.WithCancel(context.Background())
		c := &collected{}
		done := make(chan error, 1)
		go func() { _, err := k.Execute(ctx, code, nil, c.emit); done <- err }()
		time.Sleep(300 * time.Millisecond)
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("%q: err %v", code, err)
			}
		case <-time.After(10 * time.Second):
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", k.(*bashKernel).cmd.Process.Pid))
			t.Fatalf("%q: not interrupted; %s", code, b)
		}
		if strings.Contains(c.text("stdout"), "not-reached") {
			t.Fatalf("cell went on after the interrupt: %q", c.text("stdout"))
		}
	}
	c, _ := run(t, k, "echo $y", nil)
	if c.text("stdout") != "7\n" {
		t.Fatalf("state lost: %+v", c.events)
	}
}

func TestBashExitIsKernelDeath(t *testing.T) {
	k := startTestBash(t)
	_, err := k.Execute(context.Background(), "echo bye; exit 3", nil, func(Event) {})
	if !errors.Is(err, ErrKernelDied) {
		t.Fatalf("err %v", err)
	}
	_, err = k.Execute(context.Background(), "echo again", nil, func(Event) {})
	if !errors.Is(err, ErrKernelDied) {
		t.Fatalf("second err %v", err)
	}
}

func TestBashLargeOutputAndMarkerSplit(t *testing.T) {
	k := startTestBash(t)
	c, _ := run(t, k, "head -c 300000 /dev/zero | tr '\\0' 'a'; printf 'é'", nil)
	got := c.text("stdout")
	if len(got) != 300002 || !strings.HasSuffix(got, "aé") {
		t.Fatalf("len %d suffix %q", len(got), got[max(0, len(got)-5):])
	}
}

// A cell's last newline belongs to its output chunk even when the end marker
// comes in a later read of the pipe (E2B's bash kernel gives "bar\n" as one
// stdout entry; holding the newline back as a possible start of the marker
// split it into "bar" and "\n").
func TestSplitterKeepsTrailingNewlineWithItsLine(t *testing.T) {
	const marker = "__airlock_cell_end_0123"
	for _, reads := range [][]string{
		{"bar\n", marker + " 0\n"},
		{"bar\n", marker[:5], marker[5:] + " 0\n"},
		{"bar\n" + marker + " 0\n"},
	} {
		s := &splitter{marker: []byte(marker + " ")}
		var chunks []string
		for _, r := range reads {
			if out := s.feed([]byte(r)); len(out) > 0 {
				chunks = append(chunks, string(out))
			}
		}
		if len(chunks) != 1 || chunks[0] != "bar\n" || !s.found || s.status != "0" {
			t.Errorf("reads %q: chunks %q, found %v, status %q; want one chunk \"bar\\n\" and status 0", reads, chunks, s.found, s.status)
		}
	}
	// Output without a final newline ends right where the marker starts.
	s := &splitter{marker: []byte(marker + " ")}
	if out := string(s.feed([]byte("no-newline" + marker + " 3\n"))); out != "no-newline" || s.status != "3" {
		t.Errorf("got %q status %q", out, s.status)
	}
}
