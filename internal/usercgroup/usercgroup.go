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
//	/airlock/<id>/user/exit  (cpu only) envd threads on their way out
//	                         (see Start); the most cpu.shares
//
// A leaf per tree means a held fork bomb fills its own leaf only: the next
// command gets a fresh leaf with the reserve's worth of slots (a leaf is
// used again only once the tree it held is gone).
//
// Placement is race-free without a helper process: cgroup v1 places threads,
// not only processes, and a forked child starts in the cgroups of the thread
// that forked it. Start locks a goroutine to a new OS thread, moves that
// thread (its tid, written to the leaf's tasks file) into the leaf and forks
// the child from it, then ends with the goroutine. The child never runs a
// single instruction in envd's cgroup. envd's memory stays
// charged to envd's cgroup: v1 charges a process's pages to the cgroup of its
// thread group leader, the main thread, which never becomes a spare (envd
// keeps its main goroutine on it, and a spare that lands there anyway leaves
// it alone). Go starts new runtime threads from its template thread, never
// from a locked one, so no runtime thread of envd lands in a leaf either.
//
// The same per-thread trick carries two more things into every user process
// and nowhere else in envd (internal/sysinfo): the spare thread drops
// CAP_SYS_PTRACE, which envd keeps to answer sysinfo, and installs the
// seccomp filter that traps sysinfo into a listener envd serves.
//
// In a gVisor sandbox (internal/runtime/gvisor) the sentry's own cgroup v2
// hierarchy is mounted at /sys/fs/cgroup instead, and nothing is set up from
// the host: the gVisor runtime passes the sandbox's task limit in
// TasksMaxEnv, and envd's pid 1 builds the same layout inside with SetupV2
// (pids only: gVisor's v2 memory.max is not enforced; the host's memory
// cgroup holds the sandbox's memory):
//
//	/                 the sandbox (the root of its cgroup namespace)
//	/envd             envd (pid 1 and the server); no limit of its own
//	/user             pids.max = the task limit - reserve
//	/user/<n>         one started process tree; pids.max = user's - reserve
//
// v2 places processes, not threads, so there a child is forked straight into
// its leaf with clone3(CLONE_INTO_CGROUP) (SysProcAttr.UseCgroupFD).
// gVisor's v1 cgroupfs cannot do this job: its pids charge goes to the first
// cgroup of the task's set of any hierarchy (Task.chargeLocked), so a v1
// pids.max holds only by chance; its v2 pids controller charges every
// ancestor on each task creation (cgroup2fs pids.canEnter).
//
// Where there is no writable "user" cgroup (envd run outside a sandbox),
// Start just calls start, from a spare thread if envd holds CAP_SYS_PTRACE.
package usercgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/sysinfo"
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

// UserPids is the part of a pids limit the users' processes may take: all
// but UserReserve (at least 1).
func UserPids(pidsMax int64) int64 { return max(pidsMax-UserReserve(pidsMax), 1) }

// UserMemory is the part of a memory limit (bytes) the users' processes may
// take: all but MemoryReserve (at least 1).
func UserMemory(limit int64) int64 { return max(limit-MemoryReserve(limit), 1) }

// UserCPUShares is the cpu.shares of the "user" child. envd's threads sit in
// the parent with the default weight of 1024 each, so envd gets the CPU first
// when it has something to do, even while the user's processes spin.
const UserCPUShares = 128

// root is where the hierarchies are mounted in a sandbox (the sandbox's own
// cgroup is the root of its cgroup namespace).
var root = "/sys/fs/cgroup"

type placer struct {
	dirs   []string // <root>/<ctrl>/user, one per controller; v2: <root>/user
	v2     bool
	next   atomic.Uint64
	spares *spares    // the threads user processes are forked from; nil: fork from any thread
	mu     sync.Mutex // serializes leaf creation and the sweep of empty leaves
	// unborn are v2 leaves made for a start that has not forked into them
	// yet: empty, but not to be swept (v1 leaves hold their spare thread).
	unborn map[string]bool
}

var (
	once   sync.Once
	global *placer
)

