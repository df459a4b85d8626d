package usercgroup

import (
	"os/exec"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/sysinfo"
)

// TestQuiesceHoldsStarts: while quiesced, no spare thread exists and a Start
// waits; Wake lets it fork. Quiesce and Wake twice are each once.
func TestQuiesceHoldsStarts(t *testing.T) {
	if !sysinfo.HoldsPtrace() {
		t.Skip("spare threads are kept only by a process holding CAP_SYS_PTRACE (or with v1 user cgroups)")
	}
	start := func() chan error {
		done := make(chan error, 1)
		go func() {
			cmd := exec.Command("/bin/true")
			err, _ := Start(nil, func() error { return cmd.Run() })
			done <- err
		}()
		return done
	}
	if err := <-start(); err != nil {
		t.Fatalf("Start before Quiesce: %v", err)
	}
	Quiesce()
	Quiesce()
	done := start()
	select {
	case err := <-done:
		t.Fatalf("a Start ran while quiesced: %v", err)
	case <-time.After(300 * time.Millisecond):
	}
	Wake()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Start after Wake: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a Start held by Quiesce did not run after Wake")
	}
	Wake()
	if err := <-start(); err != nil {
		t.Fatalf("Start after a second Wake: %v", err)
	}
}

// TestStartsShareASpare: trees started one after another are forked from
// one thread (readying a thread is the cost of a start), and a Quiesce
// retires it: the start after the Wake forks from a new one.
func TestStartsShareASpare(t *testing.T) {
	if !sysinfo.HoldsPtrace() {
		t.Skip("spare threads are kept only by a process holding CAP_SYS_PTRACE (or with v1 user cgroups)")
	}
	forker := func() int {
		t.Helper()
		var tid int
		err, _ := Start(nil, func() error {
			tid = unix.Gettid()
			return exec.Command("/bin/true").Run()
		})
		if err != nil {
			t.Fatal(err)
		}
		return tid
	}
	first := forker()
	for i := 0; i < 3; i++ {
		if tid := forker(); tid != first {
			t.Fatalf("start %d forked from thread %d, the one before from %d", i+2, tid, first)
		}
	}
	Quiesce()
	Wake()
	if tid := forker(); tid == first {
		t.Fatalf("the start after a Quiesce forked from thread %d, which the Quiesce retired", tid)
	}
}
