package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// bgCounter is a background process started through envd, as a user's
// `commands.run(..., {background: true})` is: it counts in ~/w, appending each
// number through a descriptor opened once (fd 3), and after each step writes
// what the kernel says of it to ~/w/state: its pid, cwd and fd 3 (through
// /proc), and how many lines the file holds. A Python process beside it holds
// 64 MiB of memory that is not zeros.
const bgCounter = `mkdir -p ~/w
cd ~/w || exit 1
setsid sh -c '
exec 3>>held
i=0
while :; do
  i=$((i+1))
  echo $i >&3
  echo "$i $$ $(readlink /proc/$$/cwd) $(readlink /proc/$$/fd/3) $(wc -l < held)" > state.tmp
  mv state.tmp state
  sleep 0.2
done' </dev/null >/dev/null 2>&1 &
setsid python3 -c 'import time
b = bytes(range(256)) * (256 << 10)
open("hog.ready", "w").close()
time.sleep(1e9)' </dev/null >/dev/null 2>&1 &
echo started`

// routes lists the sandbox's IPv4 routes (interface, destination, gateway).
const routes = `tail -n +2 /proc/net/route | awk '{print $1, $2, $3}'`

type bgState struct {
	I     int
	Pid   string
	Cwd   string
	FD3   string
	Lines int
}

// readBG reads the background counter's last report through envd.
func readBG(t *testing.T, m *sandbox.Manager, info sandbox.Info) (bgState, bool) {
	t.Helper()
	out, code := run(t, m, info, "cat ~/w/state 2>/dev/null")
	f := strings.Fields(out)
	if code != 0 || len(f) != 5 {
		return bgState{}, false
	}
	i, err1 := strconv.Atoi(f[0])
	lines, err2 := strconv.Atoi(f[4])
	return bgState{I: i, Pid: f[1], Cwd: f[2], FD3: f[3], Lines: lines}, err1 == nil && err2 == nil
}

// waitBG waits until the counter has passed after and returns its report.
func waitBG(t *testing.T, m *sandbox.Manager, info sandbox.Info, after int) bgState {
	t.Helper()
	var s bgState
	testenv.Eventually(t, 30*time.Second, fmt.Sprintf("the background counter of %s to pass %d", info.ID, after), func() bool {
		var ok bool
		s, ok = readBG(t, m, info)
		return ok && s.I > after
	})
	return s
}

// checkBG checks a report taken after a restore against one from before:
// the same process, its cwd and fd 3 intact, and a writable layer of the
// same instant as its memory (every number it counted is in the file once).
func checkBG(t *testing.T, what string, before, after bgState) {
	t.Helper()
	if after.Pid != before.Pid {
		t.Errorf("%s: the counter's pid is %s, was %s", what, after.Pid, before.Pid)
	}
	if after.Cwd != "/home/user/w" || after.FD3 != "/home/user/w/held" {
		t.Errorf("%s: the counter's cwd %q and fd 3 %q", what, after.Cwd, after.FD3)
	}
	if after.I <= before.I {
		t.Errorf("%s: the counter is at %d, was %d", what, after.I, before.I)
	}
	if after.Lines != after.I {
		t.Errorf("%s: the counter's file holds %d lines at step %d: layer and memory are not of one instant", what, after.Lines, after.I)
	}
}

// gvisorManager is a started manager whose "base-gvisor" template runs on
// gVisor, with a sandbox network of the test's own.
func gvisorManager(t *testing.T, r *rig) (*sandbox.Manager, *gvisor.Runtime) {
	t.Helper()
	testenv.NeedRunsc(t)
	gv, err := gvisor.New(filepath.Join(r.dataDir, "runtime-gvisor"), nil)
	if err != nil {
		t.Fatal(err)
	}
	n := testNetwork(t, r.dataDir)
	m := sandbox.New(sandbox.Options{
		Runtime: r.rt, Runtimes: []runtime.Runtime{gv}, Store: r.db, Templates: twoRuntimes{r.tpl},
		DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour, Network: n.net,
	})
	m.Start()
	t.Cleanup(func() {
		m.KillAll(context.Background())
		m.Close()
	})
	return m, gv
}

// sentryOf reports a live runsc-sandbox process of sandbox id.
func sentryOf(id string) (int, bool) {
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
		if len(args) > 1 && args[0] == "runsc-sandbox" && args[len(args)-1] == id+"-gv" {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			return pid, true
		}
	}
	return 0, false
}

