package daemon

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// TestPausedRetention: `serve --paused-retention` deletes paused sandboxes
// (paused with or without memory) once they have been paused that long, with
// their disk: at start-up for what an earlier server paused, and while it
// runs; running sandboxes and younger paused ones stay; 0 keeps them all.
func TestPausedRetention(t *testing.T) {
	h := newHost(t, "linux")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	base := h.args

	// Retention off: paused sandboxes stay however long.
	h.args = append(slices.Clip(base), "--paused-retention=0")
	h.start()
	running := h.newSandbox(ctx)
	old := []*sbx{h.newSandbox(ctx), h.newSandbox(ctx)}
	h.pause(ctx, old[0], false)
	h.pause(ctx, old[1], true)
	time.Sleep(3 * time.Second)
	h.expectListed(ctx, running.id, old[0].id, old[1].id)
	h.stop()

	// Retention 3 s: the sandboxes paused more than 3 s ago go at start.
	h.args = append(slices.Clip(base), "--paused-retention=3s")
	h.start()
	h.expectDeleted(ctx, 5*time.Second, old...)
	h.expectListed(ctx, running.id)

	// One paused now stays until it is 3 s old, then goes too.
	young := h.newSandbox(ctx)
	pausedAt := time.Now() // no later than the server's own pause time
	h.pause(ctx, young, false)
	h.expectListed(ctx, running.id, young.id)
	h.expectDeleted(ctx, 10*time.Second, young)
	if d := time.Since(pausedAt); d < 3*time.Second {
		t.Errorf("sandbox %s was deleted %s after its pause, before its 3 s retention", young.id, d)
	}
	h.expectListed(ctx, running.id)
	// The running sandbox still works.
	if got, _, err := h.backend().ReadFile(ctx, running.id, "/home/user/survive.txt", 1<<20); err != nil || string(got) != "kept "+running.id {
		t.Fatalf("running sandbox %s after the sweeps: %q, %v", running.id, got, err)
	}
}

// expectListed checks that every id is listed (in any state).
func (h *host) expectListed(ctx context.Context, ids ...string) {
	h.t.Helper()
	list, err := h.client().List(ctx, e2bclient.ListQuery{})
	if err != nil {
		h.t.Fatalf("list: %v", err)
	}
	var got []string
	for _, l := range list {
		got = append(got, l.SandboxID)
	}
	for _, id := range ids {
		if !slices.Contains(got, id) {
			h.t.Fatalf("sandbox %s is not listed (listed: %v)\nserver log:\n%s", id, got, tail(h.srv.log, 30))
		}
	}
}

// expectDeleted waits until each sandbox is unknown to the server and
// nothing of it is left on disk: its writable layer, checkpoint image,
// network state and log.
func (h *host) expectDeleted(ctx context.Context, within time.Duration, ss ...*sbx) {
	h.t.Helper()
	deadline := time.Now().Add(within)
	for _, s := range ss {
		for {
			_, err := h.client().Get(ctx, s.id)
			var e *e2bclient.Error
			if errors.As(err, &e) && e.Status == 404 {
				break
			}
			if time.Now().After(deadline) {
				h.t.Fatalf("paused sandbox %s is still there %s after its retention ended (get: %v)\nserver log:\n%s", s.id, within, err, tail(h.srv.log, 30))
			}
			time.Sleep(100 * time.Millisecond)
		}
		list, err := h.client().List(ctx, e2bclient.ListQuery{State: e2bwire.StatePaused})
		if err != nil {
			h.t.Fatal(err)
		}
		for _, l := range list {
			if l.SandboxID == s.id {
				h.t.Fatalf("deleted sandbox %s is still listed as paused", s.id)
			}
		}
		// The network's teardown runs in the background after the kill.
		for _, p := range []string{h.dir.Sandbox(s.id), h.dir.Paused(s.id), h.dir.SandboxLog(s.id), filepath.Join(h.dir.Network(), s.id)} {
			for {
				_, err := os.Lstat(p)
				if errors.Is(err, os.ErrNotExist) {
					break
				}
				if time.Now().After(deadline) {
					h.t.Fatalf("sandbox %s was deleted but %s is left (%v)", s.id, p, err)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
	}
}
