package e2bclient

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

const testKey = "e2b_test"

// apiServer serves handlers keyed by "METHOD /path" and fails the test on any
// request without the API key or to a route it does not know.
func apiServer(t *testing.T, routes map[string]http.HandlerFunc) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if got := r.Header.Get("X-API-KEY"); got != testKey {
			t.Errorf("%s %s: X-API-KEY %q", r.Method, r.URL.Path, got)
		}
		h, ok := routes[r.Method+" "+r.URL.Path]
		if !ok {
			t.Errorf("unexpected %s %s", r.Method, r.URL)
			http.NotFound(w, r)
			return
		}
		h(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// body reads a request body as a JSON object, so tests compare what was on
// the wire rather than what a Go type would make of it.
func body(t *testing.T, r *http.Request) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
		t.Errorf("%s %s: body: %v", r.Method, r.URL.Path, err)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", r.Method, r.URL.Path, ct)
	}
	return m
}

func jsonText(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func TestControlPlane(t *testing.T) {
	started := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	srv := apiServer(t, map[string]http.HandlerFunc{
		"POST /v2/sandboxes": func(w http.ResponseWriter, r *http.Request) {
			// Unset optional fields are left out, as the JS SDK leaves them.
			want := `{"metadata":{"owner":"me"},"templateID":"base","timeout":300}`
			if got := jsonText(body(t, r)); got != want {
				t.Errorf("create body %s, want %s", got, want)
			}
			writeJSON(w, http.StatusCreated, map[string]any{"sandboxID": "abc", "templateID": "t1", "alias": "base",
				"clientID": "c", "envdVersion": "0.6.4", "envdAccessToken": "tok", "domain": nil})
		},
		"GET /sandboxes/abc": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, map[string]any{"sandboxID": "abc", "templateID": "t1", "alias": "base",
				"startedAt": started, "endAt": started.Add(time.Minute), "cpuCount": 2, "memoryMB": 512,
				"state": "running", "metadata": map[string]string{"owner": "me"}, "envdAccessToken": "tok"})
		},
		"DELETE /sandboxes/abc": func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) },
		"POST /sandboxes/abc/timeout": func(w http.ResponseWriter, r *http.Request) {
			if got := jsonText(body(t, r)); got != `{"timeout":0}` {
				t.Errorf("timeout body %s", got)
			}
			w.WriteHeader(http.StatusNoContent)
		},
		"GET /sandboxes/abc/metrics": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, []map[string]any{{"timestamp": started, "cpuUsedPct": 12.5, "memUsed": 1 << 20, "memTotal": 1 << 30}})
		},
		"GET /v2/sandboxes": func(w http.ResponseWriter, r *http.Request) {
			q := r.URL.Query()
			// The metadata filter is itself a query string, escaped once more
			// as a whole (docs/E2B-WIRE.md §2.5): "a b" -> "a+b" -> "a%2Bb".
			if q.Get("limit") != "100" || q.Get("state") != "running" || q.Get("metadata") != "k%3Da%2Bb" {
				t.Errorf("list query %s", r.URL.RawQuery)
			}
			switch q.Get("nextToken") {
			case "":
				w.Header().Set("X-Next-Token", "page2")
				writeJSON(w, http.StatusOK, []map[string]any{{"sandboxID": "one", "state": "running"}})
			case "page2":
				writeJSON(w, http.StatusOK, []map[string]any{{"sandboxID": "two", "state": "running"}})
			default:
				t.Errorf("nextToken %q", q.Get("nextToken"))
			}
		},
	})
	c := New(Config{APIURL: srv.URL + "/", APIKey: testKey, SandboxURL: "http://unused"})
	ctx := context.Background()

	timeout := int64(300)
	sb, err := c.Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Timeout: &timeout, Metadata: e2bwire.Strings(map[string]string{"owner": "me"}),
		EnvVars: e2bwire.Strings(nil)})
	if err != nil || sb.SandboxID != "abc" || sb.EnvdAccessToken != "tok" || sb.Alias != "base" {
		t.Fatalf("create: %+v, %v", sb, err)
	}
	d, err := c.Get(ctx, "abc")
	if err != nil || d.State != e2bwire.StateRunning || !d.StartedAt.Equal(started) || d.CPUCount != 2 || d.EnvdAccessToken != "tok" || d.Metadata["owner"] != "me" {
		t.Fatalf("get: %+v, %v", d, err)
	}
	if err := c.SetTimeout(ctx, "abc", 0); err != nil {
		t.Fatal(err)
	}
	ms, err := c.Metrics(ctx, "abc")
	if err != nil || len(ms) != 1 || ms[0].CPUUsedPct != 12.5 || ms[0].MemTotal != 1<<30 {
		t.Fatalf("metrics: %+v, %v", ms, err)
	}
	list, err := c.List(ctx, ListQuery{State: "running", Metadata: map[string]string{"k": "a b"}})
	if err != nil || len(list) != 2 || list[0].SandboxID != "one" || list[1].SandboxID != "two" {
		t.Fatalf("list: %+v, %v", list, err)
	}
	if err := c.Kill(ctx, "abc"); err != nil {
		t.Fatal(err)
	}
}

