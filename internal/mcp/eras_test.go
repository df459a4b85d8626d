package mcp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"github.com/airlock-sandbox/airlock/internal/apikey"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testenv"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

const testKey = "e2b_test_key"

// bearer sets the API key on every request, as a configured MCP client does.
type bearer struct{ key string }

func (b bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+b.key)
	return http.DefaultTransport.RoundTrip(r)
}

// httpServer serves /mcp over a fake backend, as serve mounts it.
func httpServer(t *testing.T, b Backend) string {
	t.Helper()
	h := newStreamableHandler(func(string) Backend { return b }, func(k string) (apikey.Principal, error) {
		if k != testKey {
			return apikey.Principal{}, apikey.ErrNotFound
		}
		return apikey.Principal{Scopes: apikey.All}, nil
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv.URL
}

// rawPost sends one JSON-RPC body and returns the status, headers and the
// JSON answer (the first SSE data line when the answer is an event stream).
func rawPost(t *testing.T, url string, body string, header map[string]string) (int, http.Header, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+testKey)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && strings.Contains(d, `"id"`) {
				data = []byte(d)
				break
			}
		}
	}
	var out map[string]any
	if len(bytes.TrimSpace(data)) > 0 && json.Unmarshal(data, &out) != nil {
		out = map[string]any{"raw": string(data)}
	}
	return resp.StatusCode, resp.Header, out
}

