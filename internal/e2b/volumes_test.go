package e2b

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// fakeVolumes is an in-memory VolumeService that fails the way
// volume.Service does (internal/volume tests the real one on btrfs).
type fakeVolumes struct {
	mu      sync.Mutex
	vols    map[string]volume.Volume
	mounted map[string][]string
	n       int
}

func (f *fakeVolumes) Create(_ context.Context, owner, name string, size int64) (volume.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := volume.ValidName(name); err != nil {
		return volume.Volume{}, err
	}
	if size > 64<<20 {
		return volume.Volume{}, fmt.Errorf("%w: size %d MiB is above this server's maximum of 64 MiB per volume", volume.ErrInvalid, size>>20)
	}
	for _, v := range f.vols {
		if v.Owner == owner && v.Name == name {
			return volume.Volume{}, fmt.Errorf("%w: Volume with name '%s' already exists", volume.ErrExists, name)
		}
	}
	if name == "huge" {
		return volume.Volume{}, fmt.Errorf("%w: quota of volume space reached: the team's volumes may total at most 8 MiB (8 MiB in use, 8 MiB asked)", volume.ErrNoSpace)
	}
	if len(f.vols) >= 3 {
		return volume.Volume{}, fmt.Errorf("%w: an API key may have at most 3 volumes", volume.ErrLimit)
	}
	f.n++
	if size == 0 {
		size = 8 << 20
	}
	v := volume.Volume{ID: fmt.Sprintf("vol-%d", f.n), Name: name, Owner: owner, Token: fmt.Sprintf("tok-%d", f.n), SizeBytes: size}
	f.vols[v.ID] = v
	return v, nil
}

func (f *fakeVolumes) List(_ context.Context, owner string) ([]volume.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []volume.Volume
	for i := 1; i <= f.n; i++ {
		if v, ok := f.vols[fmt.Sprintf("vol-%d", i)]; ok && v.Owner == owner {
			out = append(out, v)
		}
	}
	return out, nil
}

func (f *fakeVolumes) Get(_ context.Context, owner, id string) (volume.Volume, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	v, ok := f.vols[id]
	if !ok || v.Owner != owner {
		return volume.Volume{}, fmt.Errorf("%w: %s", volume.ErrNotFound, id)
	}
	return v, nil
}

func (f *fakeVolumes) Destroy(ctx context.Context, owner, id string, force bool) error {
	if _, err := f.Get(ctx, owner, id); err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if sb := f.mounted[id]; len(sb) > 0 && !force {
		return &volume.InUseError{VolumeID: id, Sandboxes: sb}
	}
	delete(f.vols, id)
	return nil
}

