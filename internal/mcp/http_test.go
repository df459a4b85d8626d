package mcp

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/server"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// The runtime re-executes the test binary as each sandbox's first process.
func init() { linux.MaybeInit() }

const testKey = "test-key"

// realServer assembles what `airlock serve` runs — store, linux runtime, manager
// over the built templates, the E2B API and the sandbox proxy — on httptest
// listeners, and returns an MCP client session over an HTTPBackend pointed at it.
func realServer(t *testing.T) *mcp.ClientSession {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.BaseRootfs(t)
	envd := testenv.EnvdBinary(t)
	tpls, err := template.Open(template.Options{DataDir: testenv.DataDir(), EnvdPath: envd})
	if err != nil {
		t.Fatal(err)
	}
	dataDir := t.TempDir()
	db, err := store.OpenSQLite(filepath.Join(dataDir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	rt, err := linux.New(filepath.Join(dataDir, "runtime"), nil)
	if err != nil {
		t.Fatal(err)
	}
	mgr := sandbox.New(sandbox.Options{
		Runtime: rt, Store: db, Templates: template.Resolver{Store: tpls}, DataDir: dataDir,
		EnvdPath: envd, MaxTimeout: time.Hour,
	})
	mgr.Start()
	t.Cleanup(func() {
		mgr.KillAll(context.Background())
		mgr.Close()
	})
	api := testenv.NewHTTPServer(t, e2b.NewHandler(mgr, e2b.Options{Authenticate: func(k string) bool { return k == testKey }}))
	t.Cleanup(api.Close)
	proxy := testenv.NewHTTPServer(t, server.NewProxy(mgr, nil))
	t.Cleanup(proxy.Close)
	return connectClient(t, NewHTTPBackend(HTTPConfig{APIURL: api.URL, SandboxURL: proxy.URL, APIKey: testKey}))
}

func mustOK(t *testing.T, res *mcp.CallToolResult) {
	t.Helper()
	if res.IsError {
		t.Fatalf("tool error: %s", text(res))
	}
}

// TestHTTPBackendRealServer drives every tool once against real sandboxes.
func TestHTTPBackendRealServer(t *testing.T) {
	cs := realServer(t)
	// create_sandbox, with metadata to find it by.
	res := call(t, cs, "create_sandbox", map[string]any{"template": "base", "metadata": map[string]string{"owner": "mcp-test"}, "envs": map[string]string{"GREETING": "hi"}})
	mustOK(t, res)
	var sb sandboxOut
	structured(t, res, &sb)
	if sb.SandboxID == "" || sb.Template != "base" || sb.Status != "running" || sb.Expires == "" {
		t.Fatalf("create: %+v", sb)
	}
	id := sb.SandboxID

	// run_command: output, env from create, cwd, exit code.
	res = call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo $GREETING $X; pwd; echo oops >&2", "cwd": "/tmp", "envs": map[string]string{"X": "there"}})
	mustOK(t, res)
	var cmd runCommandOut
	structured(t, res, &cmd)
	if cmd.Stdout != "hi there\n/tmp\n" || cmd.Stderr != "oops\n" || cmd.ExitCode != 0 || cmd.PID == 0 {
		t.Errorf("run_command: %+v", cmd)
	}
	if res := call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "exit 7"}); !res.IsError || !strings.Contains(text(res), "exit code 7") {
		t.Errorf("exit 7: isError=%v %q", res.IsError, text(res))
	}
	// A foreground command past its timeout is killed and reported.
	start := time.Now()
	if res := call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "echo started; sleep 60", "timeout": 1}); !res.IsError ||
		!strings.Contains(text(res), "timed out") || !strings.Contains(text(res), "started") {
		t.Errorf("timeout: isError=%v %q", res.IsError, text(res))
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Errorf("timeout took %s", d)
	}
	// background: returns a pid at once; the process keeps running.
	res = call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "sleep 30", "background": true})
	mustOK(t, res)
	structured(t, res, &cmd)
	if cmd.PID == 0 {
		t.Fatalf("background: %+v", cmd)
	}
	res = call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "ps -o comm= -p " + strconv.Itoa(int(cmd.PID))})
	mustOK(t, res)
	structured(t, res, &cmd)
	if strings.TrimSpace(cmd.Stdout) != "sleep" {
		t.Errorf("background process not running: %+v", cmd)
	}

	// write_file, read_file (text and binary), list_files.
	mustOK(t, call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/home/user/dir/a.txt", "content": "hello file"}))
	mustOK(t, call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "dir/b.bin", "content": "/wCA", "encoding": "base64"}))
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/home/user/dir/a.txt"})
	mustOK(t, res)
	var rf readFileOut
	structured(t, res, &rf)
	if rf.Content != "hello file" || rf.Encoding != "utf8" {
		t.Errorf("read text: %+v", rf)
	}
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/home/user/dir/b.bin"})
	structured(t, res, &rf)
	if rf.Content != "/wCA" || rf.Encoding != "base64" {
		t.Errorf("read binary: %+v", rf)
	}
	if res := call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "/nope"}); !res.IsError {
		t.Error("reading a missing file is not an error")
	}
	res = call(t, cs, "list_files", map[string]any{"sandbox_id": id, "path": "/home/user/dir"})
	mustOK(t, res)
	var lf listFilesOut
	structured(t, res, &lf)
	if len(lf.Entries) != 2 || lf.Entries[0].Path != "/home/user/dir/a.txt" || lf.Entries[0].Size != 10 || lf.Entries[1].Name != "b.bin" {
		t.Errorf("list_files: %+v", lf)
	}

	// set_timeout, get_metrics, list_sandboxes.
	mustOK(t, call(t, cs, "set_timeout", map[string]any{"sandbox_id": id, "timeout": 1200}))
	var metrics getMetricsOut
	deadline := time.Now().Add(30 * time.Second)
	for {
		res = call(t, cs, "get_metrics", map[string]any{"sandbox_id": id})
		mustOK(t, res)
		structured(t, res, &metrics)
		if len(metrics.Metrics) > 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	if len(metrics.Metrics) == 0 || metrics.Metrics[len(metrics.Metrics)-1].MemTotalMB <= 0 {
		t.Errorf("get_metrics: %+v", metrics)
	}
	res = call(t, cs, "list_sandboxes", map[string]any{"metadata": map[string]string{"owner": "mcp-test"}})
	mustOK(t, res)
	var ls listSandboxesOut
	structured(t, res, &ls)
	if len(ls.Sandboxes) != 1 || ls.Sandboxes[0].SandboxID != id || ls.Sandboxes[0].MemoryTotalMB == nil {
		t.Errorf("list_sandboxes: %+v", ls)
	}
	if exp, err := time.Parse(time.RFC3339, ls.Sandboxes[0].Expires); err != nil || time.Until(exp) < 15*time.Minute {
		t.Errorf("set_timeout not applied: expires %s (%v)", ls.Sandboxes[0].Expires, err)
	}
	if !strings.Contains(text(res), id) || !strings.Contains(text(res), "MiB") {
		t.Errorf("list table:\n%s", text(res))
	}
	res = call(t, cs, "list_sandboxes", map[string]any{"metadata": map[string]string{"owner": "someone-else"}})
	structured(t, res, &ls)
	if len(ls.Sandboxes) != 0 {
		t.Errorf("metadata filter ignored: %+v", ls)
	}

	// kill_sandbox; the id is gone afterwards and tools say so.
	mustOK(t, call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id}))
	if res := call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "true"}); !res.IsError {
		t.Error("run_command in a killed sandbox succeeded")
	}
	if res := call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": "no-such-sandbox"}); !res.IsError || !strings.Contains(text(res), "no-such-sandbox") {
		t.Errorf("kill unknown: isError=%v %q", res.IsError, text(res))
	}
}

