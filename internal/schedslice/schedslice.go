// Package schedslice sets the CPU time slice the kernel's fair scheduler
// (EEVDF, Linux 6.6 and later) gives a thread, which decides how soon a thread
// that wakes up gets a CPU another thread is busy on.
//
// Why: cpu.shares and CFS quotas decide how much CPU a cgroup gets over time,
// not how long a waking thread waits for it. A neighbour's commands.run('true')
// is a chain of wake-ups (the server's proxy, the neighbour's envd, the
// command it forks, envd again, the proxy), and while another sandbox spins on
// every core each of them may find a spinner on its CPU whose slice (1.4 ms
// by default on two CPUs) the scheduler protects ("run to parity"); without a
// high-resolution tick the end of that slice is noticed at the next tick
// (4 ms at HZ=250). A waking thread whose slice is shorter than the running
// one's preempts it at once (PREEMPT_SHORT), the running one's protection
// lasts no longer than the shortest slice queued beside it, and a cgroup's
// scheduling entity carries the shortest slice of its queued threads up the
// hierarchy (all three in the 6.18 kernel this was measured on), so this
// works between sandboxes' cgroups too. The slice changes when a thread runs, not how much:
// a thread's or cgroup's share of CPU time is still its weight's, and the
// tick switches between CPU-bound threads every 4 ms as before.
//
// So the server asks for Short for all its threads at start, and every
// process it starts inherits it: envd (which asks for it again itself, in
// case it was started otherwise) and the commands envd starts for users. A
// user's process may ask for another slice (sched_setattr needs no
// privilege for that); a longer one does not protect it from preemption by a
// waking neighbour with a short one, and a shorter one than Short does not
// exist (it is the kernel's minimum).
//
// Kernels before 6.12 ignore the requested slice of a fair thread; the
// calls then change nothing (TestSetProcess skips there).
package schedslice

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// Short is the slice Airlock's own processes run with: the kernel's
// minimum (0.1 ms), well below the default (0.75 ms x (1 + log2 CPUs)).
const Short = 100 * time.Microsecond

// SetProcess gives every thread of this process the slice d (0: the
// kernel's default); threads the process makes later inherit it from the
// thread that makes them, and so do child processes. Threads that are not
// SCHED_OTHER or SCHED_BATCH (none in Airlock) are left alone.
func SetProcess(d time.Duration) error {
	entries, err := os.ReadDir("/proc/self/task")
	if err != nil {
		return fmt.Errorf("schedslice: %w", err)
	}
	var errs []error
	for _, e := range entries {
		tid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// ESRCH: the thread ended since the listing.
		if err := set(tid, d); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// set changes only the slice (sched_runtime) of thread tid, keeping its
// policy and nice value; 0 asks for the default.
func set(tid int, d time.Duration) error {
	a, err := unix.SchedGetAttr(tid, 0)
	if err != nil {
		return fmt.Errorf("schedslice: sched_getattr %d: %w", tid, err)
	}
	if a.Policy != unix.SCHED_NORMAL && a.Policy != unix.SCHED_BATCH {
		return nil
	}
	a.Size = unix.SizeofSchedAttr
	a.Runtime = uint64(d)
	a.Flags &^= unix.SCHED_FLAG_RESET_ON_FORK
	if err := unix.SchedSetAttr(tid, a, 0); err != nil {
		return fmt.Errorf("schedslice: sched_setattr %d: %w", tid, err)
	}
	return nil
}
