package mcp_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	airlockmcp "github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
)

// The runtime re-executes the test binary as each sandbox's first process.
func init() { linux.MaybeInit() }

// realServer starts what `airlock serve` runs (internal/daemon) and returns an
// MCP client session over its /mcp endpoint, authenticated with its key, as an
// agent connects.
func realServer(t *testing.T) *mcp.ClientSession {
	t.Helper()
	d := daemontest.Start(t, nil)
	transport := &mcp.StreamableClientTransport{Endpoint: d.APIURL + "/mcp", HTTPClient: daemontest.BearerClient(daemontest.Key)}
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).Connect(context.Background(), transport, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func mustOK(t *testing.T, res *mcp.CallToolResult) {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", airlockmcp.Text(res))
	}
}

// TestHTTPBackendRealServer drives every tool once against real sandboxes.
func TestHTTPBackendRealServer(t *testing.T) {
	cs := realServer(t)
	// create_sandbox, with metadata to find it by.
	res := airlockmcp.Call(t, cs, "create_sandbox", map[string]any{"template": "base", "metadata": map[string]string{"owner": "mcp test&x=1%"}, "envs": map[string]string{"GREETING": "hi"}})
	mustOK(t, res)
	var sb airlockmcp.SandboxOut
	airlockmcp.Structured(t, res, &sb)
	if sb.SandboxID == "" || sb.Template != "base" || sb.Status != "running" || sb.Expires == "" {
		t.Fatalf("create: %+v", sb)
	}
	id := sb.SandboxID

	// run_command: output, env from create, cwd, exit code.
	res = airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo $GREETING $X; pwd; echo oops >&2", "cwd": "/tmp", "envs": map[string]string{"X": "there"}})
	mustOK(t, res)
	var cmd airlockmcp.RunCommandOut
	airlockmcp.Structured(t, res, &cmd)
	if cmd.Stdout != "hi there\n/tmp\n" || cmd.Stderr != "oops\n" || cmd.ExitCode != 0 || cmd.PID == 0 {
		t.Errorf("run_command: %+v", cmd)
	}
	if res := airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "exit 7"}); !res.IsError || !strings.Contains(airlockmcp.Text(res), "exit code 7") {
		t.Errorf("exit 7: isError=%v %q", res.IsError, airlockmcp.Text(res))
	}
	// A foreground command past its timeout is killed and reported.
	start := time.Now()
	if res := airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo started; sleep 60", "timeout": 1}); !res.IsError ||
		!strings.Contains(airlockmcp.Text(res), "timed out") || !strings.Contains(airlockmcp.Text(res), "started") {
		t.Errorf("timeout: isError=%v %q", res.IsError, airlockmcp.Text(res))
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("timeout took %s", d)
	}
	// background: returns a pid at once; the process keeps running.
	res = airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "sleep 30", "background": true})
	mustOK(t, res)
	airlockmcp.Structured(t, res, &cmd)
	if cmd.PID == 0 {
		t.Fatalf("background: %+v", cmd)
	}
	res = airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "ps -o comm= -p " + strconv.Itoa(int(cmd.PID))})
	mustOK(t, res)
	airlockmcp.Structured(t, res, &cmd)
	if strings.TrimSpace(cmd.Stdout) != "sleep" {
		t.Errorf("background process not running: %+v", cmd)
	}

	// write_file, read_file (text and binary), list_files.
	mustOK(t, airlockmcp.Call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/home/user/dir/a.txt", "content": "hello file"}))
	mustOK(t, airlockmcp.Call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "dir/b.bin", "content": "/wCA", "encoding": "base64"}))
	res = airlockmcp.Call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/home/user/dir/a.txt"})
	mustOK(t, res)
	var rf airlockmcp.ReadFileOut
	airlockmcp.Structured(t, res, &rf)
	if rf.Content != "hello file" || rf.Encoding != "utf8" {
		t.Errorf("read text: %+v", rf)
	}
	res = airlockmcp.Call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/home/user/dir/b.bin"})
	airlockmcp.Structured(t, res, &rf)
	if rf.Content != "/wCA" || rf.Encoding != "base64" {
		t.Errorf("read binary: %+v", rf)
	}
	if res := airlockmcp.Call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/nope"}); !res.IsError {
		t.Error("reading a missing file is not an error")
	}
	res = airlockmcp.Call(t, cs, "list_files", map[string]any{"sandbox_id": id, "path": "/home/user/dir"})
	mustOK(t, res)
	var lf airlockmcp.ListFilesOut
	airlockmcp.Structured(t, res, &lf)
	if len(lf.Entries) != 2 || lf.Entries[0].Path != "/home/user/dir/a.txt" || lf.Entries[0].Size != 10 || lf.Entries[1].Name != "b.bin" {
		t.Errorf("list_files: %+v", lf)
	}

	// set_timeout, get_metrics, list_sandboxes.
	mustOK(t, airlockmcp.Call(t, cs, "set_timeout", map[string]any{"sandbox_id": id, "timeout": 1200}))
	var metrics airlockmcp.GetMetricsOut
	deadline := time.Now().Add(30 * time.Second)
	for {
		res = airlockmcp.Call(t, cs, "get_metrics", map[string]any{"sandbox_id": id})
		mustOK(t, res)
		airlockmcp.Structured(t, res, &metrics)
		if len(metrics.Metrics) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(metrics.Metrics) == 0 || metrics.Metrics[len(metrics.Metrics)-1].MemTotalMB <= 0 {
		t.Errorf("get_metrics: %+v", metrics)
	}
	res = airlockmcp.Call(t, cs, "list_sandboxes", map[string]any{"metadata": map[string]string{"owner": "mcp test&x=1%"}})
	mustOK(t, res)
	var ls airlockmcp.ListSandboxesOut
	airlockmcp.Structured(t, res, &ls)
	if len(ls.Sandboxes) != 1 || ls.Sandboxes[0].SandboxID != id || ls.Sandboxes[0].MemoryTotalMB == nil {
		t.Errorf("list_sandboxes: %+v", ls)
	}
	if exp, err := time.Parse(time.RFC3339, ls.Sandboxes[0].Expires); err != nil || time.Until(exp) < 15*time.Minute {
		t.Errorf("set_timeout not applied: expires %s (%v)", ls.Sandboxes[0].Expires, err)
	}
	if !strings.Contains(airlockmcp.Text(res), id) || !strings.Contains(airlockmcp.Text(res), "MiB") {
		t.Errorf("list table:\n%s", airlockmcp.Text(res))
	}
	res = airlockmcp.Call(t, cs, "list_sandboxes", map[string]any{"metadata": map[string]string{"owner": "someone-else"}})
	airlockmcp.Structured(t, res, &ls)
	if len(ls.Sandboxes) != 0 {
		t.Errorf("metadata filter ignored: %+v", ls)
	}

	// kill_sandbox; the id is gone afterwards and tools say so.
	mustOK(t, airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id}))
	if res := airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "true"}); !res.IsError {
		t.Error("run_command in a killed sandbox succeeded")
	}
	if res := airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": "no-such-sandbox"}); !res.IsError || !strings.Contains(airlockmcp.Text(res), "no-such-sandbox") {
		t.Errorf("kill unknown: isError=%v %q", res.IsError, airlockmcp.Text(res))
	}
}

