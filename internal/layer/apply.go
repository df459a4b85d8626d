package layer

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/sys/unix"
)

// overlayPrefix names overlayfs's private xattrs on its upper dir (opaque,
// origin, impure, ...). They describe the upper's relation to its lowers and
// mean nothing, or something wrong, in a self-contained layer; Apply never
// carries them into dst.
const overlayPrefix = "trusted.overlay."

// Apply makes dst (must not exist) = lower with upper applied, overlayfs semantics: a char device
// 0/0 in upper is a whiteout (the path is absent in dst), a dir with xattr trusted.overlay.opaque=y
// replaces the lower dir's contents, a non-dir replaces a dir and vice versa, dirs present in both
// take upper's metadata, everything else from upper wins. Unchanged files of lower are HARD LINKS
// (no data copied: a 1.5 GB template costs inodes, not bytes); dirs are created fresh with lower's
// mode/owner/mtime/xattrs. Upper may be consumed (entries renamed into dst): the caller deletes it.
// Lower is never modified.
//
// lower, upper and dst must be on one filesystem (links and renames do not
// cross filesystems). An upper with overlayfs redirects or metacopy files is
// refused: it is not a self-contained diff (the runtime mounts every overlay
// with both off). On error dst is removed; upper may then be partly consumed.
// lower may be "" for an empty parent (a first layer).
func Apply(lower, upper, dst string) (retErr error) {
	if _, err := os.Lstat(dst); err == nil {
		return fmt.Errorf("layer: apply: %s already exists", dst)
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("layer: apply: %w", err)
	}
	var lo *dir
	if lower != "" {
		var err error
		if lo, err = openDirAt(unix.AT_FDCWD, lower); err != nil {
			return fmt.Errorf("layer: apply: lower %s: %w", lower, err)
		}
		defer lo.close()
	}
	up, err := openDirAt(unix.AT_FDCWD, upper)
	if err != nil {
		return fmt.Errorf("layer: apply: upper %s: %w", upper, err)
	}
	defer up.close()
	if err := os.Mkdir(dst, 0o700); err != nil {
		return fmt.Errorf("layer: apply: %w", err)
	}
	defer func() {
		if retErr != nil {
			_ = os.RemoveAll(dst)
		}
	}()
	out, err := openDirAt(unix.AT_FDCWD, dst)
	if err != nil {
		return fmt.Errorf("layer: apply: %w", err)
	}
	defer out.close()
	a := &applier{}
	var ust unix.Stat_t
	if err := unix.Fstat(up.fd, &ust); err != nil {
		return fmt.Errorf("layer: apply: %w", err)
	}
	opaque, err := a.checkDir(up, "")
	if err != nil {
		return fmt.Errorf("layer: apply: %w", err)
	}
	if opaque {
		lo = nil
	}
	if err := a.merge(lo, up, out, ""); err != nil {
		return fmt.Errorf("layer: apply: %w", err)
	}
	if err := copyDirMeta(up, &ust, out); err != nil {
		return fmt.Errorf("layer: apply: /: %w", err)
	}
	return nil
}

type applier struct{}

// checkDir reports whether the upper dir d is opaque, and refuses overlayfs
// redirects (a renamed lower dir stored by reference).
func (a *applier) checkDir(d *dir, where string) (opaque bool, err error) {
	if v, err := fgetXattr(d.fd, overlayPrefix+"redirect"); err == nil {
		return false, fmt.Errorf("%s/: overlayfs redirect to %q: upper is not self-contained (mount with redirect_dir=off)", where, v)
	}
	v, err := fgetXattr(d.fd, overlayPrefix+"opaque")
	// "y" is an opaque dir. ("x" marks a dir holding xwhiteouts for a
	// data-only lower, which is not opaque.)
	return err == nil && string(v) == "y", nil
}

// whiteout reports whether an upper entry stands for a deleted path: a char
// device 0/0, or an overlayfs "xwhiteout" (an empty regular file carrying
// trusted.overlay.whiteout).
func whiteout(d *dir, name string, st *unix.Stat_t) bool {
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFCHR:
		return st.Rdev == 0
	case unix.S_IFREG:
		if st.Size == 0 {
			_, err := getXattr(d.path(name), overlayPrefix+"whiteout")
			return err == nil
		}
	}
	return false
}

// merge fills the fresh dir out with lower (may be nil) overlaid by upper
// (may be nil). where is the path relative to the roots, for errors.
func (a *applier) merge(lower, upper, out *dir, where string) error {
	seen := map[string]bool{}
	if upper != nil {
		names, err := upper.names()
		if err != nil {
			return fmt.Errorf("%s/: %w", where, err)
		}
		for _, name := range names {
			seen[name] = true
			if err := a.fromUpper(lower, upper, out, name, where+"/"+name); err != nil {
				return err
			}
		}
	}
	if lower == nil {
		return nil
	}
	names, err := lower.names()
	if err != nil {
		return fmt.Errorf("%s/: %w", where, err)
	}
	for _, name := range names {
		if seen[name] {
			continue
		}
		if err := a.fromLower(lower, out, name, where+"/"+name); err != nil {
			return err
		}
	}
	return nil
}

