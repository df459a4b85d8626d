package template

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// runCommand runs a build tool with its output into out. The tool gets its own process
// group so cancellation kills it together with everything it started (dpkg, maintainer
// scripts), and the namespaces in unshare when we are root (the only case where the
// real tools work anyway).
func runCommand(ctx context.Context, out io.Writer, env []string, unshare uintptr, name string, args ...string) error {
	// Tools come from the host's PATH even when env is meant for inside a chroot.
	path, err := lookPath(name, hostEnv())
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if os.Geteuid() == 0 {
		cmd.SysProcAttr.Unshareflags = unshare
	}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	// A killed tool's grandchildren may hold the output pipe open; don't wait on them.
	cmd.WaitDelay = 5 * time.Second
	err = cmd.Run()
	if cmd.Process != nil {
		// Nothing the tool started may outlive it and keep writing into the rootfs.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	if err != nil && ctx.Err() != nil {
		return fmt.Errorf("%s: %w", name, ctx.Err())
	}
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// hostEnv is our environment with the sbin directories on PATH: debootstrap and chroot
// live there, and a non-login root shell often lacks them.
func hostEnv() []string {
	env := os.Environ()
	path := os.Getenv("PATH")
	have := map[string]bool{}
	for _, d := range filepath.SplitList(path) {
		have[d] = true
	}
	for _, d := range []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"} {
		if !have[d] {
			path += string(filepath.ListSeparator) + d
		}
	}
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "PATH=") && !strings.HasPrefix(kv, "LC_ALL=") && !strings.HasPrefix(kv, "DEBIAN_FRONTEND=") {
			out = append(out, kv)
		}
	}
	return append(out, "PATH="+strings.TrimPrefix(path, string(filepath.ListSeparator)))
}

// lookPath finds name on the PATH of env (not of this process, which exec.LookPath uses),
// so the builder and the tools agree on which binaries run.
func lookPath(name string, env []string) (string, error) {
	path := ""
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			continue
		}
		p := filepath.Join(dir, name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	hint := ""
	if name == "debootstrap" {
		hint = " (install it: scripts/setup.sh)"
	}
	return "", fmt.Errorf("%s not found on PATH%s: %w", name, hint, exec.ErrNotFound)
}

// diskUsage sums the allocated size of a tree, counting hard-linked files once, like du.
func diskUsage(root string) (int64, error) {
	var total int64
	seen := map[[2]uint64]bool{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			total += info.Size()
			return nil
		}
		if st.Nlink > 1 && !d.IsDir() {
			id := [2]uint64{st.Dev, st.Ino}
			if seen[id] {
				return nil
			}
			seen[id] = true
		}
		total += st.Blocks * 512
		return nil
	})
	if err != nil {
		return 0, fmt.Errorf("measure %s: %w", root, err)
	}
	return total, nil
}

func or(s, def string) string {
	if s == "" {
		return def
	}
	return s
}
