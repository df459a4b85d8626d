package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

// EventsBackend is what the sandbox_events tool needs; a Backend that has
// it gets the tool. Apart from Backend so that backends without events
// (tests' fakes) need not grow a method.
type EventsBackend interface {
	// SandboxEvents returns the newest limit lifecycle events of a
	// sandbox, oldest first.
	SandboxEvents(ctx context.Context, sandboxID string, limit int) ([]lifecycle.Event, error)
}

// SandboxEvents implements EventsBackend through the events API.
func (h *HTTPBackend) SandboxEvents(ctx context.Context, id string, limit int) ([]lifecycle.Event, error) {
	return h.c.SandboxEvents(ctx, id, limit)
}

const (
	defaultEventsLimit = 20
	maxEventsLimit     = lifecycle.MaxLimit
)

type sandboxEventsIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of the sandbox; a killed sandbox's events stay readable for days"`
	Limit     int    `json:"limit,omitempty" jsonschema:"how many of the latest events to return"`
}

type eventOut struct {
	Type        string `json:"type" jsonschema:"created, updated, paused, resumed, checkpointed or killed"`
	Time        string `json:"time" jsonschema:"RFC 3339"`
	ExecutionID string `json:"execution_id" jsonschema:"one per run of the sandbox: a create or a resume starts a new one"`
	// Detail is what the event says beyond its type, in words.
	Detail string `json:"detail,omitempty"`
	// Data is the event's eventData as E2B's API has it.
	Data map[string]any `json:"data,omitempty"`
}

type sandboxEventsOut struct {
	SandboxID string     `json:"sandbox_id"`
	Events    []eventOut `json:"events" jsonschema:"oldest first"`
}

func registerEventsTool(s *mcp.Server, b EventsBackend) {
	addTool(s, &mcp.Tool{
		Name: "sandbox_events",
		Description: "Get a sandbox's recent lifecycle events, oldest first: when it was created, its timeout or network changed, it was paused, resumed, snapshotted or forked, and when and why it was killed " +
			"(request, timeout, oom, orphaned by a server restart, ...). Works for sandboxes that are already gone.",
		InputSchema: schemaFor[sandboxEventsIn](func(p map[string]*jsonschema.Schema) {
			setDefault(p["limit"], defaultEventsLimit)
			p["limit"].Minimum = jsonschema.Ptr(1.0)
			p["limit"].Maximum = jsonschema.Ptr(float64(maxEventsLimit))
		}),
		Annotations: annotate("Get a sandbox's lifecycle events", hints{readOnly: true}),
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in sandboxEventsIn) (*mcp.CallToolResult, sandboxEventsOut, error) {
		limit := in.Limit
		if limit <= 0 {
			limit = defaultEventsLimit
		}
		evs, err := b.SandboxEvents(ctx, in.SandboxID, min(limit, maxEventsLimit))
		if err != nil {
			return nil, sandboxEventsOut{}, fmt.Errorf("events of sandbox %s: %w", in.SandboxID, err)
		}
		out := sandboxEventsOut{SandboxID: in.SandboxID, Events: make([]eventOut, 0, len(evs))}
		var text strings.Builder
		for _, e := range evs {
			o := eventOut{
				Type: strings.TrimPrefix(e.Type, "sandbox.lifecycle."), Time: rfc3339(e.Timestamp),
				ExecutionID: e.SandboxExecutionID, Detail: eventDetail(e.EventData),
			}
			_ = json.Unmarshal(e.EventData, &o.Data) // shown as it came; Detail says it in words
			out.Events = append(out.Events, o)
			fmt.Fprintf(&text, "%s %s", o.Time, o.Type)
			if o.Detail != "" {
				fmt.Fprintf(&text, " (%s)", o.Detail)
			}
			text.WriteByte('\n')
		}
		if len(evs) == 0 {
			return textResult("No lifecycle events for sandbox %s: it never existed for this API key, or its events are past the server's retention.", in.SandboxID), out, nil
		}
		return textResult("Lifecycle events of sandbox %s, oldest first:\n%s", in.SandboxID, text.String()), out, nil
	})
}

// eventDetail says in words what an event's data adds to its type.
func eventDetail(raw json.RawMessage) string {
	var d lifecycle.EventData
	if len(raw) == 0 || json.Unmarshal(raw, &d) != nil {
		return ""
	}
	var parts []string
	if d.KillReason != "" {
		parts = append(parts, "reason: "+d.KillReason)
	}
	if d.SetTimeout != "" {
		parts = append(parts, "ends at "+d.SetTimeout)
	}
	if n := d.NetworkEgress; n != nil {
		parts = append(parts, fmt.Sprintf("egress allowed %v %v, denied %v", n.AllowedCIDRs, n.AllowedDomains, n.DeniedCIDRs))
	}
	if d.SnapshotID != "" {
		parts = append(parts, "snapshot "+d.SnapshotID)
	}
	if d.ForkCount > 0 {
		parts = append(parts, fmt.Sprintf("fork of %d", d.ForkCount))
	}
	if x := d.Execution; x != nil {
		parts = append(parts, fmt.Sprintf("ran %s on %d vCPU, %d MiB", (time.Duration(x.ExecutionTime)*time.Millisecond).Round(time.Millisecond), x.VCPUCount, x.MemoryMB))
	}
	return strings.Join(parts, "; ")
}
