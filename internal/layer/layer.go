// Package layer holds the on-disk operations on template layers: giving an upper
// dir written through a user namespace its image ids back (ShiftOwnership), and
// making a layer's self-contained rootfs from its parent's and a diff (Apply).
//
// Both work with directory file descriptors (openat, mkdirat, linkat, renameat,
// fchownat) rather than full paths, so trees deeper than PATH_MAX work and no
// symlink in a tree is ever followed: a build step writes whatever it likes
// into its upper dir, and the host must not be steered outside it.
//
// Nothing here is offered by a library: containerd's and moby's archive code
// applies diffs as tar streams (copying data); a layer here is applied in place
// by renames and hard links, so it costs inodes, not bytes.
package layer

import (
	"fmt"
	"os"
	"strconv"

	"golang.org/x/sys/unix"
)

// dir is an open directory: its fd, and an *os.File over it whose name
// (/proc/self/fd/N) makes the os package's own fallback lstat of entries with
// an unknown d_type resolve to the right place.
type dir struct {
	f  *os.File
	fd int
}

func openDirAt(parent int, name string) (*dir, error) {
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &dir{f: os.NewFile(uintptr(fd), "/proc/self/fd/"+strconv.Itoa(fd)), fd: fd}, nil
}

func (d *dir) close() {
	if d != nil {
		d.f.Close()
	}
}

// names lists the entries of d (unsorted, without . and ..).
func (d *dir) names() ([]string, error) {
	if _, err := d.f.Seek(0, 0); err != nil {
		return nil, err
	}
	return d.f.Readdirnames(-1)
}

// path names an entry of d for the path-only system calls (xattrs without
// following symlinks): short, whatever the depth of d.
func (d *dir) path(name string) string { return d.f.Name() + "/" + name }

