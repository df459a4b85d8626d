package mcp

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
)

// TestHTTPBackendErrors: what the API answers reaches the tools as the Backend
// contract says, without a real server: a template still being built is a
// NotReadyError the tools wait on, and any other refusal carries the server's
// message and status.
func TestHTTPBackendErrors(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.Method == http.MethodPost && r.URL.Path == "/v2/sandboxes":
			w.Header().Set("Retry-After", "7")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"code":503,"message":"template python3 is still being built: step 1/2"}`))
		case r.URL.Path == "/sandboxes/abc/timeout":
			// A 503 without Retry-After is no build to wait for.
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte(`{"code":503,"message":"busy"}`))
		default:
			w.WriteHeader(http.StatusNotFound)
			_, _ = w.Write([]byte(`{"code":404,"message":"sandbox \"abc\" not found"}`))
		}
	}))
	defer api.Close()
	b := NewHTTPBackend(e2bclient.Config{APIURL: api.URL, SandboxURL: "http://127.0.0.1:1", APIKey: "k"})
	ctx := context.Background()

	_, err := b.CreateSandbox(ctx, CreateSandboxRequest{Template: "python3", Timeout: time.Minute})
	var nr *NotReadyError
	if !errors.As(err, &nr) || nr.RetryAfter != 7*time.Second || nr.Message != "template python3 is still being built: step 1/2" {
		t.Errorf("create while building: %#v", err)
	}
	if err := b.SetTimeout(ctx, "abc", time.Minute); errors.As(err, &nr) || err == nil || err.Error() != "busy (HTTP 503)" {
		t.Errorf("503 without Retry-After: %v", err)
	}
	if err := b.KillSandbox(ctx, "abc"); err == nil || err.Error() != `sandbox "abc" not found (HTTP 404)` {
		t.Errorf("kill unknown: %v", err)
	}
	// Sandbox traffic first needs the sandbox's token, whose lookup fails the same way.
	if _, _, err := b.ReadFile(ctx, "abc", "/x", 10); !errors.Is(err, ErrNotFound) || err == nil || !strings.Contains(err.Error(), "not found (HTTP 404)") {
		t.Errorf("read in unknown sandbox: %v", err)
	}
}
