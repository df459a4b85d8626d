package e2bclient

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// LogsQuery selects a page of a sandbox's log (GET /v2/sandboxes/{id}/logs).
type LogsQuery struct {
	// Cursor is where the page starts (unix ms); zero: the start, or now
	// going backward.
	Cursor   time.Time
	Backward bool
	// Level is the lowest level returned (debug, info, warn, error).
	Level string
	// Search keeps entries whose message contains it.
	Search string
	// Limit bounds the page; 0 is the server's default (1000).
	Limit int
}

// LogEntry is one entry of a sandbox's log (upstream's SandboxLogEntry).
type LogEntry struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

// SandboxLogs returns a page of a sandbox's log.
func (c *Client) SandboxLogs(ctx context.Context, id string, q LogsQuery) ([]LogEntry, error) {
	v := url.Values{}
	if !q.Cursor.IsZero() {
		v.Set("cursor", strconv.FormatInt(q.Cursor.UnixMilli(), 10))
	}
	if q.Backward {
		v.Set("direction", "backward")
	}
	if q.Level != "" {
		v.Set("level", q.Level)
	}
	if q.Search != "" {
		v.Set("search", q.Search)
	}
	if q.Limit > 0 {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	path := "/v2" + sandboxPath(id) + "/logs"
	if len(v) > 0 {
		path += "?" + v.Encode()
	}
	var out struct {
		Logs []LogEntry `json:"logs"`
	}
	if _, err := c.do(ctx, http.MethodGet, path, nil, &out); err != nil {
		return nil, err
	}
	return out.Logs, nil
}
