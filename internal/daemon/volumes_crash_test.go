package daemon

// A crash of the server in the middle of a volume's create or destroy leaves,
// after a restart, the old state or the new one (issue 17): never a listed
// volume without its directory, a directory nothing names, or a name that
// stays taken. Each case arms one crash point (internal/crashpoint).

import (
	"context"
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

// TestVolumeMountSurvivesKill9: a sandbox's volume and its files outlive a
// kill -9 of the server (the re-adopted sandbox still writes through its
// mount, and a destroy is still refused while it does) and a reboot of the
// host (a new sandbox mounts the volume and finds every file).
func TestVolumeMountSurvivesKill9(t *testing.T) {
	h := newHost(t, "linux")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h.start()
	vol := h.createVolume("mounted")
	mount := func() string {
		timeout := int64(600)
		s, err := h.client().Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Timeout: &timeout,
			VolumeMounts: []e2bwire.SandboxVolumeMount{{Name: "mounted", Path: "/data"}}})
		if err != nil {
			t.Fatalf("create with a volume: %v", err)
		}
		h.ids[s.SandboxID] = true
		return s.SandboxID
	}
	id := mount()
	b := h.backend()
	run(ctx, t, b, id, "echo before > /data/before.txt")

	h.kill9()
	h.start()
	b = h.backend() // the new server's ports
	if got := run(ctx, t, b, id, "cat /data/before.txt && echo after > /data/after.txt && cat /data/after.txt"); got != "before\nafter\n" {
		t.Fatalf("the re-adopted sandbox's volume: %q", got)
	}
	if code, body := h.volumeCall("DELETE", "/volumes/"+vol.VolumeID, "", nil); code != http.StatusConflict || !strings.Contains(string(body), id) {
		t.Fatalf("destroy of a volume a re-adopted sandbox mounts: %d %s", code, body)
	}
	if code, body := h.volumeCall("GET", "/volumecontent/"+vol.VolumeID+"/file?path=/after.txt", "Bearer "+vol.Token, nil); code != http.StatusOK || string(body) != "after\n" {
		t.Fatalf("the content API after the crash: %d %s", code, body)
	}

	h.stop()
	h.reboot(true)
	h.start()
	next := mount()
	if got := run(ctx, t, h.backend(), next, "cat /data/before.txt /data/after.txt"); got != "before\nafter\n" {
		t.Fatalf("after a reboot the volume holds %q", got)
	}
	h.stop()
}

// TestVolumeMountGVisor: on the gvisor runtime, which shows a sandbox the
// host's ids unshifted, a volume mounts as a plain bind: the default user
// writes it, the content API reads it, and a pause with memory (runsc
// checkpoint) and its resume keep the mount.
func TestVolumeMountGVisor(t *testing.T) {
	h := newHost(t, "gvisor")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	h.start()
	defer h.stop()
	vol := h.createVolume("gv")
	timeout := int64(600)
	s, err := h.client().Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Timeout: &timeout,
		VolumeMounts: []e2bwire.SandboxVolumeMount{{Name: "gv", Path: "/data"}}})
	if err != nil {
		t.Fatalf("create with a volume: %v", err)
	}
	h.ids[s.SandboxID] = true
	b := h.backend()
	if got := run(ctx, t, b, s.SandboxID, "echo hi > /data/a.txt && stat -c %U:%u /data/a.txt"); got != "user:1000\n" {
		t.Fatalf("a file the default user wrote on the volume: %q", got)
	}
	if code, body := h.volumeCall("GET", "/volumecontent/"+vol.VolumeID+"/file?path=/a.txt", "Bearer "+vol.Token, nil); code != http.StatusOK || string(body) != "hi\n" {
		t.Fatalf("the content API: %d %s", code, body)
	}
	paused := &sbx{id: s.SandboxID}
	h.pause(ctx, paused, true)
	if paused.inRAM != nil {
		t.Fatalf("the pause froze the sandbox in RAM instead of saving it with its mount: %v", paused.inRAM)
	}
	if code, body := h.volumeCall("PUT", "/volumecontent/"+vol.VolumeID+"/file?path=/b.txt", "Bearer "+vol.Token, strings.NewReader("while paused")); code != http.StatusCreated {
		t.Fatalf("write while paused: %d %s", code, body)
	}
	if _, _, err := h.client().Connect(ctx, s.SandboxID, 5*time.Minute); err != nil {
		t.Fatalf("resume: %v", err)
	}
	if got := run(ctx, t, b, s.SandboxID, "cat /data/a.txt /data/b.txt && echo again >> /data/a.txt"); got != "hi\nwhile paused" {
		t.Fatalf("after resume the volume reads %q", got)
	}
	if err := h.client().Kill(ctx, s.SandboxID); err != nil {
		t.Fatal(err)
	}
}