func get() *placer {
	once.Do(func() {
		global = &placer{}
		if d := filepath.Join(root, Name); isV2(root) && unix.Access(filepath.Join(d, "cgroup.procs"), unix.W_OK) == nil {
			global.dirs, global.v2 = []string{d}, true
		} else {
			var dirs []string
			for _, c := range Controllers {
				d := filepath.Join(root, c, Name)
				if unix.Access(filepath.Join(d, "tasks"), unix.W_OK) != nil {
					dirs = nil
					break
				}
				dirs = append(dirs, d)
			}
			global.dirs = dirs
		}
		// Spare threads where a thread must be placed in a v1 leaf, or must
		// shed CAP_SYS_PTRACE (and carry the sysinfo filter) before it forks.
		if (len(global.dirs) > 0 && !global.v2) || sysinfo.HoldsPtrace() {
			sp := &spares{}
			sp.changed = sync.NewCond(&sp.mu)
			global.spares = sp
			sp.mu.Lock()
			global.readyAheadLocked() // for the first command
			sp.mu.Unlock()
		}
	})
	return global
}

// Enabled reports whether user processes get cgroups of their own here. The
// first call also starts readying the first spare thread.
func Enabled() bool { return len(get().dirs) > 0 }

// Start runs start (which must fork the child from the calling goroutine, as
// exec.Cmd.Start and syscall.ForkExec do, with sys as its SysProcAttr) so
// that the child and everything it forks live in a fresh leaf cgroup: on v1
// from an OS thread placed in the leaf, on v2 through sys.UseCgroupFD. When
// the leaf cannot be made, the child starts where envd is and the error is
// returned beside start's result for the caller to log.
//
// Where envd holds CAP_SYS_PTRACE (the linux runtime grants it for
// internal/sysinfo), the child is always forked from a spare thread that
// dropped it and carries the sysinfo filter (sysinfo.PrepareThread): no user
// process gets the capability, and each process tree traps sysinfo into a
// listener of its own. A thread that could not drop it forks nothing: Start
// returns that error instead.
//
// Readying a thread costs about 1 ms of CPU, most of it the moves between
// v1 cgroups, which also wait for an RCU grace period per hierarchy, so one
// is readied ahead (fresh) and the next is readied in the background once a
// Start has forked from it. The thread forks one tree and ends at once, and
// every tree gets a fresh leaf. Reusing the thread and leaf of a tree that
// is gone would save the readying, and was tried twice: keeping the thread
// until its tree was gone, and ending it when the command was reaped if the
// command left a tree running. Under load, both made the first command
// after an all-at-once attack (fork and memory bomb among them) stop for one
// to two seconds or time out, in 4 and 3 of 20 runs, against 1 of 60 for a
// fresh thread and leaf (1.6 s, no time-out). The mechanism is not pinned
// down; the candidates are a thread that must run from the leaves of the attack to end (it holds
// one of envd's Ps meanwhile, and GOMAXPROCS is the sandbox's CPU count),
// and an attack inheriting a reused leaf's dirty page cache, which v1
// reclaim waits on while forks hold the kernel's cgroup_threadgroup_rwsem.
// A third form, the second using a leaf again only if it holds under 1 MiB,
// timed out none of 40 (2 took 1.3-1.4 s) and took commands.run from
// 3.3-3.7 to 2.7-2.8 ms; it is not in until a full test run is green with
// it (its first had two failures that pass alone; see README).
func Start(sys *syscall.SysProcAttr, start func() error) (err, placeErr error) {
	p := get()
	if p.v2 {
		if p.spares == nil {
			return p.startV2(sys, start)
		}
		inner := start
		start = func() error {
			err, placeErr = p.startV2(sys, inner)
			return err
		}
	} else if p.spares == nil {
		return start(), nil
	}
	s := p.acquire()
	defer s.retire()
	if s.err != nil {
		return s.err, errors.Join(placeErr, s.placeErr) // the thread ends without forking
	}
	s.run <- start
	err = <-s.done
	p.readyNext()
	return err, errors.Join(placeErr, s.placeErr)
}

