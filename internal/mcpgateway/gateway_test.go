package mcpgateway

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const testToken = "s3cret-token"

// syncBuffer is a log sink the tests read while the gateway writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// startGateway starts a gateway in this process for config, served by an
// httptest server, and returns its URL and log.
func startTestGateway(t *testing.T, e *testEnv, config string) (*Gateway, string, *syncBuffer) {
	t.Helper()
	specs, err := parseConfig([]byte(config), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	logs := &syncBuffer{}
	g := NewGateway(specs, e.opts, slog.New(slog.NewTextHandler(logs, nil)))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatalf("Start: %v\nlog:\n%s", err, logs)
	}
	srv := httptest.NewServer(g.Handler(testToken))
	t.Cleanup(func() {
		srv.Close()
		g.Close()
	})
	return g, srv.URL, logs
}

// bearer adds the token to every request of a client.
type bearer struct {
	token string
	base  http.RoundTripper
}

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.token)
	return b.base.RoundTrip(r)
}

// connect connects the go-sdk's client to the gateway; version "" lets it
// negotiate the newest protocol.
func connect(t *testing.T, url, version string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	return connectWith(t, url, testToken, version, opts)
}

func connectWith(t *testing.T, url, token, version string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "test-client", Version: "1"}, opts)
	tr := &mcp.StreamableClientTransport{Endpoint: url + "/mcp", HTTPClient: &http.Client{Transport: bearer{token, http.DefaultTransport}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var so *mcp.ClientSessionOptions
	if version != "" {
		so = &mcp.ClientSessionOptions{ProtocolVersion: version}
	}
	cs, err := c.Connect(ctx, tr, so)
	if err != nil {
		t.Fatalf("connect (%s): %v", version, err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs
}

func callText(t *testing.T, cs *mcp.ClientSession, name string, args any) (*mcp.CallToolResult, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	var texts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			texts = append(texts, tc.Text)
		}
	}
	return res, strings.Join(texts, "\n")
}

func TestAggregation(t *testing.T) {
	e := newTestEnv(t)
	e.shipRepo(t, "acme", "tools")
	_, url, logs := startTestGateway(t, e, `{
		"everything": {},
		"memory": {},
		"github/acme/tools": {"runCmd": "`+strings.ReplaceAll(e.runCmd("gamma"), `"`, `\"`)+`", "envs": {"CUSTOM_VAR": "custom value"}}
	}`)
	var progressMu sync.Mutex
	var progress []string
	cs := connect(t, url, "", &mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
		progressMu.Lock()
		progress = append(progress, req.Params.Message)
		progressMu.Unlock()
	}})
	if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
		t.Errorf("the go-sdk client negotiated %q, want 2026-07-28", v)
	}
	ctx := context.Background()

	// Tools: every server's, prefixed, with what describes them kept.
	tools := map[string]*mcp.Tool{}
	for tool, err := range cs.Tools(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		tools[tool.Name] = tool
	}
	for _, p := range []string{"everything", "memory", "tools"} {
		for _, n := range []string{"echo", "add", "fail", "big", "crash", "gen0"} {
			if tools[p+"_"+n] == nil {
				t.Errorf("tool %s_%s missing", p, n)
			}
		}
	}
	if len(tools) != 3*11 {
		t.Errorf("%d tools, want 33: %v", len(tools), slices.Sorted(mapsKeys(tools)))
	}
	echo := tools["memory_echo"]
	if echo.Description != "echoes its text (beta)" || echo.Title != "Echo" || echo.Annotations == nil || !echo.Annotations.ReadOnlyHint || !echo.Annotations.IdempotentHint {
		t.Errorf("memory_echo lost its description, title or annotations: %+v %+v", echo, echo.Annotations)
	}
	if s, _ := json.Marshal(echo.InputSchema); !strings.Contains(string(s), `"text":{"description":"the text to echo","type":"string"}`) || !strings.Contains(string(s), `"required":["text"]`) {
		t.Errorf("memory_echo input schema = %s", s)
	}
	if s, _ := json.Marshal(tools["everything_add"].OutputSchema); !strings.Contains(string(s), `"sum"`) {
		t.Errorf("everything_add output schema = %s", s)
	}

	// Calls go to the server of the prefix.
	if _, txt := callText(t, cs, "everything_echo", map[string]any{"text": "hi"}); txt != "alpha: hi" {
		t.Errorf("everything_echo = %q", txt)
	}
	if _, txt := callText(t, cs, "memory_echo", map[string]any{"text": "hi"}); txt != "beta: hi" {
		t.Errorf("memory_echo = %q", txt)
	}
	if _, txt := callText(t, cs, "tools_echo", map[string]any{"text": "hi"}); txt != "gamma: hi" {
		t.Errorf("tools_echo = %q", txt)
	}
	res, _ := callText(t, cs, "everything_add", map[string]any{"a": 2, "b": 3})
	if b, _ := json.Marshal(res.StructuredContent); string(b) != `{"sum":5}` || res.IsError {
		t.Errorf("everything_add structured content = %s (isError %v)", b, res.IsError)
	}
	res, txt := callText(t, cs, "memory_fail", map[string]any{})
	if !res.IsError || !strings.Contains(txt, "this tool always fails") {
		t.Errorf("memory_fail = %v %q, want the server's isError result", res.IsError, txt)
	}
	// A JSON-RPC error of the server stays one, code and message.
	_, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "memory_rpcerror", Arguments: map[string]any{}})
	var werr *jsonrpc.Error
	if !errors.As(err, &werr) || werr.Code != jsonrpc.CodeInvalidParams || werr.Message != "rpcerror: bad params from beta" {
		t.Errorf("a server's JSON-RPC error came back as %#v", err)
	}
	// An unknown tool is the gateway's protocol error.
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "memory_nope"}); err == nil || !strings.Contains(err.Error(), "unknown tool") {
		t.Errorf("unknown tool: %v", err)
	}
	// Custom servers run in their clone, with their envs; the gateway's
	// token is not passed on.
	if _, txt := callText(t, cs, "tools_env", map[string]any{"name": "CUSTOM_VAR"}); txt != "custom value" {
		t.Errorf("CUSTOM_VAR = %q", txt)
	}
	if _, txt := callText(t, cs, "tools_args", map[string]any{}); !strings.HasSuffix(txt, "|"+filepath.Join(e.opts.GitHubDir, "acme", "tools")) {
		t.Errorf("custom server's directory: %q", txt)
	}
	if _, txt := callText(t, cs, "everything_args", map[string]any{}); !strings.HasPrefix(txt, "stdio|") {
		t.Errorf("everything's arguments: %q", txt)
	}
	if _, txt := callText(t, cs, "memory_env", map[string]any{"name": "MEMORY_FILE_PATH"}); txt != filepath.Join(e.opts.StateDir, "memory.json") {
		t.Errorf("MEMORY_FILE_PATH = %q", txt)
	}

	// Progress notifications of a downstream call reach the caller.
	params := &mcp.CallToolParams{Name: "everything_progress", Arguments: map[string]any{}}
	params.SetProgressToken("client-token")
	if _, err := cs.CallTool(ctx, params); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("log:\n%s", logs)
		}
	})
	testenv.Eventually(t, 15*time.Second, "progress notifications", func() bool {
		progressMu.Lock()
		defer progressMu.Unlock()
		return slices.Equal(progress, []string{"step 1", "step 2", "step 3"})
	})

	// Prompts, by prefixed name.
	var prompts []string
	for p, err := range cs.Prompts(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		prompts = append(prompts, p.Name)
	}
	if want := []string{"everything_greet", "memory_greet", "tools_greet"}; !slices.Equal(prompts, want) {
		t.Errorf("prompts = %v, want %v", prompts, want)
	}
	pr, err := cs.GetPrompt(ctx, &mcp.GetPromptParams{Name: "memory_greet", Arguments: map[string]string{"name": "Pat"}})
	if err != nil || pr.Messages[0].Content.(*mcp.TextContent).Text != "beta says hi to Pat" {
		t.Errorf("memory_greet = %v, %v", pr, err)
	}

	// Resources keep their URIs; reads go to the server that listed them,
	// or whose template matches.
	var uris []string
	for r, err := range cs.Resources(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		uris = append(uris, r.URI)
	}
	if want := []string{"test://alpha/readme", "test://beta/readme", "test://gamma/readme"}; !slices.Equal(uris, want) {
		t.Errorf("resources = %v, want %v", uris, want)
	}
	var templates []string
	for r, err := range cs.ResourceTemplates(ctx, nil) {
		if err != nil {
			t.Fatal(err)
		}
		templates = append(templates, r.URITemplate)
	}
	if len(templates) != 3 {
		t.Errorf("resource templates = %v", templates)
	}
	for uri, want := range map[string]string{
		"test://beta/readme":    "readme of beta",
		"test://gamma/items/42": "gamma item 42",
		"test://alpha/items/7":  "alpha item 7",
	} {
		rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil || rr.Contents[0].Text != want {
			t.Errorf("read %s = %v, %v; want %q", uri, rr, err, want)
		}
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://beta/items/missing"}); err == nil || !strings.Contains(err.Error(), "Resource not found") {
		t.Errorf("a resource the server does not have: %v", err)
	}
	if _, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "test://nobody/x"}); err == nil {
		t.Error("a URI no server listed was read")
	}
}