// fromUpper puts upper's entry name into out.
func (a *applier) fromUpper(lower, upper, out *dir, name, where string) error {
	st, err := lstatAt(upper.fd, name)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if whiteout(upper, name, &st) {
		return nil
	}
	if !isDir(&st) {
		if isReg(&st) {
			if _, err := getXattr(upper.path(name), overlayPrefix+"metacopy"); err == nil {
				return fmt.Errorf("%s: overlayfs metacopy file (data still in lower): upper is not self-contained (mount with metacopy=off)", where)
			}
		}
		// Renaming keeps the inode: data, mode (setuid bits), owner, times,
		// xattrs, and hard links between upper entries.
		if err := unix.Renameat(upper.fd, name, out.fd, name); err != nil {
			return fmt.Errorf("%s: move into the layer: %w", where, err)
		}
		return stripOverlayXattrs(out.path(name))
	}
	sub, err := openDirAt(upper.fd, name)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	defer sub.close()
	opaque, err := a.checkDir(sub, where)
	if err != nil {
		return err
	}
	var lsub *dir
	if lower != nil && !opaque {
		if lst, err := lstatAt(lower.fd, name); err == nil && isDir(&lst) {
			if lsub, err = openDirAt(lower.fd, name); err != nil {
				return fmt.Errorf("%s: lower: %w", where, err)
			}
			defer lsub.close()
		}
	}
	o, err := mkdirAt(out, name)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	defer o.close()
	if err := a.merge(lsub, sub, o, where); err != nil {
		return err
	}
	if err := copyDirMeta(sub, &st, o); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// fromLower puts lower's entry name, which upper does not mention, into out:
// a hard link for a non-dir, a fresh dir holding links for a dir.
func (a *applier) fromLower(lower, out *dir, name, where string) error {
	st, err := lstatAt(lower.fd, name)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	if !isDir(&st) {
		// linkat without AT_SYMLINK_FOLLOW links a symlink itself.
		if err := unix.Linkat(lower.fd, name, out.fd, name, 0); err != nil {
			return fmt.Errorf("%s: hard link from lower: %w", where, err)
		}
		return nil
	}
	sub, err := openDirAt(lower.fd, name)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	defer sub.close()
	o, err := mkdirAt(out, name)
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	defer o.close()
	if err := a.merge(sub, nil, o, where); err != nil {
		return err
	}
	if err := copyDirMeta(sub, &st, o); err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	return nil
}

// mkdirAt creates a private dir (its mode is set at the end) and opens it.
func mkdirAt(parent *dir, name string) (*dir, error) {
	if err := unix.Mkdirat(parent.fd, name, 0o700); err != nil {
		return nil, err
	}
	return openDirAt(parent.fd, name)
}

// copyDirMeta gives the dir out the owner, mode, xattrs (not overlayfs's) and
// times of src, whose stat is st. Called once out's contents are complete, so
// that creating them does not change the mtime afterwards.
func copyDirMeta(src *dir, st *unix.Stat_t, out *dir) error {
	if err := unix.Fchown(out.fd, int(st.Uid), int(st.Gid)); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	// After chown, which may clear setgid.
	if err := unix.Fchmod(out.fd, st.Mode&07777); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	names, err := flistXattrs(src.fd)
	if err != nil {
		return fmt.Errorf("list xattrs: %w", err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, overlayPrefix) {
			continue
		}
		v, err := fgetXattr(src.fd, n)
		if err != nil {
			if errors.Is(err, unix.ENODATA) {
				continue
			}
			return fmt.Errorf("xattr %s: %w", n, err)
		}
		if err := unix.Fsetxattr(out.fd, n, v, 0); err != nil {
			return fmt.Errorf("xattr %s: %w", n, err)
		}
	}
	ts := []unix.Timespec{st.Atim, st.Mtim}
	if err := unix.UtimesNanoAt(out.fd, "", ts, unix.AT_EMPTY_PATH); err != nil {
		// Older kernels lack AT_EMPTY_PATH for utimensat; go through /proc.
		if err := unix.UtimesNanoAt(unix.AT_FDCWD, out.f.Name(), ts, 0); err != nil {
			return fmt.Errorf("times: %w", err)
		}
	}
	return nil
}

// stripOverlayXattrs removes overlayfs's private xattrs from an entry moved
// out of the upper dir (origin and the like, set on copy-up).
func stripOverlayXattrs(path string) error {
	names, err := listXattrs(path)
	if err != nil {
		return fmt.Errorf("%s: list xattrs: %w", path, err)
	}
	for _, n := range names {
		if strings.HasPrefix(n, overlayPrefix) {
			if err := unix.Lremovexattr(path, n); err != nil && !errors.Is(err, unix.ENODATA) {
				return fmt.Errorf("%s: remove xattr %s: %w", path, n, err)
			}
		}
	}
	return nil
}

func fgetXattr(fd int, name string) ([]byte, error) {
	return readXattr(func(b []byte) (int, error) { return unix.Fgetxattr(fd, name, b) })
}

// readXattr grows its buffer until get (an fgetxattr or lgetxattr of one file and
// attribute) fits the value, which may grow between the size query and the read.
func readXattr(get func(buf []byte) (int, error)) ([]byte, error) {
	buf := make([]byte, 256)
	for {
		n, err := get(buf)
		if errors.Is(err, unix.ERANGE) {
			sz, err := get(nil)
			if err != nil {
				return nil, err
			}
			buf = make([]byte, sz+1)
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

func flistXattrs(fd int) ([]string, error) {
	return listXattrNames(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) })
}

// listXattrNames reads a NUL-separated name list with list (an flistxattr or
// llistxattr of one file), growing the buffer while the list grows under it. A
// filesystem without xattrs has none.
func listXattrNames(list func(buf []byte) (int, error)) ([]string, error) {
	for {
		sz, err := list(nil)
		if errors.Is(err, unix.ENOTSUP) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		if sz == 0 {
			return nil, nil
		}
		buf := make([]byte, sz)
		n, err := list(buf)
		if errors.Is(err, unix.ERANGE) {
			continue
		}
		if err != nil {
			return nil, err
		}
		var out []string
		for _, s := range strings.Split(string(buf[:n]), "\x00") {
			if s != "" {
				out = append(out, s)
			}
		}
		return out, nil
	}
}
