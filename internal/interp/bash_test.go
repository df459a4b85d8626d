package interp

import (
	"context"
	"os"
	"strings"
	"testing"
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

// What is bash's own (the shared contract is kerneltest's, run by
// TestBashConformance): functions and cd persist, output that ends without a
// newline ends there, and a failing cell's error is its status as
// bash_kernel reports it.
func TestBashSemantics(t *testing.T) {
	k := startTestBash(t)
	c, n := run(t, k, "x=41; f() { echo \"f:$1\"; }; cd /", nil)
	if n != 1 || len(c.events) != 0 {
		t.Fatalf("first cell: n=%d events=%+v", n, c.events)
	}
	c, _ = run(t, k, "echo $((x+1)); f hi; pwd; printf 'no newline'", nil)
	if got := c.text("stdout"); got != "42\nf:hi\n/\nno newline" {
		t.Fatalf("stdout %q", got)
	}
	// bash_kernel's error: an empty name, the status as value.
	c, _ = run(t, k, "ls /nonexistent-dir", nil)
	if e := c.errs(); len(e) != 1 || e[0].Name != "" || e[0].Value != "2" || !strings.Contains(c.text("stderr"), "nonexistent") {
		t.Fatalf("failing cell: %+v", c.events)
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
