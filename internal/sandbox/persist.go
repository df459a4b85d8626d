package sandbox

import (
	"context"
	"errors"
)

// errNotYet marks the persistence operations being built (issue 13).
var errNotYet = errors.New("not implemented yet")

// Fork starts req.Count sandboxes from the state of sandbox id.
func (m *Manager) Fork(ctx context.Context, id string, req ForkRequest) ([]ForkResult, error) {
	return nil, errNotYet
}

// CreateSnapshot saves the state of sandbox id.
func (m *Manager) CreateSnapshot(ctx context.Context, id string, req SnapshotRequest) (Snapshot, error) {
	return Snapshot{}, errNotYet
}

// ListSnapshots returns the snapshots f selects.
func (m *Manager) ListSnapshots(ctx context.Context, f SnapshotFilter) ([]Snapshot, error) {
	return nil, errNotYet
}

// DeleteSnapshot removes a snapshot.
func (m *Manager) DeleteSnapshot(ctx context.Context, idOrName string) error {
	return errNotYet
}
