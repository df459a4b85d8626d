package linux

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"

	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/timing"
)

// Every boot of a sandbox gets a boot id of its own in
// /proc/sys/kernel/random/boot_id, as a machine does: software keys caches and
// "did we reboot" checks on it, and E2B's resume without memory is a boot. The
// kernel has one per host, libcontainer refuses any mount under /proc but
// lxcfs's files, so a CreateRuntime hook binds it from the host: a file of
// the sandbox's root filesystem (bootIDFile, written for each boot) mounted
// over the kernel's in the sandbox's mount namespace, once /proc is mounted
// and before pivot_root. The mount is of the sandbox's own root filesystem,
// so CRIU saves and restores it with the rest, and a restore (not a boot)
// keeps the id the image has.

// bootIDFile is where a boot's id lives in the sandbox's root filesystem:
// read-only to it (the host's root owns it), hidden by its dot.
const bootIDFile = "/etc/.airlock-boot-id"

// newBootID is a random (version 4) UUID, as the kernel writes boot_id.
func newBootID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x\n", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16]), nil
}

// bindBootID writes a new boot id into rootfs and binds it over
// /proc/sys/kernel/random/boot_id in the mount namespace of pid.
func bindBootID(rootfs string, pid int) error {
	id, err := newBootID()
	if err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	src := filepath.Join(rootfs, bootIDFile)
	if err := os.MkdirAll(filepath.Dir(src), 0o755); err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	if err := os.WriteFile(src+".tmp", []byte(id), 0o444); err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	if err := os.Rename(src+".tmp", src); err != nil {
		return fmt.Errorf("boot id: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		// The thread joins the sandbox's mount namespace and never comes
		// back: it stays locked and ends with this goroutine. setns of a
		// mount namespace needs a thread that shares its filesystem
		// attributes with no other, hence the unshare first.
		goruntime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			done <- fmt.Errorf("unshare fs: %w", err)
			return
		}
		ns, err := os.Open("/proc/" + strconv.Itoa(pid) + "/ns/mnt")
		if err != nil {
			done <- err
			return
		}
		defer ns.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNS); err != nil {
			done <- fmt.Errorf("join the mount namespace: %w", err)
			return
		}
		target := filepath.Join(rootfs, "proc/sys/kernel/random/boot_id")
		if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
			done <- fmt.Errorf("bind over %s: %w", target, err)
			return
		}
		done <- nil
	}()
	return <-done
}

// bootIDHook makes every boot of cfg's sandbox (not a restore) get a boot id
// of its own.
// ctx carries the start's timing (rt.hook.boot_id).
func bootIDHook(ctx context.Context, cfg *configs.Config, rootfs string) {
	if cfg.Hooks == nil {
		cfg.Hooks = configs.Hooks{}
	}
	cfg.Hooks[configs.CreateRuntime] = append(cfg.Hooks[configs.CreateRuntime],
		configs.NewFunctionHook(func(st *specs.State) error {
			defer timing.Start(ctx, "rt.hook.boot_id")()
			if err := bindBootID(rootfs, st.Pid); err != nil {
				return fmt.Errorf("linux runtime: %w", err)
			}
			return nil
		}))
}
