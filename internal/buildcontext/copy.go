package buildcontext

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/moby/sys/user"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/dockerfile"
)

// CopyInto carries out a COPY or ADD step: it writes the step's files into
// upper, an empty directory that will be applied as a layer onto rootfs (the
// parent's root filesystem, read only here).
//
// Destination paths are resolved against rootfs's symlinks, scoped to
// rootfs (so on merged-usr Debian, COPY x /bin/x lands in upper/usr/bin/x
// and never creates upper/bin, which would shadow the /bin -> usr/bin link),
// then written at the same relative path under upper. Directories that
// exist in rootfs and must hold new files are created in upper with the
// mode, owner and mtime they have in rootfs: in an overlay, a directory in
// the upper layer replaces the attributes of the one below.
//
// All writes go through an os.Root on upper, so a symlink written by this
// step can never lead a later write out of upper.
func (c *Context) CopyInto(ctx context.Context, step dockerfile.Step, rootfs, upper string) error {
	if step.Kind != dockerfile.StepCopy {
		return fmt.Errorf("CopyInto: step at line %d is not COPY/ADD", step.Line)
	}
	instr := "COPY"
	if step.Add {
		instr = "ADD"
	}
	rootfs, err := filepath.Abs(rootfs)
	if err != nil {
		return fmt.Errorf("%s: rootfs: %w", instr, err)
	}
	ms, err := c.matches(step.Sources)
	if err != nil {
		return err
	}
	up, err := os.OpenRoot(upper)
	if err != nil {
		return fmt.Errorf("%s: opening upper: %w", instr, err)
	}
	defer up.Close()
	w := &writer{c: c, ctx: ctx, instr: instr, rootfs: rootfs, up: up}
	if step.Chown != "" {
		w.chown = true
		if w.uid, w.gid, err = lookupOwner(rootfs, step.Chown); err != nil {
			return fmt.Errorf("%s --chown=%s: %w", instr, step.Chown, err)
		}
	}
	if step.Chmod != "" {
		b, err := strconv.ParseUint(step.Chmod, 8, 32)
		if err != nil || b > 0o7777 {
			return fmt.Errorf("%s --chmod=%s: not an octal mode", instr, step.Chmod)
		}
		m := goMode(uint32(b))
		w.chmod = &m
	}

	dest, err := w.resolve(strings.TrimSuffix(step.Dest, "/"))
	if err != nil {
		return err
	}
	// Docker: several sources (or a glob matching several) and a
	// destination written with a trailing "/" need a directory.
	destIsDir := strings.HasSuffix(step.Dest, "/") || len(ms) > 1
	for _, m := range ms {
		if err := ctx.Err(); err != nil {
			return err
		}
		switch {
		case m.info.IsDir():
			// A directory source copies its contents.
			if err := w.ensureDir(dest, m.info); err != nil {
				return err
			}
			if err := w.copyTree(m.rel, dest); err != nil {
				return err
			}
		case !copyable(m.info.Mode()):
			return fmt.Errorf("%s source %s: %s is not a regular file, directory or symlink", instr, m.src, m.rel)
		default:
			if step.Add && m.info.Mode().IsRegular() {
				isArchive, err := c.isArchive(m.rel)
				if err != nil {
					return fmt.Errorf("ADD source %s: %w", m.src, err)
				}
				if isArchive {
					if err := w.ensureDir(dest, nil); err != nil {
						return err
					}
					if err := w.extract(m, dest); err != nil {
						return err
					}
					continue
				}
			}
			target := dest
			isDir, err := w.isDir(dest)
			if err != nil {
				return err
			}
			if destIsDir || isDir {
				if err := w.ensureDir(dest, nil); err != nil {
					return err
				}
				target = path.Join(dest, m.name)
			} else if err := w.ensureDir(parentOrDot(dest), nil); err != nil {
				return err
			}
			if err := w.copyEntry(m.rel, target, m.info); err != nil {
				return err
			}
		}
	}
	return w.finish()
}

func parentOrDot(p string) string { return path.Dir(p) }

// writer holds one CopyInto's state.
type writer struct {
	c        *Context
	ctx      context.Context
	instr    string
	rootfs   string
	up       *os.Root
	chown    bool // --chown given: it overrides archive owners too
	uid, gid int
	chmod    *fs.FileMode
	// dirTimes are the mtimes of directories created in upper, set last
	// (writing into a directory changes its mtime), deepest first.
	dirTimes []dirTime
}

type dirTime struct {
	rel   string
	mtime time.Time
}

