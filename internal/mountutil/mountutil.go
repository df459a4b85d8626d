// Package mountutil holds the host-side mount checks that sandbox teardown
// relies on, so that a directory is never deleted while something is still
// mounted under it (deleting through an overlay would reach the template).
package mountutil

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// MountedUnder lists the mount points at or below dir in this process's mount
// namespace.
func MountedUnder(dir string) []string {
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	dir = filepath.Clean(dir)
	var out []string
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && (fields[4] == dir || strings.HasPrefix(fields[4], dir+"/")) {
			out = append(out, fields[4])
		}
	}
	return out
}

// Unmount detaches the mount at path; a path that is not a mount point is not
// an error.
func Unmount(path string) error {
	err := unix.Unmount(path, unix.MNT_DETACH)
	if err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount %s: %w", path, err)
	}
	return nil
}

// RemoveAll removes dir unless something is still mounted under it.
func RemoveAll(dir string) error {
	if m := MountedUnder(dir); len(m) > 0 {
		return fmt.Errorf("not removing %s: %s is still mounted", dir, m[0])
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}
