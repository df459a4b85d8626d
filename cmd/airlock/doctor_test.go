package main

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// runDoctor runs `airlock doctor` in process with args, on a data dir not
// made yet and ports nothing holds.
func runDoctor(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := doctorCmd()
	var out bytes.Buffer
	cmd.SetOut(&out)
	cmd.SetArgs(append([]string{"--data-dir", filepath.Join(t.TempDir(), "data"),
		"--api-addr", "127.0.0.1:0", "--sandbox-addr", "127.0.0.1:0", "--metrics-addr", "127.0.0.1:0"}, args...))
	err := cmd.Execute()
	return out.String(), err
}

// `airlock doctor` passes on the test host (set up by scripts/setup.sh) and
// fails, naming the tool and its fix, with btrfs-progs' mkfs.btrfs missing
// from PATH on a new data dir.
func TestDoctorCommand(t *testing.T) {
	testenv.NeedRoot(t)
	out, err := runDoctor(t)
	if err != nil {
		t.Fatalf("doctor on the test host: %v\n%s", err, out)
	}
	if !strings.Contains(out, "✔ kernel:") || strings.Contains(out, "✖") {
		t.Errorf("doctor on the test host:\n%s", out)
	}

	t.Setenv("PATH", t.TempDir())
	out, err = runDoctor(t)
	if !errors.Is(err, errDoctorFailed) {
		t.Fatalf("doctor without mkfs.btrfs on PATH returned %v\n%s", err, out)
	}
	for _, want := range []string{"✖ disk pool:", "mkfs.btrfs", "fix: install btrfs-progs", "serving would fail"} {
		if !strings.Contains(out, want) {
			t.Errorf("doctor without mkfs.btrfs on PATH does not say %q:\n%s", want, out)
		}
	}
	if out, err = runDoctor(t, "--disk-quota=false"); err != nil {
		t.Errorf("doctor without mkfs.btrfs but --disk-quota=false: %v\n%s", err, out)
	}
}
