// Package testenv gives tests the real things they need: root, a built base
// template and the envd binary. A test that lacks one skips locally and fails
// in CI (AIRLOCK_TEST_REQUIRE=1), saying what is missing.
package testenv

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
)

// NeedRoot stops a test that needs root (namespaces, mounts, cgroups).
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "test needs root")
	}
}

// Missing stops a test whose prerequisite (a language runtime, a built
// template) is absent: a skip locally, a failure in CI.
func Missing(t testing.TB, why string) {
	t.Helper()
	missing(t, why)
}

func missing(t testing.TB, why string) {
	t.Helper()
	if os.Getenv("AIRLOCK_TEST_REQUIRE") == "1" {
		t.Fatal(why)
	}
	t.Skip(why)
}

// DataDir is where tests find built templates: AIRLOCK_TEST_DATA_DIR, default
// /var/lib/airlock-test (outside the clone, so builds are cached across runs).
func DataDir() string {
	if d := os.Getenv("AIRLOCK_TEST_DATA_DIR"); d != "" {
		return d
	}
	return "/var/lib/airlock-test"
}

// BaseRootfs returns the root filesystem of the built base template. It does
// not build it (a minute or more): `make test` and `airlock template build base` do.
// It reads the store's record itself rather than importing internal/template,
// which would make every package whose tests use testenv depend on the builder.
func BaseRootfs(t testing.TB) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(DataDir(), "templates", "base", "template.json"))
	var rec struct {
		Key string `json:"key"`
	}
	if err == nil {
		err = json.Unmarshal(data, &rec)
	}
	rootfs := filepath.Join(DataDir(), "layers", rec.Key, "rootfs")
	if err == nil {
		_, err = os.Stat(rootfs)
	}
	if err != nil || rec.Key == "" {
		missing(t, fmt.Sprintf("base template not built in %s: run `bin/airlock template build base --data-dir %s`: %v", DataDir(), DataDir(), err))
	}
	return rootfs
}

var (
	envdOnce sync.Once
	envdPath string
	envdErr  error
)

// EnvdBinary returns a static envd binary: AIRLOCK_ENVD if set, else one built
// once per test process.
func EnvdBinary(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("AIRLOCK_ENVD"); p != "" {
		return p
	}
	envdOnce.Do(func() {
		dir, err := os.MkdirTemp("", "airlock-envd-")
		if err != nil {
			envdErr = err
			return
		}
		envdPath = filepath.Join(dir, "envd")
		cmd := exec.Command("go", "build", "-o", envdPath, "github.com/airlock-sandbox/airlock/cmd/envd")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			envdErr = err
			envdPath = string(out)
		}
	})
	if envdErr != nil {
		t.Fatalf("build envd: %v\n%s", envdErr, envdPath)
	}
	return envdPath
}

// NeedRunsc stops a test that needs gVisor's runsc (scripts/setup.sh builds it).
func NeedRunsc(t testing.TB) {
	t.Helper()
	if _, err := gvisor.Find(); err != nil {
		missing(t, err.Error())
	}
}
