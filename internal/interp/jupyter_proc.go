package interp

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/usercgroup"
)

// kernelCmd builds the command of a kernel process: run as the context's user, in its own
// process group (so Close and interrupts reach everything the code started), with the
// sandbox env plus overrides (later KEY=VALUE entries win).
func kernelCmd(opts Options, argv []string, overrides ...string) *exec.Cmd {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = opts.Cwd
	cmd.Env = mergeEnv(opts.Env, overrides)
	attr := &syscall.SysProcAttr{Setpgid: true}
	if opts.UID != uint32(os.Getuid()) || opts.GID != uint32(os.Getgid()) || len(opts.Groups) > 0 {
		attr.Credential = &syscall.Credential{Uid: opts.UID, Gid: opts.GID, Groups: opts.Groups}
	}
	cmd.SysProcAttr = attr
	return cmd
}

// mergeEnv appends overrides to base, dropping base entries whose key an override sets.
func mergeEnv(base, overrides []string) []string {
	set := map[string]bool{}
	for _, kv := range overrides {
		k, _, _ := strings.Cut(kv, "=")
		set[k] = true
	}
	out := make([]string, 0, len(base)+len(overrides))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if !set[k] {
			out = append(out, kv)
		}
	}
	return append(out, overrides...)
}

// envValue returns KEY's value in a KEY=VALUE list (the last one wins, as for execve).
func envValue(env []string, key string) string {
	v := ""
	for _, kv := range env {
		if k, val, ok := strings.Cut(kv, "="); ok && k == key {
			v = val
		}
	}
	return v
}

// killGroup ends a kernel's process group: SIGKILL to -pgid, then reaps the leader through
// waitDone (closed once cmd.Wait returned). The kernel's pid is its pgid (Setpgid).
func killGroup(cmd *exec.Cmd, waitDone <-chan struct{}) error {
	if cmd.Process == nil {
		return nil
	}
	pid := cmd.Process.Pid
	if err := syscall.Kill(-pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("kill kernel process group %d: %w", pid, err)
	}
	select {
	case <-waitDone:
	case <-time.After(5 * time.Second):
		return fmt.Errorf("kernel process %d not reaped after SIGKILL", pid)
	}
	return nil
}

// prepareRunDir makes the kernel's support-file directory, readable by the kernel's user.
func prepareRunDir(opts Options) error {
	if opts.RunDir == "" {
		return errors.New("interp: Options.RunDir is empty")
	}
	if err := os.MkdirAll(opts.RunDir, 0o755); err != nil {
		return fmt.Errorf("create run dir: %w", err)
	}
	return nil
}

// writeKernelFile writes a support file into RunDir owned by the kernel's user (the
// connection file holds the HMAC key: mode 0600).
func writeKernelFile(opts Options, name string, data []byte, mode os.FileMode) (string, error) {
	path := opts.RunDir + "/" + name
	tmp := path + ".tmp-" + randomHex(4) // unique: kernels may share a RunDir
	if err := os.WriteFile(tmp, data, mode); err != nil {
		return "", fmt.Errorf("write %s: %w", name, err)
	}
	if os.Getuid() == 0 {
		if err := os.Chown(tmp, int(opts.UID), int(opts.GID)); err != nil {
			return "", fmt.Errorf("chown %s: %w", name, err)
		}
	}
	if err := os.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("install %s: %w", name, err)
	}
	return path, nil
}

// startKernel starts a kernel (or a probe of the interpreter) in a cgroup of
// its own, as envd does for every user process (internal/usercgroup): code
// run in a kernel is the user's, and must not take envd's reserve of pids
// and memory.
func startKernel(cmd *exec.Cmd) error {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	err, _ := usercgroup.Start(cmd.SysProcAttr, cmd.Start)
	return err
}
