package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// volumeBackend is fakeBackend with volumes: a map by id, refusing taken
// names as the server does.
type volumeBackend struct {
	fakeBackend
	vmu     sync.Mutex
	vols    []VolumeInfo
	deleted []string
	forced  []bool
}

func (f *volumeBackend) CreateVolume(_ context.Context, name string, sizeMB int64) (VolumeInfo, error) {
	f.vmu.Lock()
	defer f.vmu.Unlock()
	for _, v := range f.vols {
		if v.Name == name {
			return VolumeInfo{}, fmt.Errorf("Volume with name '%s' already exists (HTTP 400)", name)
		}
	}
	if sizeMB == 0 {
		sizeMB = 1024 // the server's default
	}
	v := VolumeInfo{ID: fmt.Sprintf("vol-%d", len(f.vols)+1), Name: name, SizeMB: sizeMB}
	f.vols = append(f.vols, v)
	return v, nil
}

func (f *volumeBackend) ListVolumes(context.Context) ([]VolumeInfo, error) {
	f.vmu.Lock()
	defer f.vmu.Unlock()
	var out []VolumeInfo
	for _, v := range f.vols {
		out = append(out, VolumeInfo{ID: v.ID, Name: v.Name}) // as the API lists: no size
	}
	return out, nil
}

func (f *volumeBackend) GetVolume(_ context.Context, id string) (VolumeInfo, error) {
	f.vmu.Lock()
	defer f.vmu.Unlock()
	for _, v := range f.vols {
		if v.ID == id {
			return v, nil
		}
	}
	return VolumeInfo{}, fmt.Errorf("volume %q not found (HTTP 404): %w", id, ErrNotFound)
}

func (f *volumeBackend) DeleteVolume(_ context.Context, id string, force bool) error {
	f.vmu.Lock()
	defer f.vmu.Unlock()
	if id == "mounted" && !force {
		return errors.New("volume mounted is mounted by sandbox sb1 (HTTP 409)")
	}
	f.deleted, f.forced = append(f.deleted, id), append(f.forced, force)
	return nil
}

// CreateSandbox reports the mounts it was asked for, as a server that mounts
// them does.
func (f *volumeBackend) CreateSandbox(ctx context.Context, r CreateSandboxRequest) (SandboxInfo, error) {
	i, err := f.fakeBackend.CreateSandbox(ctx, r)
	i.VolumeMounts = r.VolumeMounts
	return i, err
}

func toolNames(t *testing.T, b Backend) map[string]bool {
	t.Helper()
	lt, err := connectClient(t, b).ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, tool := range lt.Tools {
		names[tool.Name] = true
	}
	return names
}

// TestVolumeToolsOffered: the volume tools come with a VolumesBackend and
// only with one.
func TestVolumeToolsOffered(t *testing.T) {
	with, without := toolNames(t, &volumeBackend{}), toolNames(t, &fakeBackend{})
	for _, n := range []string{"create_volume", "list_volumes", "get_volume", "delete_volume"} {
		if !with[n] {
			t.Errorf("%s missing with a VolumesBackend", n)
		}
		if without[n] {
			t.Errorf("%s offered by a backend without volumes", n)
		}
	}
	if !with["create_sandbox"] {
		t.Error("create_sandbox missing")
	}
}

