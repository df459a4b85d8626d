// Package sysinfo makes sysinfo(2) inside a linux-runtime sandbox report the
// sandbox's memory, uptime and task count instead of the host's, so that
// glibc's sysconf(_SC_PHYS_PAGES) and _SC_AVPHYS_PAGES (Python's os.sysconf,
// JVMs, thread-pool and cache sizing), busybox free and the like agree with
// the sandbox's /proc/meminfo and /proc/uptime (lxcfs's views). No file
// system can answer a system call, so envd answers it through a seccomp user
// notification. gVisor's sentry answers sysinfo itself and needs none of this.
//
// The lifecycle, for each process tree envd starts:
//
//  1. Thread. internal/usercgroup forks every user process from a spare OS
//     thread that ends after the fork. Before that thread is offered (off the
//     request path), PrepareThread drops CAP_SYS_PTRACE from it and installs a
//     seccomp filter with SECCOMP_FILTER_FLAG_NEW_LISTENER that traps sysinfo
//     and allows everything else. Filters are per thread and inherited across
//     fork, so the child forked from that thread and everything it forks trap
//     sysinfo into this one listener; envd's other threads never carry it
//     (Go starts new runtime threads from its template thread, never from a
//     locked one).
//  2. Listener. The listener descriptor goes, non-blocking, into Go's
//     netpoller: one parked goroutine per live process tree, no OS thread.
//  3. Handler. For each notification: read the sandbox's view (its memory
//     cgroup, pids.current and pid 1's start time: what lxcfs computes
//     /proc/meminfo and /proc/uptime from), open the caller's
//     /proc/<pid>/mem, check that the notification is still valid (so the
//     pid was not reused in between), write the struct sysinfo at the
//     caller's pointer and let the call return 0; -EFAULT when the write
//     fails, as the kernel would. Any other failure lets the real system call
//     run (SECCOMP_USER_NOTIF_FLAG_CONTINUE), so a caller never hangs and at
//     worst sees the host's numbers.
//  4. Close. When the thread has ended and every process of the tree has
//     exited and been reaped, the kernel reports POLLHUP on the listener and
//     the goroutine closes it.
//  5. Checkpoint. CRIU cannot dump a seccomp notification descriptor, so
//     before a checkpoint envd quiesces (envdapi.QuiesceSignal): it stops
//     readying spare threads and discards the readied one
//     (usercgroup.Quiesce), then closes every listener (CloseListeners).
//     A filter cannot be removed, nor given a new listener, so from then on
//     the kernel answers the sysinfo(2) of every tree that was running with
//     ENOSYS (a SECCOMP_RET_USER_NOTIF filter without a listener): in the
//     sandbox that runs on after a fork's or snapshot's capture, and in a
//     restored one, since CRIU restores filters but not listeners. Trees
//     started after the wake get a filter and a listener of their own
//     again. envd itself never carries the filter (its
//     own threads are never spare threads), so nothing in envd calls into a
//     dead listener.
//
// Writing into the memory of a process of another uid, or of a non-dumpable
// one, needs CAP_SYS_PTRACE in the sandbox's user namespace, so the linux
// runtime grants it to the sandbox's root, that is to envd. No user process
// may hold it: every thread that forks one drops it from its effective,
// permitted and inheritable sets first (DropPtrace; capabilities are per
// thread), and under no_new_privs, which every sandbox process has, execve
// never raises the permitted set above the old one, not even for root. With
// envd holding a capability its children lack, a root command can no longer
// ptrace envd or read its memory either.
//
// Side effect: seccomp allows one listener per filter chain, so a process in a
// trapped tree cannot install a filter with a listener of its own (EBUSY).
package sysinfo

import (
	"fmt"
	"runtime"
	"sync"

	"golang.org/x/sys/unix"
)

// capSysPtrace is CAP_SYS_PTRACE's bit (include/uapi/linux/capability.h).
const capSysPtrace = 19

