package sandbox

// Snapshots: a running sandbox's state saved for new sandboxes to start from
// (E2B's POST /sandboxes/{id}/snapshots, GET /snapshots, and Create with a
// snapshot's id or name as the template).
//
// Each snapshot is a capture (persist.go) in <data>/sandboxes/.snapshots/<raw
// id>, and a record in the store, which holds its names, owner and the Info a
// sandbox started from it is like. The directory is complete before the
// record is written, and the record is deleted before the directory, so a
// record always names a whole capture; a crash between the two leaves a
// directory with no record, which Recover removes (sweepSnapshots).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/crashpoint"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// snapshotTag is the one tag a snapshot's full name carries.
const snapshotTag = ":default"

// CreateSnapshot saves the state of running sandbox id as a snapshot that
// sandboxes can be created from; a name req.Owner already uses moves to the
// new one. Names are per owner: another owner's snapshot of the same name
// is neither replaced nor in the way.
func (m *Manager) CreateSnapshot(ctx context.Context, id string, req SnapshotRequest) (_ Snapshot, err error) {
	defer m.observe(OpSnapshot, time.Now(), &err)
	name := strings.TrimSuffix(req.Name, snapshotTag)
	if strings.Contains(name, ":") {
		return Snapshot{}, fmt.Errorf("%w: snapshot name %q: only the %q tag is supported", ErrInvalid, req.Name, snapshotTag)
	}
	raw := "snap" + newID()
	dir := filepath.Join(m.snapshotsDir(), raw)
	var rec store.Snapshot
	// Under the sandbox's op lock, so that its events stay in order (a kill
	// waits): the capture, then the snapshot's record with its
	// checkpointed event, in one transaction.
	err = m.with(id, func(e *entry) error {
		e.mu.Lock()
		base := e.info
		e.mu.Unlock()
		if _, err := m.capture(ctx, e, dir); err != nil {
			return err
		}
		crashpoint.Hit(crashpoint.SnapshotCaptured)
		spec, err := json.Marshal(base)
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		rec = store.Snapshot{
			ID: raw, Name: name, SandboxID: id, TemplateID: base.TemplateID, Owner: req.Owner,
			CreatedAt: time.Now().UTC(), Spec: spec,
		}
		m.snapMu.Lock()
		defer m.snapMu.Unlock()
		replaced, err := m.commitSnapshot(context.WithoutCancel(ctx), e, rec,
			lifecycle.EventData{SnapshotID: snapshotOf(rec).ID})
		if err != nil {
			return fmt.Errorf("snapshot: %w", err)
		}
		crashpoint.Hit(crashpoint.SnapshotWritten)
		if replaced != "" {
			// Its record is gone with the name; its files follow.
			if err := os.RemoveAll(filepath.Join(m.snapshotsDir(), replaced)); err != nil {
				m.log.Warn("snapshot replaced: files left for the next start", "id", replaced, "err", err)
			}
		}
		return nil
	})
	if err != nil {
		_ = os.RemoveAll(dir)
		return Snapshot{}, err
	}
	m.log.Info("snapshot created", "id", raw, "name", name, "sandbox", id)
	return snapshotOf(rec), nil
}

// snapshotOf is the API's view of a record.
func snapshotOf(r store.Snapshot) Snapshot {
	s := Snapshot{ID: r.ID + snapshotTag, SandboxID: r.SandboxID, TemplateID: r.TemplateID, Owner: r.Owner, CreatedAt: r.CreatedAt}
	if r.Name != "" {
		s.ID = r.Name + snapshotTag
		s.Names = []string{s.ID}
	}
	return s
}

// ListSnapshots returns the snapshots f selects, newest first.
func (m *Manager) ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error) {
	recs, err := m.opts.Store.ListSnapshots(ctx, store.SnapshotFilter{SandboxID: f.SandboxID, Owner: f.Owner, Name: f.Name})
	if err != nil {
		return nil, err
	}
	out := make([]Snapshot, 0, len(recs))
	for _, r := range recs {
		out = append(out, snapshotOf(r))
	}
	return out, nil
}

