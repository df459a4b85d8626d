package linux

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// ProbeRootfs makes, under dir, what every sandbox's root is made of: a
// read-only, idmapped view of a lower directory (open_tree, mount_setattr
// with MOUNT_ATTR_IDMAP, move_mount, from a user namespace of
// DefaultIDMap) and an overlay over that view with a writable upper, as
// mountOverlay makes it. It checks that a file of the host's root in the
// lower shows as the map's root through the overlay, and that the overlay
// takes a write, then undoes everything. `airlock doctor` runs it; the error
// names the step the kernel refused.
func ProbeRootfs(dir string) (err error) {
	ids := DefaultIDMap
	s := &idmapStore{dir: filepath.Join(dir, "idmap"), m: ids}
	lower, view, rootfs := filepath.Join(dir, "lower"), filepath.Join(dir, "view"), filepath.Join(dir, "rootfs")
	for _, d := range []string{lower, view} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return err
		}
	}
	if err := os.WriteFile(filepath.Join(lower, "probe"), []byte("probe\n"), 0o644); err != nil {
		return err
	}
	if err := s.mountIDMapped(lower, view); err != nil {
		return fmt.Errorf("idmapped mount (kernel 5.12 or later, a filesystem that supports it): %w", err)
	}
	defer func() {
		if s.nsfd > 0 {
			unix.Close(s.nsfd)
		}
		err = errors.Join(err, unmountProbe(view))
	}()
	if err := mountOverlay(view, dir, filepath.Join(dir, "upper"), rootfs, ids); err != nil {
		return fmt.Errorf("overlay over an idmapped layer (kernel 5.19 or later): %w", err)
	}
	defer func() { err = errors.Join(err, unmountProbe(rootfs)) }()
	st, err := os.Stat(filepath.Join(rootfs, "probe"))
	if err != nil {
		return fmt.Errorf("read through the overlay: %w", err)
	}
	if uid := st.Sys().(*syscall.Stat_t).Uid; uid != ids.HostID {
		return fmt.Errorf("the lower's root-owned file shows as uid %d through the idmapped overlay, want %d", uid, ids.HostID)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "written"), []byte("x"), 0o644); err != nil {
		return fmt.Errorf("write through the overlay: %w", err)
	}
	return nil
}

func unmountProbe(target string) error {
	if err := unix.Unmount(target, unix.MNT_DETACH); err != nil {
		return fmt.Errorf("unmount %s: %w", target, err)
	}
	return nil
}