// TestHTTPEras: /mcp serves both eras on one endpoint. A go-sdk client
// negotiates 2026-07-28 and works without a session (stateless, progress
// included); a client of 2025-06-18 initializes and gets a session; a
// request at a version the server does not speak gets a JSON-RPC error
// listing the ones it does; the bearer key is required either way.
func TestHTTPEras(t *testing.T) {
	defer func(d time.Duration) { progressEvery = d }(progressEvery)
	progressEvery = 0
	f := &outputBackend{fakeBackend: &fakeBackend{exec: Execution{Stdout: []string{"one\n", "two\n"}}, files: map[string][]byte{"/etc/hostname": []byte("sbx\n")}}}
	url := httpServer(t, f) + "/mcp"
	ctx := context.Background()

	t.Run("go-sdk client, 2026-07-28, stateless", func(t *testing.T) {
		var mu sync.Mutex
		var progress []string
		c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, &mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
				mu.Lock()
				progress = append(progress, r.Params.Message)
				mu.Unlock()
			},
		})
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{testKey}}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		if v := cs.InitializeResult().ProtocolVersion; v != "2026-07-28" {
			t.Errorf("negotiated %s", v)
		}
		if cs.ID() != "" {
			t.Errorf("a stateless client has session id %q", cs.ID())
		}
		params := &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"code": "x", "sandbox_id": "sb1"}}
		params.SetProgressToken("p1")
		res, err := cs.CallTool(ctx, params)
		if err != nil || res.IsError || !strings.Contains(text(res), "one\ntwo") {
			t.Fatalf("run_code: %v %s", err, text(res))
		}
		// The client runs its notification handler apart from the call.
		var got []string
		testenv.Eventually(t, 5*time.Second, "progress of both lines", func() bool {
			mu.Lock()
			got = slices.Clone(progress)
			mu.Unlock()
			return slices.Contains(got, "stdout: one") && slices.Contains(got, "stdout: two")
		})
		if !slices.Contains(got, "stdout: one") || !slices.Contains(got, "stdout: two") {
			t.Errorf("progress over stateless HTTP: %q", got)
		}
		rr, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "sandbox://sb1/etc/hostname"})
		if err != nil || rr.Contents[0].Text != "sbx\n" {
			t.Errorf("resources/read: %v %+v", err, rr)
		}
	})

	t.Run("go-sdk client, 2025-06-18, session", func(t *testing.T) {
		c := mcp.NewClient(&mcp.Implementation{Name: "t", Version: "0"}, nil)
		cs, err := c.Connect(ctx, &mcp.StreamableClientTransport{Endpoint: url, HTTPClient: &http.Client{Transport: bearer{testKey}}},
			&mcp.ClientSessionOptions{ProtocolVersion: "2025-06-18"})
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		if v := cs.InitializeResult().ProtocolVersion; v != "2025-06-18" || cs.ID() == "" {
			t.Errorf("negotiated %s, session %q", v, cs.ID())
		}
		if res := call(t, cs, "list_sandboxes", map[string]any{}); res.IsError {
			t.Error(text(res))
		}
	})

	t.Run("raw initialize 2025-06-18 gets a session", func(t *testing.T) {
		status, h, out := rawPost(t, url, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`, nil)
		res, _ := out["result"].(map[string]any)
		if status != 200 || h.Get("Mcp-Session-Id") == "" || res["protocolVersion"] != "2025-06-18" {
			t.Fatalf("initialize: %d session %q %v", status, h.Get("Mcp-Session-Id"), out)
		}
		sid := h.Get("Mcp-Session-Id")
		hdr := map[string]string{"Mcp-Session-Id": sid, "Mcp-Protocol-Version": "2025-06-18"}
		if status, _, _ := rawPost(t, url, `{"jsonrpc":"2.0","method":"notifications/initialized"}`, hdr); status != http.StatusAccepted {
			t.Fatalf("initialized: %d", status)
		}
		status, _, out = rawPost(t, url, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, hdr)
		res, _ = out["result"].(map[string]any)
		if tools, _ := res["tools"].([]any); status != 200 || len(tools) < 10 {
			t.Errorf("tools/list in the session: %d %v", status, out)
		}
	})

	t.Run("raw initialize at an unknown version is answered with a supported one", func(t *testing.T) {
		_, _, out := rawPost(t, url, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"1999-01-01","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`, nil)
		res, _ := out["result"].(map[string]any)
		if res["protocolVersion"] != "2025-11-25" {
			t.Errorf("initialize 1999-01-01: %v", out)
		}
	})

	t.Run("raw server/discover and a stateless call", func(t *testing.T) {
		meta := `"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}`
		// 2026-07-28 mirrors the method (and a tool's name) in headers.
		hdr := map[string]string{"Mcp-Protocol-Version": "2026-07-28", "Mcp-Method": "server/discover"}
		status, h, out := rawPost(t, url, `{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{`+meta+`}}`, hdr)
		res, _ := out["result"].(map[string]any)
		if status != 200 || h.Get("Mcp-Session-Id") != "" || !slices.Contains(anyStrings(res["supportedVersions"]), "2026-07-28") {
			t.Fatalf("discover: %d %v", status, out)
		}
		hdr["Mcp-Method"] = "tools/call"
		hdr["Mcp-Name"] = "list_sandboxes"
		status, h, out = rawPost(t, url, `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"list_sandboxes","arguments":{},`+meta+`}}`, hdr)
		res, _ = out["result"].(map[string]any)
		if status != 200 || h.Get("Mcp-Session-Id") != "" || res["structuredContent"] == nil {
			t.Errorf("stateless tools/call: %d %v", status, out)
		}
	})

	unknown := func(t *testing.T, body string, hdr map[string]string, requested string) {
		t.Helper()
		status, h, out := rawPost(t, url, body, hdr)
		e, _ := out["error"].(map[string]any)
		data, _ := e["data"].(map[string]any)
		if status != http.StatusBadRequest || !strings.HasPrefix(h.Get("Content-Type"), "application/json") || e["code"] != float64(mcp.CodeUnsupportedProtocolVersion) ||
			data["requested"] != requested || !slices.Equal(anyStrings(data["supported"]), mcp.SupportedProtocolVersions()) ||
			!strings.Contains(e["message"].(string), "2026-07-28, 2025-11-25") {
			t.Errorf("%d %v", status, out)
		}
		if out["id"] != float64(7) {
			t.Errorf("id not echoed: %v", out["id"])
		}
	}
	t.Run("unknown old version in the header", func(t *testing.T) {
		unknown(t, `{"jsonrpc":"2.0","id":7,"method":"tools/list"}`, map[string]string{"Mcp-Protocol-Version": "2024-01-01"}, "2024-01-01")
	})
	t.Run("unknown new version in the header and _meta", func(t *testing.T) {
		unknown(t, `{"jsonrpc":"2.0","id":7,"method":"tools/list","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2099-01-01","io.modelcontextprotocol/clientCapabilities":{}}}}`,
			map[string]string{"Mcp-Protocol-Version": "2099-01-01"}, "2099-01-01")
	})
	t.Run("unknown version in _meta only", func(t *testing.T) {
		unknown(t, `{"jsonrpc":"2.0","id":7,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2030-01-01"}}}`, nil, "2030-01-01")
	})

	t.Run("the API key is required in both eras", func(t *testing.T) {
		for _, hdr := range []map[string]string{{"Mcp-Protocol-Version": "2026-07-28"}, {}} {
			req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{}}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			req.Header.Set("Authorization", "Bearer wrong")
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("wrong key, %v: %d", hdr, resp.StatusCode)
			}
		}
	})
}

