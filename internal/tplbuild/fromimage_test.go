package tplbuild_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/testenv"
	"github.com/airlock-sandbox/airlock/internal/tplbuild"
)

// The build sandbox's container init re-executes the test binary.
func init() { linux.MaybeInit() }

// buildService is a Service over a real template store in the test data dir.
func buildService(t *testing.T, opts template.Options) (*tplbuild.Service, *template.Store) {
	t.Helper()
	opts.DataDir, opts.EnvdPath, opts.NoEgress = testenv.DataDir(), testenv.EnvdBinary(t), true
	st, err := template.Open(opts)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	s, err := tplbuild.Open(st, tplbuild.Options{Dir: filepath.Join(dir, "builds"), FilesDir: filepath.Join(dir, "files")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, st
}

// startBuild requests and starts a build of spec under a fresh name, removed
// at the end of the test.
func startBuild(t *testing.T, s *tplbuild.Service, st *template.Store, prefix string, spec tplbuild.Spec) (string, string) {
	t.Helper()
	name := fmt.Sprintf("test-%s-%d", prefix, time.Now().UnixNano()%1_000_000_000)
	t.Cleanup(func() {
		if err := st.Remove(context.Background(), name, nil); err != nil && !errors.Is(err, template.ErrNotFound) {
			t.Errorf("remove %s: %v", name, err)
		}
	})
	tpl, id, err := s.Request(tplbuild.Request{Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Start("", tpl, id, spec); err != nil {
		t.Fatal(err)
	}
	return tpl, id
}

// finished waits for a build to end and returns its status with its log.
func finished(t *testing.T, s *tplbuild.Service, tpl, id string, limit time.Duration) tplbuild.Status {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		st, err := s.Status("", tpl, id, 0, 10000)
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == tplbuild.StatusReady || st.Status == tplbuild.StatusError {
			return st
		}
		if time.Now().After(deadline) {
			t.Fatalf("build %s still %s after %v", id, st.Status, limit)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func logText(st tplbuild.Status) string {
	var b strings.Builder
	for _, e := range st.Entries {
		b.WriteString(e.Message + "\n")
	}
	return b.String()
}

// TestFromImageThroughMirror builds the SDK's
// Template().fromImage('ubuntu:22.04').runCmd(...) with a docker.io registry
// mirror: the in-process registry on 127.0.0.1 stands in for the operator's
// Docker Hub mirror, holding a small shell image as library/ubuntu:22.04.
func TestFromImageThroughMirror(t *testing.T) {
	testenv.NeedRoot(t)
	rootfs := testenv.BaseRootfs(t)
	hub := ocitest.Registry(t)
	// The marker carries the run's time so the image (and the layers keyed by
	// its digest) are new each run and the step really runs.
	marker := fmt.Sprintf("ubuntu from the mirror %d", time.Now().UnixNano())
	img := ocitest.ShellImage(t, rootfs, ociimage.Config{Env: []string{"PATH=/usr/bin:/bin"}}, []string{"/bin/bash", "/bin/cat"},
		map[string]string{"etc/marker": marker + "\n"})
	ocitest.Push(t, hub, "library/ubuntu:22.04", img)
	mirror, err := ociimage.ParseMirror("docker.io=http://" + hub)
	if err != nil {
		t.Fatal(err)
	}
	s, st := buildService(t, template.Options{RegistryMirrors: []ociimage.Mirror{mirror}})
	tpl, id := startBuild(t, s, st, "fromimage", tplbuild.Spec{FromImage: "ubuntu:22.04", Steps: []tplbuild.Step{
		{Type: "RUN", Args: []string{"cat /etc/marker > /copied && cat /copied"}},
	}})
	got := finished(t, s, tpl, id, 3*time.Minute)
	log := logText(got)
	if got.Status != tplbuild.StatusReady {
		t.Fatalf("status %s, reason %+v\n%s", got.Status, got.Reason, log)
	}
	if !strings.Contains(log, marker) || !strings.Contains(log, "registry mirror http://"+hub) {
		t.Errorf("the log lacks the image's marker %q or the mirror:\n%s", marker, log)
	}
	built, err := st.Get(tpl)
	if err != nil || built.Source.From != "ubuntu:22.04" {
		t.Errorf("template %+v: %v", built.Source, err)
	}
}

// offline fails every registry request as a refused dial would, so that a
// pull with no mirror is tried without leaving the host.
type offline struct{}

func (offline) RoundTrip(r *http.Request) (*http.Response, error) {
	return nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("no network in this test (" + r.URL.Host + ")")}
}

// TestFromImageUnreachable: a source image that cannot be fetched fails the
// build at once, with a reason naming the image and the cause, at the SDK's
// "base" step.
func TestFromImageUnreachable(t *testing.T) {
	testenv.NeedRoot(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close()
	down, err := ociimage.ParseMirror("docker.io=http://" + closed)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts template.Options
		want []string
	}{
		{"mirror down", template.Options{RegistryMirrors: []ociimage.Mirror{down}}, []string{"ubuntu:22.04", "registry mirror http://" + closed, "connection refused"}},
		{"no mirror", template.Options{ImageTransport: offline{}}, []string{"ubuntu:22.04", "registry unreachable", "no network in this test"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, st := buildService(t, tc.opts)
			start := time.Now()
			tpl, id := startBuild(t, s, st, "fromimage-down", tplbuild.Spec{FromImage: "ubuntu:22.04", Steps: []tplbuild.Step{{Type: "RUN", Args: []string{"true"}}}})
			got := finished(t, s, tpl, id, time.Minute)
			if got.Status != tplbuild.StatusError || got.Reason == nil || got.Reason.Step != "base" {
				t.Fatalf("status %s, reason %+v", got.Status, got.Reason)
			}
			for _, w := range tc.want {
				if !strings.Contains(got.Reason.Message, w) {
					t.Errorf("reason %q does not say %q", got.Reason.Message, w)
				}
			}
			t.Logf("failed after %v: %s", time.Since(start).Round(time.Millisecond), got.Reason.Message)
		})
	}
}
