package template_test

import (
	"bytes"
	"context"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestBuildFromRegistryWithBasicAuth builds FROM an image on a registry that
// requires basic auth, with BuildRequest.Keychain carrying the credentials
// (what the E2B SDK's fromImage(image, {username, password}) becomes); the
// same build without them, or with a wrong password, fails naming the image
// and the registry's refusal.
func TestBuildFromRegistryWithBasicAuth(t *testing.T) {
	testenv.NeedRoot(t)
	rootfs := testenv.BaseRootfs(t)
	h := registry.New(registry.Logger(log.New(io.Discard, "", 0)), registry.WithBlobHandler(registry.NewDiskBlobHandler(t.TempDir())))
	// Pushes go to an open listener on the same registry; builds use the
	// one that asks for a password.
	open := httptest.NewServer(h)
	t.Cleanup(open.Close)
	guarded := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != "builder" || p != "s3cret" {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`, http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(guarded.Close)
	marker := "private " + time.Now().String() + "\n"
	img := ocitest.ShellImage(t, rootfs, ociimage.Config{Env: []string{"PATH=/usr/bin:/bin"}}, []string{"/bin/cat"},
		map[string]string{"etc/marker": marker})
	ocitest.Push(t, strings.TrimPrefix(open.URL, "http://"), "team/tool:1", img)
	ref := strings.TrimPrefix(guarded.URL, "http://") + "/team/tool:1"

	s, err := template.Open(template.Options{DataDir: testenv.DataDir(), EnvdPath: testenv.EnvdBinary(t), NoEgress: true})
	if err != nil {
		t.Fatal(err)
	}

	good, err := ociimage.BasicAuthFor(ref, "builder", "s3cret")
	if err != nil {
		t.Fatal(err)
	}
	tpl, _ := build(t, s, template.BuildRequest{Name: uniqueName(t, s, "regauth"), Dockerfile: []byte("FROM " + ref + "\n"), Keychain: good})
	if tpl.Source.From != ref {
		t.Errorf("source %+v", tpl.Source)
	}
	if got, err := os.ReadFile(filepath.Join(tpl.RootFS, "etc/marker")); err != nil || string(got) != marker {
		t.Errorf("the pulled image's /etc/marker: %q, %v; want %q", got, err, marker)
	}

	wrong, err := ociimage.BasicAuthFor(ref, "builder", "wrong")
	if err != nil {
		t.Fatal(err)
	}
	for what, req := range map[string]template.BuildRequest{
		"no credentials":   {Dockerfile: []byte("FROM " + ref + "\n")},
		"a wrong password": {Dockerfile: []byte("FROM " + ref + "\n"), Keychain: wrong},
	} {
		req.Name = uniqueName(t, s, "regauth-bad")
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var out bytes.Buffer
		_, err := s.Build(ctx, req, &out)
		cancel()
		if err == nil || !strings.Contains(err.Error(), ref) || !strings.Contains(err.Error(), "UNAUTHORIZED") {
			t.Errorf("%s: %v; want an error naming %s and UNAUTHORIZED", what, err, ref)
		}
	}
}