func anyStrings(v any) []string {
	l, _ := v.([]any)
	out := make([]string, 0, len(l))
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// TestPeekMessage: the router reads what it needs of a body, and nothing
// breaks on bodies that are not what it expects.
func TestPeekMessage(t *testing.T) {
	for _, c := range []struct {
		body, method, version string
	}{
		{`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`, "tools/list", ""},
		{` [{"jsonrpc":"2.0","id":1,"method":"server/discover","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}}]`, "server/discover", "2026-07-28"},
		{`{"method":"x","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":5}}}`, "x", "5"},
		{`not json`, "", ""},
		{`[]`, "", ""},
		{``, "", ""},
	} {
		p := peekMessage([]byte(c.body))
		if p.method != c.method || p.metaVersion != c.version {
			t.Errorf("%q: %+v", c.body, p)
		}
	}
}

// TestUnknownVersionsStdio: over a stream transport (stdio, here in memory)
// the go-sdk answers a 2026-era request at a version it does not speak with
// -32022 and the supported versions, and initialize at an unknown version
// with a version it speaks, as the spec says.
func TestUnknownVersionsStdio(t *testing.T) {
	ctx := context.Background()
	exchange := func(t *testing.T, body string) map[string]any {
		t.Helper()
		st, ct := mcp.NewInMemoryTransports()
		ss, err := NewServer(&fakeBackend{}, Options{}).Connect(ctx, st, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer ss.Close()
		conn, err := ct.Connect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		msg, err := jsonrpc.DecodeMessage([]byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if err := conn.Write(ctx, msg); err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		resp, err := conn.Read(rctx)
		if err != nil {
			t.Fatal(err)
		}
		data, _ := jsonrpc.EncodeMessage(resp)
		var out map[string]any
		_ = json.Unmarshal(data, &out)
		return out
	}
	for _, method := range []string{"server/discover", "tools/list"} {
		out := exchange(t, `{"jsonrpc":"2.0","id":1,"method":"`+method+`","params":{"_meta":{"io.modelcontextprotocol/protocolVersion":"2099-01-01","io.modelcontextprotocol/clientCapabilities":{}}}}`)
		e, _ := out["error"].(map[string]any)
		data, _ := e["data"].(map[string]any)
		if e["code"] != float64(mcp.CodeUnsupportedProtocolVersion) || !slices.Equal(anyStrings(data["supported"]), mcp.SupportedProtocolVersions()) {
			t.Errorf("%s at 2099-01-01: %v", method, out)
		}
	}
	out := exchange(t, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"1999-01-01","capabilities":{},"clientInfo":{"name":"raw","version":"0"}}}`)
	if res, _ := out["result"].(map[string]any); res["protocolVersion"] != "2025-11-25" {
		t.Errorf("initialize at 1999-01-01: %v", out)
	}
}
