package mcp

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// fakeBackend records what the tools asked for and answers from canned values;
// it lets the tool layer (schemas, defaults, result shapes) be tested without
// sandboxes. HTTPBackend is tested against a real server in http_test.go.
type fakeBackend struct {
	mu      sync.Mutex
	created []CreateSandboxRequest
	runs    []RunCodeRequest
	cmds    []RunCommandRequest
	writes  map[string][]byte
	timeout time.Duration
	exec    Execution
	cmd     CommandResult
	files   map[string][]byte
	dirs    map[string]bool
	err     error // returned by every method when set
}

func (f *fakeBackend) CreateSandbox(_ context.Context, r CreateSandboxRequest) (SandboxInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return SandboxInfo{}, f.err
	}
	f.created = append(f.created, r)
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return SandboxInfo{SandboxID: "sb" + string(rune('0'+len(f.created))), Template: r.Template, State: "running",
		StartedAt: now, EndAt: now.Add(r.Timeout)}, nil
}

func (f *fakeBackend) KillSandbox(_ context.Context, id string) error { return f.err }

func (f *fakeBackend) ListSandboxes(_ context.Context, r ListSandboxesRequest) ([]SandboxInfo, error) {
	if f.err != nil {
		return nil, f.err
	}
	t := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return []SandboxInfo{
		{SandboxID: "short", Template: "base", State: "running", StartedAt: t, EndAt: t.Add(time.Minute),
			HasMetrics: true, CPUPct: 12.5, MemUsed: 64 << 20, MemTotal: 512 << 20},
		{SandboxID: "a-much-longer-id", Template: "code-interpreter-v1", State: "paused", StartedAt: t, EndAt: t.Add(time.Hour)},
	}, nil
}

func (f *fakeBackend) SetTimeout(_ context.Context, _ string, d time.Duration) error {
	f.timeout = d
	return f.err
}

func (f *fakeBackend) GetMetrics(context.Context, string) ([]Metric, error) {
	if f.err != nil {
		return nil, f.err
	}
	return []Metric{{Timestamp: time.Unix(1, 0), CPUCount: 2, CPUPct: 1}, {Timestamp: time.Unix(2, 0), CPUCount: 2, CPUPct: 50, MemUsed: 100 << 20, MemTotal: 1 << 30}}, nil
}

func (f *fakeBackend) RunCode(_ context.Context, r RunCodeRequest) (Execution, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.runs = append(f.runs, r)
	return f.exec, f.err
}

func (f *fakeBackend) RunCommand(_ context.Context, r RunCommandRequest) (CommandResult, error) {
	f.cmds = append(f.cmds, r)
	return f.cmd, f.err
}

func (f *fakeBackend) ReadFile(_ context.Context, _, path string, limit int) ([]byte, bool, error) {
	if f.err != nil {
		return nil, false, f.err
	}
	data, ok := f.files[path]
	switch {
	case !ok && f.dirs[path]:
		return nil, false, fmt.Errorf("path %q is a directory: %w", path, ErrIsDirectory)
	case !ok:
		return nil, false, fmt.Errorf("file %q not found: %w", path, ErrNotFound)
	case len(data) > limit:
		return data[:limit], true, nil
	}
	return data, false, nil
}

func (f *fakeBackend) WriteFile(_ context.Context, _, path string, data []byte) error {
	if f.writes == nil {
		f.writes = map[string][]byte{}
	}
	f.writes[path] = data
	return f.err
}

func (f *fakeBackend) ListFiles(_ context.Context, _, path string, depth int) ([]FileEntry, error) {
	if f.err != nil {
		return nil, f.err
	}
	return []FileEntry{{Name: "a.txt", Path: path + "/a.txt", Type: "file", Size: 3, Permissions: "-rw-r--r--"},
		{Name: "d", Path: path + "/d", Type: "dir", Permissions: "drwxr-xr-x"}}, nil
}

// connectClient serves NewServer(b) over in-memory transports and returns a client session.
func connectClient(t *testing.T, b Backend) *mcp.ClientSession {
	return connectClientWith(t, b, Options{})
}

func connectClientWith(t *testing.T, b Backend, opts Options) *mcp.ClientSession {
	t.Helper()
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := NewServer(b, opts).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any) *mcp.CallToolResult {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	return res
}

func text(res *mcp.CallToolResult) string {
	var b strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			b.WriteString(tc.Text)
		}
	}
	return b.String()
}