func TestVolumesAPI(t *testing.T) {
	fv := &fakeVolumes{vols: map[string]volume.Volume{}, mounted: map[string][]string{}}
	h, _ := newTestHandler(t, func(o *Options) {
		o.Authenticate = func(k string) bool { return k == testKey || k == otherKey }
		o.Volumes = fv
	})
	rec := request(t, h, "POST", "/volumes", `{"name":"data"}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	var created e2bwire.VolumeAndToken
	if err := json.Unmarshal(rec.Body.Bytes(), &created); err != nil {
		t.Fatal(err)
	}
	if created.VolumeID != "vol-1" || created.Name != "data" || created.Token != "tok-1" || created.SizeMB != 8 {
		t.Fatalf("created = %+v", created)
	}
	checkError(t, request(t, h, "POST", "/volumes", `{"name":"data"}`), http.StatusBadRequest, "Volume with name 'data' already exists")
	checkError(t, request(t, h, "POST", "/volumes", `{"name":"a b"}`), http.StatusBadRequest, "Invalid volume name...")
	checkError(t, request(t, h, "POST", "/volumes", `{}`), http.StatusBadRequest, "name is required...")
	checkError(t, request(t, h, "POST", "/volumes", ``), http.StatusBadRequest, "name is required...")
	checkError(t, request(t, h, "POST", "/volumes", `{"name":`), http.StatusBadRequest, "...")
	checkError(t, request(t, h, "POST", "/volumes", `{"name":"x","sizeMB":0}`), http.StatusBadRequest, "sizeMB must be a positive number of MiB")
	checkError(t, request(t, h, "POST", "/volumes", `{"name":"x","sizeMB":-5}`), http.StatusBadRequest, "sizeMB must be a positive number of MiB")
	checkError(t, request(t, h, "POST", "/volumes", `{"name":"x","sizeMB":"big"}`), http.StatusBadRequest, "...")
	checkError(t, request(t, h, "POST", "/volumes", `{"name":"x","sizeMB":65}`), http.StatusBadRequest, "size 65 MiB is above...")
	if rec := request(t, h, "POST", "/volumes", `{"name":"sized","sizeMB":16}`); rec.Code != http.StatusCreated || !strings.Contains(rec.Body.String(), `"sizeMB":16`) {
		t.Fatalf("sized create: %d %s", rec.Code, rec.Body)
	}
	// Same name under another key is another volume.
	if rec := request(t, h, "POST", "/volumes", `{"name":"data"}`, "X-API-KEY", otherKey); rec.Code != http.StatusCreated {
		t.Fatalf("other key's create: %d %s", rec.Code, rec.Body)
	}
	checkError(t, request(t, h, "POST", "/volumes", `{"name":"more"}`), http.StatusTooManyRequests, "an API key may have at most 3 volumes")
	checkError(t, request(t, h, "POST", "/volumes", `{"name":"huge"}`), http.StatusInsufficientStorage, "quota of volume space reached: the team's volumes may total at most 8 MiB (8 MiB in use, 8 MiB asked)")

	rec = request(t, h, "GET", "/volumes", "")
	if rec.Code != http.StatusOK || rec.Body.String() != `[{"volumeID":"vol-1","name":"data"},{"volumeID":"vol-2","name":"sized"}]`+"\n" {
		t.Fatalf("list: %d %s", rec.Code, rec.Body)
	}
	rec = request(t, h, "GET", "/volumes/vol-1", "")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"token":"tok-1"`) {
		t.Fatalf("get: %d %s", rec.Code, rec.Body)
	}
	checkError(t, request(t, h, "GET", "/volumes/vol-1", "", "X-API-KEY", otherKey), http.StatusNotFound, `volume "vol-1" not found`)
	checkError(t, request(t, h, "DELETE", "/volumes/vol-1", "", "X-API-KEY", otherKey), http.StatusNotFound, `volume "vol-1" not found`)
	checkError(t, request(t, h, "GET", "/volumes/nope", ""), http.StatusNotFound, `volume "nope" not found`)
	checkError(t, request(t, h, "GET", "/volumes", "", "X-API-KEY", ""), http.StatusUnauthorized, "...")

	fv.mounted["vol-1"] = []string{"sbx-a", "sbx-b"}
	checkError(t, request(t, h, "DELETE", "/volumes/vol-1", ""), http.StatusConflict, "volume vol-1 is mounted by sandbox(es) sbx-a, sbx-b...")
	checkError(t, request(t, h, "DELETE", "/volumes/vol-1?force=maybe", ""), http.StatusBadRequest, `force must be true or false, not "maybe"`)
	if rec := request(t, h, "DELETE", "/volumes/vol-1?force=true", ""); rec.Code != http.StatusNoContent || rec.Body.Len() != 0 {
		t.Fatalf("forced delete: %d %s", rec.Code, rec.Body)
	}
	checkError(t, request(t, h, "DELETE", "/volumes/vol-1", ""), http.StatusNotFound, `volume "vol-1" not found`)
}

func TestVolumesAPIWithoutService(t *testing.T) {
	h, _ := newTestHandler(t)
	for _, m := range []string{"GET /volumes", "POST /volumes", "GET /volumes/x", "DELETE /volumes/x"} {
		method, path, _ := strings.Cut(m, " ")
		checkError(t, request(t, h, method, path, `{"name":"x"}`), http.StatusNotImplemented, "volumes are not available on this server...")
	}
}