// spares are the OS threads user processes are forked from: at most one
// readied ahead, idle (a task in a fresh leaf's pids count). While quiesced
// (Quiesce) there is none, and none is readied until Wake.
type spares struct {
	mu       sync.Mutex
	changed  *sync.Cond // quiesced, readying or fresh changed
	quiesced bool
	started  bool   // a Start has taken a spare
	readying int    // threads being readied (readyAheadLocked)
	fresh    *spare // readied, never used
}

// firstReadyDelay is how long after the first Start the spare behind it is
// readied: long enough for a first command such as `echo` to end first
// (readying competes with it for the sandbox's CPU, and a cold create's time
// to first answer includes that command), short enough to be ready before
// a tree the first command left running has grown.
const firstReadyDelay = 20 * time.Millisecond

// spare is an OS thread readied to fork one user process tree
// (sysinfo.PrepareThread) and, on v1, moved into a leaf of its own.
type spare struct {
	err      error // the thread kept a privilege no user process may have
	placeErr error // no leaf or no sysinfo filter: logged, the child starts anyway
	run      chan func() error
	done     chan error
}

// retire ends s's thread, taking its leaf membership, dropped capability and
// seccomp filter with it; the leaf goes in a later sweep, once empty.
func (s *spare) retire() { close(s.run) }

// acquire returns the fresh spare for one Start; while there is none it
// waits for the one being readied, readying one if none is. While quiesced
// it waits for Wake.
func (p *placer) acquire() *spare {
	sp := p.spares
	sp.mu.Lock()
	defer sp.mu.Unlock()
	for {
		if !sp.quiesced {
			if s := sp.fresh; s != nil {
				sp.fresh = nil
				return s
			}
			if sp.readying == 0 {
				p.readyAheadLocked()
			}
		}
		sp.changed.Wait()
	}
}

// readyNext readies the spare for the next Start once this one has forked,
// so that neither the readying's work nor its cgroup moves (which hold up
// every fork while they wait) come before the fork. Behind the first Start
// it waits firstReadyDelay.
func (p *placer) readyNext() {
	sp := p.spares
	sp.mu.Lock()
	first := !sp.started
	sp.started = true
	sp.mu.Unlock()
	if first {
		time.AfterFunc(firstReadyDelay, p.keepOneFresh)
		return
	}
	p.keepOneFresh()
}

// keepOneFresh readies a spare if none is fresh or being readied.
func (p *placer) keepOneFresh() {
	sp := p.spares
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.quiesced && sp.fresh == nil && sp.readying == 0 {
		p.readyAheadLocked()
	}
}

// readyAheadLocked readies a fresh spare in the background. The caller
// holds sp.mu.
func (p *placer) readyAheadLocked() {
	sp := p.spares
	sp.readying++
	go func() {
		s := p.newSpare()
		sp.mu.Lock()
		sp.readying--
		if sp.quiesced || sp.fresh != nil {
			s.retire()
		} else {
			sp.fresh = s
		}
		sp.changed.Broadcast()
		sp.mu.Unlock()
	}()
}

// newSpare readies a thread and returns it once it is ready to fork.
func (p *placer) newSpare() *spare {
	s := &spare{run: make(chan func() error), done: make(chan error, 1)}
	readied := make(chan struct{})
	sysinfo.OnDisposableThread(func() { p.spareThread(s, readied) })
	<-readied
	return s
}

// Quiesce retires the spare thread, waiting for any being readied, and
// readies no other until Wake; a Start meanwhile waits for the Wake. envd
// calls it before a checkpoint (envdapi.QuiesceSignal): a spare carries a
// seccomp filter whose listener is about to be closed
// (sysinfo.CloseListeners), and a filter cannot get a new one, so every tree
// forked from that thread would get ENOSYS from sysinfo(2). Where no spares
// are kept (gVisor, envd outside a sandbox) it does nothing.
func Quiesce() {
	sp := get().spares
	if sp == nil {
		return
	}
	sp.mu.Lock()
	sp.quiesced = true
	for sp.readying > 0 {
		sp.changed.Wait()
	}
	fresh := sp.fresh
	sp.fresh = nil
	sp.mu.Unlock()
	if fresh != nil {
		fresh.retire()
	}
}

