package daemon_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestServeRegistryMirror: serve's registry mirrors reach the server's template
// store, whose builds pull FROM ubuntu:22.04 through them. The in-process
// registry on 127.0.0.1 stands in for the operator's Docker Hub mirror.
func TestServeRegistryMirror(t *testing.T) {
	testenv.NeedRoot(t)
	hub := ocitest.Registry(t) // stands in for the Docker Hub mirror
	marker := fmt.Sprintf("served through the mirror %d", time.Now().UnixNano())
	ocitest.Push(t, hub, "library/ubuntu:22.04", ocitest.ShellImage(t, testenv.BaseRootfs(t),
		ociimage.Config{Env: []string{"PATH=/usr/bin:/bin"}}, []string{"/bin/cat"}, map[string]string{"etc/marker": marker + "\n"}))
	mirrors, err := ociimage.ParseMirrors([]string{"docker.io=http://" + hub})
	if err != nil {
		t.Fatal(err)
	}
	d := daemontest.Start(t, func(c *daemon.Config) { c.RegistryMirrors = mirrors })
	if got := d.Templates.ImageOptions().Mirrors; len(got) != 1 || got[0] != mirrors[0] {
		t.Fatalf("the template store's mirrors: %v, want %v", got, mirrors)
	}
	name := fmt.Sprintf("test-servemirror-%d", time.Now().UnixNano()%1_000_000_000)
	t.Cleanup(func() {
		if err := d.Templates.Remove(context.Background(), name, nil); err != nil && !errors.Is(err, template.ErrNotFound) {
			t.Errorf("remove %s: %v", name, err)
		}
	})
	var out bytes.Buffer
	tpl, err := d.Templates.Build(context.Background(), template.BuildRequest{Name: name, Dockerfile: []byte("FROM ubuntu:22.04\nRUN cat /etc/marker\n")}, &out)
	if err != nil {
		t.Fatalf("build through the server's mirror: %v\n%s", err, out.String())
	}
	if log, err := os.ReadFile(tpl.BuildLog); err != nil || !strings.Contains(string(log), marker) {
		t.Errorf("build log lacks %q (%v):\n%s", marker, err, log)
	}
}
