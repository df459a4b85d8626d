// Package nsfile keeps a network namespace alive by a bind mount of it at a
// path of Airlock's state directory, the way ip-netns keeps one under
// /var/run/netns: Make creates one there, Remove lets it go.
package nsfile

import (
	"errors"
	"fmt"
	"os"
	goruntime "runtime"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/mountutil"
)

// Make creates a network namespace and bind-mounts it at path, without
// moving the calling goroutine's thread into it for longer than the unshare.
//
// vishvananda/netns has NewNamed, but only for /var/run/netns/<name>; the
// namespace must live under Airlock's own state directory, so the unshare and
// bind mount are done here.
func Make(path string) (netns.NsHandle, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return -1, fmt.Errorf("netns mount point: %w", err)
	}
	f.Close()

	type result struct {
		h   netns.NsHandle
		err error
	}
	done := make(chan result, 1)
	// A dedicated, locked thread: if returning it to the host namespace fails,
	// the goroutine exits still locked and the runtime discards the thread
	// instead of reusing one that sits in the sandbox's namespace.
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			done <- result{-1, fmt.Errorf("current netns: %w", err)}
			return
		}
		defer orig.Close()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			done <- result{-1, fmt.Errorf("unshare netns: %w", err)}
			goruntime.UnlockOSThread()
			return
		}
		self := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		mountErr := unix.Mount(self, path, "", unix.MS_BIND, "")
		var h netns.NsHandle = -1
		if mountErr == nil {
			h, mountErr = netns.GetFromPath(path)
		}
		if err := netns.Set(orig); err != nil {
			// Thread stays locked and dies with the goroutine.
			done <- result{-1, errors.Join(mountErr, fmt.Errorf("return to host netns: %w", err))}
			return
		}
		goruntime.UnlockOSThread()
		if mountErr != nil {
			done <- result{-1, fmt.Errorf("bind netns: %w", mountErr)}
			return
		}
		done <- result{h, nil}
	}()
	r := <-done
	if r.err != nil {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
	}
	return r.h, r.err
}

// Remove unmounts and removes a namespace bind mount; the namespace dies
// with its last user (the sandbox's processes are gone by then).
func Remove(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unmount netns %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove netns %s: %w", path, err)
	}
	return nil
}

// Ensure makes a namespace at path (Make) unless one is mounted there
// already; a file left there without one is replaced.
func Ensure(path string) error {
	if mounted, err := mountutil.IsMountPoint(path); err == nil && mounted {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("stale netns mount point %s: %w", path, err)
	}
	h, err := Make(path)
	if err != nil {
		return err
	}
	h.Close()
	return nil
}