// resolve maps an absolute image path to its path relative to rootfs with
// every rootfs symlink on the way resolved, scoped to rootfs.
func (w *writer) resolve(imagePath string) (string, error) {
	j, err := securejoin.SecureJoin(w.rootfs, imagePath)
	if err != nil {
		return "", fmt.Errorf("%s: resolving %s in the image: %w", w.instr, imagePath, err)
	}
	rel, err := filepath.Rel(w.rootfs, j)
	if err != nil || rel == ".." || strings.HasPrefix(rel, "../") {
		return "", fmt.Errorf("%s: %s resolves outside the image", w.instr, imagePath)
	}
	return filepath.ToSlash(rel), nil
}

// lower is the Lstat of rel in rootfs (nil if absent).
func (w *writer) lower(rel string) (fs.FileInfo, error) {
	fi, err := os.Lstat(filepath.Join(w.rootfs, rel))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, nil
	}
	return fi, err
}

// upperInfo is the Lstat of rel in upper (nil if absent).
func (w *writer) upperInfo(rel string) (fs.FileInfo, error) {
	fi, err := w.up.Lstat(rel)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, nil
	}
	return fi, err
}

// isDir reports whether rel is a directory in the merged view.
func (w *writer) isDir(rel string) (bool, error) {
	fi, err := w.upperInfo(rel)
	if err != nil || fi != nil {
		return fi != nil && fi.IsDir(), err
	}
	fi, err = w.lower(rel)
	return fi != nil && fi.IsDir(), err
}

// ensureDir makes rel and its parents exist as directories in upper. A
// directory present in rootfs is copied up with its attributes; a missing
// one is created 0755 owned by the --chown owner (or root) — or, for rel
// itself when src is given, with src's mode and mtime.
func (w *writer) ensureDir(rel string, src fs.FileInfo) error {
	if rel == "." || rel == "" {
		return nil
	}
	if err := w.ensureDir(path.Dir(rel), nil); err != nil {
		return err
	}
	fi, err := w.upperInfo(rel)
	if err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	if fi != nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s: cannot create directory /%s: a file is in the way", w.instr, rel)
		}
		return nil
	}
	low, err := w.lower(rel)
	if err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	if low != nil {
		if !low.IsDir() {
			return fmt.Errorf("%s: /%s exists in the image and is not a directory", w.instr, rel)
		}
		st := low.Sys().(*syscall.Stat_t)
		return w.mkdir(rel, low.Mode(), int(st.Uid), int(st.Gid), low.ModTime())
	}
	mode, mtime := fs.FileMode(0o755), time.Time{}
	if src != nil {
		mode, mtime = src.Mode(), src.ModTime()
		if w.chmod != nil {
			mode = *w.chmod
		}
	}
	return w.mkdir(rel, mode, w.uid, w.gid, mtime)
}

func (w *writer) mkdir(rel string, mode fs.FileMode, uid, gid int, mtime time.Time) error {
	if err := w.up.Mkdir(rel, 0o700); err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	if err := w.up.Chown(rel, uid, gid); err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	if err := w.up.Chmod(rel, permOf(mode)); err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	if !mtime.IsZero() {
		w.dirTimes = append(w.dirTimes, dirTime{rel, mtime})
	}
	return nil
}

func permOf(m fs.FileMode) fs.FileMode {
	return m & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
}

// copyTree copies the contents of the context directory src into the
// (existing) upper directory dst.
func (w *writer) copyTree(src, dst string) error {
	ents, err := w.c.readDir(src)
	if err != nil {
		return fmt.Errorf("%s: reading %s: %w", w.instr, src, err)
	}
	for _, e := range ents {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		s := path.Join(src, e.Name())
		fi, err := w.c.root.Lstat(s)
		if err != nil {
			return fmt.Errorf("%s: %w", w.instr, err)
		}
		switch {
		case fi.IsDir():
			// Follow rootfs symlinks for directories, so a tree holding
			// bin/ copied to / fills usr/bin.
			d, err := w.resolve("/" + path.Join(dst, e.Name()))
			if err != nil {
				return err
			}
			if err := w.ensureDir(d, fi); err != nil {
				return err
			}
			if err := w.copyTree(s, d); err != nil {
				return err
			}
		case copyable(fi.Mode()):
			if err := w.copyEntry(s, path.Join(dst, e.Name()), fi); err != nil {
				return err
			}
		}
	}
	return nil
}

// clearTarget makes room for a non-directory at dst in upper.
func (w *writer) clearTarget(dst string) error {
	fi, err := w.upperInfo(dst)
	if err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	if fi != nil {
		if fi.IsDir() {
			return fmt.Errorf("%s: cannot overwrite directory /%s with a file", w.instr, dst)
		}
		return w.up.Remove(dst)
	}
	low, err := w.lower(dst)
	if err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	if low != nil && low.IsDir() {
		return fmt.Errorf("%s: cannot overwrite directory /%s with a file", w.instr, dst)
	}
	return nil
}

