package daemon

// Paused sandboxes outlive the server (issue 13, item 4): a kill -9 of
// `airlock serve`, and a restart of the whole stack with every process,
// mount, cgroup, netns and runtime state dir gone (a stand-in for a host
// reboot). Each runs a real `airlock serve` child process (serveproc_test.go)
// on both runtimes.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/mcp"
)

// The marker command of the background process each sandbox runs: unique,
// so that finding it after a resume cannot be a coincidence.
const bgMarker = "sleep 86401"

// sbx is one sandbox under test: what it was given and what it ran.
type sbx struct {
	id     string
	memory bool
	pid    uint32
	// inRAM is why its last pause with memory is not on disk (nil when it
	// is): the sandbox is frozen in RAM.
	inRAM error
	// gaps are lost processes of a pause with memory, reported at the
	// end so that what follows (another reboot, a kill) is checked too.
	gaps []string
}

func TestPausedSandboxSurvivesRestartAndReboot(t *testing.T) {
	for _, rt := range []string{"linux", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			t.Run("filesystem", func(t *testing.T) { testSurvive(t, rt, false) })
			t.Run("memory", func(t *testing.T) { testSurvive(t, rt, true) })
		})
	}
}

func testSurvive(t *testing.T, rt string, memory bool) {
	h := newHost(t, rt)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h.start()
	s := h.newSandbox(ctx)
	h.pause(ctx, s, memory)

	// kill -9 of the server.
	h.kill9()
	h.start()
	h.expectPaused(ctx, s)
	h.resume(ctx, s)
	h.checkState(ctx, s, "after kill -9 and restart")

	// A reboot: processes, mounts, cgroups, netns and runtime state gone.
	h.pause(ctx, s, memory)
	for _, clear := range []bool{true, false} {
		when := "after a reboot with the runtime and network state dirs cleared"
		if !clear {
			when = "after a reboot with stale runtime and network state files"
			h.pause(ctx, s, memory)
		}
		h.stop()
		h.reboot(clear)
		h.start()
		h.expectPaused(ctx, s)
		h.resume(ctx, s)
		h.checkState(ctx, s, when)
	}

	// And the sandbox still works as any other: it can be killed cleanly.
	if err := h.client().Kill(ctx, s.id); err != nil {
		t.Fatalf("kill %s: %v", s.id, err)
	}
	if len(s.gaps) > 0 {
		t.Fatalf("%s", strings.Join(s.gaps, "\n"))
	}
}

// newSandbox creates a base sandbox, writes a file into it and starts a
// background process in it.
func (h *host) newSandbox(ctx context.Context) *sbx {
	h.t.Helper()
	timeout := int64(600)
	created, err := h.client().Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Timeout: &timeout})
	if err != nil {
		h.t.Fatalf("create: %v", err)
	}
	s := &sbx{id: created.SandboxID}
	h.ids[s.id] = true
	b := h.backend()
	if err := b.WriteFile(ctx, s.id, "/home/user/survive.txt", []byte("kept "+s.id)); err != nil {
		h.t.Fatalf("write a file into %s: %v", s.id, err)
	}
	res, err := b.RunCommand(ctx, mcp.RunCommandRequest{SandboxID: s.id, Command: bgMarker, Background: true})
	if err != nil {
		h.t.Fatalf("start a background process in %s: %v", s.id, err)
	}
	s.pid = res.PID
	h.serveHTTP(ctx, s)
	if out := run(ctx, h.t, b, s.id, fmt.Sprintf("tr '\\0' ' ' </proc/%d/cmdline", s.pid)); !strings.Contains(out, bgMarker) {
		h.t.Fatalf("background process %d of %s is not running %q: %q", s.pid, s.id, bgMarker, out)
	}
	return s
}

func (h *host) pause(ctx context.Context, s *sbx, memory bool) {
	h.t.Helper()
	if err := h.client().Pause(ctx, s.id, memory); err != nil {
		h.t.Fatalf("pause %s (memory %v): %v", s.id, memory, err)
	}
	s.memory = memory
	s.inRAM = nil
	if memory {
		_, s.inRAM = os.Stat(h.dir.PausedComplete(s.id))
	}
}

// expectPaused checks that the server lists s among its paused sandboxes,
// as Sandbox.list({query: {state: ['paused']}}) asks.
func (h *host) expectPaused(ctx context.Context, s *sbx) {
	h.t.Helper()
	list, err := h.client().List(ctx, e2bclient.ListQuery{State: e2bwire.StatePaused})
	if err != nil {
		h.t.Fatalf("list paused: %v", err)
	}
	var ids []string
	for _, l := range list {
		ids = append(ids, l.SandboxID)
	}
	if !slices.Contains(ids, s.id) {
		h.t.Fatalf("paused sandbox %s is not listed as paused after the restart (paused: %v)\nserver log:\n%s", s.id, ids, tail(h.srv.log, 40))
	}
}

