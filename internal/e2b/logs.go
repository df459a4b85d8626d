package e2b

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/sandboxlog"
)

// The logs endpoints (the CLI's `e2b sandbox logs`, the dashboard; not the
// SDKs): a sandbox's log (internal/sandbox/sblogs.go) as SandboxLogs (v1)
// and SandboxLogsV2Response (v2) shape it.

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
	// maxLogLimit is v2's (upstream's maximum); v1 has none upstream and
	// takes up to maxLogLimitV1.
	maxLogLimit   = 1000
	maxLogLimitV1 = 10000
	// maxLogSearch is upstream's maxLength of search.
	maxLogSearch = 256
)

// logsQuery reads the id and the query: a start time in unix milliseconds
// (its name differs by version), limit, direction, level and search.
func logsQuery(r *http.Request, startParam string, maxLimit int) (string, sandbox.LogQuery, error) {
	id, err := sandboxIDParam(r)
	if err != nil {
		return "", sandbox.LogQuery{}, err
	}
	q := r.URL.Query()
	lq := sandbox.LogQuery{Owner: ownerFrom(r.Context()), Limit: defaultLogLimit}
	if v := q.Get(startParam); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 0 || ms > unixBound*1000 {
			return "", lq, badRequest("%s must be unix milliseconds, got %q", startParam, v)
		}
		lq.Cursor = time.UnixMilli(ms)
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > maxLimit {
			return "", lq, badRequest("limit must be an integer in [0, %d], got %q", maxLimit, v)
		}
		lq.Limit = n
	}
	switch v := q.Get("direction"); v {
	case "", "forward":
	case "backward":
		lq.Backward = true
	default:
		return "", lq, badRequest("direction must be forward or backward, got %q", v)
	}
	if v := q.Get("level"); v != "" {
		l := strings.ToLower(v)
		if _, ok := sandboxlog.Rank(l); !ok {
			return "", lq, badRequest("level must be one of debug, info, warn, error, got %q", v)
		}
		lq.MinLevel = l
	}
	if v := q.Get("search"); v != "" {
		if utf8.RuneCountInString(v) > maxLogSearch {
			return "", lq, badRequest("search must be at most %d characters, got %d", maxLogSearch, utf8.RuneCountInString(v))
		}
		lq.Search = v
	}
	return id, lq, nil
}

// logFields are an entry's fields on the wire: its own, plus its logger
// and origin (who wrote it: the sandbox or the host).
func logFields(e sandbox.LogEntry) map[string]string {
	f := make(map[string]string, len(e.Fields)+2)
	for k, v := range e.Fields {
		f[k] = v
	}
	f["logger"] = e.Logger
	f["origin"] = e.Origin
	return f
}

func entriesJSON(entries []sandbox.LogEntry) []logEntryJSON {
	out := make([]logEntryJSON, 0, len(entries))
	for _, e := range entries {
		out = append(out, logEntryJSON{Timestamp: e.Time.UTC(), Level: e.Level, Message: e.Message, Fields: logFields(e)})
	}
	return out
}

// logLine is an entry as v1's `line`: one JSON object, which the CLI parses
// and prints (it needs `level`; `logger` is what --loggers filters on).
func logLine(e sandbox.LogEntry) string {
	obj := make(map[string]string, len(e.Fields)+4)
	for k, v := range e.Fields {
		obj[k] = v
	}
	obj["level"] = e.Level
	obj["logger"] = e.Logger
	obj["message"] = e.Message
	obj["origin"] = e.Origin
	b, _ := json.Marshal(obj) // a map of strings always marshals
	return string(b)
}

func (h *Handler) logsV1(w http.ResponseWriter, r *http.Request) error {
	id, q, err := logsQuery(r, "start", maxLogLimitV1)
	if err != nil {
		return err
	}
	entries, err := h.sbx(r.Context()).Logs(r.Context(), id, q)
	if err != nil {
		return managerError(fmt.Errorf("sandbox logs: %w", err), id, "")
	}
	if q.Limit == 0 {
		entries = nil // the manager reads 0 as no bound; the API as none
	}
	lines := make([]logLineJSON, 0, len(entries))
	for _, e := range entries {
		lines = append(lines, logLineJSON{Timestamp: e.Time.UTC(), Line: logLine(e)})
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": lines, "logEntries": entriesJSON(entries)})
	return nil
}

// logsV2 pages by cursor (unix ms) in either direction.
func (h *Handler) logsV2(w http.ResponseWriter, r *http.Request) error {
	id, q, err := logsQuery(r, "cursor", maxLogLimit)
	if err != nil {
		return err
	}
	entries, err := h.sbx(r.Context()).Logs(r.Context(), id, q)
	if err != nil {
		return managerError(fmt.Errorf("sandbox logs: %w", err), id, "")
	}
	if q.Limit == 0 {
		entries = nil // the manager reads 0 as no bound; the API as none
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": entriesJSON(entries)})
	return nil
}