// TestHTTPBackendRunCode: run_code creates a code-interpreter-v1 sandbox, keeps
// state across calls, returns a plot as a decoded PNG, and reports exceptions.
func TestHTTPBackendRunCode(t *testing.T) {
	cs := realServer(t)
	res := call(t, cs, "run_code", map[string]any{"code": "x = 41\nprint('hello')\nx + 1"})
	mustOK(t, res)
	var out runCodeOut
	structured(t, res, &out)
	if !out.CreatedSandbox || out.SandboxID == "" || out.Stdout != "hello\n" || len(out.Results) != 1 || out.Results[0].Text != "42" {
		t.Fatalf("first run: %+v", out)
	}
	id := out.SandboxID
	defer call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id})

	res = call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "x * 2"})
	mustOK(t, res)
	structured(t, res, &out)
	if out.CreatedSandbox || len(out.Results) != 1 || out.Results[0].Text != "82" {
		t.Errorf("state not kept: %+v", out)
	}

	res = call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()"})
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

	res = call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "1/0"})
	structured(t, res, &out)
	if !res.IsError || out.Error == nil || out.Error.Name != "ZeroDivisionError" {
		t.Errorf("exception: isError=%v %+v", res.IsError, out.Error)
	}

	res = call(t, cs, "run_code", map[string]any{"sandbox_id": id, "language": "javascript", "code": "[1,2,3].map(n => n * 2).join(',')"})
	mustOK(t, res)
	structured(t, res, &out)
	if len(out.Results) != 1 || !strings.Contains(out.Results[0].Text, "2,4,6") {
		t.Errorf("javascript: %+v", out)
	}

	// A timeout interrupts the code; the context survives.
	res = call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "import time\ntime.sleep(60)", "timeout": 2})
	if !res.IsError || !strings.Contains(text(res), "timed out") {
		t.Errorf("timeout: isError=%v %q", res.IsError, text(res))
	}
	res = call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "x"})
	mustOK(t, res)
	structured(t, res, &out)
	if len(out.Results) != 1 || out.Results[0].Text != "41" {
		t.Errorf("after timeout: %+v", out)
	}
}
