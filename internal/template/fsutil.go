package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// mountedFrom reports whether any mount in our namespace uses the build directory dir:
// something mounted inside it, a bind or idmapped mount of its rootfs (mountinfo's root
// field), or an overlay with it as a lower layer. Deleting files under a live overlay is
// undefined behaviour, so this guards sandboxes even when no InUse hook is given.
func mountedFrom(dir string) (bool, error) {
	mounts, err := mountinfo.GetMounts(nil)
	if err != nil {
		return false, fmt.Errorf("list mounts: %w", err)
	}
	// The key directory name is a 64-bit hash, so this suffix names one build even when
	// the data directory sits on its own filesystem and roots are relative to it.
	rootfs := "/" + filepath.Base(dir) + "/rootfs"
	for _, m := range mounts {
		if m.Mountpoint == dir || strings.HasPrefix(m.Mountpoint, dir+"/") ||
			strings.Contains(m.Root+"/", rootfs+"/") || strings.Contains(m.VFSOptions, rootfs) {
			return true, nil
		}
	}
	return false, nil
}

// discard deletes the build directory nameDir/key. It renames it first so Get never
// sees a half-deleted build under a valid key, and a crash mid-way leaves only an .old-
// directory that the next build cleans up.
func discard(nameDir, key string) error {
	old, err := os.MkdirTemp(nameDir, ".old-"+key+"-")
	if err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(nameDir, key), filepath.Join(old, "build")); err != nil {
		_ = os.Remove(old)
		return err
	}
	return removeTree(old, false)
}

// removeTree deletes dir. A debootstrap killed mid-way may have left proc or sysfs
// mounted inside the target if it ran without its private mount namespace; RemoveAll
// would then descend into the host's /proc or /sys. So mounts below dir are detached
// first when unmount is set, and otherwise make the removal fail.
func removeTree(dir string, unmount bool) error {
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("list mounts under %s: %w", dir, err)
	}
	if len(mounts) > 0 && !unmount {
		return fmt.Errorf("%s has %d mounts inside", dir, len(mounts))
	}
	// Deepest first, so a parent is never detached from under a child we still see.
	sort.Slice(mounts, func(i, j int) bool { return len(mounts[i].Mountpoint) > len(mounts[j].Mountpoint) })
	for _, m := range mounts {
		if err := unix.Unmount(m.Mountpoint, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("unmount %s: %w", m.Mountpoint, err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove %s: %w", dir, err)
	}
	return nil
}

// lockDir takes an exclusive flock on dir/.lock, polling so ctx can interrupt the wait.
// The kernel drops the lock if the process dies, so a crashed build never blocks others.
func lockDir(ctx context.Context, dir string, p *progress) (unlock func(), err error) {
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open lock file: %w", err)
	}
	waiting := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		if !waiting {
			waiting = true
			p.setPhase("waiting for another build of this template to finish")
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return func() {
		_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
	}, nil
}

// syncFS flushes the filesystem holding dir: one syncfs is far cheaper than fsyncing
// each of the tens of thousands of files in a rootfs.
func syncFS(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.Syncfs(int(f.Fd())); err != nil {
		return fmt.Errorf("syncfs %s: %w", dir, err)
	}
	return nil
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", dir, err)
	}
	return nil
}

func formatSize(n int64) string {
	return fmt.Sprintf("%d MB", (n+500_000)/1_000_000)
}

// copyDirAttrs creates dst as a directory with src's mode, owner and times, unless
// dst exists already.
func copyDirAttrs(src, dst string, st os.FileInfo) error {
	if _, err := os.Lstat(dst); err == nil {
		return nil
	}
	if err := os.Mkdir(dst, st.Mode().Perm()); err != nil {
		return err
	}
	// Mkdir applies the umask and drops setgid/sticky bits; set them exactly.
	if err := os.Chmod(dst, st.Mode()&(os.ModePerm|os.ModeSetgid|os.ModeSetuid|os.ModeSticky)); err != nil {
		return err
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		if err := os.Lchown(dst, int(sys.Uid), int(sys.Gid)); err != nil {
			return err
		}
	}
	return os.Chtimes(dst, st.ModTime(), st.ModTime())
}

// writeFileAtomic replaces path with data durably: readers see the old file
// or the new one, and a crash leaves one of the two.
func writeFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, ".tmp-"+filepath.Base(path)+"-*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr, os.Chmod(tmp.Name(), perm)); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		os.Remove(tmp.Name())
		return fmt.Errorf("write %s: %w", path, err)
	}
	return syncDir(dir)
}
