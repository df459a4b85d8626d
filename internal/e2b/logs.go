package e2b

import (
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// The logs endpoints (CLI and dashboard, not the SDKs): Airlock's sandbox log
// is its event log (OOM kills, ...), as SandboxLogs (v1) and
// SandboxLogsV2Response (v2) shape it.

type logLineJSON struct {
	Timestamp time.Time `json:"timestamp"`
	Line      string    `json:"line"`
}

type logEntryJSON struct {
	Timestamp time.Time         `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields"`
}

const (
	defaultLogLimit = 1000
	maxLogLimit     = 10000
)

// logsQuery reads the id, a start time in unix milliseconds (param name
// differs by version) and a limit.
func logsQuery(r *http.Request, startParam string) (string, time.Time, int, error) {
	id, err := sandboxIDParam(r)
	if err != nil {
		return "", time.Time{}, 0, err
	}
	q := r.URL.Query()
	var start time.Time
	if v := q.Get(startParam); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 || ms > unixBound*1000 {
			return "", time.Time{}, 0, badRequest("%s must be unix milliseconds, got %q", startParam, v)
		}
		start = time.UnixMilli(ms)
	}
	limit := defaultLogLimit
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxLogLimit {
			return "", time.Time{}, 0, badRequest("limit must be an integer in [0, %d], got %q", maxLogLimit, v)
		}
		limit = n
	}
	return id, start, limit, nil
}

func entriesJSON(entries []sandbox.LogEntry) []logEntryJSON {
	out := make([]logEntryJSON, 0, len(entries))
	for _, e := range entries {
		fields := e.Fields
		if fields == nil {
			fields = map[string]string{}
		}
		out = append(out, logEntryJSON{Timestamp: e.Time.UTC(), Level: e.Level, Message: e.Message, Fields: fields})
	}
	return out
}

func (h *Handler) logsV1(w http.ResponseWriter, r *http.Request) error {
	id, start, limit, err := logsQuery(r, "start")
	if err != nil {
		return err
	}
	entries, err := h.m.Logs(r.Context(), id, start)
	if err != nil {
		return managerError(fmt.Errorf("sandbox logs: %w", err), id, "")
	}
	entries = entries[:min(len(entries), limit)]
	lines := make([]logLineJSON, 0, len(entries))
	for _, e := range entries {
		lines = append(lines, logLineJSON{Timestamp: e.Time.UTC(), Line: e.Message})
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": lines, "logEntries": entriesJSON(entries)})
	return nil
}

// logsV2 pages by cursor (unix ms) in either direction.
func (h *Handler) logsV2(w http.ResponseWriter, r *http.Request) error {
	id, start, limit, err := logsQuery(r, "cursor")
	if err != nil {
		return err
	}
	dir := r.URL.Query().Get("direction")
	if dir != "" && dir != "forward" && dir != "backward" {
		return badRequest("direction must be forward or backward, got %q", dir)
	}
	from := start
	if dir == "backward" {
		from = time.Time{}
	}
	entries, err := h.m.Logs(r.Context(), id, from)
	if err != nil {
		return managerError(fmt.Errorf("sandbox logs: %w", err), id, "")
	}
	if dir == "backward" {
		// Newest first, at or before the cursor (now when absent).
		var rev []sandbox.LogEntry
		for i := len(entries) - 1; i >= 0; i-- {
			if start.IsZero() || !entries[i].Time.After(start) {
				rev = append(rev, entries[i])
			}
		}
		entries = rev
	}
	entries = entries[:min(len(entries), limit)]
	writeJSON(w, http.StatusOK, map[string]any{"logs": entriesJSON(entries)})
	return nil
}
