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
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
)

// NeedRoot stops a test that needs root (namespaces, mounts, cgroups).
func NeedRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		missing(t, "test needs root")
	}
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
		envdErr = BuildEnvd(envdPath)
	})
	if envdErr != nil {
		t.Fatal(envdErr)
	}
	return envdPath
}

// Alive reports whether pid exists and is not a zombie: a killed process
// stays one until its parent reaps it.
func Alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and may
	// hold any of its own.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || !strings.HasPrefix(s[i:], ") Z")
}

// BuildEnvd builds cmd/envd from this source tree at path, as the Makefile
// does: with cgo (its pid 1 is C that runs before Go, cmd/envd/pid1.c),
// linked statically, with Go's own DNS resolver and user lookup, since it
// runs inside arbitrary root filesystems.
func BuildEnvd(path string) error {
	cmd := exec.Command("go", "build", "-tags", "netgo,osusergo", "-o", path, "github.com/airlock-sandbox/airlock/cmd/envd")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build envd: %w\n%s", err, out)
	}
	return nil
}

// NeedRunsc stops a test that needs gVisor's runsc (scripts/setup.sh builds it).
func NeedRunsc(t testing.TB) {
	t.Helper()
	if _, err := gvisor.Find(); err != nil {
		missing(t, err.Error())
	}
}

// Missing stops a test whose prerequisite this machine lacks: a skip, except
// in CI (AIRLOCK_TEST_REQUIRE=1), where a silently skipped test would hide a
// gap, so it fails.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	missing(t, fmt.Sprintf(format, args...))
}

// Eventually polls cond every 10 ms until it holds, failing the test if d
// passes first.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("timed out waiting for %s", what)
}
