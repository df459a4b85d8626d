package volumecontent

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// maxListEntries bounds one listing, so a deep listing of a huge tree cannot
// hold the server's memory.
const maxListEntries = 100_000

// fsError maps a file system error about the path shown to the client to
// its status and message.
func (req *request) fsError(err error, shown string) error {
	var he *httpError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &he):
		return he
	case isEscape(err):
		return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("path %q leads outside the volume (through a symlink)", shown), err: err}
	case errors.Is(err, syscall.EDQUOT):
		return &httpError{status: http.StatusInsufficientStorage, msg: fmt.Sprintf("volume %s is full: its quota is %d MiB; remove files to make room", req.vol.ID, req.vol.SizeBytes>>20), err: err}
	case errors.Is(err, syscall.ENOSPC):
		// The pool all sandboxes and volumes share, not this volume's quota.
		return &httpError{status: http.StatusInsufficientStorage, msg: fmt.Sprintf("no space left on the server's disk pool for volume %s (its own quota is %d MiB)", req.vol.ID, req.vol.SizeBytes>>20), err: err}
	case errors.Is(err, os.ErrNotExist):
		return &httpError{status: http.StatusNotFound, msg: fmt.Sprintf("path %q not found", shown), err: err}
	case errors.Is(err, os.ErrExist), errors.Is(err, syscall.ENOTEMPTY):
		return &httpError{status: http.StatusConflict, msg: fmt.Sprintf("path %q already exists", shown), err: err}
	case errors.Is(err, syscall.EISDIR):
		return &httpError{status: http.StatusConflict, msg: fmt.Sprintf("path %q is a directory", shown), err: err}
	case errors.Is(err, syscall.ENOTDIR):
		return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("path %q: a component of it is a file, but must be a directory", shown), err: err}
	case errors.Is(err, syscall.ELOOP):
		return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("path %q: too many levels of symlinks", shown), err: err}
	case errors.Is(err, syscall.ENAMETOOLONG), errors.Is(err, syscall.EINVAL):
		return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("path %q: %v", shown, errors.Unwrap(err)), err: err}
	}
	return &httpError{status: http.StatusInternalServerError, msg: fmt.Sprintf("path %q: %v", shown, err), err: err}
}

// isEscape reports os.Root's refusal of a path that leads out of the root
// (its error is not exported).
func isEscape(err error) bool {
	return err != nil && strings.Contains(err.Error(), "path escapes from parent")
}

// openDir opens the directory rel beneath the root (following symlinks that
// stay inside) and checks it is one.
func (req *request) openDir(rel string) (*os.File, error) {
	f, err := req.root.Open(rel)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		f.Close()
		return nil, syscall.ENOTDIR
	}
	return f, nil
}

// statEntry describes rel without following it if it is a symlink: its
// parent is opened beneath the root and the last component is looked at
// with fstatat on that descriptor.
func (req *request) statEntry(rel string) (e2bwire.VolumeEntryStat, error) {
	if rel == "." {
		f, err := req.root.Open(".")
		if err != nil {
			return e2bwire.VolumeEntryStat{}, err
		}
		defer f.Close()
		var st unix.Stat_t
		if err := unix.Fstat(int(f.Fd()), &st); err != nil {
			return e2bwire.VolumeEntryStat{}, err
		}
		return entry("/", "/", &st, ""), nil
	}
	parent, base := path.Split(rel)
	dir, err := req.openDir(cleanParent(parent))
	if err != nil {
		return e2bwire.VolumeEntryStat{}, err
	}
	defer dir.Close()
	return statAt(int(dir.Fd()), base, display(rel))
}

func cleanParent(parent string) string {
	if parent = strings.TrimSuffix(parent, "/"); parent == "" {
		return "."
	}
	return parent
}

func statAt(dirfd int, name, shown string) (e2bwire.VolumeEntryStat, error) {
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return e2bwire.VolumeEntryStat{}, &os.PathError{Op: "stat", Path: shown, Err: err}
	}
	target := ""
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		buf := make([]byte, 4096)
		if n, err := unix.Readlinkat(dirfd, name, buf); err == nil {
			target = string(buf[:n])
		}
	}
	return entry(name, shown, &st, target), nil
}