// copyEntry copies a regular file or symlink of the context to dst.
func (w *writer) copyEntry(src, dst string, fi fs.FileInfo) error {
	if err := w.clearTarget(dst); err != nil {
		return err
	}
	if fi.Mode()&fs.ModeSymlink != 0 {
		target, err := w.c.root.Readlink(src)
		if err != nil {
			return fmt.Errorf("%s: %w", w.instr, err)
		}
		return w.symlink(target, dst, w.uid, w.gid, fi.ModTime())
	}
	in, err := w.c.openRegular(src)
	if err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	defer in.Close()
	mode := fi.Mode()
	if w.chmod != nil {
		mode = *w.chmod
	}
	return w.writeFile(dst, in, mode, w.uid, w.gid, fi.ModTime())
}

func (w *writer) writeFile(dst string, r io.Reader, mode fs.FileMode, uid, gid int, mtime time.Time) error {
	out, err := w.up.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	_, err = io.Copy(out, ctxReader{w.ctx, r})
	if err == nil {
		// Owner first: chown clears setuid/setgid bits.
		err = out.Chown(uid, gid)
	}
	if err == nil {
		err = out.Chmod(permOf(mode))
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = w.up.Chtimes(dst, mtime, mtime)
	}
	if err != nil {
		return fmt.Errorf("%s: writing /%s: %w", w.instr, dst, err)
	}
	return nil
}

func (w *writer) symlink(target, dst string, uid, gid int, mtime time.Time) error {
	if err := w.up.Symlink(target, dst); err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	if err := w.up.Lchown(dst, uid, gid); err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	// os.Root has no Lchtimes: set the link's own times relative to its
	// directory's descriptor.
	dir, err := w.up.Open(path.Dir(dst))
	if err != nil {
		return fmt.Errorf("%s: %w", w.instr, err)
	}
	defer dir.Close()
	ts := []unix.Timespec{unix.NsecToTimespec(mtime.UnixNano()), unix.NsecToTimespec(mtime.UnixNano())}
	if err := unix.UtimesNanoAt(int(dir.Fd()), path.Base(dst), ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("%s: setting times of /%s: %w", w.instr, dst, err)
	}
	return nil
}

// finish sets the mtimes of the directories created, deepest (latest)
// first, after everything was written into them.
func (w *writer) finish() error {
	for i := len(w.dirTimes) - 1; i >= 0; i-- {
		d := w.dirTimes[i]
		if err := w.up.Chtimes(d.rel, d.mtime, d.mtime); err != nil {
			return fmt.Errorf("%s: %w", w.instr, err)
		}
	}
	return nil
}

// ctxReader stops a long copy when the build is cancelled.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// lookupOwner resolves a --chown value: numeric ids as they are, names in
// rootfs's /etc/passwd and /etc/group. Without a group, the gid is the uid
// (Docker's documented rule).
func lookupOwner(rootfs, spec string) (uid, gid int, err error) {
	u, g, hasGroup := strings.Cut(spec, ":")
	if uid, err = lookupID(rootfs, "/etc/passwd", u, func(r io.Reader, name string) (int, bool, error) {
		us, err := user.ParsePasswdFilter(r, func(x user.User) bool { return x.Name == name })
		if err != nil || len(us) == 0 {
			return 0, false, err
		}
		return us[0].Uid, true, nil
	}); err != nil {
		return 0, 0, err
	}
	if !hasGroup {
		return uid, uid, nil
	}
	gid, err = lookupID(rootfs, "/etc/group", g, func(r io.Reader, name string) (int, bool, error) {
		gs, err := user.ParseGroupFilter(r, func(x user.Group) bool { return x.Name == name })
		if err != nil || len(gs) == 0 {
			return 0, false, err
		}
		return gs[0].Gid, true, nil
	})
	return uid, gid, err
}

func lookupID(rootfs, file, name string, find func(io.Reader, string) (int, bool, error)) (int, error) {
	if n, err := strconv.Atoi(name); err == nil {
		if n < 0 {
			return 0, fmt.Errorf("negative id %d", n)
		}
		return n, nil
	}
	kind := "user"
	if file == "/etc/group" {
		kind = "group"
	}
	p, err := securejoin.SecureJoin(rootfs, file)
	if err != nil {
		return 0, fmt.Errorf("reading %s of the image: %w", file, err)
	}
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("unknown %s %q: the image has no %s", kind, name, file)
	}
	if err != nil {
		return 0, fmt.Errorf("reading %s of the image: %w", file, err)
	}
	defer f.Close()
	id, ok, err := find(f, name)
	if err != nil {
		return 0, fmt.Errorf("reading %s of the image: %w", file, err)
	}
	if !ok {
		return 0, fmt.Errorf("unknown %s %q (not in the image's %s)", kind, name, file)
	}
	return id, nil
}