// resume connects to paused sandbox s, which must answer 201 (resumed).
func (h *host) resume(ctx context.Context, s *sbx) {
	h.t.Helper()
	_, resumed, err := h.client().Connect(ctx, s.id, 5*time.Minute)
	if err != nil {
		h.t.Fatalf("resume %s: %v\nserver log:\n%s", s.id, err, tail(h.srv.log, 40))
	}
	if !resumed {
		h.t.Fatalf("connect to paused %s answered 200 (was running), not 201 (resumed)", s.id)
	}
}

// checkState checks that s kept its file, and its background process when
// it was paused with memory (else that the process is gone).
func (h *host) checkState(ctx context.Context, s *sbx, when string) {
	h.t.Helper()
	b := h.backend()
	got, _, err := b.ReadFile(ctx, s.id, "/home/user/survive.txt", 1<<20)
	if err != nil || string(got) != "kept "+s.id {
		h.t.Fatalf("%s: the file written before the pause reads %q, %v", when, got, err)
	}
	cmdline := run(ctx, h.t, b, s.id, fmt.Sprintf("tr '\\0' ' ' </proc/%d/cmdline 2>/dev/null; true", s.pid))
	running := strings.Contains(cmdline, bgMarker)
	// The web server started with the background process: it runs when
	// that one does, else it is started again.
	h.checkPort(ctx, s, when, !running)
	switch {
	case s.memory && !running:
		why := "its checkpoint image was complete"
		if s.inRAM != nil {
			why = fmt.Sprintf("the pause left no complete checkpoint image (%v): the runtime froze the sandbox in RAM instead of saving it to disk, which no reboot survives", s.inRAM)
		}
		// Reported at the end of the test, so that what works after it
		// (another reboot, a kill) is still checked.
		s.gaps = append(s.gaps, fmt.Sprintf("%s: sandbox %s was paused with memory but its background process %d (%s) is gone; %s", when, s.id, s.pid, bgMarker, why))
	case !s.memory && running:
		h.t.Fatalf("%s: sandbox %s was paused without memory, yet process %d still runs %q", when, s.id, s.pid, cmdline)
	}
}

// run runs a command in a sandbox and returns its stdout; a failure to run
// it fails the test.
func run(ctx context.Context, t *testing.T, b mcp.Backend, id, cmd string) string {
	t.Helper()
	res, err := b.RunCommand(ctx, mcp.RunCommandRequest{SandboxID: id, Command: cmd, Timeout: time.Minute})
	if err == nil && res.ExitCode != 0 {
		err = errors.New(res.Stderr)
	}
	if err != nil {
		t.Fatalf("run %q in %s: %v", cmd, id, err)
	}
	return res.Stdout
}

// serveHTTP starts a web server on port 8000 in s that answers with s's id.
func (h *host) serveHTTP(ctx context.Context, s *sbx) {
	h.t.Helper()
	b := h.backend()
	run(ctx, h.t, b, s.id, "mkdir -p /tmp/www && echo -n 'served by "+s.id+"' >/tmp/www/index.html")
	if _, err := b.RunCommand(ctx, mcp.RunCommandRequest{SandboxID: s.id, Command: "cd /tmp/www && exec python3 -m http.server 8000", Background: true}); err != nil {
		h.t.Fatalf("start a web server in %s: %v", s.id, err)
	}
}

// checkPort checks that s's port 8000 answers through the sandbox proxy
// (its network works), starting the web server again first with restart
// (the sandbox came back without its processes).
func (h *host) checkPort(ctx context.Context, s *sbx, when string, restart bool) {
	h.t.Helper()
	get := func() (string, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, h.srv.sandbox+"/", nil)
		req.Header.Set(e2bwire.HeaderSandboxID, s.id)
		req.Header.Set(e2bwire.HeaderSandboxPort, "8000")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			return "", fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
		}
		return string(body), err
	}
	if restart {
		h.serveHTTP(ctx, s)
	}
	want := "served by " + s.id
	var got string
	var err error
	poll := func(d time.Duration) bool {
		for deadline := time.Now().Add(d); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
			if got, err = get(); err == nil && got == want {
				return true
			}
		}
		return false
	}
	if poll(10 * time.Second) {
		return
	}
	h.t.Fatalf("%s: port 8000 of %s through the proxy answers %q, %v; want %q", when, s.id, got, err, want)
}