func lstatAt(d int, name string) (unix.Stat_t, error) {
	var st unix.Stat_t
	err := unix.Fstatat(d, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	return st, err
}

func isDir(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFDIR }
func isReg(st *unix.Stat_t) bool { return st.Mode&unix.S_IFMT == unix.S_IFREG }

// ShiftOwnership walks an upper dir written through a user namespace and maps host ids
// [hostBase, hostBase+size) back to [0, size) with Lchown (never following symlinks); ids outside
// the range are left alone.
//
// chown(2) clears setuid and setgid bits of regular files and drops their file
// capabilities and never asks; so the mode is set again afterwards, and a
// security.capability xattr is written back with its v3 rootid mapped the same
// way (rootid 0 is written as a v2 capability, which means the same). POSIX
// ACLs (system.posix_acl_access/default) name users and groups by host id too;
// their named entries are mapped as well.
func ShiftOwnership(upper string, hostBase, size uint32) error {
	if size == 0 {
		return nil
	}
	m := idShift{base: hostBase, size: size}
	root, err := openDirAt(unix.AT_FDCWD, upper)
	if err != nil {
		return fmt.Errorf("layer: shift %s: %w", upper, err)
	}
	defer root.close()
	// The root itself (openDirAt refused a symlink there).
	var st unix.Stat_t
	if err := unix.Fstat(root.fd, &st); err != nil {
		return fmt.Errorf("layer: shift %s: %w", upper, err)
	}
	if err := m.shiftEntry(upper, unix.AT_FDCWD, upper, &st); err != nil {
		return fmt.Errorf("layer: shift %s: %w", upper, err)
	}
	if err := m.walk(root, upper); err != nil {
		return fmt.Errorf("layer: shift: %w", err)
	}
	return nil
}

type idShift struct{ base, size uint32 }

func (m idShift) mapID(id uint32) (uint32, bool) {
	if id >= m.base && id-m.base < m.size {
		return id - m.base, true
	}
	return id, false
}

func (m idShift) walk(d *dir, where string) error {
	names, err := d.names()
	if err != nil {
		return fmt.Errorf("%s: %w", where, err)
	}
	for _, name := range names {
		st, err := lstatAt(d.fd, name)
		if err != nil {
			return fmt.Errorf("%s/%s: %w", where, name, err)
		}
		if err := m.shiftEntry(d.path(name), d.fd, name, &st); err != nil {
			return fmt.Errorf("%s/%s: %w", where, name, err)
		}
		if isDir(&st) {
			sub, err := openDirAt(d.fd, name)
			if err != nil {
				return fmt.Errorf("%s/%s: %w", where, name, err)
			}
			err = m.walk(sub, where+"/"+name)
			sub.close()
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// shiftEntry maps the owner of one entry (name in parent; path is the same
// entry for the xattr calls).
func (m idShift) shiftEntry(path string, parent int, name string, st *unix.Stat_t) error {
	uid, uok := m.mapID(st.Uid)
	gid, gok := m.mapID(st.Gid)
	isLink := st.Mode&unix.S_IFMT == unix.S_IFLNK
	// ACLs and capabilities exist on files and dirs only (never symlinks).
	if !isLink {
		if err := m.shiftACLs(path); err != nil {
			return err
		}
	}
	if !uok && !gok {
		return nil
	}
	var capv []byte
	if isReg(st) {
		capv, _ = getXattr(path, "security.capability")
	}
	if err := unix.Fchownat(parent, name, int(uid), int(gid), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if isReg(st) && st.Mode&(unix.S_ISUID|unix.S_ISGID) != 0 {
		// Regular file: fchmodat follows nothing here (the entry is not a link).
		if err := unix.Fchmodat(parent, name, st.Mode&07777, 0); err != nil {
			return fmt.Errorf("restore mode after chown: %w", err)
		}
	}
	if capv != nil {
		if v, ok := m.shiftCap(capv); ok {
			if err := unix.Lsetxattr(path, "security.capability", v, 0); err != nil {
				return fmt.Errorf("restore file capabilities after chown: %w", err)
			}
		}
	}
	return nil
}

// VFS capability xattr layout (linux/capability.h).
const (
	vfsCapRevisionMask = 0xFF000000
	vfsCapRevision2    = 0x02000000
	vfsCapRevision3    = 0x03000000
	vfsCapV2Size       = 20
	vfsCapV3Size       = 24
)

// shiftCap maps the rootid of a v3 capability; v2 (no rootid) is kept as it
// is. ok is false for a value that is neither (then it stays dropped).
func (m idShift) shiftCap(v []byte) ([]byte, bool) {
	if len(v) < 4 {
		return nil, false
	}
	magic := le32(v[0:])
	switch {
	case magic&vfsCapRevisionMask == vfsCapRevision2 && len(v) == vfsCapV2Size:
		return v, true
	case magic&vfsCapRevisionMask == vfsCapRevision3 && len(v) == vfsCapV3Size:
		root, ok := m.mapID(le32(v[20:]))
		if !ok {
			return v, true
		}
		out := append([]byte(nil), v...)
		if root == 0 {
			// Capabilities for the image's root: the v2 form.
			putLE32(out[0:], vfsCapRevision2|(magic&^vfsCapRevisionMask))
			return out[:vfsCapV2Size], true
		}
		putLE32(out[20:], root)
		return out, true
	}
	return nil, false
}

// POSIX ACL xattr layout (linux/posix_acl_xattr.h): a version word, then
// entries of tag (u16), perm (u16), id (u32).
const (
	aclVersion = 2
	aclUser    = 0x02
	aclGroup   = 0x08
)

func (m idShift) shiftACLs(path string) error {
	for _, name := range []string{"system.posix_acl_access", "system.posix_acl_default"} {
		v, err := getXattr(path, name)
		if err != nil || len(v) < 4 || le32(v) != aclVersion || (len(v)-4)%8 != 0 {
			continue
		}
		changed := false
		for off := 4; off+8 <= len(v); off += 8 {
			tag := uint16(v[off]) | uint16(v[off+1])<<8
			if tag != aclUser && tag != aclGroup {
				continue
			}
			if id, ok := m.mapID(le32(v[off+4:])); ok {
				putLE32(v[off+4:], id)
				changed = true
			}
		}
		if changed {
			if err := unix.Lsetxattr(path, name, v, 0); err != nil {
				return fmt.Errorf("map ACL %s: %w", name, err)
			}
		}
	}
	return nil
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

func putLE32(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

// getXattr reads one xattr of path without following a symlink; an absent
// attribute is an error (ENODATA).
func getXattr(path, name string) ([]byte, error) {
	return readXattr(func(b []byte) (int, error) { return unix.Lgetxattr(path, name, b) })
}

// listXattrs lists the xattr names of path without following a symlink.
func listXattrs(path string) ([]string, error) {
	return listXattrNames(func(b []byte) (int, error) { return unix.Llistxattr(path, b) })
}
