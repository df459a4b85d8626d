package e2bclient

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// Pause pauses a running sandbox (POST /sandboxes/{id}/pause); memory false
// keeps only its filesystem.
func (c *Client) Pause(ctx context.Context, id string, memory bool) error {
	_, err := c.do(ctx, http.MethodPost, sandboxPath(id)+"/pause", e2bwire.PauseRequest{Memory: &memory}, nil)
	return err
}

// Connect returns a sandbox, resuming it when paused (resumed is then true:
// the server answered 201), with its timeout at least d from now.
func (c *Client) Connect(ctx context.Context, id string, d time.Duration) (sb e2bwire.Sandbox, resumed bool, err error) {
	secs := int64(d / time.Second)
	_, status, err := c.doStatus(ctx, http.MethodPost, sandboxPath(id)+"/connect", e2bwire.ConnectSandbox{Timeout: &secs}, &sb)
	return sb, status == http.StatusCreated, err
}

// Fork starts count sandboxes from one capture of a running sandbox, each
// living d; every result holds a sandbox or the error that one fork met.
func (c *Client) Fork(ctx context.Context, id string, count int, d time.Duration) ([]e2bwire.SandboxForkResult, error) {
	n, secs := int64(count), int64(d/time.Second)
	var out []e2bwire.SandboxForkResult
	_, err := c.do(ctx, http.MethodPost, sandboxPath(id)+"/fork", e2bwire.ForkRequest{Count: &n, Timeout: &secs}, &out)
	return out, err
}

// CreateSnapshot snapshots a running sandbox; an empty name is none.
func (c *Client) CreateSnapshot(ctx context.Context, id, name string) (e2bwire.SnapshotInfo, error) {
	var req e2bwire.SnapshotRequest
	if name != "" {
		req.Name = &name
	}
	var out e2bwire.SnapshotInfo
	_, err := c.do(ctx, http.MethodPost, sandboxPath(id)+"/snapshots", req, &out)
	return out, err
}

// ListSnapshots lists the snapshots of one sandbox (every one when
// sandboxID is empty), first page only.
func (c *Client) ListSnapshots(ctx context.Context, sandboxID string) ([]e2bwire.SnapshotInfo, error) {
	v := url.Values{"limit": {"100"}}
	if sandboxID != "" {
		v.Set("sandboxID", sandboxID)
	}
	var out []e2bwire.SnapshotInfo
	_, err := c.do(ctx, http.MethodGet, "/snapshots?"+v.Encode(), nil, &out)
	return out, err
}

// FindSnapshots lists the snapshots whose ID or name ref is, with or
// without its tag (GET /snapshots?name=); the server answers with the
// key's team's only, so names other teams also use find one at most.
func (c *Client) FindSnapshots(ctx context.Context, ref string) ([]e2bwire.SnapshotInfo, error) {
	var out []e2bwire.SnapshotInfo
	_, err := c.do(ctx, http.MethodGet, "/snapshots?"+url.Values{"name": {ref}}.Encode(), nil, &out)
	return out, err
}

// DeleteSnapshot deletes a snapshot by its ID or name (E2B deletes
// snapshots through DELETE /templates/{id}).
func (c *Client) DeleteSnapshot(ctx context.Context, ref string) error {
	_, err := c.do(ctx, http.MethodDelete, "/templates/"+url.PathEscape(ref), nil, nil)
	return err
}
