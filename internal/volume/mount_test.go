package volume

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// A forced destroy of a volume that is bind-mounted (as a sandbox mounts
// it) removes the volume: btrfs deletes a subvolume whose root is only the
// source of a bind mount; the mount stays, on a deleted directory, until
// its sandbox goes.
func TestForcedDestroyWhileBindMounted(t *testing.T) {
	ctx := context.Background()
	e := newTestEnv(t, Options{})
	v, err := e.svc.Create(ctx, "k", "mounted", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(v.Path, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	target := t.TempDir()
	if err := unix.Mount(v.Path, target, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	defer unix.Unmount(target, unix.MNT_DETACH)
	e.svc.SetMountChecker(mounts{v.ID: {"sbx"}})
	if err := e.svc.Destroy(ctx, "k", v.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v.Path); !os.IsNotExist(err) {
		t.Errorf("volume dir after a forced destroy: %v", err)
	}
	if _, err := os.ReadFile(filepath.Join(target, "f")); !os.IsNotExist(err) {
		t.Errorf("read through the mount after: %v", err)
	}
	if err := os.WriteFile(filepath.Join(target, "g"), []byte("y"), 0o644); !os.IsNotExist(err) {
		t.Errorf("write through the mount after: %v", err)
	}
}
