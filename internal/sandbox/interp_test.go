package sandbox_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/proxy"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// interpDo sends one request to a sandbox's code interpreter through the proxy.
func interpDo(t *testing.T, proxyURL, id, method, path, body, token string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, proxyURL+path, strings.NewReader(body))
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", "49999")
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("X-Access-Token", token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestCodeInterpreterWarmPoolEnv: a pooled sandbox's kernels start before any
// client exists; a claim that brings env vars must restart them so the code
// sees the client's env (here FOO=bar from create()).
func TestCodeInterpreterWarmPoolEnv(t *testing.T) {
	r := newRig(t)
	r.tpl.Kernels = []string{"bash"}
	m := r.manager(t, 0)
	m.SetWarmPool(r.tpl, 1)
	deadline := time.Now().Add(time.Minute)
	for m.WarmCount(r.tpl.ID) < 1 {
		if time.Now().After(deadline) {
			t.Fatal("warm pool did not fill")
		}
		time.Sleep(10 * time.Millisecond)
	}
	info := create(t, m, time.Minute)
	srv := testenv.NewHTTPServer(t, proxy.New(m, nil))
	defer srv.Close()
	st, body := interpDo(t, srv.URL, info.ID, "POST", "/execute", `{"code":"echo \"foo=$FOO\"","language":"bash"}`, info.AccessToken)
	// stdout may arrive in several chunks: join them.
	var stdout strings.Builder
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		var ev struct{ Type, Text string }
		if json.Unmarshal([]byte(l), &ev) == nil && ev.Type == "stdout" {
			stdout.WriteString(ev.Text)
		}
	}
	if st != 200 || stdout.String() != "foo=bar\n" {
		t.Fatalf("claimed sandbox's kernel does not see the client's env: %d %q", st, body)
	}
}

// TestCodeInterpreterThroughProxy drives the code interpreter of a real sandbox
// the way @e2b/code-interpreter does: through the sandbox-traffic proxy with
// E2b-Sandbox-Port: 49999, which reaches envd's interpreter socket.
func TestCodeInterpreterThroughProxy(t *testing.T) {
	r := newRig(t)
	r.tpl.Kernels = []string{"bash"}
	m := r.manager(t, 0)
	info := create(t, m, time.Minute)
	srv := testenv.NewHTTPServer(t, proxy.New(m, nil))
	defer srv.Close()

	do := func(method, path, body, token string) (int, string) {
		t.Helper()
		return interpDo(t, srv.URL, info.ID, method, path, body, token)
	}
	if st, body := do("GET", "/health", "", ""); st != 200 || strings.TrimSpace(body) != `"OK"` {
		t.Fatalf("health: %d %q", st, body)
	}
	// The prewarmed bash default context is listed.
	if st, body := do("GET", "/contexts", "", ""); st != 200 || !strings.Contains(body, `"language":"bash"`) || !strings.Contains(body, `"cwd":"/home/user"`) {
		t.Fatalf("contexts: %d %q", st, body)
	}
	if st, _ := do("POST", "/execute", `{"code":"echo hi","language":"bash"}`, "wrong"); st != 401 {
		t.Fatalf("bad token: %d", st)
	}
	t0 := time.Now()
	st, body := do("POST", "/execute", `{"code":"x=5; echo \"$(whoami) $PWD $FOO $BAR\"; echo warn >&2","language":"bash","env_vars":{"BAR":"per-exec"}}`, info.AccessToken)
	t.Logf("first bash execute: %v", time.Since(t0))
	if st != 200 {
		t.Fatalf("execute: %d %q", st, body)
	}
	var got []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(body), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		got = append(got, m)
	}
	// stdout and stderr are separate pipes, each may come in several chunks,
	// and their relative order is not fixed.
	byType := map[string]string{}
	var tail []string
	for _, l := range got {
		typ := l["type"].(string)
		if typ == "stdout" || typ == "stderr" {
			byType[typ] += l["text"].(string)
		} else {
			tail = append(tail, typ)
		}
	}
	// Kernels run as root in the default user's home, as E2B's.
	if byType["stdout"] != "root /home/user bar per-exec\n" || byType["stderr"] != "warn\n" ||
		strings.Join(tail, ",") != "number_of_executions,end_of_execution" {
		t.Fatalf("stream: %q", body)
	}
	t0 = time.Now()
	_, body = do("POST", "/execute", `{"code":"echo $x ${BAR-unset}; false","language":"bash"}`, info.AccessToken)
	t.Logf("warm bash execute: %v", time.Since(t0))
	if !strings.Contains(body, `"text":"5 unset`) || !strings.Contains(body, `"type":"error","value":"1"`) {
		t.Fatalf("state/exit status: %q", body)
	}
	// In-sandbox code reaches the interpreter on localhost:49999, as on E2B.
	out, code := run(t, m, info, `python3 -c 'import urllib.request; print(urllib.request.urlopen("http://localhost:49999/health").read().decode())'`)
	if code != 0 || strings.TrimSpace(out) != `"OK"` {
		t.Fatalf("in-sandbox localhost:49999: %q (exit %d)", out, code)
	}
	// A language the server does not know: a clear 400.
	if st, body := do("POST", "/execute", `{"code":"1","language":"cobol"}`, info.AccessToken); st != 200 || !strings.Contains(body, `"name":"UnknownLanguage"`) || !strings.Contains(body, "supported languages") {
		t.Fatalf("unknown language: %d %q", st, body)
	}
}
