package usercgroup

import (
	"fmt"
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

// TestEachStartTakesAFreshSpare: every tree is forked from a thread of its
// own, which ends after the fork (a thread kept in the leaves of a tree
// that still runs stopped envd during attacks), and the next one is
// readied as a start takes one, without waiting for the next start: a
// start after a Quiesce forks from one readied after the Wake.
func TestEachStartTakesAFreshSpare(t *testing.T) {
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
	sp := get().spares
	seen := map[int]bool{}
	for i := 0; i < 4; i++ {
		tid := forker()
		if seen[tid] {
			t.Fatalf("start %d forked from thread %d, which forked an earlier tree", i+1, tid)
		}
		seen[tid] = true
		waitFresh(t, sp, fmt.Sprintf("start %d", i+1))
	}
	Quiesce()
	sp.mu.Lock()
	left := sp.fresh != nil || sp.readying > 0
	sp.mu.Unlock()
	if left {
		t.Fatal("a spare is kept or readied while quiesced")
	}
	Wake()
	if tid := forker(); seen[tid] {
		t.Fatalf("the start after a Quiesce forked from thread %d, which forked an earlier tree", tid)
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