func entry(name, shown string, st *unix.Stat_t, target string) e2bwire.VolumeEntryStat {
	typ := e2bwire.VolumeEntryUnknown
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
		typ = e2bwire.VolumeEntryFile
	case unix.S_IFDIR:
		typ = e2bwire.VolumeEntryDirectory
	case unix.S_IFLNK:
		typ = e2bwire.VolumeEntrySymlink
	}
	return e2bwire.VolumeEntryStat{
		Name: name, Type: typ, Path: shown, Size: st.Size,
		Mode: st.Mode & 0o7777, UID: st.Uid, GID: st.Gid,
		Atime: time.Unix(st.Atim.Unix()).UTC(), Mtime: time.Unix(st.Mtim.Unix()).UTC(), Ctime: time.Unix(st.Ctim.Unix()).UTC(),
		Target: target,
	}
}

// unixMode turns st_mode permission bits into an os.FileMode, which keeps
// setuid, setgid and sticky elsewhere.
func unixMode(m uint32) os.FileMode {
	mode := os.FileMode(m & 0o777)
	if m&unix.S_ISUID != 0 {
		mode |= os.ModeSetuid
	}
	if m&unix.S_ISGID != 0 {
		mode |= os.ModeSetgid
	}
	if m&unix.S_ISVTX != 0 {
		mode |= os.ModeSticky
	}
	return mode
}

func (h *Handler) stat(w http.ResponseWriter, _ *http.Request, req *request) error {
	e, err := req.statEntry(req.rel)
	if err != nil {
		return req.fsError(err, req.shown())
	}
	writeJSON(w, http.StatusOK, e)
	return nil
}

func (h *Handler) patch(w http.ResponseWriter, r *http.Request, req *request) error {
	var md e2bwire.VolumeMetadata
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxPatchBody))
	if err != nil {
		return fail(http.StatusBadRequest, "reading the body: %v", err)
	}
	if err := json.Unmarshal(body, &md); err != nil {
		return fail(http.StatusBadRequest, "the body must be a JSON object with uid, gid and mode (each optional): %v", err)
	}
	if md.Mode != nil && *md.Mode > 0o7777 {
		return fail(http.StatusBadRequest, "mode %#o is not a permission mode (0 to 07777)", *md.Mode)
	}
	if _, err := req.statEntry(req.rel); err != nil {
		return req.fsError(err, req.shown())
	}
	if md.Mode != nil {
		if err := req.root.Chmod(req.rel, unixMode(*md.Mode)); err != nil {
			return req.fsError(err, req.shown())
		}
	}
	if md.UID != nil || md.GID != nil {
		uid, gid := -1, -1 // unchanged
		if md.UID != nil {
			uid = int(*md.UID)
		}
		if md.GID != nil {
			gid = int(*md.GID)
		}
		if err := req.root.Lchown(req.rel, uid, gid); err != nil {
			return req.fsError(err, req.shown())
		}
	}
	e, err := req.statEntry(req.rel)
	if err != nil {
		return req.fsError(err, req.shown())
	}
	writeJSON(w, http.StatusOK, e)
	return nil
}

