package registry

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

// TestPull: go-containerregistry's client pulls a template's image from
// the store whole (every layer's digest checked by validate.Image), many
// pulls at once build it once, and every error is the API's.
func TestPull(t *testing.T) {
	img, err := random.Image(4096, 3)
	if err != nil {
		t.Fatal(err)
	}
	var builds atomic.Int32
	s := &Store{Dir: t.TempDir(), Build: func(_ context.Context, n, tag string) (v1.Image, error) {
		if n != "airlock/base" || tag != "v1" {
			return nil, ErrNotFound
		}
		builds.Add(1)
		return img, nil
	}}
	srv := httptest.NewServer(s)
	defer srv.Close()
	host := strings.TrimPrefix(srv.URL, "http://")
	ref, err := name.ParseReference(host+"/airlock/base:v1", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			got, err := remote.Image(ref)
			if err != nil {
				t.Error(err)
				return
			}
			if err := validate.Image(got); err != nil {
				t.Error(err)
			}
			want, _ := img.Digest()
			if d, _ := got.Digest(); d != want {
				t.Errorf("digest %s, want %s", d, want)
			}
		})
	}
	wg.Wait()
	if n := builds.Load(); n != 1 {
		t.Errorf("built %d times, want once", n)
	}
	want, _ := img.Digest()
	byDigest, err := name.ParseReference(host+"/airlock/base@"+want.String(), name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Image(byDigest); err != nil {
		t.Errorf("by digest: %v", err)
	}

	for _, c := range []struct {
		method, path string
		status       int
		code         string
	}{
		{"GET", "/v2/", 200, ""},
		{"HEAD", "/v2/airlock/base/manifests/v1", 200, ""},
		{"GET", "/v2/airlock/nosuch/manifests/v1", 404, "MANIFEST_UNKNOWN"},
		{"GET", "/v2/airlock/base/manifests/sha256:" + strings.Repeat("0", 64), 404, "MANIFEST_UNKNOWN"},
		{"GET", "/v2/airlock/base/manifests/bad:tag", 400, "TAG_INVALID"},
		{"GET", "/v2/Airlock/BASE/manifests/v1", 400, "NAME_INVALID"},
		{"GET", "/v2/airlock/base/blobs/sha256:" + strings.Repeat("0", 64), 404, "BLOB_UNKNOWN"},
		{"GET", "/v2/airlock/base/blobs/../../etc/passwd", 404, "BLOB_UNKNOWN"},
		{"PUT", "/v2/airlock/base/manifests/v2", 405, "UNSUPPORTED"},
		{"GET", "/elsewhere", 404, "NAME_UNKNOWN"},
	} {
		req, _ := http.NewRequest(c.method, srv.URL+c.path, nil)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Errors []struct{ Code, Message string }
		}
		_ = json.NewDecoder(res.Body).Decode(&body)
		res.Body.Close()
		if res.StatusCode != c.status || (c.code != "" && (len(body.Errors) != 1 || body.Errors[0].Code != c.code || body.Errors[0].Message == "")) {
			t.Errorf("%s %s: %d %+v, want %d %s", c.method, c.path, res.StatusCode, body, c.status, c.code)
		}
	}
}

// TestRestart: a store over the same directory serves the images an
// earlier one made, without making them again; two tags made at once are
// both kept.
func TestRestart(t *testing.T) {
	dir := t.TempDir()
	imgs := map[string]v1.Image{}
	for _, tag := range []string{"a", "b"} {
		img, err := random.Image(1024, 2)
		if err != nil {
			t.Fatal(err)
		}
		imgs[tag] = img
	}
	first := &Store{Dir: dir, Build: func(_ context.Context, _, tag string) (v1.Image, error) {
		if img, ok := imgs[tag]; ok {
			return img, nil
		}
		return nil, ErrNotFound
	}}
	var wg sync.WaitGroup
	for tag := range imgs {
		wg.Go(func() {
			if _, err := first.Tag(context.Background(), "airlock/base", tag); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	second := &Store{Dir: dir, Build: func(context.Context, string, string) (v1.Image, error) {
		t.Error("the restarted store made an image again")
		return nil, ErrNotFound
	}}
	srv := httptest.NewServer(second)
	defer srv.Close()
	for tag, img := range imgs {
		ref, err := name.ParseReference(strings.TrimPrefix(srv.URL, "http://")+"/airlock/base:"+tag, name.Insecure)
		if err != nil {
			t.Fatal(err)
		}
		got, err := remote.Image(ref)
		if err != nil {
			t.Fatalf("%s after a restart: %v", tag, err)
		}
		want, _ := img.Digest()
		if d, _ := got.Digest(); d != want {
			t.Errorf("%s: digest %s, want %s", tag, d, want)
		}
	}
}
