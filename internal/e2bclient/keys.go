package e2bclient

import (
	"context"
	"net/http"
	"net/url"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// CreateKey is POST /api-keys: the answer holds the key, this once.
func (c *Client) CreateKey(ctx context.Context, body e2bwire.NewTeamAPIKey) (e2bwire.TeamAPIKey, error) {
	var out e2bwire.TeamAPIKey
	_, err := c.do(ctx, http.MethodPost, "/api-keys", body, &out)
	return out, err
}

// ListKeys is GET /api-keys: the keys of team (ID or name; "" the caller's).
func (c *Client) ListKeys(ctx context.Context, team string) ([]e2bwire.TeamAPIKey, error) {
	path := "/api-keys"
	if team != "" {
		path += "?" + url.Values{"team": {team}}.Encode()
	}
	var out []e2bwire.TeamAPIKey
	_, err := c.do(ctx, http.MethodGet, path, nil, &out)
	return out, err
}

// UpdateKey is PATCH /api-keys/{id}.
func (c *Client) UpdateKey(ctx context.Context, id string, body e2bwire.NewTeamAPIKey) (e2bwire.TeamAPIKey, error) {
	var out e2bwire.TeamAPIKey
	_, err := c.do(ctx, http.MethodPatch, "/api-keys/"+url.PathEscape(id), body, &out)
	return out, err
}

// RevokeKey is DELETE /api-keys/{id}.
func (c *Client) RevokeKey(ctx context.Context, id string) error {
	_, err := c.do(ctx, http.MethodDelete, "/api-keys/"+url.PathEscape(id), nil, nil)
	return err
}

// Teams is GET /teams.
func (c *Client) Teams(ctx context.Context) ([]e2bwire.Team, error) {
	var out []e2bwire.Team
	_, err := c.do(ctx, http.MethodGet, "/teams", nil, &out)
	return out, err
}

// Audit reads the audit log, newest first: of team (ID or name; "" every
// team), at most limit entries, before sequence number before (0: the
// newest).
func (c *Client) Audit(ctx context.Context, team string, limit int, before int64) ([]e2bwire.AuditEntry, error) {
	q := url.Values{}
	if team != "" {
		q.Set("team", team)
	}
	if limit > 0 {
		q.Set("limit", strconv.Itoa(limit))
	}
	if before > 0 {
		q.Set("before", strconv.FormatInt(before, 10))
	}
	var out []e2bwire.AuditEntry
	_, err := c.do(ctx, http.MethodGet, e2bwire.AuditPath+"?"+q.Encode(), nil, &out)
	return out, err
}

// UpdateTeam is PATCH /teams/{team} (ID or name): its quotas.
func (c *Client) UpdateTeam(ctx context.Context, team string, q e2bwire.TeamQuotas) (e2bwire.Team, error) {
	var out e2bwire.Team
	_, err := c.do(ctx, http.MethodPatch, "/teams/"+url.PathEscape(team), e2bwire.TeamUpdate{Quotas: &q}, &out)
	return out, err
}
