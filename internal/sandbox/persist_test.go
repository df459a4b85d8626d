package sandbox_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
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
// the process holding 64 MiB still holds it, and envd answers again. A
// sandbox network kept across the pause works again (the namespace is
// readdressed after runsc stripped it).
func TestGVisorPauseWithMemory(t *testing.T) {
	r := newRig(t)
	m, gv := gvisorManager(t, r)
	ctx := context.Background()
	info, err := m.Create(ctx, sandbox.CreateRequest{Template: "base-gvisor", Timeout: 5 * time.Minute, Secure: true})
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
	if !strings.Contains(routesBefore, "eth0") {
		t.Fatalf("no route through eth0 in the sandbox: %q", routesBefore)
	}
	sentry, ok := sentryOf(info.ID)
	if !ok {
		t.Fatalf("no sentry of %s before the pause", info.ID)
	}

	start := time.Now()
	if err := m.Pause(ctx, info.ID, sandbox.PauseOptions{}); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	t.Logf("pause with memory: %v", time.Since(start))
	got, err := m.Get(ctx, info.ID)
	if err != nil || got.State != sandbox.StatePaused || !got.PausedWithMemory {
		t.Fatalf("after Pause: %+v, %v", got, err)
	}
	dirs := layout.DataDir{Root: r.dataDir}
	if _, err := os.Stat(dirs.PausedComplete(info.ID)); err != nil {
		t.Fatalf("no complete mark: the sandbox was not checkpointed (frozen in place?): %v", err)
	}
	img, err := os.Stat(filepath.Join(dirs.PausedMemory(info.ID), "checkpoint.img"))
	if err != nil {
		t.Fatalf("no runsc image: %v", err)
	}
	var imgBytes int64
	entries, _ := os.ReadDir(dirs.PausedMemory(info.ID))
	for _, de := range entries {
		if fi, err := de.Info(); err == nil {
			imgBytes += fi.Size()
		}
	}
	t.Logf("image: %d MiB (%s %d bytes)", imgBytes>>20, img.Name(), img.Size())
	if imgBytes < 64<<20 {
		t.Errorf("the image holds %d bytes, less than the 64 MiB a process held", imgBytes)
	}
	if _, alive := sentryOf(info.ID); alive {
		t.Errorf("the sentry (pid %d) lives on after a pause with memory", sentry)
	}
	if _, err := gv.Load(info.ID); !errors.Is(err, runtime.ErrNotFound) {
		t.Errorf("runsc still holds the paused sandbox: %v", err)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/cgroup/memory", gvisor.CgroupParent, info.ID)); !os.IsNotExist(err) {
		t.Errorf("the sandbox's memory cgroup survived the pause (its RAM is not released): %v", err)
	}

	start = time.Now()
	if _, resumed, err := m.Connect(ctx, info.ID, 5*time.Minute); err != nil || !resumed {
		t.Fatalf("Connect: resumed=%v err=%v", resumed, err)
	}
	t.Logf("resume: %v", time.Since(start))
	after := waitBG(t, m, info, before.I)
	checkBG(t, "after resume", before, after)
	if out, code := run(t, m, info, "kill -0 "+strings.TrimSpace(hog)+" && echo alive"); code != 0 || out != "alive\n" {
		t.Errorf("the process holding 64 MiB (pid %q) is gone after resume: %q", hog, out)
	}
	// The netstack took its address and routes from the namespace kept
	// across the pause, which runsc had stripped: readdressed, it has them.
	if out, _ := run(t, m, info, routes); out != routesBefore {
		t.Errorf("routes after resume:\n%s\nbefore the pause:\n%s", out, routesBefore)
	}
	if _, err := os.Stat(dirs.Paused(info.ID)); !os.IsNotExist(err) {
		t.Errorf("the image outlived the resume: %v", err)
	}
	// And a second cycle, from the restored sandbox.
	if err := m.Pause(ctx, info.ID, sandbox.PauseOptions{}); err != nil {
		t.Fatalf("second Pause: %v", err)
	}
	if _, err := os.Stat(dirs.PausedComplete(info.ID)); err != nil {
		t.Fatalf("second pause did not checkpoint: %v", err)
	}
	if _, resumed, err := m.Connect(ctx, info.ID, 5*time.Minute); err != nil || !resumed {
		t.Fatalf("second Connect: resumed=%v err=%v", resumed, err)
	}
	checkBG(t, "after the second resume", after, waitBG(t, m, info, after.I))
}

// TestGVisorCaptureLeavesRunning forks and snapshots a real gVisor sandbox
// with envd: the capture quiesces envd, checkpoints with the sandbox left
// running, and wakes envd, so the original serves on with its counter; the
// fork and a sandbox created from the snapshot run the captured counter (same
// pid, counting on from the capture) and are independent of the original.
func TestGVisorCaptureLeavesRunning(t *testing.T) {
	r := newRig(t)
	m, _ := gvisorManager(t, r)
	ctx := context.Background()
	info, err := m.Create(ctx, sandbox.CreateRequest{Template: "base-gvisor", Timeout: 5 * time.Minute, Secure: true})
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
	t.Logf("fork of 1: %v", time.Since(start))
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

	snap, err := m.CreateSnapshot(ctx, info.ID, sandbox.SnapshotRequest{Name: "quiesce-test"})
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
