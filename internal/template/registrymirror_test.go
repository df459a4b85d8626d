package template_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestBuildThroughRegistryMirror builds `FROM ubuntu:22.04` and `FROM
// e2bdev/base:latest` (Docker Hub names) with a docker.io registry mirror, and
// runs a step in each. Docker Hub is never reached: the in-process registry on
// 127.0.0.1 stands in for the operator's Docker Hub mirror, holding images made
// here (a /bin/sh, cat and their libraries from the base template's rootfs, and
// an /etc/marker) under Docker Hub's paths library/ubuntu:22.04 and
// e2bdev/base:latest.
func TestBuildThroughRegistryMirror(t *testing.T) {
	testenv.NeedRoot(t)
	rootfs := testenv.BaseRootfs(t)
	hub := ocitest.Registry(t) // stands in for the Docker Hub mirror
	// The markers carry the run's time so the images (and the layers keyed
	// by their digests) are new each run and the RUN steps really run.
	nonce := time.Now().UnixNano()
	images := map[string]string{
		"library/ubuntu:22.04": fmt.Sprintf("ubuntu:22.04 from the mirror %d", nonce),
		"e2bdev/base:latest":   fmt.Sprintf("e2bdev/base from the mirror %d", nonce),
	}
	for repo, marker := range images {
		img := ocitest.ShellImage(t, rootfs, ociimage.Config{Env: []string{"PATH=/usr/bin:/bin"}}, []string{"/bin/cat"},
			map[string]string{"etc/marker": marker + "\n"})
		ocitest.Push(t, hub, repo, img)
	}
	mirror, err := ociimage.ParseMirror("docker.io=http://" + hub)
	if err != nil {
		t.Fatal(err)
	}
	s, err := template.Open(template.Options{
		DataDir: testenv.DataDir(), EnvdPath: testenv.EnvdBinary(t), NoEgress: true,
		RegistryMirrors: []ociimage.Mirror{mirror},
	})
	if err != nil {
		t.Fatal(err)
	}
	for from, repo := range map[string]string{"ubuntu:22.04": "library/ubuntu:22.04", "e2bdev/base:latest": "e2bdev/base:latest"} {
		name := uniqueName(t, s, "regmirror")
		start := time.Now()
		tpl, out := build(t, s, template.BuildRequest{Name: name, Dockerfile: []byte("FROM " + from + "\nRUN cat /etc/marker\n")})
		t.Logf("FROM %s through the mirror: %v, %d layers", from, time.Since(start).Round(time.Millisecond), len(tpl.Layers))
		log, err := os.ReadFile(tpl.BuildLog)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(log), images[repo]) || !strings.Contains(string(log), "pulling through the registry mirror http://"+hub) {
			t.Errorf("FROM %s: the build log lacks the mirror's marker %q or the mirror:\n%s", from, images[repo], log)
		}
		if !strings.Contains(out, "from the registry mirror http://"+hub) {
			t.Errorf("FROM %s: the build output does not say it used the mirror:\n%s", from, out)
		}
		if tpl.Source.From != from {
			t.Errorf("FROM %s: source %+v", from, tpl.Source)
		}
	}

	// The mirror down: the build fails at once, naming the image and the
	// mirror; Docker Hub is not tried instead.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := ln.Addr().String()
	ln.Close()
	downMirror, err := ociimage.ParseMirror("docker.io=http://" + down)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := template.Open(template.Options{DataDir: testenv.DataDir(), EnvdPath: testenv.EnvdBinary(t), NoEgress: true, RegistryMirrors: []ociimage.Mirror{downMirror}})
	if err != nil {
		t.Fatal(err)
	}
	name := uniqueName(t, s2, "regmirror-down")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	start := time.Now()
	_, err = s2.Build(ctx, template.BuildRequest{Name: name, Dockerfile: []byte("FROM ubuntu:22.04\nRUN cat /etc/marker\n")}, &out)
	if !errors.Is(err, ociimage.ErrUnreachable) {
		t.Fatalf("build with the mirror down: %v\n%s", err, out.String())
	}
	for _, want := range []string{"FROM ubuntu:22.04", "registry mirror http://" + down, "connection refused"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("build with the mirror down: %q does not say %q", err, want)
		}
	}
	t.Logf("mirror down, failed after %v: %v", time.Since(start).Round(time.Millisecond), err)
}