// structured decodes a result's structured content into v.
func structured(t *testing.T, res *mcp.CallToolResult, v any) {
	t.Helper()
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("structured content %s: %v", b, err)
	}
}

func TestToolSchemas(t *testing.T) {
	cs := connectClient(t, &fakeBackend{})
	lt, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	schemas := map[string]map[string]any{}
	for _, tool := range lt.Tools {
		if tool.Description == "" {
			t.Errorf("%s has no description", tool.Name)
		}
		b, _ := json.Marshal(tool.InputSchema)
		var s map[string]any
		if err := json.Unmarshal(b, &s); err != nil {
			t.Fatal(err)
		}
		schemas[tool.Name] = s
	}
	want := []string{"create_sandbox", "kill_sandbox", "list_sandboxes", "run_code", "run_command",
		"read_file", "write_file", "list_files", "set_timeout", "get_metrics"}
	for _, n := range want {
		if schemas[n] == nil {
			t.Errorf("tool %s missing", n)
		}
	}
	prop := func(tool, p string) map[string]any {
		props, _ := schemas[tool]["properties"].(map[string]any)
		m, _ := props[p].(map[string]any)
		if m == nil {
			t.Fatalf("%s has no property %s", tool, p)
		}
		return m
	}
	js := func(v any) string { b, _ := json.Marshal(v); return string(b) }
	checks := []struct{ tool, prop, key, want string }{
		{"create_sandbox", "template", "default", `"base"`},
		{"create_sandbox", "timeout", "default", `300`},
		{"create_sandbox", "timeout", "minimum", `1`},
		{"create_sandbox", "timeout", "maximum", `86400`},
		{"run_code", "language", "enum", `["python","javascript","typescript","bash","r","java"]`},
		{"run_code", "language", "default", `"python"`},
		{"run_code", "timeout", "maximum", `86400`},
		{"run_command", "timeout", "default", `300`},
		{"list_sandboxes", "state", "enum", `["running","paused"]`},
		{"write_file", "encoding", "enum", `["utf8","base64"]`},
		{"set_timeout", "timeout", "minimum", `1`},
		{"create_sandbox", "volume_mounts", "type", `"array"`},
	}
	for _, c := range checks {
		if got := js(prop(c.tool, c.prop)[c.key]); got != c.want {
			t.Errorf("%s.%s %s = %s, want %s", c.tool, c.prop, c.key, got, c.want)
		}
	}
	if _, ok := prop("create_sandbox", "template")["enum"]; ok {
		t.Error("template must not be an enum: user-built templates are valid too")
	}
	if req := js(schemas["run_command"]["required"]); !strings.Contains(req, "sandbox_id") || !strings.Contains(req, "command") {
		t.Errorf("run_command required = %s", req)
	}
}

func TestCreateSandboxDefaultsAndCustomTemplate(t *testing.T) {
	f := &fakeBackend{}
	cs := connectClient(t, f)
	res := call(t, cs, "create_sandbox", map[string]any{})
	if res.IsError {
		t.Fatal(text(res))
	}
	var out sandboxOut
	structured(t, res, &out)
	if out.SandboxID != "sb1" || out.Template != "base" || out.Status != "running" || out.Expires != "2026-01-02T03:09:05Z" {
		t.Errorf("out = %+v", out)
	}
	if f.created[0].Template != "base" || f.created[0].Timeout != 300*time.Second {
		t.Errorf("defaults not applied: %+v", f.created[0])
	}
	// A template built by the user is accepted, and the other fields pass through.
	res = call(t, cs, "create_sandbox", map[string]any{"template": "my-built-tpl", "timeout": 60,
		"metadata": map[string]string{"k": "v"}, "envs": map[string]string{"A": "1"}, "allow_internet": false})
	if res.IsError {
		t.Fatal(text(res))
	}
	got := f.created[1]
	if got.Template != "my-built-tpl" || got.Timeout != time.Minute || got.Metadata["k"] != "v" || got.Envs["A"] != "1" ||
		got.AllowInternet == nil || *got.AllowInternet {
		t.Errorf("request = %+v", got)
	}
}

func TestBoundsAndEnumsRejected(t *testing.T) {
	f := &fakeBackend{}
	cs := connectClient(t, f)
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"create_sandbox", map[string]any{"timeout": 0}},
		{"create_sandbox", map[string]any{"timeout": 86401}},
		{"run_code", map[string]any{"code": "1", "language": "ruby"}},
		{"list_sandboxes", map[string]any{"state": "killed"}},
		{"run_command", map[string]any{"command": "ls"}}, // sandbox_id is required
		{"list_files", map[string]any{"sandbox_id": "x", "depth": 11}},
	} {
		res := call(t, cs, c.tool, c.args)
		if !res.IsError {
			t.Errorf("%s %v: accepted, want an error result", c.tool, c.args)
		}
	}
	if len(f.created)+len(f.runs)+len(f.cmds) != 0 {
		t.Errorf("backend called for invalid arguments")
	}
}