func TestErrors(t *testing.T) {
	srv := apiServer(t, map[string]http.HandlerFunc{
		"DELETE /sandboxes/gone": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusNotFound, e2bwire.Error{Code: 404, Message: `sandbox "gone" not found`})
		},
		"POST /v2/sandboxes": func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "5")
			writeJSON(w, http.StatusServiceUnavailable, e2bwire.Error{Code: 503, Message: "template python3 is still being built"})
		},
		"GET /sandboxes/plain": func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "bad gateway from somewhere", http.StatusBadGateway)
		},
		"GET /sandboxes/empty": func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusTeapot) },
		"GET /sandboxes/garbled": func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.WriteString(w, "{not json")
		},
	})
	c := New(Config{APIURL: srv.URL, APIKey: testKey})
	ctx := context.Background()

	err := c.Kill(ctx, "gone")
	var e *Error
	if !errors.As(err, &e) || e.Status != 404 || e.Message != `sandbox "gone" not found` || err.Error() != `sandbox "gone" not found (HTTP 404)` {
		t.Errorf("404: %#v", err)
	}
	if _, ok := e.RetryAfter(); ok {
		t.Error("a 404 without Retry-After has one")
	}

	_, err = c.Create(ctx, e2bwire.NewSandbox{TemplateID: "python3"})
	if !errors.As(err, &e) || e.Status != 503 {
		t.Fatalf("503: %#v", err)
	}
	if wait, ok := e.RetryAfter(); !ok || wait != 5*time.Second {
		t.Errorf("Retry-After: %s, %v", wait, ok)
	}

	for id, want := range map[string]string{
		"plain": "bad gateway from somewhere (HTTP 502)",
		"empty": "418 I'm a teapot (HTTP 418)",
	} {
		if _, err := c.Get(ctx, id); err == nil || err.Error() != want {
			t.Errorf("%s: %v, want %q", id, err, want)
		}
	}
	if _, err := c.Get(ctx, "garbled"); err == nil || !strings.Contains(err.Error(), "decode answer") {
		t.Errorf("garbled answer: %v", err)
	}

	// Nothing listening: wrapped with what failed, and not an *Error.
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close()
	_, err = New(Config{APIURL: dead.URL, APIKey: testKey}).Get(ctx, "abc")
	if err == nil || errors.As(err, &e) || !strings.HasPrefix(err.Error(), "airlock API: ") {
		t.Errorf("unreachable API: %v", err)
	}
}

// TestSandboxURLDiscovery: without a sandbox URL the client asks the server
// once, and says how to set one when the server names none.
func TestSandboxURLDiscovery(t *testing.T) {
	var asked atomic.Int32
	answer := "http://127.0.0.1:1/"
	srv := apiServer(t, map[string]http.HandlerFunc{
		"GET " + e2bwire.InfoPath: func(w http.ResponseWriter, r *http.Request) {
			asked.Add(1)
			writeJSON(w, http.StatusOK, e2bwire.ServerInfo{SandboxURL: answer})
		},
	})
	c := New(Config{APIURL: srv.URL, APIKey: testKey})
	for range 2 {
		u, err := c.SandboxURL(context.Background())
		if err != nil || u != "http://127.0.0.1:1" {
			t.Fatalf("sandbox URL %q, %v", u, err)
		}
	}
	if n := asked.Load(); n != 1 {
		t.Errorf("asked %d times", n)
	}

	answer = ""
	_, err := New(Config{APIURL: srv.URL, APIKey: testKey}).SandboxURL(context.Background())
	if err == nil || !strings.Contains(err.Error(), "names no sandboxUrl") {
		t.Errorf("empty answer: %v", err)
	}
}

func TestPathEscaping(t *testing.T) {
	var got string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.URL.EscapedPath()
		w.WriteHeader(http.StatusNoContent)
	}))
	defer srv.Close()
	if err := New(Config{APIURL: srv.URL}).Kill(context.Background(), "a/b?c"); err != nil {
		t.Fatal(err)
	}
	if want := "/sandboxes/" + url.PathEscape("a/b?c"); got != want {
		t.Errorf("path %q, want %q", got, want)
	}
}
