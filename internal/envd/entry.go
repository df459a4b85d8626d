package envd

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/airlock-sandbox/airlock/api/gen/filesystem"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
)

// metadataXattrPrefix namespaces user metadata in extended attributes, the same
// names E2B's envd uses, so files keep their metadata across envd implementations.
const metadataXattrPrefix = "user.e2b."

// entryInfo describes path (which must be absolute) as the SDKs expect it.
func (s *Server) entryInfo(path string) (*fspb.EntryInfo, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	return s.entryFromInfo(path, path, fi), nil
}

// entryFromInfo builds an EntryInfo from an lstat result. realPath is where the
// entry is on disk; shownPath is the path reported to the client (ListDir rebuilds
// it from the path the client asked for). A symlink reports its resolved target and
// the target's type, bits and size, while permissions stay the link's own string,
// as E2B's envd does.
func (s *Server) entryFromInfo(realPath, shownPath string, fi os.FileInfo) *fspb.EntryInfo {
	e := &fspb.EntryInfo{
		Name:         filepath.Base(shownPath),
		Path:         shownPath,
		Size:         entrySize(fi),
		Mode:         uint32(fi.Mode().Perm()),
		Permissions:  fi.Mode().String(),
		ModifiedTime: timestamppb.New(fi.ModTime()),
		Type:         fileType(fi.Mode()),
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner = s.ownerName(st.Uid)
		e.Group = s.groupName(st.Gid)
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if target, err := filepath.EvalSymlinks(realPath); err == nil {
			if abs, err := filepath.Abs(target); err == nil {
				target = abs
			}
			e.SymlinkTarget = proto.String(target)
			if tfi, err := os.Stat(realPath); err == nil {
				e.Type = fileType(tfi.Mode())
				e.Mode = uint32(tfi.Mode().Perm())
				e.Size = entrySize(tfi)
			}
		} else if raw, err := os.Readlink(realPath); err == nil {
			// Dangling link: report where it points, keep the symlink type.
			if !filepath.IsAbs(raw) {
				raw = filepath.Join(filepath.Dir(shownPath), raw)
			}
			e.SymlinkTarget = proto.String(filepath.Clean(raw))
		}
	} else if fi.Mode().IsRegular() || fi.IsDir() {
		e.Metadata = readMetadata(realPath)
	}
	return e
}

// dirBlock is ext4's block size (the default, and what E2B's sandboxes use).
const dirBlock = 4096

// entrySize is the size reported for an entry. A directory reports what ext4
// would: its bytes in whole 4 KiB blocks, at least one. E2B's sandboxes run on
// ext4, where even an empty directory has a 4096-byte block, and its SDK tests
// check that a directory's size is above 0; the filesystems under a sandbox's
// root here (overlayfs on btrfs, tmpfs) report the bytes of the names instead,
// 0 for an empty directory.
func entrySize(fi os.FileInfo) int64 {
	if !fi.IsDir() {
		return fi.Size()
	}
	return max(1, (fi.Size()+dirBlock-1)/dirBlock) * dirBlock
}

func fileType(m fs.FileMode) fspb.FileType {
	switch {
	case m.IsDir():
		return fspb.FileType_FILE_TYPE_DIRECTORY
	case m&fs.ModeSymlink != 0:
		return fspb.FileType_FILE_TYPE_SYMLINK
	default:
		return fspb.FileType_FILE_TYPE_FILE
	}
}

func (s *Server) ownerName(uid uint32) string {
	if n, ok := s.users.UserName(uid); ok {
		return n
	}
	return strconv.FormatUint(uint64(uid), 10)
}

func (s *Server) groupName(gid uint32) string {
	if n, ok := s.users.GroupName(gid); ok {
		return n
	}
	return strconv.FormatUint(uint64(gid), 10)
}

// xattrBuf sizes: the kernel caps a value at 64 KiB and names lists likewise.
const xattrMax = 64 << 10

func listXattrs(path string) []string {
	buf := make([]byte, 1024)
	for {
		n, err := unix.Llistxattr(path, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < xattrMax {
			buf = make([]byte, xattrMax)
			continue
		}
		if err != nil || n <= 0 {
			return nil
		}
		var names []string
		for _, name := range bytes.Split(buf[:n], []byte{0}) {
			if len(name) > 0 {
				names = append(names, string(name))
			}
		}
		return names
	}
}

// readMetadata returns the user.e2b.* xattrs of path, or nil when there are none
// (the common case costs one listxattr call).
func readMetadata(path string) map[string]string {
	var out map[string]string
	for _, name := range listXattrs(path) {
		key, ok := strings.CutPrefix(name, metadataXattrPrefix)
		if !ok || key == "" {
			continue
		}
		buf := make([]byte, 4096)
		n, err := unix.Lgetxattr(path, name, buf)
		if errors.Is(err, unix.ERANGE) {
			buf = make([]byte, xattrMax)
			n, err = unix.Lgetxattr(path, name, buf)
		}
		if err != nil {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out[key] = string(buf[:n])
	}
	return out
}

// replaceMetadata makes meta the file's complete metadata: an upload replaces
// whatever the previous version of the file carried.
func replaceMetadata(f *os.File, meta map[string]string) error {
	fd := int(f.Fd())
	buf := make([]byte, 4096)
	for {
		n, err := unix.Flistxattr(fd, buf)
		if errors.Is(err, unix.ERANGE) && len(buf) < xattrMax {
			buf = make([]byte, xattrMax)
			continue
		}
		if err == nil {
			for _, name := range bytes.Split(buf[:n], []byte{0}) {
				if strings.HasPrefix(string(name), metadataXattrPrefix) {
					_ = unix.Fremovexattr(fd, string(name))
				}
			}
		}
		break
	}
	for k, v := range meta {
		if err := unix.Fsetxattr(fd, metadataXattrPrefix+k, []byte(v), 0); err != nil {
			return fmt.Errorf("storing metadata %q: %w", k, err)
		}
	}
	return nil
}

// mkdirAllOwned creates dir and its missing parents, handing each created
// directory to the user so they own what they asked for (docs/E2B-WIRE.md §3.6).
func mkdirAllOwned(dir string, u *unixuser.User) error {
	var missing []string
	for p := dir; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return &fs.PathError{Op: "mkdir", Path: p, Err: syscall.ENOTDIR}
			}
			break
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		missing = append(missing, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		if err := os.Mkdir(missing[i], 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		chownTo(missing[i], u)
	}
	return nil
}

// chownTo is best effort: it only matters when envd runs as root, which it always
// does in a sandbox.
func chownTo(path string, u *unixuser.User) {
	if os.Geteuid() == 0 && u != nil {
		_ = os.Lchown(path, int(u.UID), int(u.GID))
	}
}