// TestGVisorPauseWithMemory pauses a real gVisor sandbox with envd, from the
// base template, to disk: envd quiesces (its host-bound sockets closed), runsc
// saves the sentry into <data>/paused/<id>/memory, the sentry and the
// sandbox's cgroup go (its RAM with them). Resume restores it: the background
// counter is the same process and counts on, its cwd and open file intact,
// the process holding 64 MiB still holds it, and envd answers again. The
// sandbox network kept across the pause works again (the namespace is
// readdressed after runsc stripped it).
func TestGVisorPauseWithMemory(t *testing.T) {
	r := newRig(t)
	m, gv := gvisorManager(t, r)
	testPauseWithMemory(t, r, m, pausedSandbox{
		template: "base-gvisor", image: "checkpoint.img", rt: gv, network: true,
		alive: func(id string) bool { _, ok := sentryOf(id); return ok },
	})
}

// pausedSandbox says what testPauseWithMemory checks for one backend.
type pausedSandbox struct {
	template string
	// image is a file every image of the backend holds.
	image string
	rt    runtime.Runtime
	// network: the sandbox has a network, whose routes must be the same
	// after a resume.
	network bool
	// alive reports whether a host process of the sandbox runs.
	alive func(id string) bool
	// started, if set, runs once the background processes run;
	// resumed after each resume.
	started func(t *testing.T, m *sandbox.Manager, info sandbox.Info)
	resumed func(t *testing.T, m *sandbox.Manager, info sandbox.Info, cycle int)
}

// testPauseWithMemory pauses a sandbox with a background counter and a
// process holding 64 MiB to disk, checks that nothing of it runs or holds
// memory on the host, resumes it and checks its processes, twice.
func testPauseWithMemory(t *testing.T, r *rig, m *sandbox.Manager, p pausedSandbox) {
	ctx := context.Background()
	info, err := m.Create(ctx, sandbox.CreateRequest{Template: p.template, Timeout: 5 * time.Minute, Secure: true})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if out, code := run(t, m, info, bgCounter); code != 0 || out != "started\n" {
		t.Fatalf("starting the background processes: %q (exit %d)", out, code)
	}
	testenv.Eventually(t, 30*time.Second, "the 64 MiB holder", func() bool {
		_, code := run(t, m, info, "test -e ~/w/hog.ready")
		return code == 0
	})
	hog, _ := run(t, m, info, "pgrep -f 'bytes\\(range' | head -n 1")
	before := waitBG(t, m, info, 2)
	routesBefore, _ := run(t, m, info, routes)
	if p.network && !strings.Contains(routesBefore, "eth0") {
		t.Fatalf("no route through eth0 in the sandbox: %q", routesBefore)
	}
	if !p.alive(info.ID) {
		t.Fatalf("no host process of %s before the pause", info.ID)
	}
	if p.started != nil {
		p.started(t, m, info)
	}

	for cycle := 1; cycle <= 2; cycle++ {
		start := time.Now()
		if err := m.Pause(ctx, info.ID, sandbox.PauseOptions{}); err != nil {
			t.Fatalf("Pause %d: %v", cycle, err)
		}
		t.Logf("pause %d with memory: %v", cycle, time.Since(start))
		got, err := m.Get(ctx, info.ID)
		if err != nil || got.State != sandbox.StatePaused || !got.PausedWithMemory {
			t.Fatalf("after Pause %d: %+v, %v", cycle, got, err)
		}
		dirs := layout.DataDir{Root: r.dataDir}
		if _, err := os.Stat(dirs.PausedComplete(info.ID)); err != nil {
			t.Fatalf("pause %d: no complete mark: the sandbox was not checkpointed (frozen in place?): %v", cycle, err)
		}
		if _, err := os.Stat(filepath.Join(dirs.PausedMemory(info.ID), p.image)); err != nil {
			t.Fatalf("pause %d: no %s in the image: %v", cycle, p.image, err)
		}
		var imgBytes int64
		entries, _ := os.ReadDir(dirs.PausedMemory(info.ID))
		for _, de := range entries {
			if fi, err := de.Info(); err == nil {
				imgBytes += fi.Size()
			}
		}
		t.Logf("pause %d: image of %d MiB", cycle, imgBytes>>20)
		if imgBytes < 64<<20 {
			t.Errorf("pause %d: the image holds %d bytes, less than the 64 MiB a process held", cycle, imgBytes)
		}
		// Its writable layer holds little here; counting the template its
		// root overlay shows would add hundreds of MiB.
		if got.PausedDiskBytes < imgBytes || got.PausedDiskBytes > imgBytes+64<<20 {
			t.Errorf("pause %d: the sandbox is said to hold %d bytes on disk; its image holds %d and its writable layer little", cycle, got.PausedDiskBytes, imgBytes)
		}
		if p.alive(info.ID) {
			t.Errorf("pause %d: a host process of the sandbox lives on after a pause with memory", cycle)
		}
		if _, err := p.rt.Load(info.ID); !errors.Is(err, runtime.ErrNotFound) {
			t.Errorf("pause %d: the runtime still holds the paused sandbox: %v", cycle, err)
		}
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory/airlock", info.ID)); !os.IsNotExist(err) {
			t.Errorf("pause %d: the sandbox's memory cgroup survived the pause (its RAM is not released): %v", cycle, err)
		}

		start = time.Now()
		if _, resumed, err := m.Connect(ctx, info.ID, 5*time.Minute); err != nil || !resumed {
			t.Fatalf("Connect %d: resumed=%v err=%v", cycle, resumed, err)
		}
		t.Logf("resume %d: %v", cycle, time.Since(start))
		after := waitBG(t, m, info, before.I)
		checkBG(t, fmt.Sprintf("after resume %d", cycle), before, after)
		before = after
		if out, code := run(t, m, info, "kill -0 "+strings.TrimSpace(hog)+" && echo alive"); code != 0 || out != "alive\n" {
			t.Errorf("resume %d: the process holding 64 MiB (pid %q) is gone: %q", cycle, hog, out)
		}
		// The network took its address and routes from the namespace kept
		// across the pause (which runsc had stripped, and the manager
		// readdressed).
		if out, _ := run(t, m, info, routes); out != routesBefore {
			t.Errorf("routes after resume %d:\n%s\nbefore the pause:\n%s", cycle, out, routesBefore)
		}
		if _, err := os.Stat(dirs.Paused(info.ID)); !os.IsNotExist(err) {
			t.Errorf("resume %d: the image outlived the resume: %v", cycle, err)
		}
		if p.resumed != nil {
			p.resumed(t, m, info, cycle)
		}
	}
}

