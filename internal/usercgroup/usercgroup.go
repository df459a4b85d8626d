// Package usercgroup places the processes envd starts for users (commands,
// PTYs, sudo, code-interpreter kernels) in cgroups of their own, apart from
// envd, so that a workload that exhausts the sandbox's pids or memory hits the
// users' limit and never takes envd with it.
//
// The host (internal/runtime/linux) makes the sandbox's cgroup /airlock/<id>
// hold the sandbox's total limits and creates a child "user" in the pids,
// memory and cpu hierarchies with the total minus a reserve (UserReserve):
// envd stays in /airlock/<id> and keeps that reserve of pids and memory for
// itself (the Go runtime aborts the whole process when it cannot create an OS
// thread). "user" and its cgroup.procs and tasks files belong to the
// sandbox's root, so envd can create a leaf per started process tree under it:
//
//	/airlock/<id>            total limits; envd (pid 1 and the server)
//	/airlock/<id>/user       total - reserve; low cpu.shares
//	/airlock/<id>/user/<n>   one started process tree; pids and memory
//	                         limits = user's - reserve
//
// A leaf per tree means a held fork bomb fills its own leaf only: the next
// command gets a fresh leaf with the reserve's worth of slots.
//
// Placement is race-free without a helper process: cgroup v1 places threads,
// not only processes, and a forked child starts in the cgroups of the thread
// that forked it. Start locks a goroutine to a new OS thread, moves that
// thread (its tid, written to the leaf's tasks file) into the leaf, forks the
// child from it, and lets the thread end with the goroutine. The child never
// runs a single instruction in envd's cgroup. envd's memory stays charged to
// envd's cgroup: v1 charges a process's pages to the cgroup of its thread
// group leader. Go starts new runtime threads from its template thread, never
// from a locked one, so no runtime thread of envd lands in a leaf either.
//
// Where there is no writable "user" cgroup (gVisor, where the sandbox has no
// cgroupfs; envd run outside a sandbox), Start just calls start.
package usercgroup

import (
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Controllers are the cgroup v1 hierarchies that have a "user" child.
var Controllers = []string{"pids", "memory", "cpu"}

// Name is the child of a sandbox's cgroup that holds the users' processes.
const Name = "user"

// UserReserve returns how many of a sandbox's pidsMax the user processes
// cannot take (kept for envd), and equally how many each process tree leaves
// to the others: 1/16 of the total, between 16 and 128. envd needs a few
// dozen threads at most.
func UserReserve(pidsMax int64) int64 {
	return min(max(pidsMax/16, 16), 128)
}

// MemoryReserve returns how much of a sandbox's memory limit (bytes) the user
// processes cannot take: envd's resident set is 10-30 MiB; 1/8 of the total,
// between 32 and 128 MiB, and never more than half.
func MemoryReserve(limit int64) int64 {
	return min(max(limit/8, 32<<20), 128<<20, limit/2)
}

// UserCPUShares is the cpu.shares of the "user" child. envd's threads sit in
// the parent with the default weight of 1024 each, so envd gets the CPU first
// when it has something to do, even while the user's processes spin.
const UserCPUShares = 128

// root is where the hierarchies are mounted in a sandbox (the sandbox's own
// cgroup is the root of its cgroup namespace).
var root = "/sys/fs/cgroup"

type placer struct {
	dirs  []string // <root>/<ctrl>/user, one per controller
	next  atomic.Uint64
	ready chan *spare // a thread placed in a fresh leaf (keepSpare)
	mu    sync.Mutex  // serializes leaf creation and the sweep of empty leaves
}

var (
	once   sync.Once
	global *placer
)

func get() *placer {
	once.Do(func() {
		var dirs []string
		for _, c := range Controllers {
			d := filepath.Join(root, c, Name)
			if unix.Access(filepath.Join(d, "tasks"), unix.W_OK) != nil {
				return
			}
			dirs = append(dirs, d)
		}
		global = &placer{dirs: dirs, ready: make(chan *spare)}
		go global.keepSpare()
	})
	return global
}

// Enabled reports whether user processes get cgroups of their own here.
func Enabled() bool { return get() != nil }

// Start runs start (which must fork the child from the calling goroutine, as
// exec.Cmd.Start and syscall.ForkExec do) on an OS thread placed in a fresh
// leaf cgroup, so the child and everything it forks live there. When the leaf
// cannot be made, the child starts where envd is and the error is returned
// beside start's result for the caller to log.
//
// Moving a thread between v1 cgroups waits for an RCU grace period per
// hierarchy (milliseconds), so a thread already placed in a fresh leaf is kept
// ready (spare) and the next one is placed in the background after each use.
// A start that finds none ready waits for the one being placed: placements
// are serialized (p.mu) anyway, so placing its own would not be sooner.
func Start(start func() error) (err, placeErr error) {
	p := get()
	if p == nil {
		return start(), nil
	}
	s := <-p.ready
	s.run <- start
	return <-s.done, s.placeErr
}

// spare is an OS thread already moved into a fresh leaf, parked until a Start
// hands it the function that forks a child.
type spare struct {
	placeErr error
	run      chan func() error
	done     chan error
}

// keepSpare places one thread after another in a fresh leaf and offers it on
// p.ready; it blocks while the offered one is unused, so at most one idle
// thread (one task in a leaf's pids count) exists per sandbox.
func (p *placer) keepSpare() {
	for {
		s := &spare{run: make(chan func() error), done: make(chan error, 1)}
		placed := make(chan error, 1)
		go func() {
			goruntime.LockOSThread() // never unlocked: see Start
			placed <- p.enter()
			s.done <- (<-s.run)()
		}()
		s.placeErr = <-placed
		p.ready <- s
	}
}

// enter creates a leaf in every controller and moves the calling thread
// into it.
func (p *placer) enter() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep()
	name := "t" + strconv.FormatUint(p.next.Add(1), 10)
	tid := []byte(strconv.Itoa(unix.Gettid()))
	for _, d := range p.dirs {
		leaf := filepath.Join(d, name)
		if err := os.Mkdir(leaf, 0o755); err != nil {
			return fmt.Errorf("usercgroup: %w", err)
		}
		if err := limitLeaf(filepath.Base(filepath.Dir(d)), d, leaf); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(leaf, "tasks"), tid, 0); err != nil {
			return fmt.Errorf("usercgroup: enter %s: %w", leaf, err)
		}
	}
	return nil
}

