package daemon

// A crash of the server in the middle of a pause, resume, snapshot or fork
// leaves, after a restart, the old state or the new one (issue 13, item 8).
// Each case arms one crash point (internal/crashpoint: the server SIGKILLs
// itself there), runs the operation, restarts the server without it and
// checks what the new server found.

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/crashpoint"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// crashCase is one operation crashed at one point.
type crashCase struct {
	point string
	// op runs the operation on sandbox s (its error is the crash's).
	op func(ctx context.Context, c *e2bclient.Client, s *sbx) error
	// want is the state s must be in after the restart: old or new, known
	// for each point ("running" or "paused").
	want string
	// memoryPause: the point is on a pause-with-memory path, which a
	// sandbox frozen in RAM (the known gap) never reaches.
	memoryPause bool
	// keepsProcess: s's background process must still run after the
	// restart (and, for a paused s, its resume).
	keepsProcess bool
	// pausedFirst: s is paused without memory before the crash is armed.
	pausedFirst bool
	// prepare runs on s before the crash is armed (on a server of its own).
	prepare func(ctx context.Context, c *e2bclient.Client, s *sbx) error
	// snapshot: after the restart exactly one snapshot of s exists, and a
	// sandbox starts from it with s's file.
	snapshot bool
}

func pauseOp(memory bool) func(context.Context, *e2bclient.Client, *sbx) error {
	return func(ctx context.Context, c *e2bclient.Client, s *sbx) error {
		s.memory = memory
		return c.Pause(ctx, s.id, memory)
	}
}

func resumeOp(ctx context.Context, c *e2bclient.Client, s *sbx) error {
	_, _, err := c.Connect(ctx, s.id, 5*time.Minute)
	return err
}

func snapshotOp(ctx context.Context, c *e2bclient.Client, s *sbx) error {
	_, err := c.CreateSnapshot(ctx, s.id, "crash-"+s.id)
	return err
}

func forkOp(ctx context.Context, c *e2bclient.Client, s *sbx) error {
	_, err := c.Fork(ctx, s.id, 2, 5*time.Minute)
	return err
}

var crashCases = []crashCase{
	// A pause without memory commits with its record, before the release.
	{point: crashpoint.PauseRecorded, op: pauseOp(false), want: e2bwire.StateRunning, keepsProcess: true},
	{point: crashpoint.PauseReleased, op: pauseOp(false), want: e2bwire.StatePaused},
	// A pause with memory commits with its complete image. The image is
	// taken of the frozen sandbox, whose processes end only with the
	// release, so before the complete mark the sandbox runs on with them.
	{point: crashpoint.PauseCheckpointed, op: pauseOp(true), want: e2bwire.StateRunning, memoryPause: true, keepsProcess: true},
	{point: crashpoint.PauseImageComplete, op: pauseOp(true), want: e2bwire.StatePaused, memoryPause: true, keepsProcess: true},
	{point: crashpoint.PauseRecorded + "/memory", op: pauseOp(true), want: e2bwire.StatePaused, memoryPause: true, keepsProcess: true},
	// A resume commits when the sandbox runs.
	{point: crashpoint.ResumeBooted, op: resumeOp, want: e2bwire.StateRunning, pausedFirst: true},
	// Snapshots and forks: the source runs on; the capture is all or nothing.
	{point: crashpoint.CaptureFrozen, op: snapshotOp, want: e2bwire.StateRunning, keepsProcess: true},
	{point: crashpoint.SnapshotCaptured, op: snapshotOp, want: e2bwire.StateRunning, keepsProcess: true},
	// A name moves to a new snapshot only once it is whole.
	{point: crashpoint.SnapshotWritten, op: snapshotOp, prepare: snapshotOp, want: e2bwire.StateRunning, keepsProcess: true, snapshot: true},
	{point: crashpoint.ForkCaptured, op: forkOp, want: e2bwire.StateRunning, keepsProcess: true},
	{point: crashpoint.StartedFromCapture, op: forkOp, want: e2bwire.StateRunning, keepsProcess: true},
}

func TestCrashMidOperation(t *testing.T) {
	for _, rt := range []string{"linux", "gvisor"} {
		t.Run(rt, func(t *testing.T) {
			h := newHost(t, rt)
			parent := t
			for _, cc := range crashCases {
				t.Run(strings.ReplaceAll(cc.point, "/", "-"), func(t *testing.T) {
					// One data dir for every case; each reports to its own test.
					h.t = t
					defer func() { h.t = parent }()
					testCrash(t, h, cc)
				})
			}
		})
	}
}