func TestBackendErrorsAreToolErrors(t *testing.T) {
	f := &fakeBackend{err: errors.New("sandbox \"nope\" not found")}
	cs := connectClient(t, f)
	for name, args := range map[string]map[string]any{
		"create_sandbox": {},
		"kill_sandbox":   {"sandbox_id": "nope"},
		"list_sandboxes": {},
		"run_code":       {"code": "1", "sandbox_id": "nope"},
		"run_command":    {"sandbox_id": "nope", "command": "true"},
		"read_file":      {"sandbox_id": "nope", "path": "/a"},
		"write_file":     {"sandbox_id": "nope", "path": "/a", "content": "x"},
		"list_files":     {"sandbox_id": "nope"},
		"set_timeout":    {"sandbox_id": "nope", "timeout": 10},
		"get_metrics":    {"sandbox_id": "nope"},
	} {
		res := call(t, cs, name, args)
		if !res.IsError || !strings.Contains(text(res), "not found") {
			t.Errorf("%s: isError=%v text=%q", name, res.IsError, text(res))
		}
	}
}

func TestKillListTimeoutMetrics(t *testing.T) {
	f := &fakeBackend{}
	cs := connectClient(t, f)
	res := call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": "sb1"})
	var k killOut
	structured(t, res, &k)
	if res.IsError || !k.Killed || k.SandboxID != "sb1" {
		t.Errorf("kill: %+v %s", k, text(res))
	}

	res = call(t, cs, "list_sandboxes", map[string]any{"state": "running"})
	var l listSandboxesOut
	structured(t, res, &l)
	if len(l.Sandboxes) != 2 || l.Sandboxes[0].CPUPercent == nil || *l.Sandboxes[0].CPUPercent != 12.5 ||
		*l.Sandboxes[0].MemoryUsedMB != 64 || l.Sandboxes[1].CPUPercent != nil {
		t.Errorf("list structured = %+v", l)
	}
	lines := strings.Split(text(res), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "SANDBOX ID") {
		t.Fatalf("table:\n%s", text(res))
	}
	// Aligned: the TEMPLATE column starts at the same offset on every line.
	col := strings.Index(lines[0], "TEMPLATE")
	if strings.Index(lines[1], "base") != col || strings.Index(lines[2], "code-interpreter-v1") != col {
		t.Errorf("columns not aligned:\n%s", text(res))
	}
	if !strings.Contains(lines[1], "12.5%") || !strings.Contains(lines[1], "64/512 MiB") {
		t.Errorf("metrics missing from table row %q", lines[1])
	}

	res = call(t, cs, "set_timeout", map[string]any{"sandbox_id": "sb1", "timeout": 600})
	if res.IsError || f.timeout != 10*time.Minute {
		t.Errorf("set_timeout: %v %s", f.timeout, text(res))
	}
	res = call(t, cs, "get_metrics", map[string]any{"sandbox_id": "sb1"})
	var m getMetricsOut
	structured(t, res, &m)
	if len(m.Metrics) != 2 || m.Metrics[1].CPUPercent != 50 || m.Metrics[1].MemTotalMB != 1024 || !strings.Contains(text(res), "CPU 50.0%") {
		t.Errorf("metrics = %+v %s", m, text(res))
	}
}

