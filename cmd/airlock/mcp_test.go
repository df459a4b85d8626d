package main

import (
	"os"
	"path/filepath"
	"testing"
)

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
