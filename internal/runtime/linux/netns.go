package linux

import (
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// A sandbox that joins a network namespace prepared by the caller
// (Spec.NetNS) is in a namespace owned by the host's user namespace, not by its
// own. Two things follow, and prepareNetNS handles both from the host:
//
//   - the sandbox cannot mount sysfs (the kernel wants CAP_SYS_ADMIN over the
//     netns's owner), so the host mounts a read-only sysfs instance *for that
//     netns* at <Spec.Dir>/sys and the sandbox gets it as a bind mount. A bind
//     of the host's /sys (runc's rootless answer) would show the host's
//     interfaces, other sandboxes' veths among them;
//   - its root's CAP_NET_BIND_SERVICE does not count there, so ports below
//     1024 are opened to every uid of that netns (ip_unprivileged_port_start
//     = 0, what Docker does in every container). The netns holds only this
//     sandbox, so that gives nothing to anyone else.

// sysfsMountPoint is where the netns's sysfs lives on the host.
func sysfsMountPoint(dir string) string { return filepath.Join(dir, "sys") }

// prepareNetNS mounts the sysfs of netns at sysfsMountPoint(dir) and sets the
// netns's unprivileged port start to 0.
func prepareNetNS(netns, dir string) error {
	target := sysfsMountPoint(dir)
	if err := os.MkdirAll(target, 0o755); err != nil {
		return fmt.Errorf("sysfs mount point: %w", err)
	}
	mfd, err := inNetNS(netns, func() (int, error) {
		// /proc/sys/net is the netns of the thread that opens it.
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0"), 0); err != nil {
			return -1, fmt.Errorf("ip_unprivileged_port_start: %w", err)
		}
		fsfd, err := unix.Fsopen("sysfs", unix.FSOPEN_CLOEXEC)
		if err != nil {
			return -1, fmt.Errorf("fsopen sysfs: %w", err)
		}
		defer unix.Close(fsfd)
		// The superblock takes the netns of the thread that creates it.
		if err := unix.FsconfigCreate(fsfd); err != nil {
			return -1, fmt.Errorf("create sysfs: %w", err)
		}
		mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC,
			unix.MOUNT_ATTR_RDONLY|unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
		if err != nil {
			return -1, fmt.Errorf("fsmount sysfs: %w", err)
		}
		return mfd, nil
	})
	if err != nil {
		return fmt.Errorf("netns %s: %w", netns, err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("attach sysfs at %s: %w", target, err)
	}
	return nil
}

// inNetNS runs fn on an OS thread that has joined netns, then returns the
// thread to the host's netns. A thread that cannot go back is left locked, so
// the Go runtime ends it instead of reusing it.
func inNetNS(netns string, fn func() (int, error)) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{-1, err}
			return
		}
		defer host.Close()
		target, err := os.Open(netns)
		if err != nil {
			ch <- result{-1, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{-1, fmt.Errorf("join: %w", err)}
			return
		}
		fd, err := fn()
		if serr := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); serr != nil {
			// Stay locked: the thread dies with this goroutine.
			if fd >= 0 {
				unix.Close(fd)
			}
			ch <- result{-1, fmt.Errorf("return to the host netns: %w", serr)}
			return
		}
		goruntime.UnlockOSThread()
		ch <- result{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}

// joinNetNS points the spec at the prepared netns and replaces its sysfs mount
// with a read-only bind of the netns's own sysfs.
func joinNetNS(s *specs.Spec, netns, dir string) {
	for i := range s.Linux.Namespaces {
		if s.Linux.Namespaces[i].Type == specs.NetworkNamespace {
			s.Linux.Namespaces[i].Path = netns
		}
	}
	for i, m := range s.Mounts {
		if m.Type == "sysfs" {
			s.Mounts[i] = specs.Mount{
				Destination: m.Destination, Type: "bind", Source: sysfsMountPoint(dir),
				Options: []string{"rbind", "ro", "nosuid", "nodev", "noexec"},
			}
		}
	}
}
