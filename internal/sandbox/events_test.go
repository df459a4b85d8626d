package sandbox_test

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
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
	// envd (pid 1 of the sandbox's pid namespace) is in the sandbox's own
	// cgroup; users' processes live in its user/ child.
	procs, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/pids/airlock", info.ID, "cgroup.procs"))
	if err != nil {
		t.Fatalf("the sandbox's cgroup: %v", err)
	}
	pid := 0
	for _, f := range strings.Fields(string(procs)) {
		status, err := os.ReadFile("/proc/" + f + "/status")
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if ns, ok := strings.CutPrefix(line, "NSpid:"); ok && strings.HasSuffix(strings.TrimSpace(ns), "\t1") {
				pid, _ = strconv.Atoi(f)
			}
		}
	}
	if pid == 0 {
		t.Fatalf("no init among the sandbox's processes %q", procs)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		if _, err := m.Get(ctx, info.ID); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox whose init died is still listed 15 s later")
		}
		time.Sleep(100 * time.Millisecond)
	}
	evs, err := l.SandboxEvents(ctx, "o1", info.ID, lifecycle.Page{Limit: 10, OrderAsc: true})
	if err != nil || len(evs) != 2 || evs[0].Type != lifecycle.Created || evs[1].Type != lifecycle.Killed {
		t.Fatalf("events: %+v %v", evs, err)
	}
	var d lifecycle.EventData
	if err := json.Unmarshal(evs[1].EventData, &d); err != nil || d.KillReason != lifecycle.KillExited {
		t.Fatalf("kill reason: %s %v", evs[1].EventData, err)
	}
	if d.Execution == nil || d.Execution.ExecutionTime <= 0 || evs[1].SandboxExecutionID != evs[0].SandboxExecutionID {
		t.Fatalf("killed event's execution: %s", evs[1].EventData)
	}
}
