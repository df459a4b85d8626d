package daemon

// Lifecycle events and kill -9 of the server: an event whose operation
// answered is never lost, and one a crash kept from being recorded is
// recorded by the next server when the state on disk tells it happened.

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/crashpoint"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

func TestLifecycleEventsSurviveKill9(t *testing.T) {
	h := newHost(t, "linux")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	h.start()
	s := h.newSandbox(ctx)
	if err := h.client().SetTimeout(ctx, s.id, 20*time.Minute); err != nil {
		t.Fatal(err)
	}
	// SIGKILL right after the answer: the event was committed before it.
	h.kill9()
	h.start()
	story := func() ([]lifecycle.Event, string) {
		t.Helper()
		evs, err := h.client().SandboxEvents(ctx, s.id, 100)
		if err != nil {
			t.Fatal(err)
		}
		var types []string
		for _, e := range evs {
			types = append(types, strings.TrimPrefix(e.Type, "sandbox.lifecycle."))
		}
		return evs, strings.Join(types, " ")
	}
	if _, got := story(); got != "created updated" {
		t.Fatalf("after kill -9 the events are %q, want created updated", got)
	}

	// A pause whose image was complete when the server died, before its
	// record said paused: the next server finds it paused, and records the
	// paused event the dead one could not.
	h.stop()
	h.start(crashpoint.Env + "=" + crashpoint.PauseImageComplete)
	if err := h.client().Pause(ctx, s.id, true); err == nil {
		t.Fatal("the pause answered: its crash point was not reached (frozen in RAM?)")
	}
	h.died(10 * time.Second)
	h.start()
	if got, err := h.client().Get(ctx, s.id); err != nil || got.State != e2bwire.StatePaused {
		t.Fatalf("after the crash: %+v %v", got, err)
	}
	h.resume(ctx, s)
	if err := h.client().Kill(ctx, s.id); err != nil {
		t.Fatal(err)
	}
	evs, got := story()
	if got != "created updated paused resumed killed" {
		t.Fatalf("events: %q", got)
	}
	var paused lifecycle.EventData
	if err := json.Unmarshal(evs[2].EventData, &paused); err != nil || paused.Execution == nil || paused.Execution.ExecutionTime <= 0 {
		t.Fatalf("the recovered pause's event: %s %v", evs[2].EventData, err)
	}
	if evs[2].SandboxExecutionID != evs[0].SandboxExecutionID || evs[3].SandboxExecutionID == evs[0].SandboxExecutionID || evs[4].SandboxExecutionID != evs[3].SandboxExecutionID {
		t.Fatalf("executions across the restarts: %s %s %s %s %s", evs[0].SandboxExecutionID, evs[1].SandboxExecutionID, evs[2].SandboxExecutionID, evs[3].SandboxExecutionID, evs[4].SandboxExecutionID)
	}

	// A kill whose event was recorded when the server died, before its
	// teardown: the next server finishes the teardown, without a second
	// event.
	k := h.newSandbox(ctx)
	h.stop()
	h.start(crashpoint.Env + "=" + crashpoint.KillRecorded)
	if err := h.client().Kill(ctx, k.id); err == nil {
		t.Fatal("the kill answered: its crash point was not reached")
	}
	h.died(10 * time.Second)
	h.start()
	if _, err := h.client().Get(ctx, k.id); err == nil {
		t.Fatal("the sandbox whose killed event was recorded is alive after the restart")
	}
	if _, err := os.Stat(h.dir.Sandbox(k.id)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the directory of %s is left after the restart: %v", k.id, err)
	}
	kevs, err := h.client().SandboxEvents(ctx, k.id, 100)
	if err != nil || len(kevs) != 2 || kevs[1].Type != lifecycle.Killed {
		t.Fatalf("the killed sandbox's events: %+v %v", kevs, err)
	}
	var kd lifecycle.EventData
	if err := json.Unmarshal(kevs[1].EventData, &kd); err != nil || kd.KillReason != lifecycle.KillRequest {
		t.Fatalf("kill reason after the crash: %s", kevs[1].EventData)
	}
}
