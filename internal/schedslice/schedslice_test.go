package schedslice

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// childSched starts a process from the calling thread and returns what
// it reads in /proc/self/sched.
func childSched() (string, error) {
	out, err := exec.Command("/bin/sh", "-c", "cat /proc/self/sched").Output()
	return string(out), err
}

// sliceOf returns se.slice (the slice the kernel gives the task) of a
// /proc/<pid>/sched listing.
func sliceOf(t *testing.T, sched string, err error) time.Duration {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(sched, "\n") {
		if f := strings.Fields(l); len(f) == 3 && f[0] == "se.slice" {
			ns, err := strconv.ParseInt(f[2], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return time.Duration(ns)
		}
	}
	t.Skip("no se.slice in /proc/self/sched (kernel without EEVDF)")
	return 0
}

func childSlice(t *testing.T) time.Duration {
	t.Helper()
	out, err := childSched()
	return sliceOf(t, out, err)
}

// TestSetProcess: every thread gets the short slice and so do the processes
// they start; SetProcess(0) gives both the default back.
func TestSetProcess(t *testing.T) {
	before := childSlice(t)
	if err := SetProcess(Short); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = SetProcess(0) })
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		tid, _ := strconv.Atoi(e.Name())
		a, err := unix.SchedGetAttr(tid, 0)
		if err != nil {
			t.Fatal(err)
		}
		if got := time.Duration(a.Runtime); got != Short {
			t.Errorf("thread %d has slice %s after SetProcess(%s)", tid, got, Short)
		}
	}
	if got := childSlice(t); got != Short {
		if got == before {
			t.Skipf("the kernel ignores a fair thread's requested slice (child: %s)", got)
		}
		t.Errorf("a child of a thread with slice %s runs with %s", Short, got)
	}

	// And back: the default again, for the threads and their children.
	if err := SetProcess(0); err != nil {
		t.Fatal(err)
	}
	if got := childSlice(t); got != before {
		t.Errorf("after SetProcess(0) a child runs with slice %s, want the default %s", got, before)
	}
}
