package diskquota

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"golang.org/x/sys/unix"
)

// A volume is a subvolume of the volume store with a hard limit: writes past
// it fail, and removing it frees its name and qgroup.
func TestVolumeLimitAndRemove(t *testing.T) {
	p := openTestPool(t)
	if err := p.CreateVolume("v1", 16<<20); err != nil {
		t.Fatal(err)
	}
	dir := p.VolumeDir("v1")
	if !IsSubvolume(dir) {
		t.Fatalf("%s is not a subvolume", dir)
	}
	st, err := os.Stat(filepath.Join(p.MountPoint(), VolumesDir))
	if err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("volume store: %v, %v", st, err)
	}
	n, err := fill(filepath.Join(dir, "big"), 64<<20)
	if !errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("wrote %d bytes past a 16 MiB volume; err %v", n, err)
	}
	if _, limit, err := p.Usage(dir); err != nil || limit != 16<<20 {
		t.Fatalf("usage: limit %d, %v", limit, err)
	}
	if err := p.CreateVolume("v1", 16<<20); !errors.Is(err, os.ErrExist) {
		t.Fatalf("second create of v1: %v", err)
	}
	if err := p.CreateVolume("v2", 0); err == nil {
		t.Fatal("a volume without a limit was made")
	}
	names, err := p.Volumes()
	if err != nil || !slices.Equal(names, []string{"v1"}) {
		t.Fatalf("Volumes() = %v, %v", names, err)
	}
	if err := p.RemoveVolume("v1"); err != nil {
		t.Fatal(err)
	}
	if err := p.RemoveVolume("v1"); err != nil {
		t.Fatalf("removing a removed volume: %v", err)
	}
	if names, _ := p.Volumes(); len(names) != 0 {
		t.Fatalf("after remove: %v", names)
	}
	// The store itself is not a sandbox directory: Reserved says so, and the
	// pool refuses to treat it as one.
	if !Reserved(VolumesDir) {
		t.Error("Reserved(.volumes) = false: a sweep of sandbox dirs would delete volumes")
	}
	if err := p.Create(filepath.Join(p.MountPoint(), VolumesDir), 1<<20); err == nil {
		t.Error("Create made the volume store a sandbox subvolume")
	}
}

// A volume half made when the server died (still under its temporary name)
// is gone after the pool opens again; a whole one stays.
func TestVolumeTemporarySwept(t *testing.T) {
	p := openTestPool(t)
	if err := p.CreateVolume("kept", 8<<20); err != nil {
		t.Fatal(err)
	}
	store := filepath.Join(p.MountPoint(), VolumesDir)
	parent, err := unix.Open(store, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = subvolCreate(parent, tempPrefix+"half-1234")
	unix.Close(parent)
	if err != nil {
		t.Fatal(err)
	}
	p2, err := Open(p.image, p.MountPoint(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(store, tempPrefix+"half-1234")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temporary survived reopen: %v", err)
	}
	if names, _ := p2.Volumes(); !slices.Equal(names, []string{"kept"}) {
		t.Errorf("Volumes() after reopen = %v", names)
	}
	// The reopened pool's sweep keeps the volume's qgroup (and so its limit).
	if _, limit, err := p2.Usage(p2.VolumeDir("kept")); err != nil || limit != 8<<20 {
		t.Errorf("the kept volume's limit after reopen: %d, %v", limit, err)
	}
}