// threadCaps reads the calling thread's capability sets (capget with pid 0 is
// the calling thread).
func threadCaps() (*unix.CapUserHeader, *[2]unix.CapUserData, error) {
	hdr := &unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(hdr, &data[0]); err != nil {
		return nil, nil, fmt.Errorf("sysinfo: capget: %w", err)
	}
	return hdr, &data, nil
}

// HoldsPtrace reports whether the calling thread has CAP_SYS_PTRACE in its
// permitted set, that is whether threads of this process that fork user
// processes must drop it first.
func HoldsPtrace() bool {
	_, data, err := threadCaps()
	return err == nil && data[0].Permitted&(1<<capSysPtrace) != 0
}

// DropPtrace removes CAP_SYS_PTRACE from the calling OS thread's effective,
// permitted and inheritable sets (the caller has locked the goroutine to a
// thread that never runs anything else afterwards). Dropping needs no
// capability, and no_new_privs keeps every process forked from the thread
// from getting it back through execve.
func DropPtrace() error {
	hdr, data, err := threadCaps()
	if err != nil {
		return err
	}
	const bit = uint32(1) << capSysPtrace
	if (data[0].Permitted|data[0].Effective|data[0].Inheritable)&bit == 0 {
		return nil
	}
	data[0].Permitted &^= bit
	data[0].Effective &^= bit
	data[0].Inheritable &^= bit
	if err := unix.Capset(hdr, &data[0]); err != nil {
		return fmt.Errorf("sysinfo: drop CAP_SYS_PTRACE: %w", err)
	}
	return nil
}

var (
	enabledOnce sync.Once
	enabled     bool
)

// Enabled reports whether this process answers sysinfo for the processes it
// starts: the architecture is one the filter knows, the process holds
// CAP_SYS_PTRACE (the runtime granted it for this) and /proc/meminfo is
// lxcfs's view. Where /proc shows the kernel's numbers anyway (a host,
// gVisor, a sandbox without lxcfs), the kernel's sysinfo already agrees with
// it and nothing is trapped. Decided once per process.
func Enabled() bool {
	enabledOnce.Do(func() {
		if !archSupported || !HoldsPtrace() {
			return
		}
		enabled = viewDiffers(procPaths)
	})
	return enabled
}

// PrepareThread readies the calling OS thread, locked and ending after it
// forks, to fork user processes: it drops CAP_SYS_PTRACE and, where Enabled,
// installs the sysinfo filter and starts serving its listener. err means the
// capability could not be dropped: nothing may be forked from this thread.
// filterErr means the filter is missing: the processes forked from the thread
// see the kernel's sysinfo; the caller logs it.
func PrepareThread() (err, filterErr error) {
	// Before the drop: Enabled looks at this thread's capabilities the first
	// time it is asked.
	on := Enabled()
	if err := DropPtrace(); err != nil {
		return err, nil
	}
	if !on {
		return nil, nil
	}
	return nil, attach(procPaths)
}

// OnDisposableThread runs fn in a new goroutine locked for good to an OS
// thread that is not the process's main thread, so that the thread ends when
// fn returns, taking whatever fn changed about it (PrepareThread's dropped
// capability and filter, a cgroup v1 membership) along.
//
// The main thread never qualifies: Go never ends it (a goroutine that exits
// locked to it parks it for good instead), and as the thread group leader its
// v1 memory cgroup is the one the whole process is charged to. A goroutine
// that lands on it keeps it, untouched and locked, so that no later one can
// land there, and passes fn on to another. (envd locks its main goroutine to
// the main thread at init, so this only happens in other binaries, tests.)
func OnDisposableThread(fn func()) {
	go func() {
		runtime.LockOSThread() // never unlocked
		if unix.Gettid() == unix.Getpid() {
			OnDisposableThread(fn)
			select {}
		}
		fn()
	}()
}
