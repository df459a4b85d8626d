package diskquota

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// VolumesDir is the volume store: a plain directory (not a subvolume)
// directly under the sandboxes directory, holding one quota-limited
// subvolume per volume (storage that outlives sandboxes; internal/volume
// owns what is in it). Like the snapshot store it is dot-named, so the
// manager's sweep of stray sandbox directories (Reserved) leaves it alone,
// and it is made on first use with mode 0700: only the server reaches it,
// sandboxes get a volume through a bind mount.
const VolumesDir = ".volumes"

// isStore reports whether name, directly under the mount point, is one of
// the stores that hold subvolumes of their own.
func isStore(name string) bool { return name == SnapshotsDir || name == VolumesDir }

// VolumeDir is where the volume named name lives in the volume store.
func (p *Pool) VolumeDir(name string) string {
	return filepath.Join(p.mountPoint, VolumesDir, name)
}

// CreateVolume makes a new empty subvolume for the volume name, limited to
// limit bytes (which must be positive: a volume always has a quota). Like
// Snapshot it is made under a temporary name, limited and renamed into place,
// so after a crash the volume's directory is either absent or whole with its
// limit (the temporary is removed when the pool opens next).
func (p *Pool) CreateVolume(name string, limit int64) error {
	if limit <= 0 {
		return fmt.Errorf("diskquota: volume %s: limit %d must be positive", name, limit)
	}
	dst := p.VolumeDir(name)
	if _, err := p.key(dst); err != nil {
		return err
	}
	if err := p.prepare(dst); err != nil {
		return err
	}
	tmp, err := tempName(dst)
	if err != nil {
		return err
	}
	parent, err := unix.Open(filepath.Dir(dst), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	defer unix.Close(parent)
	if err := subvolCreate(parent, filepath.Base(tmp)); err != nil {
		return fmt.Errorf("diskquota: create subvolume %s: %w", tmp, err)
	}
	return p.place(parent, tmp, dst, limit, nil)
}

// RemoveVolume deletes a volume's subvolume with everything in it and its
// qgroup; a volume that is not there is no error (a retried removal).
func (p *Pool) RemoveVolume(name string) error {
	return p.Remove(p.VolumeDir(name))
}

// Volumes lists the names of the volumes in the store (not the temporaries
// of volumes being made), so the volume service can find directories its
// records do not name.
func (p *Pool) Volumes() ([]string, error) {
	entries, err := os.ReadDir(filepath.Join(p.mountPoint, VolumesDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("diskquota: %w", err)
	}
	var names []string
	for _, e := range entries {
		if e.IsDir() && !isTemp(e.Name()) {
			names = append(names, e.Name())
		}
	}
	return names, nil
}
