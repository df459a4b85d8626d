package usercgroup

import (
	"os"
	"os/exec"
	"path/filepath"
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

// TestForksShareASpare: trees forked one after another, each reaped before
// the next, are forked from one thread (readying a thread is the cost of a
// start), and a Quiesce retires it: the start after the Wake forks from a
// new one. A fresh spare is readied behind the first start all the same.
func TestForksShareASpare(t *testing.T) {
	if !sysinfo.HoldsPtrace() {
		t.Skip("spare threads are kept only by a process holding CAP_SYS_PTRACE (or with v1 user cgroups)")
	}
	forker := func() int {
		t.Helper()
		var tid int
		cmd := exec.Command("/bin/true")
		release, err, _ := Fork(nil, func() error {
			tid = unix.Gettid()
			return cmd.Start()
		})
		if err != nil {
			t.Fatal(err)
		}
		_ = cmd.Wait()
		release()
		return tid
	}
	first := forker()
	for i := 0; i < 3; i++ {
		if tid := forker(); tid != first {
			t.Fatalf("start %d forked from thread %d, the one before from %d", i+2, tid, first)
		}
	}
	waitFresh(t, get().spares, "the first starts")
	Quiesce()
	Wake()
	if tid := forker(); tid == first {
		t.Fatalf("the start after a Quiesce forked from thread %d, which the Quiesce retired", tid)
	}
}

// TestReleaseBesideRunningTree: a spare released while its tree still runs
// (its leaf lists a task besides its thread) ends at once and is not
// parked; one whose tree is gone is parked, retiring the one parked before,
// unless its memory leaf holds smallLeaf or more.
func TestReleaseBesideRunningTree(t *testing.T) {
	if !sysinfo.HoldsPtrace() {
		t.Skip("spare threads are kept only by a process holding CAP_SYS_PTRACE (or with v1 user cgroups)")
	}
	p := get()
	spareListing := func(tids string) *spare {
		t.Helper()
		tasks := filepath.Join(t.TempDir(), "tasks")
		if err := os.WriteFile(tasks, []byte(tids), 0o600); err != nil {
			t.Fatal(err)
		}
		return &spare{tasks: tasks, tid: "100", run: make(chan func() error), done: make(chan error, 1)}
	}
	busy := spareListing("100\n101\n")
	p.release(busy)
	p.spares.mu.Lock()
	parkedBusy := p.spares.parked == busy
	p.spares.mu.Unlock()
	if parkedBusy || !retired(busy) {
		t.Fatalf("a spare whose tree runs was parked (%v) or kept (retired %v)", parkedBusy, retired(busy))
	}
	gone := spareListing("100\n")
	p.release(gone)
	p.spares.mu.Lock()
	parked := p.spares.parked == gone
	p.spares.mu.Unlock()
	if !parked || retired(gone) {
		t.Fatalf("a spare whose tree is gone was not parked (parked %v, retired %v)", parked, retired(gone))
	}
	next := spareListing("100\n")
	p.release(next)
	if !retired(gone) {
		t.Fatal("the spare parked before was not retired")
	}
	// A tree that is gone but left its page cache in the leaf (a file it
	// wrote): the next tree must not inherit it.
	cached := spareListing("100\n")
	cached.memUsage = filepath.Join(t.TempDir(), "memory.usage_in_bytes")
	if err := os.WriteFile(cached.memUsage, []byte("2097152\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p.release(cached)
	if !retired(cached) {
		t.Fatal("a spare whose leaf holds 2 MiB was kept")
	}
	// No thread stands behind next: later starts must not get it.
	p.spares.mu.Lock()
	if p.spares.parked == next {
		p.spares.parked = nil
		next.retire()
	}
	p.spares.mu.Unlock()
}

// retired reports whether s was retired (its run channel closed).
func retired(s *spare) bool {
	select {
	case _, open := <-s.run:
		return !open
	default:
		return false
	}
}

// waitFresh waits until a fresh spare is ready, and fails the test after
// 10 s.
func waitFresh(t *testing.T, sp *spares, after string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sp.mu.Lock()
		fresh := sp.fresh != nil
		sp.mu.Unlock()
		if fresh {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s no fresh spare was readied", after)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