func TestRunCode(t *testing.T) {
	png := []byte("\x89PNG\r\n\x1a\nfake image bytes")
	f := &fakeBackend{exec: Execution{
		Stdout:  []string{"hello\n"},
		Results: []Result{{Formats: map[string]string{"png": base64.StdEncoding.EncodeToString(png), "text": "<Figure>"}}, {IsMain: true, Formats: map[string]string{"text": "2"}}},
	}}
	cs := connectClient(t, f)

	// No sandbox id: one code-interpreter-v1 sandbox is created and named.
	res := call(t, cs, "run_code", map[string]any{"code": "print('hello'); 1+1"})
	if res.IsError {
		t.Fatal(text(res))
	}
	var out runCodeOut
	structured(t, res, &out)
	if len(f.created) != 1 || f.created[0].Template != "code-interpreter-v1" {
		t.Fatalf("created = %+v", f.created)
	}
	if !out.CreatedSandbox || out.SandboxID != "sb1" || !strings.Contains(text(res), "sb1") {
		t.Errorf("out = %+v text = %q", out, text(res))
	}
	if f.runs[0].SandboxID != "sb1" || f.runs[0].Language != "python" || f.runs[0].Timeout != 300*time.Second {
		t.Errorf("run request = %+v", f.runs[0])
	}
	if out.Stdout != "hello\n" || len(out.Results) != 2 || out.Results[1].Text != "2" || !out.Results[1].IsMain {
		t.Errorf("out = %+v", out)
	}
	var imgs []*mcp.ImageContent
	for _, c := range res.Content {
		if ic, ok := c.(*mcp.ImageContent); ok {
			imgs = append(imgs, ic)
		}
	}
	if len(imgs) != 1 || imgs[0].MIMEType != "image/png" || !bytes.Equal(imgs[0].Data, png) {
		t.Errorf("images = %+v, want the decoded PNG once", imgs)
	}

	// With a sandbox id: nothing is created; a context id replaces the language.
	res = call(t, cs, "run_code", map[string]any{"code": "x", "sandbox_id": "sb1", "context_id": "ctx", "timeout": 5})
	structured(t, res, &out)
	if len(f.created) != 1 || out.CreatedSandbox || f.runs[1].ContextID != "ctx" || f.runs[1].Language != "" || f.runs[1].Timeout != 5*time.Second {
		t.Errorf("second call: created=%d out=%+v req=%+v", len(f.created), out, f.runs[1])
	}

	// An exception in the code is an error result that still carries the output.
	f.exec = Execution{Error: &ExecutionError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: "tb"}}
	res = call(t, cs, "run_code", map[string]any{"code": "1/0", "sandbox_id": "sb1"})
	structured(t, res, &out)
	if !res.IsError || out.Error == nil || out.Error.Name != "ZeroDivisionError" || !strings.Contains(text(res), "division by zero") {
		t.Errorf("error run: isError=%v out=%+v text=%q", res.IsError, out, text(res))
	}
}

func TestRunCommand(t *testing.T) {
	f := &fakeBackend{cmd: CommandResult{PID: 7, Stdout: "out\n", Stderr: "err\n"}}
	cs := connectClient(t, f)
	res := call(t, cs, "run_command", map[string]any{"sandbox_id": "s", "command": "echo out", "cwd": "/tmp", "envs": map[string]string{"A": "b"}})
	var out runCommandOut
	structured(t, res, &out)
	if res.IsError || out.Stdout != "out\n" || out.Stderr != "err\n" || !strings.Contains(text(res), "exit code 0") {
		t.Errorf("out = %+v text=%q", out, text(res))
	}
	if r := f.cmds[0]; r.Cwd != "/tmp" || r.Envs["A"] != "b" || r.Timeout != 300*time.Second || r.Background {
		t.Errorf("request = %+v", r)
	}
	f.cmd = CommandResult{PID: 8, ExitCode: 3}
	if res := call(t, cs, "run_command", map[string]any{"sandbox_id": "s", "command": "exit 3"}); !res.IsError {
		t.Error("a non-zero exit must be an error result")
	}
	f.cmd = CommandResult{PID: 9}
	res = call(t, cs, "run_command", map[string]any{"sandbox_id": "s", "command": "sleep 100", "background": true})
	structured(t, res, &out)
	if res.IsError || out.PID != 9 || !out.Background || !f.cmds[2].Background || !strings.Contains(text(res), "pid 9") {
		t.Errorf("background: %+v %q", out, text(res))
	}
}