// TestHTTPBackendRunCode: run_code creates a code-interpreter-v1 sandbox, keeps
// state across calls, returns a plot as a decoded PNG, and reports exceptions.
func TestHTTPBackendRunCode(t *testing.T) {
	cs := realServer(t)
	res := airlockmcp.Call(t, cs, "run_code", map[string]any{"code": "x = 41\nprint('hello')\nx + 1"})
	mustOK(t, res)
	var out airlockmcp.RunCodeOut
	airlockmcp.Structured(t, res, &out)
	if !out.CreatedSandbox || out.SandboxID == "" || out.Stdout != "hello\n" || len(out.Results) != 1 || out.Results[0].Text != "42" {
		t.Fatalf("first run: %+v", out)
	}
	id := out.SandboxID
	defer airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id})

	res = airlockmcp.Call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "x * 2"})
	mustOK(t, res)
	airlockmcp.Structured(t, res, &out)
	if out.CreatedSandbox || len(out.Results) != 1 || out.Results[0].Text != "82" {
		t.Errorf("state not kept: %+v", out)
	}

	res = airlockmcp.Call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"})
	mustOK(t, res)
	var png []byte
	for _, c := range res.Content {
		if ic, ok := c.(*mcp.ImageContent); ok && ic.MIMEType == "image/png" {
			png = ic.Data
		}
	}
	if !bytes.HasPrefix(png, []byte("\x89PNG\r\n\x1a\n")) {
		t.Errorf("no decoded PNG in %d content items (first bytes %q)", len(res.Content), png[:min(len(png), 8)])
	}

	res = airlockmcp.Call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "1/0"})
	airlockmcp.Structured(t, res, &out)
	if !res.IsError || out.Error == nil || out.Error.Name != "ZeroDivisionError" {
		t.Errorf("exception: isError=%v %+v", res.IsError, out.Error)
	}

	res = airlockmcp.Call(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "javascript", "code": "[1,2,3].map(n => n * 2).join(',')"})
	mustOK(t, res)
	airlockmcp.Structured(t, res, &out)
	if len(out.Results) != 1 || !strings.Contains(out.Results[0].Text, "2,4,6") {
		t.Errorf("javascript: %+v", out)
	}

	// A timeout interrupts the code; the context survives.
	res = airlockmcp.Call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "import time\ntime.sleep(60)", "timeout": 2})
	if !res.IsError || !strings.Contains(airlockmcp.Text(res), "timed out") {
		t.Errorf("timeout: isError=%v %q", res.IsError, airlockmcp.Text(res))
	}
	res = airlockmcp.Call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "x"})
	mustOK(t, res)
	airlockmcp.Structured(t, res, &out)
	if len(out.Results) != 1 || out.Results[0].Text != "41" {
		t.Errorf("after timeout: %+v", out)
	}
}
