package sandbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// TestSnapshotNamesPerOwner: two owners snapshot under one name and each
// starts its own from it; a third owner finds neither; a create told that
// the name is a template it may not use (SnapshotOnly) still starts the
// owner's own snapshot and nothing else; a new snapshot of the name replaces
// the owner's only; deleting one owner's leaves the other's.
func TestSnapshotNamesPerOwner(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, time.Hour)
	ctx := context.Background()
	const name = "nightly"

	snapshot := func(owner string) {
		t.Helper()
		info, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: 10 * time.Minute, Secure: true, Owner: owner})
		if err != nil {
			t.Fatalf("%s: create: %v", owner, err)
		}
		if out, code := run(t, m, info, "echo made by "+owner+" > ~/owner.txt"); code != 0 {
			t.Fatalf("%s: write: %d %s", owner, code, out)
		}
		if _, err := m.CreateSnapshot(ctx, info.ID, sandbox.SnapshotRequest{Name: name, Owner: owner}); err != nil {
			t.Fatalf("%s: snapshot as %q: %v", owner, name, err)
		}
		if err := m.Kill(ctx, info.ID); err != nil {
			t.Fatal(err)
		}
	}
	// startFrom returns the file a sandbox started from ref as owner finds.
	startFrom := func(owner, ref string, snapshotOnly bool) (string, error) {
		t.Helper()
		info, err := m.Create(ctx, sandbox.CreateRequest{Template: ref, Timeout: 10 * time.Minute, Secure: true, Owner: owner, SnapshotOnly: snapshotOnly})
		if err != nil {
			return "", err
		}
		defer m.Kill(ctx, info.ID)
		out, _ := run(t, m, info, "cat ~/owner.txt")
		return out, nil
	}
	snapshot("team-a")
	snapshot("team-b")

	for _, owner := range []string{"team-a", "team-b"} {
		want := "made by " + owner + "\n"
		if got, err := startFrom(owner, name, false); err != nil || got != want {
			t.Fatalf("%s: from %q: %q, %v; want %q", owner, name, got, err, want)
		}
		if got, err := startFrom(owner, name+":default", true); err != nil || got != want {
			t.Fatalf("%s: from %q, snapshot only: %q, %v; want %q", owner, name, got, err, want)
		}
	}
	if _, err := startFrom("team-c", name, false); !errors.Is(err, sandbox.ErrTemplateNotFound) {
		t.Fatalf("team-c: from %q: %v; want no such template", name, err)
	}
	if _, err := startFrom("team-a", "base", true); !errors.Is(err, sandbox.ErrTemplateNotFound) {
		t.Fatalf("team-a: from base, snapshot only: %v; want no such template", err)
	}

	snapshot("team-a") // replaces team-a's nightly, not team-b's
	if snaps, err := m.ListSnapshots(ctx, sandbox.SnapshotFilter{Name: name}); err != nil || len(snaps) != 2 {
		t.Fatalf("snapshots named %q: %+v, %v; want one per owner", name, snaps, err)
	}

	if err := m.DeleteSnapshot(ctx, name, "team-a"); err != nil {
		t.Fatalf("team-a: delete: %v", err)
	}
	if err := m.DeleteSnapshot(ctx, name, "team-a"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("team-a: delete again: %v; want not found (team-b's is not team-a's)", err)
	}
	if got, err := startFrom("team-b", name, false); err != nil || got != "made by team-b\n" {
		t.Fatalf("team-b: from %q after team-a's delete: %q, %v", name, got, err)
	}
	if snaps, err := m.ListSnapshots(ctx, sandbox.SnapshotFilter{Name: name}); err != nil || len(snaps) != 1 || snaps[0].Owner != "team-b" {
		t.Fatalf("snapshots named %q after team-a's delete: %+v, %v", name, snaps, err)
	}
}
