package main

import (
	"encoding/json"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/mcp"
)

// TestInfoHandler: the sandbox URL a client learns is the proxy's listen address,
// or, when the proxy listens on every address, the host the client used for the API
// with the proxy's port (never the API's port plus one).
func TestInfoHandler(t *testing.T) {
	for _, tt := range []struct {
		listen *net.TCPAddr
		host   string
		want   string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4011}, "127.0.0.1:4000", "http://127.0.0.1:4011"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 4011}, "sandbox.example:4000", "http://sandbox.example:4011"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 4011}, "[::1]:4000", "http://[::1]:4011"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 4011}, "10.1.2.3", "http://10.1.2.3:4011"},
	} {
		req := httptest.NewRequest("GET", mcp.InfoPath, nil)
		req.Host = tt.host
		rec := httptest.NewRecorder()
		infoHandler(tt.listen).ServeHTTP(rec, req)
		var info mcp.ServerInfo
		if err := json.Unmarshal(rec.Body.Bytes(), &info); err != nil || info.SandboxURL != tt.want {
			t.Errorf("listen %v, Host %q: %s (%v), want sandboxUrl %s", tt.listen, tt.host, rec.Body, err, tt.want)
		}
	}
}

// TestMCPSettingsFromEnv: airlock mcp takes the E2B_* variables serve prints, and
// the AIRLOCK_* names win when both are set.
func TestMCPSettingsFromEnv(t *testing.T) {
	for _, v := range []string{"AIRLOCK_URL", "AIRLOCK_SANDBOX_URL", "AIRLOCK_API_KEY"} {
		t.Setenv(v, "")
	}
	t.Setenv("E2B_API_URL", "http://e2b-api:1")
	t.Setenv("E2B_SANDBOX_URL", "http://e2b-sbx:2")
	t.Setenv("E2B_API_KEY", "e2b_from_env")
	check := func(wantURL, wantSbx, wantKey string) {
		t.Helper()
		f := mcpCmd().Flags()
		url, _ := f.GetString("url")
		sbx, _ := f.GetString("sandbox-url")
		key, err := mcpAPIKey("", t.TempDir())
		if url != wantURL || sbx != wantSbx || key != wantKey || err != nil {
			t.Errorf("url %q sandbox %q key %q (%v); want %q %q %q", url, sbx, key, err, wantURL, wantSbx, wantKey)
		}
	}
	check("http://e2b-api:1", "http://e2b-sbx:2", "e2b_from_env")
	t.Setenv("AIRLOCK_URL", "http://airlock-api:3")
	t.Setenv("AIRLOCK_SANDBOX_URL", "http://airlock-sbx:4")
	t.Setenv("AIRLOCK_API_KEY", "k1, k2")
	check("http://airlock-api:3", "http://airlock-sbx:4", "k1")

	// Nothing set: no sandbox URL (asked of the server), the key from the data dir.
	for _, v := range []string{"AIRLOCK_URL", "AIRLOCK_SANDBOX_URL", "AIRLOCK_API_KEY", "E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY"} {
		t.Setenv(v, "")
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "api-key"), []byte("e2b_file\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	f := mcpCmd().Flags()
	if sbx, _ := f.GetString("sandbox-url"); sbx != "" {
		t.Errorf("sandbox-url default %q, want empty (asked of the server)", sbx)
	}
	if key, err := mcpAPIKey("", dir); key != "e2b_file" || err != nil {
		t.Errorf("key from the data dir: %q, %v", key, err)
	}
	if _, err := mcpAPIKey("", t.TempDir()); err == nil {
		t.Error("no key anywhere: want an error")
	}
}