func testCrash(t *testing.T, h *host, cc crashCase) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	point, _, _ := strings.Cut(cc.point, "/")
	h.start()
	defer func() {
		if h.srv != nil {
			h.stop()
		}
	}()
	s := h.newSandbox(ctx)
	if cc.pausedFirst {
		h.pause(ctx, s, false)
	}
	if cc.prepare != nil {
		if err := cc.prepare(ctx, h.client(), s); err != nil {
			t.Fatalf("prepare: %v", err)
		}
	}
	before := h.sandboxList(ctx)
	h.stop()
	h.start(crashpoint.Env + "=" + point)
	// The crash points come before the answer: an operation that answered
	// did not reach its point.
	if err := cc.op(ctx, h.client(), s); err == nil {
		if cc.memoryPause {
			t.Fatalf("crash point %s was never reached (the pause succeeded): the pause froze the sandbox in RAM instead of checkpointing it", cc.point)
		}
		t.Fatalf("crash point %s was never reached: the operation succeeded\nserver log:\n%s", cc.point, tail(h.srv.log, 30))
	}
	h.died(10 * time.Second)

	h.start()
	got, gerr := h.client().Get(ctx, s.id)
	if gerr != nil {
		t.Fatalf("after a crash at %s the sandbox is gone (%v): it must be %s\nserver log:\n%s", cc.point, gerr, cc.want, tail(h.srv.log, 30))
	}
	if got.State != cc.want {
		t.Fatalf("after a crash at %s the sandbox is %s, want %s", cc.point, got.State, cc.want)
	}
	if got.State == e2bwire.StatePaused {
		h.resume(ctx, s)
	} else if _, resumed, err := h.client().Connect(ctx, s.id, 5*time.Minute); err != nil || resumed {
		t.Fatalf("connect to running %s: resumed %v, %v", s.id, resumed, err)
	}
	// The sandbox works, with its file, and its process when nothing
	// stopped it.
	s.memory = cc.keepsProcess
	h.checkState(ctx, s, "after a crash at "+cc.point)

	// Nothing half-made is left: no new sandbox (a fork that never
	// finished), no snapshot without its description, no capture, no
	// checkpoint image beside a running sandbox.
	after := h.sandboxList(ctx)
	for id := range after {
		if !before[id] {
			t.Errorf("after a crash at %s a sandbox %s appeared that was not there before", cc.point, id)
		}
	}
	snaps, err := h.client().ListSnapshots(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if cc.snapshot {
		if len(snaps) != 1 {
			t.Fatalf("after a crash at %s want one snapshot, listed: %v", cc.point, snaps)
		}
		if entries, _ := os.ReadDir(filepath.Join(h.dir.Sandboxes(), ".snapshots")); len(entries) != 1 {
			t.Errorf("after a crash at %s want one snapshot directory, found %d", cc.point, len(entries))
		}
		h.checkSnapshotStarts(ctx, snaps[0].SnapshotID, s)
		if err := h.client().DeleteSnapshot(ctx, snaps[0].SnapshotID); err != nil {
			t.Fatalf("delete snapshot: %v", err)
		}
	} else if len(snaps) != 0 {
		t.Errorf("after a crash at %s snapshots are listed: %v", cc.point, snaps)
	}
	for _, dir := range []string{filepath.Join(h.dir.Sandboxes(), ".captures"), filepath.Join(h.dir.Sandboxes(), ".snapshots"), h.dir.Paused(s.id)} {
		entries, err := os.ReadDir(dir)
		if err == nil && len(entries) > 0 {
			var names []string
			for _, e := range entries {
				names = append(names, e.Name())
			}
			t.Errorf("after a crash at %s, %s holds %v", cc.point, dir, names)
		}
	}
	// Every sandbox directory and network on disk is a listed sandbox's
	// (the network's teardown runs in the background: give it a moment).
	deadline := time.Now().Add(5 * time.Second)
	for {
		var strays []string
		for _, parent := range []string{h.dir.Sandboxes(), h.dir.Network()} {
			entries, _ := os.ReadDir(parent)
			for _, e := range entries {
				if e.IsDir() && !strings.HasPrefix(e.Name(), ".") && !after[e.Name()] {
					strays = append(strays, filepath.Join(parent, e.Name()))
				}
			}
		}
		if len(strays) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("after a crash at %s, directories of no sandbox are left: %v", cc.point, strays)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := h.client().Kill(ctx, s.id); err != nil {
		t.Errorf("kill %s: %v", s.id, err)
	}
}

// sandboxList is the set of sandbox ids the server lists, in any state.
func (h *host) sandboxList(ctx context.Context) map[string]bool {
	h.t.Helper()
	list, err := h.client().List(ctx, e2bclient.ListQuery{})
	if err != nil {
		h.t.Fatalf("list: %v", err)
	}
	out := map[string]bool{}
	for _, l := range list {
		out[l.SandboxID] = true
	}
	return out
}

// checkSnapshotStarts starts a sandbox from snapshot ref, taken of s, and
// checks that it has s's file.
func (h *host) checkSnapshotStarts(ctx context.Context, ref string, s *sbx) {
	h.t.Helper()
	timeout := int64(300)
	created, err := h.client().Create(ctx, e2bwire.NewSandbox{TemplateID: ref, Timeout: &timeout})
	if err != nil {
		h.t.Fatalf("create from snapshot %s: %v", ref, err)
	}
	h.ids[created.SandboxID] = true
	got, _, err := h.backend().ReadFile(ctx, created.SandboxID, "/home/user/survive.txt", 1<<20)
	if err != nil || string(got) != "kept "+s.id {
		h.t.Fatalf("a sandbox from snapshot %s reads %q, %v; want the file of %s", ref, got, err, s.id)
	}
	if err := h.client().Kill(ctx, created.SandboxID); err != nil {
		h.t.Fatalf("kill %s: %v", created.SandboxID, err)
	}
}