// limitLeaf gives a leaf the user's pids and memory limits minus a reserve,
// so that one process tree held at its limit (a fork bomb, a memory hog the
// OOM killer keeps killing inside its leaf) leaves room for the next command:
// that one starts in a fresh leaf, where neither limit has been reached.
func limitLeaf(ctrl, user, leaf string) error {
	var file string
	var reserve func(int64) int64
	switch ctrl {
	case "pids":
		file, reserve = "pids.max", UserReserve
	case "memory":
		file, reserve = "memory.limit_in_bytes", MemoryReserve
	default:
		return nil
	}
	b, err := os.ReadFile(filepath.Join(user, file))
	if err != nil {
		return fmt.Errorf("usercgroup: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "max" {
		return nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return fmt.Errorf("usercgroup: %s %q: %w", file, s, err)
	}
	if ctrl == "memory" && n >= 1<<62 {
		return nil // unlimited
	}
	limit := max(n-reserve(n), 1)
	if err := os.WriteFile(filepath.Join(leaf, file), []byte(strconv.FormatInt(limit, 10)), 0); err != nil {
		return fmt.Errorf("usercgroup: %s: %w", file, err)
	}
	return nil
}

// sweep removes the leaves whose processes have all ended (rmdir of a cgroup
// that still has tasks fails with EBUSY, and the leaf stays).
func (p *placer) sweep() {
	for _, d := range p.dirs {
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		kept := 0
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			leaf := filepath.Join(d, e.Name())
			// A memory leaf whose processes the OOM killer hit keeps its
			// count (v1 counts a kill only in the cgroup whose limit was hit,
			// and the host sums the sandbox's subtree for its OOM events):
			// removing it would make the host's total go back. Only so many
			// are kept, empty cgroups are not free.
			if filepath.Base(filepath.Dir(d)) == "memory" && kept < maxKeptOOMLeaves && oomKilled(leaf) {
				kept++
				continue
			}
			_ = unix.Rmdir(leaf)
		}
	}
}

// maxKeptOOMLeaves bounds the emptied memory leaves kept for their OOM kill
// counts; past it, kills of removed leaves drop out of the host's count.
const maxKeptOOMLeaves = 64

// oomKilled reports whether the kernel killed a process of a v1 memory cgroup
// because it hit its limit.
func oomKilled(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return false
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "oom_kill "); ok {
			return strings.TrimSpace(v) != "0"
		}
	}
	return false
}