func (h *Handler) remove(w http.ResponseWriter, _ *http.Request, req *request) error {
	if req.rel == "." {
		return fail(http.StatusBadRequest, "cannot delete the volume's root (destroy the volume instead)")
	}
	if _, err := req.statEntry(req.rel); err != nil {
		return req.fsError(err, req.shown())
	}
	if err := req.root.RemoveAll(req.rel); err != nil {
		return req.fsError(err, req.shown())
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) list(w http.ResponseWriter, _ *http.Request, req *request) error {
	depth, err := uintParam(req.q, "depth", 1, 1<<32-1)
	if err != nil {
		return err
	}
	depth = max(depth, 1) // upstream reads 0 as 1
	if depth > maxDepth {
		return fail(http.StatusBadRequest, "depth %d is above the maximum of %d", depth, maxDepth)
	}
	dir, err := req.openDir(req.rel)
	if err != nil {
		return req.fsError(err, req.shown())
	}
	defer dir.Close()
	out := []e2bwire.VolumeEntryStat{}
	if err := listInto(&out, dir, req.shown(), int(depth)); err != nil {
		return req.fsError(err, req.shown())
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listInto appends dir's entries (and, depth > 1, their subdirectories'),
// each directory before its contents, names sorted. Subdirectories are
// opened with O_NOFOLLOW on dir's descriptor: a symlink is listed, never
// followed.
func listInto(out *[]e2bwire.VolumeEntryStat, dir *os.File, shown string, depth int) error {
	names, err := dir.Readdirnames(-1)
	if err != nil {
		return err
	}
	slices.Sort(names)
	dirfd := int(dir.Fd())
	for _, name := range names {
		if len(*out) >= maxListEntries {
			return fail(http.StatusRequestEntityTooLarge, "the listing has more than %d entries: ask for less depth or a deeper path", maxListEntries)
		}
		e, err := statAt(dirfd, name, path.Join(shown, name))
		if errors.Is(err, unix.ENOENT) {
			continue // removed while listing
		}
		if err != nil {
			return err
		}
		*out = append(*out, e)
		if depth <= 1 || e.Type != e2bwire.VolumeEntryDirectory {
			continue
		}
		fd, err := unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
				continue // replaced while listing
			}
			return err
		}
		sub := os.NewFile(uintptr(fd), e.Path)
		err = listInto(out, sub, e.Path, depth-1)
		sub.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

func (h *Handler) mkdir(w http.ResponseWriter, _ *http.Request, req *request) error {
	uid, gid, mode, err := owner(req.q, DefaultDirMode)
	if err != nil {
		return err
	}
	force, err := boolParam(req.q, "force")
	if err != nil {
		return err
	}
	created, err := req.makeDirs(req.rel, uid, gid, mode, force)
	if err != nil {
		return req.fsError(err, req.shown())
	}
	if !created && !force {
		return fail(http.StatusConflict, "path %q already exists", req.shown())
	}
	e, err := req.statEntry(req.rel)
	if err != nil {
		return req.fsError(err, req.shown())
	}
	writeJSON(w, http.StatusCreated, e)
	return nil
}

// makeDirs makes the directory rel; with parents, the missing directories
// above it too (DefaultDirMode), each owned by uid:gid. It reports whether
// rel itself was made (false: it was a directory already).
func (req *request) makeDirs(rel string, uid, gid int, mode os.FileMode, parents bool) (created bool, err error) {
	if rel == "." {
		return false, nil
	}
	comps := strings.Split(rel, "/")
	start := len(comps) - 1
	if parents {
		start = 0
	}
	for i := start; i < len(comps); i++ {
		cur := strings.Join(comps[:i+1], "/")
		last := i == len(comps)-1
		m := os.FileMode(DefaultDirMode)
		if last {
			m = mode
		}
		err := req.root.Mkdir(cur, m)
		if errors.Is(err, os.ErrExist) {
			e, serr := req.statEntry(cur)
			if serr != nil {
				return false, serr
			}
			if e.Type != e2bwire.VolumeEntryDirectory {
				if last {
					return false, fmt.Errorf("%s: %w", cur, os.ErrExist)
				}
				return false, fmt.Errorf("%s: %w", cur, syscall.ENOTDIR)
			}
			if last {
				return false, nil
			}
			continue
		}
		if err != nil {
			return false, err
		}
		// Owner, then mode: chown clears setgid, and the umask trimmed
		// Mkdir's mode.
		if err := req.root.Lchown(cur, uid, gid); err != nil {
			return false, err
		}
		if err := req.root.Chmod(cur, m); err != nil {
			return false, err
		}
	}
	return true, nil
}

func (h *Handler) read(w http.ResponseWriter, r *http.Request, req *request) error {
	f, err := req.root.Open(req.rel)
	if err != nil {
		return req.fsError(err, req.shown())
	}
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return req.fsError(err, req.shown())
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		return fail(http.StatusBadRequest, "path %q is a directory: list it through /dir", req.shown())
	default:
		return fail(http.StatusBadRequest, "path %q is not a regular file", req.shown())
	}
	// No sniffing: the bytes are the client's, whatever they look like.
	w.Header().Set("Content-Type", "application/octet-stream")
	// ServeContent streams from the file and answers Range requests.
	http.ServeContent(w, r, "", time.Unix(st.Mtim.Unix()), f)
	return nil
}

// countingReader remembers the reader's own error, so a failed copy can
// tell a client that went away from a volume that is full.
type countingReader struct {
	r   io.Reader
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if err != nil && err != io.EOF {
		c.err = err
	}
	return n, err
}

func (h *Handler) write(w http.ResponseWriter, r *http.Request, req *request) error {
	defer discard(r)
	uid, gid, mode, err := owner(req.q, DefaultFileMode)
	if err != nil {
		return err
	}
	force, err := boolParam(req.q, "force")
	if err != nil {
		return err
	}
	if req.rel == "." {
		return fail(http.StatusBadRequest, "path \"/\" is the volume's root, not a file")
	}
	parentRel, base := path.Split(req.rel)
	parentRel = cleanParent(parentRel)
	if force {
		if _, err := req.makeDirs(parentRel, uid, gid, DefaultDirMode, true); err != nil {
			return req.fsError(err, display(parentRel))
		}
	}
	dir, err := req.openDir(parentRel)
	if err != nil {
		return req.fsError(err, display(parentRel))
	}
	defer dir.Close()
	dirfd := int(dir.Fd())
	// Refused before the body is read, when it is clear already.
	if existing, err := statAt(dirfd, base, req.shown()); err == nil {
		if existing.Type == e2bwire.VolumeEntryDirectory {
			return fail(http.StatusConflict, "path %q is a directory", req.shown())
		}
		if !force {
			return fail(http.StatusConflict, "path %q already exists (send force=true to overwrite it)", req.shown())
		}
	}
	// The body goes into an unnamed file in the target's directory: the
	// name appears only once the content is whole and on disk.
	fd, err := unix.Openat(dirfd, ".", unix.O_TMPFILE|unix.O_WRONLY|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return req.fsError(err, req.shown())
	}
	f := os.NewFile(uintptr(fd), req.shown())
	defer f.Close()
	body := &countingReader{r: r.Body}
	if _, err := io.CopyBuffer(f, body, make([]byte, 1<<20)); err != nil {
		if body.err != nil {
			return &httpError{status: http.StatusBadRequest, msg: fmt.Sprintf("reading the upload of %q: %v", req.shown(), body.err), err: err}
		}
		return req.fsError(err, req.shown())
	}
	if err := f.Chown(uid, gid); err != nil {
		return req.fsError(err, req.shown())
	}
	if err := f.Chmod(mode); err != nil {
		return req.fsError(err, req.shown())
	}
	// Delayed allocation can report a full volume only here.
	if err := f.Sync(); err != nil {
		return req.fsError(err, req.shown())
	}
	if err := linkInto(int(f.Fd()), dirfd, base, force); err != nil {
		return req.fsError(err, req.shown())
	}
	e, err := statAt(dirfd, base, req.shown())
	if err != nil {
		return req.fsError(err, req.shown())
	}
	writeJSON(w, http.StatusCreated, e)
	return nil
}

// linkInto gives the unnamed file fd the name base in dirfd: without
// replace, only if the name is free (EEXIST otherwise); with replace, by a
// rename over what is there (EISDIR for a directory), atomically for
// readers.
func linkInto(fd, dirfd int, base string, replace bool) error {
	if !replace {
		return unix.Linkat(fd, "", dirfd, base, unix.AT_EMPTY_PATH)
	}
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	tmp := ".airlock-upload-" + hex.EncodeToString(b[:])
	if err := unix.Linkat(fd, "", dirfd, tmp, unix.AT_EMPTY_PATH); err != nil {
		return err
	}
	if err := unix.Renameat(dirfd, tmp, dirfd, base); err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return err
	}
	return nil
}
