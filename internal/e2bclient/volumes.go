package e2bclient

import (
	"context"
	"net/http"
	"net/url"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// The volume API of the control plane (POST/GET /volumes, GET/DELETE
// /volumes/{id}). The content API (/volumecontent/, authorised by a volume's
// token rather than the API key) is not here: no caller of this package reads
// or writes a volume's files without a sandbox yet.

func volumePath(id string) string { return "/volumes/" + url.PathEscape(id) }

// CreateVolume creates a volume named name (POST /volumes). sizeMB is its
// quota in MiB, Airlock's extension; 0 leaves it to the server's default.
// A taken or malformed name is an *Error with status 400, a used-up per-key
// allowance 429, a server without volumes 501.
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMB int64) (e2bwire.VolumeAndToken, error) {
	body := e2bwire.NewVolume{Name: name}
	if sizeMB != 0 {
		body.SizeMB = &sizeMB
	}
	var v e2bwire.VolumeAndToken
	_, err := c.do(ctx, http.MethodPost, "/volumes", body, &v)
	return v, err
}

// ListVolumes returns the key's volumes (GET /volumes; one page, the API has
// no pagination for volumes).
func (c *Client) ListVolumes(ctx context.Context) ([]e2bwire.Volume, error) {
	var vs []e2bwire.Volume
	if _, err := c.do(ctx, http.MethodGet, "/volumes", nil, &vs); err != nil {
		return nil, err
	}
	return vs, nil
}

// GetVolume returns one of the key's volumes with its content token and size
// (GET /volumes/{id}); another key's or an unknown one is an *Error with
// status 404.
func (c *Client) GetVolume(ctx context.Context, id string) (e2bwire.VolumeAndToken, error) {
	var v e2bwire.VolumeAndToken
	_, err := c.do(ctx, http.MethodGet, volumePath(id), nil, &v)
	return v, err
}

// DeleteVolume destroys a volume and its files (DELETE /volumes/{id}). While
// sandboxes mount it the server refuses with 409 naming them, unless force
// (Airlock's ?force=true) is set.
func (c *Client) DeleteVolume(ctx context.Context, id string, force bool) error {
	path := volumePath(id)
	if force {
		path += "?force=true"
	}
	_, err := c.do(ctx, http.MethodDelete, path, nil, nil)
	return err
}