// TestGVisorCaptureLeavesRunning forks and snapshots a real gVisor sandbox
// with envd: the capture quiesces envd, checkpoints with the sandbox left
// running, and wakes envd, so the original serves on with its counter; the
// fork and a sandbox created from the snapshot run the captured counter (same
// pid, counting on from the capture) and are independent of the original.
func TestGVisorCaptureLeavesRunning(t *testing.T) {
	r := newRig(t)
	m, _ := gvisorManager(t, r)
	testCaptureLeavesRunning(t, m, "base-gvisor", "gvisor")
}

// TestLinuxCaptureLeavesRunning is TestGVisorCaptureLeavesRunning on the
// linux runtime (CRIU), with a sandbox network.
func TestLinuxCaptureLeavesRunning(t *testing.T) {
	r := newRig(t)
	if err := linux.CRIUAvailable(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	testCaptureLeavesRunning(t, linuxManager(t, r, true), "base", "linux")
}

func testCaptureLeavesRunning(t *testing.T, m *sandbox.Manager, template, name string) {
	ctx := context.Background()
	info, err := m.Create(ctx, sandbox.CreateRequest{Template: template, Timeout: 5 * time.Minute, Secure: true})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if out, code := run(t, m, info, bgCounter); code != 0 || out != "started\n" {
		t.Fatalf("starting the background processes: %q (exit %d)", out, code)
	}
	before := waitBG(t, m, info, 2)

	start := time.Now()
	forks, err := m.Fork(ctx, info.ID, sandbox.ForkRequest{Count: 1, Timeout: 5 * time.Minute})
	if err != nil || len(forks) != 1 || forks[0].Err != nil {
		t.Fatalf("Fork: %v %+v", err, forks)
	}
	t.Logf("%s: fork of 1: %v", name, time.Since(start))
	fork := forks[0].Info
	// The original serves on, its counter the same process.
	orig := waitBG(t, m, info, before.I)
	checkBG(t, "original after the fork", before, orig)
	// The fork runs the captured processes.
	f := waitBG(t, m, fork, before.I)
	checkBG(t, "fork", before, f)
	run(t, m, fork, "echo fork > ~/w/only-in-fork")
	if _, code := run(t, m, info, "test -e ~/w/only-in-fork"); code == 0 {
		t.Errorf("a file the fork wrote is in the original")
	}

	snap, err := m.CreateSnapshot(ctx, info.ID, sandbox.SnapshotRequest{Name: "quiesce-" + name})
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	orig2 := waitBG(t, m, info, orig.I)
	checkBG(t, "original after the snapshot", orig, orig2)
	from, err := m.Create(ctx, sandbox.CreateRequest{Template: snap.ID, Timeout: 5 * time.Minute, Secure: true})
	if err != nil {
		t.Fatalf("Create from the snapshot: %v", err)
	}
	checkBG(t, "sandbox from the snapshot", orig, waitBG(t, m, from, orig.I))
}

// linuxAlive reports whether a process of linux sandbox id runs on the host
// (its memory cgroup holds one).
func linuxAlive(id string) bool {
	b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/airlock", id, "cgroup.procs"))
	return err == nil && strings.TrimSpace(string(b)) != ""
}

// TestLinuxPauseWithMemory is TestGVisorPauseWithMemory on the linux runtime
// (CRIU), for a sandbox without a sandbox network (loopback only): envd
// quiesces — its sysinfo seccomp
// listeners, which CRIU cannot dump, closed, its spare thread discarded, its
// sockets closed — and the sandbox goes to disk and comes back.
func TestLinuxPauseWithMemory(t *testing.T) {
	r := newRig(t)
	if err := linux.CRIUAvailable(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	m := r.manager(t, 0)
	testPauseWithMemory(t, r, m, linuxPaused(r, false))
}

// linuxPaused is what testPauseWithMemory checks on the linux runtime: a
// sysinfo seccomp listener exists before the pause (what CRIU cannot save
// and the quiesce closes), and after each resume a tree started before the
// pause gets ENOSYS from sysinfo while a new one gets the sandbox's numbers.
func linuxPaused(r *rig, network bool) pausedSandbox {
	return pausedSandbox{
		template: "base", image: "inventory.img", rt: r.rt, alive: linuxAlive, network: network,
		started: func(t *testing.T, m *sandbox.Manager, info sandbox.Info) {
			// envd answers sysinfo for the trees it started: a seccomp
			// listener, which CRIU cannot save, is what the quiesce closes.
			if n := seccompListeners(info.ID); n == 0 {
				t.Fatalf("no seccomp listener in the sandbox before the pause: the test would not show the quiesce closes them (is lxcfs running?)")
			}
			startAsker(t, m, info)
			if got := ask(t, m, info); got != "0 "+strconv.Itoa(512<<20) {
				t.Fatalf("sysinfo in a tree started before the pause: %q, want 0 and the sandbox's 512 MiB", got)
			}
		},
		resumed: func(t *testing.T, m *sandbox.Manager, info sandbox.Info, cycle int) {
			// The known cost (envdapi.QuiesceSignal): a tree started before
			// the quiesce gets ENOSYS from sysinfo now, a new one the
			// sandbox's numbers.
			if got := ask(t, m, info); got != "38" {
				t.Errorf("resume %d: sysinfo in a tree started before the pause: %q, want ENOSYS (38)", cycle, got)
			}
			if out, _ := run(t, m, info, sysinfoProbe); out != "0 "+strconv.Itoa(512<<20)+"\n" {
				t.Errorf("resume %d: sysinfo in a new process: %q, want the sandbox's 512 MiB", cycle, out)
			}
		},
	}
}

// sysinfoProbe calls sysinfo(2) and prints 0 and totalram (in bytes), or
// the errno.
const sysinfoProbe = `python3 -c '
import ctypes, os
class S(ctypes.Structure):
    _fields_ = [("uptime", ctypes.c_long), ("loads", ctypes.c_ulong * 3), ("totalram", ctypes.c_ulong),
                ("freeram", ctypes.c_ulong), ("sharedram", ctypes.c_ulong), ("bufferram", ctypes.c_ulong),
                ("totalswap", ctypes.c_ulong), ("freeswap", ctypes.c_ulong), ("procs", ctypes.c_ushort),
                ("pad", ctypes.c_ushort), ("totalhigh", ctypes.c_ulong), ("freehigh", ctypes.c_ulong),
                ("mem_unit", ctypes.c_uint), ("_f", ctypes.c_char * 8)]
libc = ctypes.CDLL(None, use_errno=True)
s = S()
if libc.sysinfo(ctypes.byref(s)) != 0:
    print(ctypes.get_errno())
else:
    print(0, s.totalram * s.mem_unit)
'`

// startAsker starts a background process tree that calls sysinfo(2) each
// time ~/w/ask appears and writes what it got to ~/w/answer.
func startAsker(t *testing.T, m *sandbox.Manager, info sandbox.Info) {
	t.Helper()
	script := "cd ~/w || exit 1\nsetsid sh -c 'while :; do if [ -e ask ]; then " +
		strings.ReplaceAll(sysinfoProbe, "'", "'\\''") + " > answer.tmp; mv answer.tmp answer; rm -f ask; fi; sleep 0.1; done' </dev/null >/dev/null 2>&1 &\necho started"
	if out, code := run(t, m, info, script); code != 0 || out != "started\n" {
		t.Fatalf("starting the sysinfo asker: %q (exit %d)", out, code)
	}
}

// ask has the asker call sysinfo and returns its answer.
func ask(t *testing.T, m *sandbox.Manager, info sandbox.Info) string {
	t.Helper()
	run(t, m, info, "rm -f ~/w/answer; touch ~/w/ask")
	var out string
	testenv.Eventually(t, 30*time.Second, "the sysinfo asker's answer", func() bool {
		var code int32
		out, code = run(t, m, info, "cat ~/w/answer")
		return code == 0 && out != ""
	})
	return strings.TrimSpace(out)
}

// seccompListeners counts the seccomp notification descriptors the
// processes of linux sandbox id hold.
func seccompListeners(id string) int {
	b, _ := os.ReadFile(filepath.Join("/sys/fs/cgroup/memory/airlock", id, "cgroup.procs"))
	n := 0
	for _, pid := range strings.Fields(string(b)) {
		fds, _ := os.ReadDir(filepath.Join("/proc", pid, "fd"))
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", pid, "fd", fd.Name())); err == nil && l == "anon_inode:seccomp notify" {
				n++
			}
		}
	}
	return n
}

