package usercgroup

import (
	"os/exec"
	"testing"
	"time"

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