func TestFiles(t *testing.T) {
	f := &fakeBackend{files: map[string][]byte{"/t.txt": []byte("hi"), "/b.bin": {0xff, 0x00}}}
	cs := connectClient(t, f)
	res := call(t, cs, "read_file", map[string]any{"sandbox_id": "s", "path": "/t.txt"})
	var r readFileOut
	structured(t, res, &r)
	if res.IsError || r.Content != "hi" || r.Encoding != "utf8" || text(res) != "hi" {
		t.Errorf("read text: %+v", r)
	}
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": "s", "path": "/b.bin"})
	structured(t, res, &r)
	if r.Encoding != "base64" || r.Content != "/wA=" || r.Size != 2 {
		t.Errorf("read binary: %+v", r)
	}
	res = call(t, cs, "write_file", map[string]any{"sandbox_id": "s", "path": "/w", "content": "/wA=", "encoding": "base64"})
	if res.IsError || !bytes.Equal(f.writes["/w"], []byte{0xff, 0}) {
		t.Errorf("write base64: %q %s", f.writes["/w"], text(res))
	}
	call(t, cs, "write_file", map[string]any{"sandbox_id": "s", "path": "/u", "content": "text"})
	if string(f.writes["/u"]) != "text" {
		t.Errorf("write utf8 default: %q", f.writes["/u"])
	}
	if res := call(t, cs, "write_file", map[string]any{"sandbox_id": "s", "path": "/x", "content": "!!", "encoding": "base64"}); !res.IsError {
		t.Error("bad base64 accepted")
	}
	res = call(t, cs, "list_files", map[string]any{"sandbox_id": "s"})
	var l listFilesOut
	structured(t, res, &l)
	if res.IsError || len(l.Entries) != 2 || l.Entries[0].Path != "/home/user/a.txt" || !strings.Contains(text(res), "/home/user/d/") {
		t.Errorf("list: %+v %q", l, text(res))
	}
}

// notReadyBackend answers creates as a server whose template is still building,
// `left` times, then as the fake.
type notReadyBackend struct {
	*fakeBackend
	left int
}

func (b *notReadyBackend) CreateSandbox(ctx context.Context, r CreateSandboxRequest) (SandboxInfo, error) {
	b.mu.Lock()
	if b.left > 0 {
		b.left--
		n := b.left
		b.mu.Unlock()
		return SandboxInfo{}, &NotReadyError{Message: fmt.Sprintf("template %s is still being built: step 1/1 (%d left)", r.Template, n), RetryAfter: time.Millisecond}
	}
	b.mu.Unlock()
	return b.fakeBackend.CreateSandbox(ctx, r)
}

// TestToolsWaitForTemplateBuild: create_sandbox and run_code wait while the template
// builds, sending a progress notification with the server's message before each
// retry when the call has a progress token, and give up after maxTemplateWait.
func TestToolsWaitForTemplateBuild(t *testing.T) {
	b := &notReadyBackend{fakeBackend: &fakeBackend{exec: Execution{Stdout: []string{"ok\n"}}}, left: 2}
	cs, drain := progressClient(t, b, nil)

	params := &mcp.CallToolParams{Name: "create_sandbox", Arguments: map[string]any{"template": "python3"}}
	params.SetProgressToken("tok-1")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil || res.IsError {
		t.Fatalf("create: %v %s", err, text(res))
	}
	// The client hands notifications to its handler from a queue of its
	// own, which may still hold the last one when the result is back.
	var got []*mcp.ProgressNotificationParams
	testenv.Eventually(t, 5*time.Second, "4 progress notifications", func() bool {
		got = append(got, drain()...)
		return len(got) >= 4
	})
	// The phases around the wait, and one notification per retry.
	if len(got) != 4 {
		t.Fatalf("%d progress notifications, want 4: %+v", len(got), got)
	}
	if got[0].Message != "creating a sandbox from template python3" || got[3].Message != "sandbox sb1 is running" {
		t.Errorf("phases: %q, %q", got[0].Message, got[3].Message)
	}
	for i, p := range got[1:3] {
		want := fmt.Sprintf("template python3 is still being built: step 1/1 (%d left)", 1-i)
		if p.ProgressToken != "tok-1" || p.Message != want || p.Total != 600 {
			t.Errorf("progress %d: %+v, want message %q", i, p, want)
		}
	}
	for i := 1; i < len(got); i++ {
		if got[i].Progress <= got[i-1].Progress {
			t.Errorf("progress went from %v to %v: it must only grow", got[i-1].Progress, got[i].Progress)
		}
	}

	// Without a progress token it waits all the same, silently; run_code too.
	b.left = 1
	res = call(t, cs, "run_code", map[string]any{"code": "1"})
	if res.IsError || !strings.Contains(text(res), "ok") {
		t.Fatalf("run_code: %s", text(res))
	}

	// A build that outlasts the wait is an isError result naming the wait.
	defer func(d time.Duration) { maxTemplateWait = d }(maxTemplateWait)
	maxTemplateWait = 1500 * time.Millisecond
	b.left = 1000
	res = call(t, cs, "create_sandbox", map[string]any{"template": "node"})
	if !res.IsError || !strings.Contains(text(res), "gave up after waiting 2s") || !strings.Contains(text(res), "template node is still being built") {
		t.Fatalf("give up: %s", text(res))
	}
}
