package linux

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// threads is this process's OS thread count.
func threads(t *testing.T) int {
	t.Helper()
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, err := strconv.Atoi(strings.TrimSpace(v))
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatal("no Threads: in /proc/self/status")
	return 0
}

// TestReapOnExitHoldsNoThreads: waiting for many children pins no OS thread
// per child (a blocking wait would add one each), and every wait ends, with
// the child reaped, when its child exits.
func TestReapOnExitHoldsNoThreads(t *testing.T) {
	const n = 200
	before := threads(t)
	cmds := make([]*exec.Cmd, n)
	dones := make([]chan struct{}, n)
	for i := range cmds {
		cmds[i] = exec.Command("sleep", "60")
		if err := cmds[i].Start(); err != nil {
			t.Fatal(err)
		}
		dones[i] = make(chan struct{})
		cmd := cmds[i]
		reapOnExit(cmd.Process.Pid, func() { _ = cmd.Wait() }, dones[i])
	}
	t.Cleanup(func() {
		for _, c := range cmds {
			_ = c.Process.Kill()
		}
	})
	time.Sleep(200 * time.Millisecond) // let any blocking waiter start its thread
	if grew := threads(t) - before; grew > n/4 {
		t.Errorf("waiting for %d children added %d OS threads", n, grew)
	}
	for _, d := range dones[:10] {
		select {
		case <-d:
			t.Fatal("a wait ended before its child exited")
		default:
		}
	}
	for _, c := range cmds {
		_ = c.Process.Kill()
	}
	for i, d := range dones {
		select {
		case <-d:
		case <-time.After(10 * time.Second):
			t.Fatalf("child %d: the wait did not end after it was killed", i)
		}
		if cmds[i].ProcessState == nil {
			t.Fatalf("child %d was not reaped", i)
		}
	}
}
