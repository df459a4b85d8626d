package mountutil

import (
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func TestIsMountPoint(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to bind mount")
	}
	dir := filepath.Join(t.TempDir(), "m")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	check := func(path string, want bool) {
		t.Helper()
		got, err := IsMountPoint(path)
		if err != nil || got != want {
			t.Fatalf("IsMountPoint(%s) = %v, %v; want %v", path, got, err, want)
		}
	}
	check(dir, false)
	check(filepath.Join(dir, "absent"), false)
	if err := unix.Mount(dir, dir, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = Unmount(dir) })
	check(dir, true)
	if len(MountedUnder(dir)) != 1 {
		t.Fatalf("MountedUnder(%s) = %v, want the bind mount", dir, MountedUnder(dir))
	}
	if err := Unmount(dir); err != nil {
		t.Fatal(err)
	}
	check(dir, false)
}