// TestLinuxPauseWithMemoryNetwork is the same with a sandbox network, as
// `serve` gives every sandbox by default (the sandbox's own network
// namespace, which CRIU skips; the interfaces move back in on restore).
func TestLinuxPauseWithMemoryNetwork(t *testing.T) {
	r := newRig(t)
	if err := linux.CRIUAvailable(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	testPauseWithMemory(t, r, linuxManager(t, r, true), linuxPaused(r, true))
}

// linuxManager is a started manager on the linux runtime, with a sandbox
// network of the test's own or none.
func linuxManager(t *testing.T, r *rig, network bool) *sandbox.Manager {
	t.Helper()
	opts := sandbox.Options{Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour}
	if network {
		opts.Network = testNetwork(t, r.dataDir).net
	}
	m := sandbox.New(opts)
	m.Start()
	t.Cleanup(func() {
		m.KillAll(context.Background())
		m.Close()
	})
	return m
}

// quiesce has envd of linux sandbox id quiesce, as the manager does before a
// checkpoint, and waits until it has.
func quiesce(t *testing.T, r *rig, id string) {
	t.Helper()
	sb, err := r.rt.Load(id)
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.(runtime.InitSignaler).SignalInit(envdapi.QuiesceSignal); err != nil {
		t.Fatal(err)
	}
	testenv.Eventually(t, 10*time.Second, "envd to remove its socket", func() bool {
		_, err := os.Lstat(filepath.Join(r.dataDir, "sandboxes", id, envdapi.HostRunDir, envdapi.SocketName))
		return os.IsNotExist(err)
	})
}

// TestRecoverWakesQuiescedEnvd: a server that dies between quiescing envd
// and waking it (mid-pause or mid-capture) leaves a running sandbox whose
// envd does not listen; the next server's Recover wakes it and re-adopts the
// sandbox with its processes instead of reporting it killed.
func TestRecoverWakesQuiescedEnvd(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	first := sandbox.New(sandbox.Options{Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour})
	info := create(t, first, 5*time.Minute)
	if out, code := run(t, first, info, bgCounter); code != 0 || out != "started\n" {
		t.Fatalf("starting the background processes: %q (exit %d)", out, code)
	}
	before := waitBG(t, first, info, 1)
	quiesce(t, r, info.ID)
	first.Close() // the server dies; the sandbox runs on, quiesced

	second := r.recovered(t)
	if _, err := second.Get(ctx, info.ID); err != nil {
		t.Fatalf("the sandbox was not re-adopted: %v", err)
	}
	after := waitBG(t, second, info, before.I)
	if after.Pid != before.Pid {
		t.Errorf("the counter is pid %s, was %s", after.Pid, before.Pid)
	}
}

// TestQuiesceTimeoutFallsBack: when envd does not finish quiescing in time
// (here a socket that is not envd's stays in its run directory, as with an
// envd older than the protocol, whose sockets stay), the manager wakes envd
// and goes on as for a sandbox the runtime cannot save: a pause freezes it in
// place, a fork carries its files only, and the sandbox serves throughout.
func TestQuiesceTimeoutFallsBack(t *testing.T) {
	r := newRig(t)
	if err := linux.CRIUAvailable(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	m := r.manager(t, 0)
	ctx := context.Background()
	info := create(t, m, 5*time.Minute)
	run(t, m, info, "echo kept > ~/mark")
	stray, err := net.Listen("unix", filepath.Join(r.dataDir, "sandboxes", info.ID, envdapi.HostRunDir, "stray.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer stray.Close()

	start := time.Now()
	if err := m.Pause(ctx, info.ID, sandbox.PauseOptions{}); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if d := time.Since(start); d < envdapi.QuiesceTimeout {
		t.Errorf("the pause took %v, less than the quiesce timeout: did it wait for the quiesce?", d)
	}
	if _, err := os.Stat(layout.DataDir{Root: r.dataDir}.PausedComplete(info.ID)); err == nil {
		t.Fatal("the sandbox was checkpointed although envd did not quiesce")
	}
	if got, _ := m.Get(ctx, info.ID); got.State != sandbox.StatePaused {
		t.Fatalf("state after the pause: %s", got.State)
	}
	if _, resumed, err := m.Connect(ctx, info.ID, 5*time.Minute); err != nil || !resumed {
		t.Fatalf("Connect: resumed=%v err=%v", resumed, err)
	}
	if out, _ := run(t, m, info, "cat ~/mark"); out != "kept\n" {
		t.Fatalf("after a pause that fell back: %q", out)
	}

	forks, err := m.Fork(ctx, info.ID, sandbox.ForkRequest{Count: 1, Timeout: time.Minute})
	if err != nil || len(forks) != 1 || forks[0].Err != nil {
		t.Fatalf("Fork: %v %+v", err, forks)
	}
	if out, _ := run(t, m, info, "cat ~/mark"); out != "kept\n" {
		t.Fatalf("the original after a fork that fell back: %q", out)
	}
	// A fork without memory boots afresh on the files.
	if out, _ := run(t, m, forks[0].Info, "cat ~/mark"); out != "kept\n" {
		t.Fatalf("the fork: %q", out)
	}
}

// TestLinuxPauseDuringNetlinkExchanges: a process that often holds a
// netlink reply unread (as glibc's getaddrinfo does for a moment on every
// lookup) fails neither a pause nor a snapshot: CRIU refuses such a socket
// (runtime.ErrBusy), and the manager thaws the sandbox for a moment and
// tries again. The process runs on after each resume.
func TestLinuxPauseDuringNetlinkExchanges(t *testing.T) {
	r := newRig(t)
	if err := linux.CRIUAvailable(); err != nil {
		testenv.Missing(t, "%v", err)
	}
	m := r.manager(t, 0)
	info := create(t, m, time.Minute)
	const script = `import socket, struct, time
n = 0
while True:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
    s.send(struct.pack("=IHHII", 32, 18, 0x301, 1, 0) + bytes(16))  # RTM_GETLINK dump
    time.sleep(0.04)  # the reply waits in the socket
    s.recv(65536)
    s.close()
    n += 1
    open("/tmp/nl.count", "w").write(str(n))
    time.sleep(0.06)
`
	if _, code := run(t, m, info, "cat > /tmp/nl.py <<'EOF'\n"+script+"EOF\n(python3 /tmp/nl.py >/tmp/nl.err 2>&1 &)"); code != 0 {
		t.Fatal("could not start the netlink loop")
	}
	ctx := context.Background()
	count := func() int {
		out, _ := run(t, m, info, "cat /tmp/nl.count 2>/dev/null || echo 0")
		n, _ := strconv.Atoi(strings.TrimSpace(out))
		return n
	}
	deadline := time.Now().Add(10 * time.Second)
	for count() < 3 {
		if time.Now().After(deadline) {
			out, _ := run(t, m, info, "cat /tmp/nl.err")
			t.Fatalf("the netlink loop does not run: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for cycle := 1; cycle <= 4; cycle++ {
		if err := m.Pause(ctx, info.ID, sandbox.PauseOptions{}); err != nil {
			t.Fatalf("pause %d: %v", cycle, err)
		}
		if _, resumed, err := m.Connect(ctx, info.ID, time.Minute); err != nil || !resumed {
			t.Fatalf("resume %d: resumed=%v err=%v", cycle, resumed, err)
		}
		before := count()
		deadline := time.Now().Add(10 * time.Second)
		for count() <= before {
			if time.Now().After(deadline) {
				t.Fatalf("resume %d: the netlink loop did not run on", cycle)
			}
			time.Sleep(50 * time.Millisecond)
		}
		// A snapshot's capture fails (not falls back) on a refused dump.
		if _, err := m.CreateSnapshot(ctx, info.ID, sandbox.SnapshotRequest{Name: fmt.Sprintf("nl-%d", cycle)}); err != nil {
			t.Fatalf("snapshot %d: %v", cycle, err)
		}
	}
}

// TestPausedDiskSurvivesRestart: the disk a paused sandbox holds is measured
// at its pause (its writable layer with what was written in it), kept in its
// record across a restart, measured again by Recover for a record without
// it (an older Airlock's), and given back by a resume.
func TestPausedDiskSurvivesRestart(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	first := sandbox.New(sandbox.Options{Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour})
	info := create(t, first, time.Minute)
	if out, code := run(t, first, info, "head -c 3145728 /dev/urandom > ~/ballast && echo ok"); code != 0 || out != "ok\n" {
		t.Fatalf("writing 3 MiB: %q (exit %d)", out, code)
	}
	// Without memory: no checkpoint image (nor CRIU) needed, the writable
	// layer is the whole of it.
	if err := first.Pause(ctx, info.ID, sandbox.PauseOptions{DropMemory: true}); err != nil {
		first.KillAll(ctx)
		first.Close()
		t.Fatal(err)
	}
	got, err := first.Get(ctx, info.ID)
	first.Close()
	if err != nil {
		t.Fatal(err)
	}
	if got.PausedDiskBytes < 3<<20 || got.PausedDiskBytes > 64<<20 {
		t.Fatalf("paused without memory, %s holds %d bytes; want the 3 MiB written in it and little more", info.ID, got.PausedDiskBytes)
	}

	// Recovered and closed again, not through r.recovered, whose cleanup
	// would kill what the third manager below holds.
	second := sandbox.New(sandbox.Options{Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour})
	if err := second.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	after, err := second.Get(ctx, info.ID)
	second.Close()
	if err != nil || after.State != sandbox.StatePaused || after.PausedDiskBytes != got.PausedDiskBytes {
		t.Fatalf("after a restart: %+v, %v; want paused with %d bytes", after, err, got.PausedDiskBytes)
	}

	rec, err := r.db.Get(ctx, info.ID)
	if err != nil {
		t.Fatal(err)
	}
	rec.PausedDiskBytes = 0
	if err := r.db.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	third := r.recovered(t)
	after, err = third.Get(ctx, info.ID)
	if err != nil || after.PausedDiskBytes < 3<<20 {
		t.Fatalf("a record without the size, recovered: %+v, %v; want it measured again", after, err)
	}
	if rec, err := r.db.Get(ctx, info.ID); err != nil || rec.PausedDiskBytes != after.PausedDiskBytes {
		t.Errorf("the size measured at recovery was not recorded: %d, %v", rec.PausedDiskBytes, err)
	}
	if _, resumed, err := third.Connect(ctx, info.ID, time.Minute); err != nil || !resumed {
		t.Fatalf("Connect: resumed=%v, %v", resumed, err)
	}
	if after, err := third.Get(ctx, info.ID); err != nil || after.PausedDiskBytes != 0 {
		t.Errorf("resumed, it still counts %d bytes paused (%v)", after.PausedDiskBytes, err)
	}
	if rec, err := r.db.Get(ctx, info.ID); err != nil || rec.PausedDiskBytes != 0 {
		t.Errorf("resumed, its record still says %d bytes paused (%v)", rec.PausedDiskBytes, err)
	}
}
