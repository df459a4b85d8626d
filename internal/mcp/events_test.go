package mcp_test

import (
	"fmt"
	"strings"
	"testing"

	airlockmcp "github.com/airlock-sandbox/airlock/internal/mcp"
)

// TestSandboxEventsTool: an agent reads, through MCP, what happened to a
// sandbox it created, changed and killed, after it is gone.
func TestSandboxEventsTool(t *testing.T) {
	cs := realServer(t)
	res := airlockmcp.Call(t, cs, "create_sandbox", map[string]any{"template": "base", "metadata": map[string]string{"who": "mcp-events"}})
	mustOK(t, res)
	var sb airlockmcp.SandboxOut
	airlockmcp.Structured(t, res, &sb)
	mustOK(t, airlockmcp.Call(t, cs, "set_timeout", map[string]any{"sandbox_id": sb.SandboxID, "timeout": 900}))
	mustOK(t, airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": sb.SandboxID}))

	res = airlockmcp.Call(t, cs, "sandbox_events", map[string]any{"sandbox_id": sb.SandboxID})
	mustOK(t, res)
	var out airlockmcp.SandboxEventsOut
	airlockmcp.Structured(t, res, &out)
	var types []string
	for _, e := range out.Events {
		types = append(types, e.Type)
	}
	if strings.Join(types, " ") != "created updated killed" {
		t.Fatalf("events oldest first: %v", types)
	}
	if k := out.Events[2]; !strings.Contains(k.Detail, "reason: request") || k.ExecutionID == "" || k.ExecutionID != out.Events[0].ExecutionID {
		t.Fatalf("killed: %+v", k)
	}
	if !strings.Contains(out.Events[1].Detail, "ends at ") || fmt.Sprint(out.Events[1].Data["sandbox_metadata"]) != "map[who:mcp-events]" {
		t.Fatalf("updated: %+v", out.Events[1])
	}
	if text := airlockmcp.Text(res); !strings.Contains(text, "killed (reason: request") {
		t.Fatalf("text: %q", text)
	}
	// limit keeps the latest.
	res = airlockmcp.Call(t, cs, "sandbox_events", map[string]any{"sandbox_id": sb.SandboxID, "limit": 1})
	mustOK(t, res)
	airlockmcp.Structured(t, res, &out)
	if len(out.Events) != 1 || out.Events[0].Type != "killed" {
		t.Fatalf("limit 1: %+v", out.Events)
	}
	// A sandbox this key never had: no events, said in words.
	res = airlockmcp.Call(t, cs, "sandbox_events", map[string]any{"sandbox_id": "nosuchsandbox0000000"})
	mustOK(t, res)
	if !strings.Contains(airlockmcp.Text(res), "No lifecycle events") {
		t.Fatalf("unknown sandbox: %q", airlockmcp.Text(res))
	}
}
