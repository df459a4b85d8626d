package diskquota

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// SnapshotsDir is the snapshot store: a plain directory (not a subvolume)
// directly under the sandboxes directory, holding one subvolume per snapshot.
// It is made on first use, mode 0700: sandboxes never reach it.
const SnapshotsDir = ".snapshots"

// tempPrefix starts the name of a snapshot or copy being made. It is renamed
// to its final name only once whole, so a crash leaves either nothing under
// the final name or all of it; whatever still carries the prefix is garbage
// (Open's sweep, RemoveTemporaries).
const tempPrefix = ".tmp-"

// Reserved reports whether an entry of the sandboxes directory belongs to the
// pool (the snapshot store, temporaries) rather than being a sandbox: a sweep
// for stray sandbox directories must leave these alone. Sandbox ids never
// start with a dot.
func Reserved(name string) bool { return strings.HasPrefix(name, ".") }

func isTemp(name string) bool { return strings.HasPrefix(name, tempPrefix) }

// tempName is a fresh temporary name for dst, in dst's directory (rename
// does not cross directories, and a subvolume cannot be moved across
// filesystems).
func tempName(dst string) (string, error) {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("diskquota: %w", err)
	}
	return filepath.Join(filepath.Dir(dst), tempPrefix+filepath.Base(dst)+"-"+hex.EncodeToString(b[:])), nil
}

// SnapshotDir is where the snapshot named name lives in the store.
func (p *Pool) SnapshotDir(name string) string {
	return filepath.Join(p.mountPoint, SnapshotsDir, name)
}