func mapsKeys[V any](m map[string]V) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// post sends one JSON-RPC message over plain HTTP and returns the status
// and the JSON-RPC response (from a JSON or an SSE body).
func post(t *testing.T, url, token string, header map[string]string, body string) (int, map[string]any, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+"/mcp", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for k, v := range header {
		if k == "Host" {
			req.Host = v
			continue
		}
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var msg map[string]any
	text := string(raw)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(bytes.NewReader(raw))
		for sc.Scan() {
			if data, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var m map[string]any
				if json.Unmarshal([]byte(data), &m) == nil && m["id"] != nil {
					msg = m
				}
			}
		}
	} else {
		_ = json.Unmarshal(raw, &msg)
	}
	return resp.StatusCode, msg, text
}

func TestProtocolEras(t *testing.T) {
	e := newTestEnv(t)
	_, url, _ := startTestGateway(t, e, `{"memory": {}}`)

	// The go-sdk client pinned to older versions negotiates them through
	// initialize, against the same stateless handler.
	for _, v := range []string{"2025-11-25", "2025-06-18", "2025-03-26"} {
		cs := connect(t, url, v, nil)
		if got := cs.InitializeResult().ProtocolVersion; got != v {
			t.Errorf("pinned %s, negotiated %s", v, got)
		}
		if _, txt := callText(t, cs, "memory_echo", map[string]any{"text": v}); txt != "beta: "+v {
			t.Errorf("%s: memory_echo = %q", v, txt)
		}
	}

	// A raw initialize at 2025-06-18, as an older client sends it, then
	// tools/list and tools/call with the version header and no session.
	status, msg, raw := post(t, url, testToken, nil, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`)
	result, _ := msg["result"].(map[string]any)
	if status != 200 || result["protocolVersion"] != "2025-06-18" {
		t.Fatalf("initialize: %d %s", status, raw)
	}
	if info, _ := result["serverInfo"].(map[string]any); info["name"] != "airlock-mcp-gateway" {
		t.Errorf("serverInfo = %v", result["serverInfo"])
	}
	h := map[string]string{"Mcp-Protocol-Version": "2025-06-18"}
	post(t, url, testToken, h, `{"jsonrpc":"2.0","method":"notifications/initialized"}`)
	status, msg, raw = post(t, url, testToken, h, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`)
	if status != 200 || !strings.Contains(raw, `"memory_echo"`) {
		t.Fatalf("tools/list: %d %s", status, raw)
	}
	status, msg, raw = post(t, url, testToken, h, `{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"memory_echo","arguments":{"text":"raw"}}}`)
	if status != 200 || !strings.Contains(raw, `beta: raw`) {
		t.Fatalf("tools/call: %d %s", status, raw)
	}
	_ = msg

	// 2026-07-28 discovery over plain HTTP.
	status, _, raw = post(t, url, testToken, map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"},
		`{"jsonrpc":"2.0","id":4,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}}}`)
	if status != 200 || !strings.Contains(raw, `"supportedVersions":["2026-07-28","2025-11-25","2025-06-18","2025-03-26"`) {
		t.Errorf("server/discover: %d %s", status, raw)
	}
}