func TestVolumeTools(t *testing.T) {
	f := &volumeBackend{}
	cs := connectClient(t, f)

	res := call(t, cs, "create_volume", map[string]any{"name": "data"})
	if res.IsError {
		t.Fatal(text(res))
	}
	var v volumeOut
	structured(t, res, &v)
	if v != (volumeOut{VolumeID: "vol-1", Name: "data", SizeMB: 1024}) {
		t.Errorf("create: %+v", v)
	}
	if got := text(res); !strings.Contains(got, "vol-1") || !strings.Contains(got, `"name": "data"`) {
		t.Errorf("create text does not say the id and how to mount it: %q", got)
	}
	res = call(t, cs, "create_volume", map[string]any{"name": "big", "size_mb": 4096})
	structured(t, res, &v)
	if res.IsError || v.SizeMB != 4096 {
		t.Errorf("create with size_mb: %+v %s", v, text(res))
	}
	// The backend's refusal (a taken name) is a tool error that says why.
	res = call(t, cs, "create_volume", map[string]any{"name": "data"})
	if !res.IsError || !strings.Contains(text(res), "already exists") || !strings.Contains(text(res), `create volume "data"`) {
		t.Errorf("taken name: isError=%v %q", res.IsError, text(res))
	}
	// The schema refuses what cannot be a volume before the backend is asked.
	for _, args := range []map[string]any{{}, {"name": ""}, {"name": "x", "size_mb": 0}, {"name": "x", "size_mb": -5}} {
		if res := call(t, cs, "create_volume", args); !res.IsError {
			t.Errorf("create_volume %v accepted", args)
		}
	}
	if len(f.vols) != 2 {
		t.Errorf("backend holds %d volumes, want 2: %+v", len(f.vols), f.vols)
	}

	res = call(t, cs, "list_volumes", map[string]any{})
	var list listVolumesOut
	structured(t, res, &list)
	if res.IsError || len(list.Volumes) != 2 || list.Volumes[0].Name != "data" || list.Volumes[1].VolumeID != "vol-2" {
		t.Errorf("list: %+v %s", list, text(res))
	}
	if got := text(res); !strings.Contains(got, "VOLUME ID") || !regexp.MustCompile(`(?m)^vol-2 +big$`).MatchString(got) {
		t.Errorf("list text: %q", got)
	}

	// get_volume says the size the list leaves out; an unknown id is a tool error.
	res = call(t, cs, "get_volume", map[string]any{"volume_id": "vol-2"})
	structured(t, res, &v)
	if res.IsError || v != (volumeOut{VolumeID: "vol-2", Name: "big", SizeMB: 4096}) || !strings.Contains(text(res), "4096 MiB") {
		t.Errorf("get: %+v %q", v, text(res))
	}
	if res := call(t, cs, "get_volume", map[string]any{"volume_id": "vol-9"}); !res.IsError || !strings.Contains(text(res), "not found") {
		t.Errorf("get unknown: isError=%v %q", res.IsError, text(res))
	}

	res = call(t, cs, "delete_volume", map[string]any{"volume_id": "mounted"})
	if !res.IsError || !strings.Contains(text(res), "mounted by sandbox sb1") {
		t.Errorf("delete while mounted: isError=%v %q", res.IsError, text(res))
	}
	res = call(t, cs, "delete_volume", map[string]any{"volume_id": "mounted", "force": true})
	var d deleteVolumeOut
	structured(t, res, &d)
	if res.IsError || !d.Deleted || len(f.forced) != 1 || !f.forced[0] {
		t.Errorf("forced delete: %+v %s, forced %v", d, text(res), f.forced)
	}
	if res := call(t, cs, "delete_volume", map[string]any{}); !res.IsError {
		t.Error("delete_volume without volume_id accepted")
	}
}

func TestListVolumesEmpty(t *testing.T) {
	res := call(t, connectClient(t, &volumeBackend{}), "list_volumes", map[string]any{})
	var list listVolumesOut
	structured(t, res, &list)
	if res.IsError || list.Volumes == nil || len(list.Volumes) != 0 || !strings.Contains(text(res), "No volumes") {
		t.Errorf("empty list: %+v %q", list, text(res))
	}
}

func TestCreateSandboxVolumeMounts(t *testing.T) {
	f := &volumeBackend{}
	cs := connectClient(t, f)
	mounts := []map[string]any{{"name": "data", "path": "/mnt/data"}, {"name": "cache", "path": "/home/user/.cache"}}
	res := call(t, cs, "create_sandbox", map[string]any{"volume_mounts": mounts})
	if res.IsError {
		t.Fatal(text(res))
	}
	want := []VolumeMount{{Name: "data", Path: "/mnt/data"}, {Name: "cache", Path: "/home/user/.cache"}}
	if got := f.created[0].VolumeMounts; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("backend asked for %+v, want %+v", got, want)
	}
	var out sandboxOut
	structured(t, res, &out)
	if len(out.VolumeMounts) != 2 || out.VolumeMounts[1] != (volumeMount{Name: "cache", Path: "/home/user/.cache"}) {
		t.Errorf("out: %+v", out.VolumeMounts)
	}
	if got := text(res); !strings.Contains(got, "data at /mnt/data, cache at /home/user/.cache") {
		t.Errorf("text does not say the mounts: %q", got)
	}
	// Without mounts none are asked for, and the text says nothing of volumes.
	res = call(t, cs, "create_sandbox", map[string]any{})
	if f.created[1].VolumeMounts != nil || strings.Contains(text(res), "Volumes") {
		t.Errorf("no mounts: %+v %q", f.created[1].VolumeMounts, text(res))
	}
	for _, bad := range []any{
		[]map[string]any{{"name": "data"}},                  // path is required
		[]map[string]any{{"path": "/mnt"}},                  // name is required
		[]map[string]any{{"name": "", "path": "/mnt"}},      // and not empty
		[]map[string]any{{"name": "data", "path": ""}},      // nor this
		map[string]any{"name": "data", "path": "/mnt/data"}, // a list, not one mount
	} {
		if res := call(t, cs, "create_sandbox", map[string]any{"volume_mounts": bad}); !res.IsError {
			t.Errorf("volume_mounts %v accepted", bad)
		}
	}
	if len(f.created) != 2 {
		t.Errorf("backend called for invalid mounts: %d creates", len(f.created))
	}
}

