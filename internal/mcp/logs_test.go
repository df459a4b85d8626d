package mcp_test

import (
	"strings"
	"testing"
	"time"

	airlockmcp "github.com/airlock-sandbox/airlock/internal/mcp"
)

// TestSandboxLogsTool reads a real sandbox's log through the MCP tool: a
// command that exits 3 is there at warn, filters apply, and the log still
// reads after kill_sandbox.
func TestSandboxLogsTool(t *testing.T) {
	cs := realServer(t)
	res := airlockmcp.Call(t, cs, "create_sandbox", map[string]any{"template": "base"})
	mustOK(t, res)
	var sb airlockmcp.SandboxOut
	airlockmcp.Structured(t, res, &sb)
	id := sb.SandboxID
	if res := airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo mcp-log-mark; exit 3"}); !res.IsError {
		t.Fatalf("exit 3 is not an error result: %s", airlockmcp.Text(res))
	}
	mustOK(t, airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "true mcp-log-mark"}))

	logs := func(args map[string]any) airlockmcp.SandboxLogsOut {
		t.Helper()
		args["sandbox_id"] = id
		res := airlockmcp.Call(t, cs, "sandbox_logs", args)
		mustOK(t, res)
		var out airlockmcp.SandboxLogsOut
		airlockmcp.Structured(t, res, &out)
		if len(out.Entries) > 0 && !strings.Contains(airlockmcp.Text(res), out.Entries[len(out.Entries)-1].Message) {
			t.Errorf("the text does not show the newest entry: %s", airlockmcp.Text(res))
		}
		return out
	}
	all := logs(map[string]any{})
	var starts, ends int
	for _, e := range all.Entries {
		if !strings.Contains(e.Fields["cmd"], "mcp-log-mark") {
			continue
		}
		if e.Fields["exitCode"] != "" {
			ends++
		} else {
			starts++
		}
	}
	if starts != 2 || ends != 2 {
		t.Fatalf("want 2 starts and 2 ends of the commands, got %d and %d: %+v", starts, ends, all.Entries)
	}
	warn := logs(map[string]any{"level": "warn"})
	if len(warn.Entries) != 1 || warn.Entries[0].Fields["exitCode"] != "3" || warn.Entries[0].Level != "warn" {
		t.Fatalf("level warn: %+v", warn.Entries)
	}
	if got := logs(map[string]any{"search": "echo mcp-log-mark", "limit": 1}); len(got.Entries) != 1 || !strings.Contains(got.Entries[0].Message, "started") {
		t.Fatalf("search: %+v", got.Entries)
	}

	mustOK(t, airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id}))
	var after airlockmcp.SandboxLogsOut
	for range 50 {
		if after = logs(map[string]any{"level": "warn"}); len(after.Entries) == 1 {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if len(after.Entries) != 1 || after.Entries[0].Fields["exitCode"] != "3" {
		t.Fatalf("after the kill: %+v", after.Entries)
	}
	if res := airlockmcp.Call(t, cs, "sandbox_logs", map[string]any{"sandbox_id": "nosuchsandbox"}); !res.IsError {
		t.Fatalf("an unknown sandbox's log: %s", airlockmcp.Text(res))
	}
}
