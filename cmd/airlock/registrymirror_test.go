package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func TestRegistryMirrorSetting(t *testing.T) {
	t.Setenv(registryMirrorEnv, "")
	ms, err := registryMirrors([]string{"docker.io=http://127.0.0.1:5000", "ghcr.io=https://mirror.example.com"})
	want := []ociimage.Mirror{{Registry: "docker.io", Host: "127.0.0.1:5000", PlainHTTP: true}, {Registry: "ghcr.io", Host: "mirror.example.com"}}
	if err != nil || fmt.Sprint(ms) != fmt.Sprint(want) {
		t.Errorf("flags: %v, %v; want %v", ms, err, want)
	}
	if ms, err := registryMirrors(nil); err != nil || len(ms) != 0 {
		t.Errorf("nothing set: %v, %v", ms, err)
	}
	_, err = registryMirrors([]string{"docker.io=127.0.0.1:5000"})
	if err == nil || !strings.Contains(err.Error(), "--registry-mirror") || !strings.Contains(err.Error(), "http://") {
		t.Errorf("malformed flag: %v", err)
	}

	t.Setenv(registryMirrorEnv, "docker.io=http://127.0.0.1:5000, quay.io=https://q.example.com")
	if ms, err := registryMirrors(nil); err != nil || len(ms) != 2 || ms[1].Registry != "quay.io" {
		t.Errorf("from $%s: %v, %v", registryMirrorEnv, ms, err)
	}
	if ms, err := registryMirrors([]string{"docker.io=http://127.0.0.1:6000"}); err != nil || len(ms) != 1 || ms[0].Host != "127.0.0.1:6000" {
		t.Errorf("the flag does not win over $%s: %v, %v", registryMirrorEnv, ms, err)
	}
	t.Setenv(registryMirrorEnv, "docker.io")
	if _, err := registryMirrors(nil); err == nil || !strings.Contains(err.Error(), registryMirrorEnv) {
		t.Errorf("malformed $%s: %v", registryMirrorEnv, err)
	}
}

// TestTemplateBuildRegistryMirror runs the real `airlock template build` of a
// Dockerfile FROM ubuntu:22.04 with --registry-mirror docker.io=http://<loopback>.
// The in-process registry on 127.0.0.1 stands in for the operator's Docker Hub
// mirror; it holds, as library/ubuntu:22.04, an image made here (sh, cat and
// their libraries from the base template, and /etc/marker). Docker Hub is
// never reached.
func TestTemplateBuildRegistryMirror(t *testing.T) {
	bin := os.Getenv("AIRLOCK_BIN")
	if bin == "" {
		testenv.Missing(t, "AIRLOCK_BIN is not set: this test runs `airlock template build` (make build, then AIRLOCK_BIN=$PWD/bin/airlock)")
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(bin, args...)
		cmd.Env = append(os.Environ(), registryMirrorEnv+"=")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	// Bad values are refused before anything starts, by both commands.
	for _, args := range [][]string{
		{"template", "build", "--data-dir", t.TempDir(), "--registry-mirror", "docker.io=127.0.0.1:5000", t.TempDir()},
		{"serve", "--data-dir", t.TempDir(), "--registry-mirror", "docker.io"},
	} {
		out, err := run(args...)
		if err == nil || !strings.Contains(out, "--registry-mirror") || !strings.Contains(out, "invalid registry mirror") {
			t.Errorf("airlock %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}

	testenv.NeedRoot(t)
	hub := ocitest.Registry(t) // stands in for the Docker Hub mirror
	marker := fmt.Sprintf("ubuntu:22.04 from the mirror %d", time.Now().UnixNano())
	ocitest.Push(t, hub, "library/ubuntu:22.04", ocitest.ShellImage(t, testenv.BaseRootfs(t),
		ociimage.Config{Env: []string{"PATH=/usr/bin:/bin"}}, []string{"/bin/cat"}, map[string]string{"etc/marker": marker + "\n"}))
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte("FROM ubuntu:22.04\nRUN cat /etc/marker\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	name := fmt.Sprintf("test-climirror-%d", time.Now().UnixNano()%1_000_000_000)
	data := testenv.DataDir()
	t.Cleanup(func() {
		if out, err := run("template", "rm", "--data-dir", data, name); err != nil {
			t.Errorf("template rm %s: %v\n%s", name, err, out)
		}
	})
	start := time.Now()
	out, err := run("template", "build", "--data-dir", data, "--name", name, "--registry-mirror", "docker.io=http://"+hub, dir)
	if err != nil {
		t.Fatalf("airlock template build through the mirror: %v\n%s", err, out)
	}
	t.Logf("airlock template build FROM ubuntu:22.04 through the mirror: %v", time.Since(start).Round(time.Millisecond))
	// A kept build's log is templates/<name>/build-<buildID>.log.
	logs, _ := filepath.Glob(filepath.Join(data, "templates", name, "build-*.log"))
	if len(logs) != 1 {
		t.Fatalf("build logs of %s: %v, want one", name, logs)
	}
	log, err := os.ReadFile(logs[0])
	if err != nil || !strings.Contains(string(log), marker) {
		t.Errorf("build log lacks %q (%v):\n%s", marker, err, log)
	}
}
