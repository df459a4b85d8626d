package daemon_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

func volCall(t *testing.T, method, url, auth string, body io.Reader) (int, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(auth, "Bearer ") {
		req.Header.Set("Authorization", auth)
	} else if auth != "" {
		req.Header.Set("X-API-Key", auth)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

// TestVolumesServed: a server on the disk pool serves /volumes and the
// content API on its API listener; a volume and its files outlive a restart
// of the server; the volume flags reach the service.
func TestVolumesServed(t *testing.T) {
	dataDir := t.TempDir()
	edit := func(keep bool) func(*daemon.Config) {
		return func(c *daemon.Config) {
			c.DataDir = dataDir
			c.DiskQuota, c.DiskImageMB = true, 512
			c.Volumes = daemon.VolumeConfig{DefaultMB: 16, MaxMB: 32, PerKey: 2}
			// The first server leaves the pool mounted for the second.
			c.KillOnClose = !keep
		}
	}
	first := daemontest.Start(t, edit(true))
	code, body := volCall(t, "POST", first.APIURL+"/volumes", daemontest.Key, strings.NewReader(`{"name":"keep"}`))
	if code != http.StatusCreated {
		t.Fatalf("create: %d %s", code, body)
	}
	var v e2bwire.VolumeAndToken
	if err := json.Unmarshal(body, &v); err != nil {
		t.Fatal(err)
	}
	if v.SizeMB != 16 {
		t.Errorf("default size = %d MiB, want 16", v.SizeMB)
	}
	if code, body := volCall(t, "POST", first.APIURL+"/volumes", daemontest.Key, strings.NewReader(`{"name":"big","sizeMB":33}`)); code != http.StatusBadRequest {
		t.Errorf("above --volume-max-size: %d %s", code, body)
	}
	content := first.APIURL + "/volumecontent/" + v.VolumeID
	if code, body := volCall(t, "PUT", content+"/file?path=/notes/a.txt&force=true", "Bearer "+v.Token, bytes.NewReader([]byte("kept"))); code != http.StatusCreated {
		t.Fatalf("write: %d %s", code, body)
	}
	if code, body := volCall(t, "GET", content+"/file?path=/notes/a.txt", daemontest.Key, nil); code != http.StatusUnauthorized {
		t.Errorf("content API with the API key instead of the volume token: %d %s", code, body)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	second := daemontest.Start(t, edit(false))
	code, body = volCall(t, "GET", second.APIURL+"/volumes", daemontest.Key, nil)
	if code != http.StatusOK || !strings.Contains(string(body), v.VolumeID) {
		t.Fatalf("list after restart: %d %s", code, body)
	}
	content = second.APIURL + "/volumecontent/" + v.VolumeID
	if code, body := volCall(t, "GET", content+"/file?path=notes/a.txt", "Bearer "+v.Token, nil); code != http.StatusOK || string(body) != "kept" {
		t.Fatalf("read after restart: %d %s", code, body)
	}
	if code, body := volCall(t, "DELETE", second.APIURL+"/volumes/"+v.VolumeID, daemontest.Key, nil); code != http.StatusNoContent {
		t.Fatalf("destroy: %d %s", code, body)
	}
	if code, body := volCall(t, "GET", content+"/file?path=notes/a.txt", "Bearer "+v.Token, nil); code != http.StatusForbidden {
		t.Fatalf("token of a destroyed volume: %d %s", code, body)
	}
}

// Without the disk pool the volume endpoints say why they are missing.
func TestVolumesWithoutPool(t *testing.T) {
	d := daemontest.Start(t, nil)
	if code, body := volCall(t, "GET", d.APIURL+"/volumes", daemontest.Key, nil); code != http.StatusNotImplemented || !strings.Contains(string(body), "--disk-quota") {
		t.Fatalf("GET /volumes: %d %s", code, body)
	}
	if code, body := volCall(t, "GET", d.APIURL+"/volumecontent/x/path?path=/", "Bearer x", nil); code != http.StatusNotImplemented || !strings.Contains(string(body), "--disk-quota") {
		t.Fatalf("content API: %d %s", code, body)
	}
}
