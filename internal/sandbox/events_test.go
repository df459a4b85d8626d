package sandbox_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// eventsManager is a started manager over the rig that records lifecycle
// events in the rig's database.
func (r *rig) eventsManager(t *testing.T, metricsEvery time.Duration) (*sandbox.Manager, *store.LifecycleEvents) {
	t.Helper()
	l := store.NewLifecycleEvents(r.db)
	m := sandbox.New(sandbox.Options{
		Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd,
		MaxTimeout: time.Hour, MetricsInterval: metricsEvery, Events: l,
	})
	t.Cleanup(func() {
		m.KillAll(context.Background())
		m.Close()
	})
	m.Start()
	return m, l
}

// sandboxInit is the host pid of sandbox id's init (envd): pid 1 of its pid
// namespace, in the sandbox's own cgroup (users' processes live in its
// user/ child).
func sandboxInit(t *testing.T, id string) int {
	t.Helper()
	procs, err := os.ReadFile(cgroupFile("pids", id, "cgroup.procs"))
	if err != nil {
		t.Fatalf("the sandbox's cgroup: %v", err)
	}
	for _, f := range strings.Fields(string(procs)) {
		status, err := os.ReadFile("/proc/" + f + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if ns, ok := strings.CutPrefix(line, "NSpid:"); ok && strings.HasSuffix(strings.TrimSpace(ns), "\t1") {
				pid, _ := strconv.Atoi(f)
				return pid
			}
		}
	}
	t.Fatalf("no init among the sandbox's processes %q", procs)
	return 0
}

// waitGone waits until the manager no longer lists sandbox id.
func waitGone(t *testing.T, m *sandbox.Manager, id string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if _, err := m.Get(context.Background(), id); err != nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox %s is still listed %v later", id, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// killedEvent waits for sandbox id's killed event (a kill takes the
// sandbox out of the manager's map before it records the event), checks
// that its events run from created to killed, and returns the killed
// event's data.
func killedEvent(t *testing.T, l *store.LifecycleEvents, owner, id string) lifecycle.EventData {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		evs, err := l.SandboxEvents(context.Background(), owner, id, lifecycle.Page{Limit: 10, OrderAsc: true})
		if err == nil && len(evs) >= 2 && evs[0].Type == lifecycle.Created && evs[len(evs)-1].Type == lifecycle.Killed {
			var d lifecycle.EventData
			if err := json.Unmarshal(evs[len(evs)-1].EventData, &d); err != nil {
				t.Fatalf("killed event: %s %v", evs[len(evs)-1].EventData, err)
			}
			return d
		}
		if time.Now().After(deadline) {
			t.Fatalf("events 10 s after the kill: %+v %v", evs, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestInitExitKillsWithReason: a sandbox whose init (envd) dies is of no
// use any more; the metrics sampler finds it, kills it, and the killed
// event says why.
func TestInitExitKillsWithReason(t *testing.T) {
	r := newRig(t)
	m, l := r.eventsManager(t, 200*time.Millisecond)
	ctx := context.Background()
	info, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: 10 * time.Minute, Owner: "o1"})
	if err != nil {
		t.Fatal(err)
	}
	pid := sandboxInit(t, info.ID)
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	waitGone(t, m, info.ID, 15*time.Second)
	d := killedEvent(t, l, "o1", info.ID)
	if d.KillReason != lifecycle.KillExited {
		t.Fatalf("kill reason %q, want %q", d.KillReason, lifecycle.KillExited)
	}
	evs, err := l.SandboxEvents(ctx, "o1", info.ID, lifecycle.Page{Limit: 10, OrderAsc: true})
	if err != nil || len(evs) != 2 {
		t.Fatalf("events: %+v %v", evs, err)
	}
	if d.Execution == nil || d.Execution.ExecutionTime <= 0 || evs[1].SandboxExecutionID != evs[0].SandboxExecutionID {
		t.Fatalf("killed event's execution: %s", evs[1].EventData)
	}
}

// TestInitOOMKillsWithReason: when the kernel kills a sandbox's init for
// lack of memory, the sandbox is killed and its killed event says "oom".
// Users' processes cannot get envd OOM-killed (their user/ cgroup leaves
// envd a reserve), so the test does what a growing envd would: a process
// of the test's own joins the sandbox's cgroup beside envd and takes
// memory, and the envd server's oom_score_adj is raised so that the kernel
// picks it as it would pick the biggest process; its pid 1 then exits. The
// OOM kill itself is the kernel's, of the real envd.
func TestInitOOMKillsWithReason(t *testing.T) {
	r := newRig(t)
	r.tpl.MemoryMB = 128
	m, l := r.eventsManager(t, 500*time.Millisecond)
	ctx := context.Background()
	info, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: 10 * time.Minute, Owner: "o1"})
	if err != nil {
		t.Fatal(err)
	}
	pid := sandboxInit(t, info.ID)
	// The Go server is pid 1's only child (cmd/envd/pid1.c); pid 1 exits
	// when it dies, which ends the sandbox.
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", pid, pid))
	if err != nil || len(strings.Fields(string(children))) != 1 {
		t.Fatalf("envd's pid 1 has children %q (%v), want the server alone", children, err)
	}
	server := strings.Fields(string(children))[0]
	if err := os.WriteFile("/proc/"+server+"/oom_score_adj", []byte("1000"), 0); err != nil {
		t.Fatal(err)
	}
	// tail buffers /dev/zero, which has no line end, until memory runs
	// out: first envd goes, then (alone in the cgroup) tail itself.
	hog := exec.Command("/bin/sh", "-c", `echo $$ > "$1" && exec tail /dev/zero`, "hog", cgroupFile("memory", info.ID, "cgroup.procs"))
	out, err := hog.CombinedOutput()
	if st, ok := hog.ProcessState.Sys().(syscall.WaitStatus); !ok || !st.Signaled() || st.Signal() != syscall.SIGKILL {
		t.Fatalf("the memory hog ended %v, not OOM-killed: %s", err, out)
	}
	// Once the server is killed, pid 1 exits; it may still be a zombie
	// until the Airlock server reaps it (CI failed once on kill(pid, 0)
	// answering for one under load), or a moment away from exiting.
	testenv.Eventually(t, 5*time.Second, "envd to be killed (the kernel killed the hog, not envd?)", func() bool { return !testenv.Alive(pid) })
	waitGone(t, m, info.ID, 15*time.Second)
	d := killedEvent(t, l, "o1", info.ID)
	if d.KillReason != lifecycle.KillOOM {
		t.Fatalf("kill reason %q, want %q", d.KillReason, lifecycle.KillOOM)
	}
	// The sandbox's log ends with the host's word on it.
	warns, err := m.Logs(ctx, info.ID, sandbox.LogQuery{MinLevel: "warn", Owner: "o1"})
	if err != nil || len(warns) == 0 {
		t.Fatalf("the log's warnings: %+v %v", warns, err)
	}
	if last := warns[len(warns)-1]; last.Message != "sandbox killed: oom" || last.Fields["reason"] != lifecycle.KillOOM {
		t.Fatalf("the log's last warning: %+v", last)
	}
}

