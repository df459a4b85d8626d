package lxcfs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestEnsureStartsAndRestarts: Ensure starts lxcfs on an empty mount point,
// is a no-op while it lives, and after the daemon dies (its mount then answers
// ENOTCONN) replaces it with a new one.
func TestEnsureStartsAndRestarts(t *testing.T) {
	testenv.NeedRoot(t)
	if _, err := os.Stat("/dev/fuse"); err != nil {
		t.Skipf("no /dev/fuse: %v", err)
	}
	s := &Service{Dir: filepath.Join(t.TempDir(), "lxcfs")}
	t.Cleanup(func() {
		if pid := s.Pid(); pid > 0 {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		_ = unix.Unmount(s.Dir, unix.MNT_DETACH)
		_ = os.Remove(s.pidFile())
	})
	if err := s.Ensure(); err != nil {
		if os.Getenv("AIRLOCK_TEST_REQUIRE") != "1" && strings.Contains(err.Error(), "executable file not found") {
			t.Skip(err)
		}
		t.Fatal(err)
	}
	first := s.Pid()
	if first <= 0 {
		t.Fatalf("no pid in %s", s.pidFile())
	}
	meminfo := func() string {
		t.Helper()
		b, err := os.ReadFile(filepath.Join(s.Dir, "proc", "meminfo"))
		if err != nil {
			t.Fatalf("read through lxcfs: %v", err)
		}
		return string(b)
	}
	if !strings.HasPrefix(meminfo(), "MemTotal:") {
		t.Fatalf("meminfo through lxcfs: %q", meminfo())
	}
	if err := s.Ensure(); err != nil || s.Pid() != first {
		t.Fatalf("second Ensure: %v, pid %d (was %d); want the running one kept", err, s.Pid(), first)
	}

	if err := unix.Kill(first, unix.SIGKILL); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for s.live() == nil {
		if time.Now().After(deadline) {
			t.Fatal("the mount still answers 5 s after its daemon was killed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := s.Ensure(); err != nil {
		t.Fatalf("Ensure after the daemon died: %v", err)
	}
	if s.Pid() == first || s.Pid() <= 0 {
		t.Fatalf("pid %d after restart (was %d)", s.Pid(), first)
	}
	if !strings.HasPrefix(meminfo(), "MemTotal:") {
		t.Fatalf("meminfo after restart: %q", meminfo())
	}
}