// Wake ends a Quiesce: a spare is readied again (with a new sysinfo filter
// and listener). A Wake without a Quiesce does nothing.
func Wake() {
	p := get()
	sp := p.spares
	if sp == nil {
		return
	}
	sp.mu.Lock()
	defer sp.mu.Unlock()
	if !sp.quiesced {
		return
	}
	sp.quiesced = false
	p.readyAheadLocked()
	sp.changed.Broadcast()
}

// spareThread readies the thread of one spare (a disposable thread: it ends
// with the goroutine, taking its leaf membership, its dropped capability and
// its seccomp filter with it), then forks what the Start that takes it hands
// it.
func (p *placer) spareThread(s *spare, readied chan<- struct{}) {
	var filterErr error
	s.err, filterErr = sysinfo.PrepareThread()
	if s.err == nil && !p.v2 && len(p.dirs) > 0 {
		s.placeErr = p.enter()
	}
	s.placeErr = errors.Join(s.placeErr, filterErr)
	close(readied)
	for run := range s.run {
		s.done <- run()
	}
}

// startV2 forks the child into a new leaf with clone3(CLONE_INTO_CGROUP).
func (p *placer) startV2(sys *syscall.SysProcAttr, start func() error) (err, placeErr error) {
	if sys == nil {
		return start(), errors.New("usercgroup: no SysProcAttr to place the process with")
	}
	fd, name, err := p.leafV2()
	if err != nil {
		return start(), err
	}
	defer func() {
		unix.Close(fd)
		p.mu.Lock()
		delete(p.unborn, name)
		p.mu.Unlock()
	}()
	sys.UseCgroupFD, sys.CgroupFD = true, fd
	err = start()
	sys.UseCgroupFD, sys.CgroupFD = false, 0
	return err, nil
}

// leafV2 creates a leaf under the v2 "user" cgroup, with the user's pids
// limit minus the reserve, and returns an open descriptor of its directory and
// its name, which stays in p.unborn until the caller has forked into it.
func (p *placer) leafV2() (int, string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep()
	name := p.leafName()
	leaf, err := makeLeaf("pids", p.dirs[0], name)
	if err != nil {
		return -1, "", err
	}
	fd, err := unix.Open(leaf, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		_ = unix.Rmdir(leaf)
		return -1, "", fmt.Errorf("usercgroup: open %s: %w", leaf, err)
	}
	if p.unborn == nil {
		p.unborn = map[string]bool{}
	}
	p.unborn[name] = true
	return fd, name, nil
}

// enter creates a leaf in every controller and moves the calling thread
// into it.
func (p *placer) enter() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep()
	name := p.leafName()
	tid := []byte(strconv.Itoa(unix.Gettid()))
	for _, d := range p.dirs {
		leaf, err := makeLeaf(filepath.Base(filepath.Dir(d)), d, name)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(leaf, "tasks"), tid, 0); err != nil {
			return fmt.Errorf("usercgroup: enter %s: %w", leaf, err)
		}
	}
	return nil
}

// leafName names the next process tree's leaf (the same in every hierarchy).
func (p *placer) leafName() string { return "t" + strconv.FormatUint(p.next.Add(1), 10) }

// makeLeaf creates the leaf name under user, the controller ctrl's "user"
// cgroup, with limitLeaf's limits, and returns its path; a leaf it could not
// limit is removed again.
func makeLeaf(ctrl, user, name string) (string, error) {
	leaf := filepath.Join(user, name)
	if err := os.Mkdir(leaf, 0o755); err != nil {
		return "", fmt.Errorf("usercgroup: %w", err)
	}
	if err := limitLeaf(ctrl, user, leaf); err != nil {
		_ = unix.Rmdir(leaf)
		return "", err
	}
	return leaf, nil
}

