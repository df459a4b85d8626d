// Package e2b serves the E2B control-plane REST API (docs/E2B-WIRE.md §2) over the
// sandbox manager: request decoding and validation, list filters and pagination,
// and the one error body shape {"code": <status>, "message": ...}.
package e2b

import (
	"context"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Manager is what the API needs from the sandbox manager. Errors wrap the
// sandbox.Err* values so handlers can map them to status codes.
type Manager interface {
	Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Info, error)
	Get(ctx context.Context, id string) (sandbox.Info, error)
	List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Info, error)
	// ListKeys returns the keys of the sandboxes List would return, in no
	// order: a page of GET /v2/sandboxes asks Get for its own few only.
	ListKeys(ctx context.Context, f sandbox.ListFilter) ([]sandbox.ListKey, error)
	Kill(ctx context.Context, id string) error
	// SetTimeout makes the sandbox end d from now.
	SetTimeout(ctx context.Context, id string, d time.Duration) error
	// Connect returns a running sandbox (resuming a paused one, resumed=true) and
	// extends its end to at least timeout from now.
	Connect(ctx context.Context, id string, timeout time.Duration) (info sandbox.Info, resumed bool, err error)
	// Pause saves a running sandbox to disk (with its memory unless
	// opts.DropMemory) and frees its RAM; ErrConflict when already paused.
	Pause(ctx context.Context, id string, opts sandbox.PauseOptions) error
	// Fork checkpoints a running sandbox once (it keeps running) and starts
	// req.Count sandboxes from that state; each fork's outcome is reported
	// on its own. ErrInvalid for a count outside 1..MaxForkCount.
	Fork(ctx context.Context, id string, req sandbox.ForkRequest) ([]sandbox.ForkResult, error)
	// CreateSnapshot saves a running sandbox's state (it keeps running).
	CreateSnapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (sandbox.Snapshot, error)
	// ListSnapshots returns the snapshots f selects, newest first.
	ListSnapshots(ctx context.Context, f sandbox.SnapshotFilter) ([]sandbox.Snapshot, error)
	// DeleteSnapshot removes owner's snapshot by ID or name; ErrNotFound
	// when owner has none.
	DeleteSnapshot(ctx context.Context, idOrName, owner string) error
	// UpdateNetwork replaces a running sandbox's egress rules.
	UpdateNetwork(ctx context.Context, id string, u sandbox.NetworkUpdate) error
	// Metrics returns the samples taken between start and end (inclusive).
	Metrics(ctx context.Context, id string, start, end time.Time) ([]sandbox.Metric, error)
	// Logs returns a page of the sandbox's log (a killed sandbox's within
	// the retention period).
	Logs(ctx context.Context, id string, q sandbox.LogQuery) ([]sandbox.LogEntry, error)
}
