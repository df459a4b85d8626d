package linux_test

import (
	"os"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// ProbeRootfs makes a sandbox root's mounts, checks them and leaves none.
func TestProbeRootfs(t *testing.T) {
	testenv.NeedRoot(t)
	dir := t.TempDir()
	if err := linux.ProbeRootfs(dir); err != nil {
		t.Fatal(err)
	}
	mounts, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(mounts), dir) {
		t.Errorf("ProbeRootfs left a mount under %s", dir)
	}
	if err := linux.ProbeRootfs(dir + "/nonexistent/\x00"); err == nil {
		t.Error("ProbeRootfs of an impossible path succeeded")
	}
}
