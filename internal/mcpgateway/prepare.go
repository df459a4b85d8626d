package mcpgateway

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// prepare readies a custom server's directory: the clone a template shipped
// at Dir is used as it is; otherwise the repository is cloned (shallow) into
// a temporary name and renamed into place, so that a failed clone never
// leaves a directory a later start would take for a shipped one. Then
// installCmd runs there, as E2B runs it: in the repository's root, with the
// server's envs.
func prepare(ctx context.Context, s *serverSpec, o *Options, env []string, log *slog.Logger) error {
	log = log.With("server", s.Key)
	if fi, err := os.Stat(s.Dir); err == nil && fi.IsDir() {
		log.Info("repository directory exists (shipped by the template); not cloning", "dir", s.Dir)
	} else {
		url := strings.TrimSuffix(o.GitHubURL, "/") + "/" + s.Owner + "/" + s.Repo
		if err := os.MkdirAll(filepath.Dir(s.Dir), 0o755); err != nil {
			return fmt.Errorf("MCP server %q: %w", s.Key, err)
		}
		tmp := fmt.Sprintf("%s.tmp-%s", s.Dir, rand.Text()[:8])
		log.Info("cloning", "url", url, "dir", s.Dir)
		cmd := exec.Command("git", "clone", "--depth", "1", "--quiet", "--", url, tmp)
		// Never prompt for credentials: a private or missing repository
		// fails at once.
		cmd.Env = append(env, "GIT_TERMINAL_PROMPT=0")
		if out, err := runStep(ctx, cmd, log, "git clone"); err != nil {
			_ = os.RemoveAll(tmp)
			return fmt.Errorf("MCP server %q: git clone %s failed (%w)%s", s.Key, url, err, out.suffixFor("its output"))
		}
		if err := os.Rename(tmp, s.Dir); err != nil {
			_ = os.RemoveAll(tmp)
			return fmt.Errorf("MCP server %q: %w", s.Key, err)
		}
	}
	if s.InstallCmd == "" {
		return nil
	}
	log.Info("running installCmd", "cmd", s.InstallCmd)
	cmd := exec.Command("/bin/sh", "-c", s.InstallCmd)
	cmd.Dir = s.Dir
	cmd.Env = append(env, s.Env...)
	if out, err := runStep(ctx, cmd, log, "installCmd"); err != nil {
		return fmt.Errorf("MCP server %q: installCmd %q failed (%w)%s", s.Key, s.InstallCmd, err, out.suffixFor("its output"))
	}
	return nil
}

// runStep runs a preparation command in its own process group, its output
// logged and its tail kept, killed (the whole group) when ctx ends.
func runStep(ctx context.Context, cmd *exec.Cmd, log *slog.Logger, label string) (*tail, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdin = nil
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		closeAll(r, w)
		return newTailOf(err.Error()), err
	}
	w.Close()
	out := newTail(log, r, label)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-ctx.Done():
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
		err = fmt.Errorf("stopped: %w", context.Cause(ctx))
	}
	// Whatever is left of the group (a daemon the step started) goes too.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	out.wait(time.Second)
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		err = errors.New(ee.ProcessState.String())
	}
	return out, err
}

// newTailOf is a tail holding one line (a start error).
func newTailOf(line string) *tail {
	t := &tail{done: make(chan struct{}), lines: []string{line}}
	close(t.done)
	return t
}
