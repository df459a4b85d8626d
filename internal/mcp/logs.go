package mcp

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
)

// The sandbox_logs tool: what happened inside a sandbox (processes started
// and ended with their exit codes, OOM kills, the template's start command
// output, envd's errors), newest entries last.

// LogsBackend is a Backend that can read sandbox logs; HTTPBackend is one.
// The tool is offered only by backends that are.
type LogsBackend interface {
	SandboxLogs(ctx context.Context, sandboxID string, q LogsRequest) ([]LogEntry, error)
}

// LogsRequest selects the newest Limit entries at Level or above whose
// message contains Search.
type LogsRequest struct {
	Level  string
	Search string
	Limit  int
}

// LogEntry is one entry of a sandbox's log.
type LogEntry struct {
	Timestamp time.Time
	Level     string
	Message   string
	Fields    map[string]string
}

const (
	defaultLogsLimit = 100
	maxLogsLimit     = 1000
)

type sandboxLogsIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of the sandbox (a killed sandbox's log stays readable for a while)"`
	Level     string `json:"level,omitempty" jsonschema:"lowest level to return"`
	Search    string `json:"search,omitempty" jsonschema:"only entries whose message contains this text (case-sensitive)"`
	Limit     int    `json:"limit,omitempty" jsonschema:"how many of the newest entries to return"`
}

type logEntryOut struct {
	Timestamp string            `json:"timestamp"`
	Level     string            `json:"level"`
	Message   string            `json:"message"`
	Fields    map[string]string `json:"fields,omitempty"`
}

type sandboxLogsOut struct {
	SandboxID string        `json:"sandbox_id"`
	Entries   []logEntryOut `json:"entries" jsonschema:"oldest first"`
}

func registerLogsTool(s *mcp.Server, b Backend) {
	lb, ok := b.(LogsBackend)
	if !ok {
		return
	}
	addTool(s, &mcp.Tool{
		Name: "sandbox_logs",
		Description: "Read a sandbox's log: the commands started in it and how they ended (exit codes, signals, OOM kills), its template's start command output, and errors of the sandbox agent. " +
			"Use it to find out why a command or a background process died, or what a sandbox did. Returns the newest entries, oldest first.",
		InputSchema: schemaFor[sandboxLogsIn](func(p map[string]*jsonschema.Schema) {
			p["level"].Enum = []any{"debug", "info", "warn", "error"}
			setDefault(p["level"], "info")
			p["limit"].Minimum = jsonschema.Ptr(1.0)
			p["limit"].Maximum = jsonschema.Ptr(float64(maxLogsLimit))
			setDefault(p["limit"], defaultLogsLimit)
			p["search"].MaxLength = jsonschema.Ptr(256)
		}),
		Annotations: annotate("Read a sandbox's log", hints{readOnly: true}),
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in sandboxLogsIn) (*mcp.CallToolResult, sandboxLogsOut, error) {
		q := LogsRequest{Level: in.Level, Search: in.Search, Limit: in.Limit}
		if q.Level == "" {
			q.Level = "info"
		}
		if q.Limit == 0 {
			q.Limit = defaultLogsLimit
		}
		entries, err := lb.SandboxLogs(ctx, in.SandboxID, q)
		if err != nil {
			return nil, sandboxLogsOut{}, fmt.Errorf("read the log of sandbox %s: %w", in.SandboxID, err)
		}
		out := sandboxLogsOut{SandboxID: in.SandboxID, Entries: make([]logEntryOut, 0, len(entries))}
		var b strings.Builder
		for _, e := range entries {
			o := logEntryOut{Timestamp: e.Timestamp.UTC().Format(time.RFC3339Nano), Level: e.Level, Message: e.Message, Fields: e.Fields}
			out.Entries = append(out.Entries, o)
			fmt.Fprintf(&b, "%s %-5s %s %s\n", e.Timestamp.UTC().Format("2006-01-02 15:04:05.000"), strings.ToUpper(e.Level), e.Fields["logger"], e.Message)
		}
		if len(entries) == 0 {
			return textResult("Sandbox %s has no log entries at level %s or above%s.", in.SandboxID, q.Level, searchNote(q.Search)), out, nil
		}
		return textResult("%s", strings.TrimRight(b.String(), "\n")), out, nil
	})
}

func searchNote(s string) string {
	if s == "" {
		return ""
	}
	return fmt.Sprintf(" containing %q", s)
}

// SandboxLogs returns the newest entries q selects, oldest first: one
// backward page from now, turned around.
func (h *HTTPBackend) SandboxLogs(ctx context.Context, id string, q LogsRequest) ([]LogEntry, error) {
	ws, err := h.c.SandboxLogs(ctx, id, e2bclient.LogsQuery{Backward: true, Level: q.Level, Search: q.Search, Limit: q.Limit})
	if err != nil {
		return nil, err
	}
	out := make([]LogEntry, 0, len(ws))
	for _, w := range ws {
		out = append(out, LogEntry{Timestamp: w.Timestamp, Level: w.Level, Message: w.Message, Fields: w.Fields})
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Timestamp.Before(out[b].Timestamp) })
	return out, nil
}
