package e2bclient

import (
	"context"
	"errors"
	"net/http"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// TestVolumes: the volume calls send upstream's bodies (sizeMB only when
// asked for), read the answers, and turn refusals into *Error.
func TestVolumes(t *testing.T) {
	var bodies []string
	srv := apiServer(t, map[string]http.HandlerFunc{
		"POST /volumes": func(w http.ResponseWriter, r *http.Request) {
			b := jsonText(body(t, r))
			bodies = append(bodies, b)
			if b == `{"name":"taken"}` {
				writeJSON(w, http.StatusBadRequest, e2bwire.Error{Code: 400, Message: "Volume with name 'taken' already exists"})
				return
			}
			writeJSON(w, http.StatusCreated, e2bwire.VolumeAndToken{VolumeID: "v1", Name: "data", Token: "secret", SizeMB: 64})
		},
		"GET /volumes": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, []e2bwire.Volume{{VolumeID: "v1", Name: "data"}, {VolumeID: "v2", Name: "more"}})
		},
		"GET /volumes/v1": func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusOK, e2bwire.VolumeAndToken{VolumeID: "v1", Name: "data", Token: "secret", SizeMB: 64})
		},
		"DELETE /volumes/v1": func(w http.ResponseWriter, r *http.Request) {
			if got := r.URL.RawQuery; got != "" {
				t.Errorf("delete without force: query %q", got)
			}
			writeJSON(w, http.StatusConflict, e2bwire.Error{Code: 409, Message: "volume v1 is mounted by sandbox abc"})
		},
		"DELETE /volumes/v2": func(w http.ResponseWriter, r *http.Request) {
			if got := r.URL.RawQuery; got != "force=true" {
				t.Errorf("delete with force: query %q", got)
			}
			w.WriteHeader(http.StatusNoContent)
		},
	})
	c := New(Config{APIURL: srv.URL, APIKey: testKey})
	ctx := context.Background()

	v, err := c.CreateVolume(ctx, "data", 0)
	if err != nil || v.VolumeID != "v1" || v.Token != "secret" || v.SizeMB != 64 {
		t.Fatalf("create: %+v, %v", v, err)
	}
	if _, err := c.CreateVolume(ctx, "sized", 32); err != nil {
		t.Fatal(err)
	}
	var e *Error
	if _, err := c.CreateVolume(ctx, "taken", 0); !errors.As(err, &e) || e.Status != 400 || e.Message != "Volume with name 'taken' already exists" {
		t.Errorf("taken name: %#v", err)
	}
	want := []string{`{"name":"data"}`, `{"name":"sized","sizeMB":32}`, `{"name":"taken"}`}
	if len(bodies) != len(want) {
		t.Fatalf("bodies %q", bodies)
	}
	for i := range want {
		if bodies[i] != want[i] {
			t.Errorf("body %d: %s, want %s", i, bodies[i], want[i])
		}
	}

	vs, err := c.ListVolumes(ctx)
	if err != nil || len(vs) != 2 || vs[1].VolumeID != "v2" || vs[1].Name != "more" {
		t.Fatalf("list: %+v, %v", vs, err)
	}
	if g, err := c.GetVolume(ctx, "v1"); err != nil || g.Name != "data" || g.SizeMB != 64 {
		t.Fatalf("get: %+v, %v", g, err)
	}
	if err := c.DeleteVolume(ctx, "v1", false); !errors.As(err, &e) || e.Status != 409 {
		t.Errorf("delete a mounted volume: %#v", err)
	}
	if err := c.DeleteVolume(ctx, "v2", true); err != nil {
		t.Errorf("forced delete: %v", err)
	}
}
