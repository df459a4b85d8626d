package e2bclient

import (
	"context"
	"fmt"
	"net/url"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

// SandboxEvents returns the newest limit lifecycle events of a sandbox
// (GET /events/sandboxes/{id}), oldest first.
func (c *Client) SandboxEvents(ctx context.Context, id string, limit int) ([]lifecycle.Event, error) {
	q := url.Values{"limit": {fmt.Sprint(limit)}}
	var evs []lifecycle.Event
	if _, err := c.do(ctx, "GET", "/events/sandboxes/"+url.PathEscape(id)+"?"+q.Encode(), nil, &evs); err != nil {
		return nil, err
	}
	// Asked newest first, so that the page holds the latest; read in the
	// order they happened.
	for i, j := 0, len(evs)-1; i < j; i, j = i+1, j-1 {
		evs[i], evs[j] = evs[j], evs[i]
	}
	return evs, nil
}