// limitLeaf gives a leaf the user's pids and memory limits minus a reserve,
// so that one process tree held at its limit (a fork bomb, a memory hog the
// OOM killer keeps killing inside its leaf) leaves room for the next command:
// that one starts in a fresh leaf, where neither limit has been reached.
func limitLeaf(ctrl, user, leaf string) error {
	var file string
	var share func(int64) int64
	switch ctrl {
	case "pids":
		file, share = "pids.max", UserPids
	case "memory":
		file, share = "memory.limit_in_bytes", UserMemory
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
	if err := os.WriteFile(filepath.Join(leaf, file), []byte(strconv.FormatInt(share(n), 10)), 0); err != nil {
		return fmt.Errorf("usercgroup: %s: %w", file, err)
	}
	return nil
}

// sweep removes the leaves whose processes have all ended (rmdir of a cgroup
// that still has tasks fails with EBUSY, and the leaf stays), except the
// unborn ones: a concurrent start's clone3(CLONE_INTO_CGROUP) into a removed
// leaf fails (gVisor: ENOENT, seen with 8 starts at once).
func (p *placer) sweep() {
	for _, d := range p.dirs {
		ctrl := filepath.Base(filepath.Dir(d))
		if p.v2 {
			ctrl = ""
		}
		entries, err := os.ReadDir(d)
		if err != nil {
			continue
		}
		kept := 0
		for _, e := range entries {
			if !e.IsDir() || p.unborn[e.Name()] {
				continue
			}
			leaf := filepath.Join(d, e.Name())
			// A memory leaf whose processes the OOM killer hit keeps its
			// count (v1 counts a kill only in the cgroup whose limit was hit,
			// and the host sums the sandbox's subtree for its OOM events):
			// removing it would make the host's total go back. Only so many
			// are kept, empty cgroups are not free.
			if ctrl == "memory" && kept < maxKeptOOMLeaves && oomKilled(leaf) {
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

// TasksMaxEnv is the environment variable in which the gVisor runtime gives
// envd's pid 1 the sandbox's task limit (processes and threads) to enforce
// inside with SetupV2.
const TasksMaxEnv = "AIRLOCK_TASKS_MAX"

// isV2 reports whether dir is the root of a cgroup v2 hierarchy.
func isV2(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "cgroup.controllers"))
	return err == nil
}

// SetupV2 builds the v2 layout of the package comment in the cgroup v2
// hierarchy mounted at /sys/fs/cgroup (gVisor's, seen from the root of the
// sandbox's cgroup namespace), with tasksMax the whole sandbox's task limit.
// It moves the calling process (envd, before it starts the server) and
// pid 1 into /envd. Called once, before anything else runs in the sandbox.
func SetupV2(tasksMax int64) error {
	if tasksMax <= 0 {
		return fmt.Errorf("usercgroup: task limit %d", tasksMax)
	}
	if !isV2(root) {
		return fmt.Errorf("usercgroup: no cgroup v2 hierarchy at %s", root)
	}
	envdDir, user := filepath.Join(root, "envd"), filepath.Join(root, Name)
	// No internal processes: the root's controllers reach only children, so
	// envd moves out of the root before "+pids" is enabled there.
	for _, d := range []string{envdDir, user} {
		if err := os.Mkdir(d, 0o755); err != nil && !os.IsExist(err) {
			return fmt.Errorf("usercgroup: %w", err)
		}
	}
	// envd's pid 1 (its reaper) moves too: it is no user's process, and
	// nothing may stay in the root once its controllers are on.
	for _, pid := range []int{1, os.Getpid()} {
		if err := os.WriteFile(filepath.Join(envdDir, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0); err != nil {
			return fmt.Errorf("usercgroup: move envd (pid %d) to %s: %w", pid, envdDir, err)
		}
	}
	if err := os.WriteFile(filepath.Join(root, "cgroup.subtree_control"), []byte("+pids"), 0); err != nil {
		return fmt.Errorf("usercgroup: enable pids: %w", err)
	}
	if err := os.WriteFile(filepath.Join(user, "pids.max"), []byte(strconv.FormatInt(UserPids(tasksMax), 10)), 0); err != nil {
		return fmt.Errorf("usercgroup: user pids.max: %w", err)
	}
	if err := os.WriteFile(filepath.Join(user, "cgroup.subtree_control"), []byte("+pids"), 0); err != nil {
		return fmt.Errorf("usercgroup: enable pids under user: %w", err)
	}
	return nil
}
