package runtime

import (
	"crypto/rand"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

func writeRandom(t *testing.T, path string, n int) {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// DiskUsage counts the blocks files take, not their sizes (a sparse file
// costs nothing), down nested directories, and stops at a filesystem
// mounted inside (a frozen sandbox's rootfs must not count its template).
func TestDiskUsage(t *testing.T) {
	dir := t.TempDir()
	writeRandom(t, filepath.Join(dir, "a"), 3<<20)
	if err := os.MkdirAll(filepath.Join(dir, "x", "y"), 0o700); err != nil {
		t.Fatal(err)
	}
	writeRandom(t, filepath.Join(dir, "x", "y", "b"), 1<<20)
	sparse, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sparse.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	sparse.Close()
	// Directories and rounding to blocks add a little.
	const want, slack = 4 << 20, 256 << 10
	got := DiskUsage(dir)
	if got < want || got > want+slack {
		t.Fatalf("DiskUsage = %d bytes, want %d (+%d at most)", got, want, slack)
	}
	if n := DiskUsage(filepath.Join(dir, "missing")); n != 0 {
		t.Errorf("DiskUsage of a missing directory = %d, want 0", n)
	}

	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs inside needs root")
	}
	mnt := filepath.Join(dir, "x", "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", 0, "size=16m"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(mnt, unix.MNT_DETACH) })
	writeRandom(t, filepath.Join(mnt, "c"), 8<<20)
	if after := DiskUsage(dir); after < want || after > want+slack {
		t.Errorf("with 8 MiB on a tmpfs mounted inside, DiskUsage = %d bytes, want %d (+%d at most)", after, want, slack)
	}
}
