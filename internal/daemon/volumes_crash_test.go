package daemon

// A crash of the server in the middle of a volume's create or destroy leaves,
// after a restart, the old state or the new one (issue 17): never a listed
// volume without its directory, a directory nothing names, or a name that
// stays taken. Each case arms one crash point (internal/crashpoint).

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/crashpoint"
	"github.com/airlock-sandbox/airlock/internal/diskquota"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

func (h *host) volumeCall(method, path, auth string, body io.Reader) (int, []byte) {
	h.t.Helper()
	req, err := http.NewRequest(method, h.srv.api+path, body)
	if err != nil {
		h.t.Fatal(err)
	}
	if t, ok := strings.CutPrefix(auth, "Bearer "); ok {
		req.Header.Set("Authorization", "Bearer "+t)
	} else {
		req.Header.Set(e2bwire.HeaderAPIKey, serveKey)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, []byte(err.Error()) // a crash point's SIGKILL ends the connection
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, b
}

func (h *host) createVolume(name string) e2bwire.VolumeAndToken {
	h.t.Helper()
	code, body := h.volumeCall("POST", "/volumes", "", strings.NewReader(`{"name":"`+name+`","sizeMB":16}`))
	if code != http.StatusCreated {
		h.t.Fatalf("create volume %s: %d %s", name, code, body)
	}
	var v e2bwire.VolumeAndToken
	if err := json.Unmarshal(body, &v); err != nil {
		h.t.Fatal(err)
	}
	return v
}

// volumeDirs are the volume directories on the pool.
func (h *host) volumeDirs() []string {
	es, _ := os.ReadDir(filepath.Join(h.dir.Sandboxes(), diskquota.VolumesDir))
	var out []string
	for _, e := range es {
		out = append(out, e.Name())
	}
	slices.Sort(out)
	return out
}

func TestVolumeCrashMidOperation(t *testing.T) {
	h := newHost(t, "linux")
	h.start()
	kept := h.createVolume("kept")
	if code, body := h.volumeCall("PUT", "/volumecontent/"+kept.VolumeID+"/file?path=/f.txt", "Bearer "+kept.Token, strings.NewReader("kept")); code != http.StatusCreated {
		t.Fatalf("write: %d %s", code, body)
	}
	h.stop()

	for _, c := range []struct {
		point   string
		destroy bool
	}{
		{crashpoint.VolumeRecorded, false},
		{crashpoint.VolumeMade, false},
		{crashpoint.VolumeDeleting, true},
		{crashpoint.VolumeRemoved, true},
	} {
		t.Run(c.point, func(t *testing.T) {
			parent := h.t
			h.t = t
			defer func() { h.t = parent }()
			name := "victim-" + strings.ReplaceAll(c.point, "volume-", "")
			var victim e2bwire.VolumeAndToken
			if c.destroy {
				h.start()
				victim = h.createVolume(name)
				h.stop()
			}
			h.start(crashpoint.Env + "=" + c.point)
			if c.destroy {
				h.volumeCall("DELETE", "/volumes/"+victim.VolumeID, "", nil)
			} else {
				h.volumeCall("POST", "/volumes", "", strings.NewReader(`{"name":"`+name+`"}`))
			}
			h.died(30 * time.Second)

			h.start()
			defer h.stop()
			// Old state or new: the victim is gone either way here (a create
			// that never answered is undone, a destroy that began finishes).
			code, body := h.volumeCall("GET", "/volumes", "", nil)
			var listed []e2bwire.Volume
			if code != http.StatusOK || json.Unmarshal(body, &listed) != nil {
				t.Fatalf("list: %d %s", code, body)
			}
			if len(listed) != 1 || listed[0].VolumeID != kept.VolumeID {
				t.Errorf("after a crash at %s the volumes are %s, want only %s", c.point, body, kept.VolumeID)
			}
			if dirs := h.volumeDirs(); !slices.Equal(dirs, []string{kept.VolumeID}) {
				t.Errorf("after a crash at %s the volume store holds %v, want only %s", c.point, dirs, kept.VolumeID)
			}
			// The name is free again, and the kept volume's file is whole.
			again := h.createVolume(name)
			if code, body := h.volumeCall("DELETE", "/volumes/"+again.VolumeID, "", nil); code != http.StatusNoContent {
				t.Errorf("delete: %d %s", code, body)
			}
			if code, body := h.volumeCall("GET", "/volumecontent/"+kept.VolumeID+"/file?path=/f.txt", "Bearer "+kept.Token, nil); code != http.StatusOK || string(body) != "kept" {
				t.Errorf("after a crash at %s the kept volume's file: %d %s", c.point, code, body)
			}
		})
	}
}