func TestBearerAuthAndHealth(t *testing.T) {
	e := newTestEnv(t)
	_, url, _ := startTestGateway(t, e, `{"memory": {}}`)
	init := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}`

	status, _, raw := post(t, url, "", nil, init)
	if status != 401 || !strings.Contains(raw, "missing bearer token") {
		t.Errorf("without a token: %d %s", status, raw)
	}
	status, _, raw = post(t, url, "wrong", nil, init)
	if status != 401 || !strings.Contains(raw, "invalid bearer token") {
		t.Errorf("with a wrong token: %d %s", status, raw)
	}
	status, _, raw = post(t, url, testToken+"x", nil, init)
	if status != 401 {
		t.Errorf("with a longer token: %d %s", status, raw)
	}
	// Through the sandbox proxy the Host is the sandbox's public name.
	status, _, raw = post(t, url, testToken, map[string]string{"Host": "50005-sbx.airlock.example.com"}, init)
	if status != 200 {
		t.Errorf("with a foreign Host: %d %s", status, raw)
	}
	// Only the right token, and every client of the SDK sees a 401 as an
	// error it can show.
	c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "1"}, nil)
	if _, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: url + "/mcp"}, nil); err == nil {
		t.Error("the go-sdk client connected without a token")
	}

	resp, err := http.Get(url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var h Health
	if err := json.NewDecoder(resp.Body).Decode(&h); err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %d %v", resp.StatusCode, err)
	}
	if h.Status != "ok" || len(h.Servers) != 1 || h.Servers[0].Name != "memory" || h.Servers[0].State != "ready" || h.Servers[0].Tools != 11 || h.Servers[0].Prompts != 1 || h.Servers[0].Resources != 2 {
		t.Errorf("health = %+v", h)
	}
}

func TestCrashAndRestart(t *testing.T) {
	old := restartMin
	restartMin = 400 * time.Millisecond // long enough to call it while it is down
	t.Cleanup(func() { restartMin = old })
	e := newTestEnv(t)
	counter := filepath.Join(e.dir, "generation")
	e.shipRepo(t, "acme", "crashy")
	g, url, logs := startTestGateway(t, e, `{
		"memory": {},
		"github/acme/crashy": {"runCmd": "`+strings.ReplaceAll(e.runCmd("alpha"), `"`, `\"`)+`", "envs": {"MCPGW_TEST_COUNTER": "`+counter+`"}}
	}`)
	cs := connect(t, url, "", nil)
	_, pid1 := callText(t, cs, "crashy_pid", map[string]any{})
	if _, txt := callText(t, cs, "crashy_gen1", map[string]any{}); txt != "1" {
		t.Fatalf("crashy_gen1 = %q", txt)
	}

	res, txt := callText(t, cs, "crashy_crash", map[string]any{})
	if !res.IsError || !strings.Contains(txt, `MCP server "github/acme/crashy" failed during the call`) {
		t.Errorf("the call that crashed it: isError %v %q", res.IsError, txt)
	}
	// While it is down, its tools answer isError saying why.
	res, txt = callText(t, cs, "crashy_echo", map[string]any{"text": "x"})
	if !res.IsError || !strings.Contains(txt, `MCP server "github/acme/crashy" is restarting (exited: exit status 3)`) {
		t.Errorf("while down: isError %v %q", res.IsError, txt)
	}
	// The other server is not affected.
	if _, txt := callText(t, cs, "memory_echo", map[string]any{"text": "x"}); txt != "beta: x" {
		t.Errorf("memory_echo = %q", txt)
	}
	// It comes back, a new process, with its tool list refreshed.
	testenv.Eventually(t, 15*time.Second, "the restart", func() bool {
		res, _ := callText(t, cs, "crashy_echo", map[string]any{"text": "x"})
		return !res.IsError
	})
	if _, pid2 := callText(t, cs, "crashy_pid", map[string]any{}); pid2 == pid1 {
		t.Errorf("same pid %s after the restart", pid2)
	}
	var names []string
	for tool, err := range cs.Tools(context.Background(), nil) {
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(tool.Name, "crashy_gen") {
			names = append(names, tool.Name)
		}
	}
	if !slices.Equal(names, []string{"crashy_gen2"}) {
		t.Errorf("generation tools after the restart = %v, want [crashy_gen2]", names)
	}
	h := g.Health()
	if h.Servers[0].Name != "github/acme/crashy" || h.Servers[0].Restarts != 1 || h.Servers[0].State != "ready" {
		t.Errorf("health = %+v", h.Servers)
	}
	log := logs.String()
	for _, want := range []string{
		`msg=stderr server=github/acme/crashy line="crashing on purpose"`,
		`msg="server exited; restarting" server=github/acme/crashy`,
		`status="exit status 3"`,
		`msg="server restarted" server=github/acme/crashy`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %s:\n%s", want, log)
		}
	}
}

func TestTruncation(t *testing.T) {
	e := newTestEnv(t)
	e.opts.MaxResultBytes = 1000
	_, url, _ := startTestGateway(t, e, `{"memory": {}}`)
	cs := connect(t, url, "", nil)
	res, _ := callText(t, cs, "memory_big", map[string]any{"n": 5000})
	if len(res.Content) != 2 {
		t.Fatalf("content = %d blocks", len(res.Content))
	}
	if got := res.Content[0].(*mcp.TextContent).Text; got != strings.Repeat("x", 1000) {
		t.Errorf("kept %d bytes, want 1000", len(got))
	}
	note := res.Content[1].(*mcp.TextContent).Text
	if want := "[mcp-gateway: this tool result was cut: 4004 of its 5004 bytes of content were omitted; the gateway passes at most 1000 bytes of content per tool result]"; note != want {
		t.Errorf("note = %q\nwant  %q", note, want)
	}
	// Within the bound, nothing changes.
	res, txt := callText(t, cs, "memory_big", map[string]any{"n": 990})
	if len(res.Content) != 2 || txt != strings.Repeat("x", 990)+"\ntail" {
		t.Errorf("a result within the bound changed: %d blocks", len(res.Content))
	}
}

func TestTruncateResult(t *testing.T) {
	res := &mcp.CallToolResult{Content: []mcp.Content{
		&mcp.TextContent{Text: "héllo"}, // 6 bytes; a cut at 2 must not split é
		&mcp.ImageContent{Data: make([]byte, 10), MIMEType: "image/png"},
	}, StructuredContent: map[string]any{"k": strings.Repeat("v", 50)}}
	out := truncateResult(res, 2)
	if got := out.Content[0].(*mcp.TextContent).Text; got != "h" {
		t.Errorf("cut text = %q", got)
	}
	if len(out.Content) != 2 || out.StructuredContent != nil {
		t.Fatalf("out = %+v", out)
	}
	note := out.Content[1].(*mcp.TextContent).Text
	// 2 bytes cannot hold even {"k":""}: the structured content goes.
	if !strings.Contains(note, "15 of its 16 bytes of content were omitted") || !strings.Contains(note, "its structured content (58 bytes of JSON) was dropped") {
		t.Errorf("note = %q", note)
	}
	if len(res.Content) != 2 || res.Content[0].(*mcp.TextContent).Text != "héllo" {
		t.Error("the original result was changed")
	}
	if truncateResult(res, 100) != res {
		t.Error("a result within the bound was copied")
	}

	// Structured content keeps its shape: its longest strings are cut, so
	// it still matches the tool's output schema.
	res = &mcp.CallToolResult{StructuredContent: map[string]any{
		"content": strings.Repeat("é", 500), "name": "short", "list": []any{"a", strings.Repeat("b", 300), 3.0},
	}}
	out = truncateResult(res, 400)
	b, _ := json.Marshal(out.StructuredContent)
	if len(b) > 400 {
		t.Errorf("structured content is %d bytes: %s", len(b), b)
	}
	m := out.StructuredContent.(map[string]any)
	if m["name"] != "short" || !strings.HasSuffix(m["content"].(string), cutMark) || len(m["list"].([]any)) != 3 || !utf8.ValidString(m["content"].(string)) {
		t.Errorf("structured content = %s", b)
	}
	if note := out.Content[0].(*mcp.TextContent).Text; !strings.Contains(note, "its structured content's strings were cut by") {
		t.Errorf("note = %q", note)
	}
}

// TestStartFailure: a server that fails to start fails the gateway's start
// with its exit status and stderr, and nothing of the others is left.
func TestStartFailure(t *testing.T) {
	e := newTestEnv(t)
	e.shipRepo(t, "acme", "broken")
	for _, tc := range []struct {
		name, config string
		want         []string
	}{
		{"exits", `{"memory": {}, "github/acme/broken": {"runCmd": "` + strings.ReplaceAll(e.runCmd("failstart"), `"`, `\"`) + `"}}`,
			[]string{`MCP server "github/acme/broken" exited before it answered initialize: exit status 7; its stderr ended with:`, "boom: no API key configured"}},
		{"not a server", `{"github/acme/broken": {"runCmd": "echo not json; echo oops >&2; sleep 30"}}`,
			[]string{`MCP server "github/acme/broken" `, "oops"}},
		{"hangs", `{"github/acme/broken": {"runCmd": "` + strings.ReplaceAll(e.runCmd("hang"), `"`, `\"`) + `"}}`,
			[]string{`MCP server "github/acme/broken" did not answer initialize within 1s; its stderr was empty`}},
		{"no such command", `{"github/acme/broken": {"runCmd": "/nonexistent/server"}}`,
			[]string{`MCP server "github/acme/broken" exited before it answered initialize: exit status 127; its stderr ended with:`, "/nonexistent/server: not found"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := *e.opts
			o.InitTimeout = time.Second
			specs, err := parseConfig([]byte(tc.config), &o)
			if err != nil {
				t.Fatal(err)
			}
			g := NewGateway(specs, &o, slog.New(slog.NewTextHandler(io.Discard, nil)))
			start := time.Now()
			err = g.Start(context.Background())
			if err == nil {
				g.Close()
				t.Fatal("Start succeeded")
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
			if d := time.Since(start); d > 8*time.Second {
				t.Errorf("failing took %s", d)
			}
			for _, u := range g.ups {
				select {
				case <-u.done:
				default:
					t.Errorf("%s still supervised after a failed start", u.spec.Key)
				}
			}
		})
	}
}