// Snapshot makes dst a writable copy-on-write snapshot of the subvolume src,
// limited to limit bytes (<= 0: no limit). Both must be pool directories:
// directly under the mount point (a sandbox) or under SnapshotsDir (a
// snapshot). The snapshot's usage starts at src's referenced bytes, which it
// shares with src until either side rewrites them, so a sandbox started from a
// snapshot counts what it inherited against its own disk size.
//
// The snapshot is made under a temporary name, limited, renamed into place
// and made durable before Snapshot returns: after a crash dst is either absent
// or whole. src is snapshotted as it is on disk, so the caller stops its
// writers first (btrfs flushes what they had written).
func (p *Pool) Snapshot(src, dst string, limit int64) error {
	if _, err := p.key(src); err != nil {
		return err
	}
	if _, err := p.key(dst); err != nil {
		return err
	}
	if !IsSubvolume(src) {
		return fmt.Errorf("diskquota: snapshot %s: not a subvolume of the pool", src)
	}
	if err := p.prepare(dst); err != nil {
		return err
	}
	tmp, err := tempName(dst)
	if err != nil {
		return err
	}
	srcFD, err := unix.Open(src, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	defer unix.Close(srcFD)
	parent, err := unix.Open(filepath.Dir(dst), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	defer unix.Close(parent)
	if err := snapCreate(parent, srcFD, filepath.Base(tmp)); err != nil {
		return fmt.Errorf("diskquota: snapshot %s to %s: %w", src, dst, err)
	}
	return p.place(parent, tmp, dst, limit, nil)
}

// Clone makes dst a copy of the directory src with one call whether or not
// there is a pool (p may be nil):
//   - with a pool, src a subvolume of it and dst a pool directory: Snapshot;
//   - with a pool and dst a pool directory but src elsewhere (a plain
//     directory): a new subvolume limited to limit, filled by CopyTree;
//   - otherwise (no pool): CopyTree, and limit is ignored (no quota to set).
//
// Each leaves dst either absent or whole after a crash.
func (p *Pool) Clone(src, dst string, limit int64) error {
	if p == nil {
		return CopyTree(src, dst)
	}
	if _, err := p.key(dst); err != nil {
		return CopyTree(src, dst)
	}
	if _, err := p.key(src); err == nil && IsSubvolume(src) {
		return p.Snapshot(src, dst, limit)
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
	// The limit goes on before the copy, so a src larger than it fails
	// (EDQUOT) rather than landing whole.
	return p.place(parent, tmp, dst, limit, func() error { return copyInto(src, tmp) })
}

// prepare checks that dst is free and makes the snapshot or volume store when
// dst is in it.
func (p *Pool) prepare(dst string) error {
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("diskquota: %s: %w", dst, os.ErrExist)
	}
	if dir := filepath.Dir(filepath.Clean(dst)); filepath.Dir(dir) == p.mountPoint && isStore(filepath.Base(dir)) {
		if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("diskquota: %w", err)
		}
	}
	return nil
}

// place finishes a new subvolume made at tmp: limits it, runs fill (if any),
// renames it to dst and makes that durable. On any error the temporary (or
// dst, if the rename had happened) is removed again.
func (p *Pool) place(parent int, tmp, dst string, limit int64, fill func() error) (err error) {
	victim := tmp
	defer func() {
		if err != nil {
			_ = p.Remove(victim)
		}
	}()
	id, err := subvolID(tmp)
	if err != nil {
		return err
	}
	if err := p.setLimit(id, limit); err != nil {
		return fmt.Errorf("diskquota: limit %s to %d bytes: %w", dst, limit, err)
	}
	if fill != nil {
		if err := fill(); err != nil {
			return err
		}
		// Copied data must be on disk before the name that says it is whole.
		// (A snapshot needs no such flush: its ioctl flushed the source and
		// committed.)
		if err := syncfs(tmp); err != nil {
			return err
		}
	}
	if err := unix.Renameat2(parent, filepath.Base(tmp), parent, filepath.Base(dst), unix.RENAME_NOREPLACE); err != nil {
		return fmt.Errorf("diskquota: rename %s to %s: %w", tmp, dst, err)
	}
	victim = dst
	// Makes the limit and the rename durable before the caller records that
	// dst exists (btrfs commits its transaction for a renamed subvolume).
	if err := unix.Fsync(parent); err != nil {
		return fmt.Errorf("diskquota: fsync %s: %w", filepath.Dir(dst), err)
	}
	k, err := p.key(dst)
	if err != nil {
		return err
	}
	p.mu.Lock()
	p.ids[k] = id
	p.mu.Unlock()
	return nil
}

// CopyTree makes dst a copy of the directory tree src: what Clone does without
// a pool. dst must not exist; its parent must. Ownership (the mapped ids of a
// sandbox's files), modes, timestamps, extended attributes of every namespace
// (an overlay upper directory's trusted.overlay.* opaque and redirect marks),
// hard links, symlinks, sparse files, and device, fifo and socket nodes (an
// overlay whiteout is a 0:0 character device) survive. File data is shared
// (reflinked) where the filesystem can, else copied. Mounts below src are not
// crossed: their mount points are copied empty. The copy is made under a
// temporary name and renamed into place once whole and synced.
//
// It runs cp -a from coreutils (present on every host Airlock runs on) rather
// than a Go walk: cp is the reference for these semantics, including the
// orderings that are easy to get wrong (chown before chmod so setuid bits
// stay, xattrs after chown so security.capability stays, directory times after
// their contents), and --reflink=auto is FICLONE with a fallback to copying.
// --preserve=xattr makes a lost xattr an error, where plain -a would only warn.
func CopyTree(src, dst string) (err error) {
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("diskquota: %s: %w", dst, os.ErrExist)
	}
	tmp, err := tempName(dst)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	if err := copyInto(src, tmp); err != nil {
		return err
	}
	if err := syncfs(tmp); err != nil {
		return err
	}
	parent, err := unix.Open(filepath.Dir(dst), unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	defer unix.Close(parent)
	if err := unix.Renameat2(parent, filepath.Base(tmp), parent, filepath.Base(dst), unix.RENAME_NOREPLACE); err != nil {
		return fmt.Errorf("diskquota: rename %s to %s: %w", tmp, dst, err)
	}
	if err := unix.Fsync(parent); err != nil {
		_ = os.RemoveAll(dst)
		return fmt.Errorf("diskquota: fsync %s: %w", filepath.Dir(dst), err)
	}
	return nil
}

// copyInto copies src's contents and attributes onto dst (which may exist as
// an empty directory: a fresh subvolume).
func copyInto(src, dst string) error {
	fi, err := os.Stat(src)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("diskquota: copy %s: not a directory", src)
	}
	// -T: dst is the copy, never a directory to copy into. -x: stay off mounts.
	out, err := exec.Command("cp", "-a", "-x", "--preserve=xattr", "--reflink=auto", "-T", "--", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("diskquota: cp -a %s %s: %w: %s", src, dst, err, strings.TrimSpace(string(out)))
	}
	return nil
}

func syncfs(path string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Syncfs(fd); err != nil {
		return fmt.Errorf("diskquota: syncfs %s: %w", path, err)
	}
	return nil
}

// RemoveTemporaries removes the half-made copies a crash left in dir (a
// CopyTree's destination directory). Open's sweep does this for a pool's
// directories; without a pool the caller does.
func RemoveTemporaries(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("diskquota: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !isTemp(e.Name()) {
			continue
		}
		path := filepath.Join(dir, e.Name())
		if err := os.RemoveAll(path); err != nil {
			errs = append(errs, fmt.Errorf("diskquota: remove %s: %w", path, err))
		}
	}
	return errors.Join(errs...)
}