// findSnapshot looks a snapshot of owner's up by its ID or name, among
// owner's only: a name may be another owner's too, and an ID of another
// owner's is not found, as one that never existed. Owner is exact: ""
// finds the snapshots made without an owner (tests, bench), no one else's.
func (m *Manager) findSnapshot(ctx context.Context, ref, owner string) (store.Snapshot, error) {
	r, err := m.opts.Store.GetSnapshot(ctx, owner, ref)
	if errors.Is(err, store.ErrNotFound) {
		return store.Snapshot{}, fmt.Errorf("%w: snapshot %q", ErrNotFound, ref)
	}
	return r, err
}

// DeleteSnapshot removes owner's snapshot by ID or name (findSnapshot's
// lookup).
func (m *Manager) DeleteSnapshot(ctx context.Context, ref, owner string) error {
	m.snapMu.Lock()
	defer m.snapMu.Unlock()
	r, err := m.findSnapshot(ctx, ref, owner)
	if err != nil {
		return err
	}
	if _, err := m.opts.Store.DeleteSnapshot(context.WithoutCancel(ctx), r.ID); err != nil {
		return fmt.Errorf("delete snapshot %s: %w", ref, err)
	}
	if err := os.RemoveAll(filepath.Join(m.snapshotsDir(), r.ID)); err != nil {
		// Listed nowhere any more; the next start removes the rest.
		m.log.Warn("snapshot deleted: files left for the next start", "id", r.ID, "err", err)
	}
	return nil
}

// createFromSnapshot is Create for a template name that is a snapshot's; ok
// is false when it is not one.
func (m *Manager) createFromSnapshot(ctx context.Context, req CreateRequest) (info Info, ok bool, err error) {
	// Shared: other creates from it may run at once; a delete or a
	// replacement waits until this sandbox has its own copy.
	m.snapMu.RLock()
	defer m.snapMu.RUnlock()
	r, err := m.findSnapshot(ctx, req.Template, req.Owner)
	if err != nil {
		return Info{}, false, nil
	}
	var base Info
	if err := json.Unmarshal(r.Spec, &base); err != nil {
		return Info{}, true, fmt.Errorf("snapshot %s: %w", req.Template, err)
	}
	base.Owner = req.Owner
	base.Metadata = copyMap(req.Metadata)
	if req.EnvVars != nil {
		base.EnvVars = copyMap(req.EnvVars)
	}
	base.Lifecycle = req.Lifecycle
	if err := checkLifecycle(base.Lifecycle); err != nil {
		return Info{}, true, err
	}
	if len(req.VolumeMounts) > 0 {
		// Its processes were saved with the snapshot's mounts.
		return Info{}, true, fmt.Errorf("%w: a sandbox from a snapshot mounts the snapshot's volumes; volumeMounts cannot be given", ErrInvalid)
	}
	info, err = m.startFrom(ctx, filepath.Join(m.snapshotsDir(), r.ID), base, req.Timeout)
	return info, true, err
}

// sweepSnapshots removes snapshot directories that have no record: a create
// or a delete a crash interrupted.
func (m *Manager) sweepSnapshots(ctx context.Context) {
	entries, err := os.ReadDir(m.snapshotsDir())
	if err != nil {
		return
	}
	recs, err := m.opts.Store.ListSnapshots(ctx, store.SnapshotFilter{})
	if err != nil {
		m.log.Warn("snapshot sweep skipped", "err", err)
		return
	}
	known := map[string]bool{}
	for _, r := range recs {
		known[r.ID] = true
	}
	for _, de := range entries {
		if !known[de.Name()] {
			_ = os.RemoveAll(filepath.Join(m.snapshotsDir(), de.Name()))
		}
	}
}