// TestHTTPBackendVolumes: over the wire, create_sandbox's mounts reach the
// API as volumeMounts and the sandbox's reported mounts come back; the
// volume tools speak /volumes, and no tool output carries a volume's token.
func TestHTTPBackendVolumes(t *testing.T) {
	const token = "volume-token-must-not-leak"
	var createBody map[string]any
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.Method + " " + r.URL.Path {
		case "POST /v2/sandboxes":
			createBody = nil
			_ = json.NewDecoder(r.Body).Decode(&createBody)
			_ = json.NewEncoder(w).Encode(e2bwire.Sandbox{SandboxID: "sbv", EnvdAccessToken: "t"})
		case "GET /sandboxes/sbv":
			_ = json.NewEncoder(w).Encode(e2bwire.SandboxDetail{ListedSandbox: e2bwire.ListedSandbox{
				SandboxID: "sbv", TemplateID: "base", State: "running", StartedAt: time.Now(), EndAt: time.Now().Add(time.Minute),
				VolumeMounts: []e2bwire.SandboxVolumeMount{{Name: "data", Path: "/mnt/data"}}}})
		case "POST /volumes":
			var body e2bwire.NewVolume
			_ = json.NewDecoder(r.Body).Decode(&body)
			if body.Name == "bad name!" {
				w.WriteHeader(http.StatusBadRequest)
				_, _ = w.Write([]byte(`{"code":400,"message":"Invalid volume name \"bad name!\": use letters, digits, '_' and '-' only"}`))
				return
			}
			w.WriteHeader(http.StatusCreated)
			_ = json.NewEncoder(w).Encode(e2bwire.VolumeAndToken{VolumeID: "v1", Name: body.Name, Token: token, SizeMB: 16})
		case "GET /volumes":
			_ = json.NewEncoder(w).Encode([]e2bwire.Volume{{VolumeID: "v1", Name: "data"}})
		case "DELETE /volumes/v1":
			if r.URL.RawQuery != "force=true" {
				t.Errorf("delete query %q", r.URL.RawQuery)
			}
			w.WriteHeader(http.StatusNoContent)
		default:
			t.Errorf("unexpected %s %s", r.Method, r.URL)
			w.WriteHeader(http.StatusNotFound)
		}
	}))
	defer api.Close()
	cs := connectClient(t, NewHTTPBackend(e2bclient.Config{APIURL: api.URL, SandboxURL: "http://127.0.0.1:1", APIKey: "k"}))

	res := call(t, cs, "create_sandbox", map[string]any{"volume_mounts": []map[string]any{{"name": "data", "path": "/mnt/data"}}})
	if res.IsError {
		t.Fatal(text(res))
	}
	if got, _ := json.Marshal(createBody["volumeMounts"]); string(got) != `[{"name":"data","path":"/mnt/data"}]` {
		t.Errorf("volumeMounts on the wire: %s (body %v)", got, createBody)
	}
	var sb sandboxOut
	structured(t, res, &sb)
	if len(sb.VolumeMounts) != 1 || sb.VolumeMounts[0] != (volumeMount{Name: "data", Path: "/mnt/data"}) {
		t.Errorf("reported mounts: %+v", sb.VolumeMounts)
	}
	// Without mounts the field is left out, as the SDKs leave it.
	call(t, cs, "create_sandbox", map[string]any{})
	if _, ok := createBody["volumeMounts"]; ok {
		t.Errorf("volumeMounts sent without mounts: %v", createBody)
	}

	res = call(t, cs, "create_volume", map[string]any{"name": "data"})
	var v volumeOut
	structured(t, res, &v)
	if res.IsError || v != (volumeOut{VolumeID: "v1", Name: "data", SizeMB: 16}) {
		t.Errorf("create_volume: %+v %s", v, text(res))
	}
	if raw, _ := json.Marshal(res); strings.Contains(string(raw), token) {
		t.Errorf("create_volume shows the volume's token: %s", raw)
	}
	res = call(t, cs, "create_volume", map[string]any{"name": "bad name!"})
	if !res.IsError || !strings.Contains(text(res), "letters, digits, '_' and '-' only (HTTP 400)") {
		t.Errorf("bad name: isError=%v %q", res.IsError, text(res))
	}
	res = call(t, cs, "list_volumes", map[string]any{})
	var list listVolumesOut
	structured(t, res, &list)
	if res.IsError || len(list.Volumes) != 1 || list.Volumes[0] != (volumeOut{VolumeID: "v1", Name: "data"}) {
		t.Errorf("list_volumes: %+v %s", list, text(res))
	}
	if res := call(t, cs, "delete_volume", map[string]any{"volume_id": "v1", "force": true}); res.IsError {
		t.Errorf("delete_volume: %s", text(res))
	}
}