// faultyRuntime is the real linux runtime whose sandboxes fail to thaw (and,
// when asked, to checkpoint) while armed: a freezer that will not thaw
// cannot be made on demand on this machine kind, so the failure is
// injected at the runtime's edge and everything else is real.
type faultyRuntime struct {
	runtime.Runtime
	thaw, checkpoint *atomic.Bool
}

func (f faultyRuntime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	sb, err := f.Runtime.Create(ctx, spec)
	if err != nil {
		return nil, err
	}
	return faultySandbox{Sandbox: sb, f: f}, nil
}

type faultySandbox struct {
	runtime.Sandbox
	f faultyRuntime
}

var errInjected = errors.New("injected by the test")

func (s faultySandbox) Resume() error {
	if s.f.thaw.Load() {
		return fmt.Errorf("thaw: %w", errInjected)
	}
	return s.Sandbox.Resume()
}

func (s faultySandbox) Checkpoint(ctx context.Context, o runtime.CheckpointOptions) error {
	if s.f.checkpoint.Load() {
		return fmt.Errorf("checkpoint: %w", errInjected)
	}
	return s.Sandbox.(runtime.Checkpointer).Checkpoint(ctx, o)
}

func (s faultySandbox) Release(ctx context.Context) error {
	return s.Sandbox.(runtime.Checkpointer).Release(ctx)
}

func (s faultySandbox) CanCheckpoint() error {
	if c, ok := s.Sandbox.(runtime.CheckpointChecker); ok {
		return c.CanCheckpoint()
	}
	return nil
}

func (s faultySandbox) SignalInit(sig syscall.Signal) error {
	return s.Sandbox.(runtime.InitSignaler).SignalInit(sig)
}

// TestThawFailureKillsWithReason: a sandbox frozen for a snapshot's or a
// pause's checkpoint that cannot be thawed after it is killed, its killed
// event says "resume_failed", and the operation fails saying so; a snapshot
// that did not happen has neither a record nor a checkpointed event.
func TestThawFailureKillsWithReason(t *testing.T) {
	r := newRig(t)
	f := faultyRuntime{Runtime: r.rt, thaw: new(atomic.Bool), checkpoint: new(atomic.Bool)}
	l := store.NewLifecycleEvents(r.db)
	m := sandbox.New(sandbox.Options{
		Runtime: f, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd,
		MaxTimeout: time.Hour, MetricsInterval: time.Hour, Events: l,
	})
	t.Cleanup(func() {
		m.KillAll(context.Background())
		m.Close()
	})
	m.Start()
	ctx := context.Background()
	for _, op := range []string{"snapshot", "pause"} {
		t.Run(op, func(t *testing.T) {
			info, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: 10 * time.Minute, Owner: "o1"})
			if err != nil {
				t.Fatal(err)
			}
			f.thaw.Store(true)
			f.checkpoint.Store(op == "pause")
			defer f.thaw.Store(false)
			defer f.checkpoint.Store(false)
			switch op {
			case "snapshot":
				_, err = m.CreateSnapshot(ctx, info.ID, sandbox.SnapshotRequest{Name: "never", Owner: "o1"})
			case "pause":
				err = m.Pause(ctx, info.ID, sandbox.PauseOptions{})
			}
			if err == nil || !strings.Contains(err.Error(), "could not be thawed") || !strings.Contains(err.Error(), "killed") {
				t.Fatalf("%s of a sandbox that cannot be thawed: %v; want an error saying it was killed", op, err)
			}
			assertGone(t, m, r, info.ID)
			if d := killedEvent(t, l, "o1", info.ID); d.KillReason != lifecycle.KillResumeFailed {
				t.Fatalf("kill reason %q, want %q", d.KillReason, lifecycle.KillResumeFailed)
			}
			evs, _ := l.SandboxEvents(ctx, "o1", info.ID, lifecycle.Page{Limit: 10, Types: []string{lifecycle.Checkpointed, lifecycle.Paused}})
			if len(evs) != 0 {
				t.Fatalf("events of a %s that did not happen: %+v", op, evs)
			}
			if snaps, err := m.ListSnapshots(ctx, sandbox.SnapshotFilter{SandboxID: info.ID}); err != nil || len(snaps) != 0 {
				t.Fatalf("snapshots of the lost sandbox: %+v %v", snaps, err)
			}
		})
	}
}
