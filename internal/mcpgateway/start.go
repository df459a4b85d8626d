package mcpgateway

import (
	"bufio"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// reportGrace is how long past the start's deadline the command still waits
// for the daemon's own report (which says what it was doing) before it
// gives up on it.
const reportGrace = 3 * time.Second

// startGateway is `mcp-gateway --config JSON`, as E2B's SDK runs it (as
// root, in the foreground, GATEWAY_ACCESS_TOKEN in its environment): check
// the config, refuse a second gateway, write the config and token, start the
// daemon detached, and wait for it to be ready. Exit 0 once it serves, or 1
// with the reason on stderr, which the SDK shows as
// "Failed to start MCP gateway: <stderr>".
func startGateway(o *Options, config string, stdout, stderr io.Writer) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(stderr, format+"\n", args...)
		return 1
	}
	if strings.TrimSpace(config) == "" {
		return fail("--config is required: a JSON object whose keys are MCP server names, e.g. --config '{\"memory\": {}}'")
	}
	if _, err := parseConfig([]byte(config), o); err != nil {
		return fail("%v", err)
	}
	for _, d := range []string{o.EtcDir, o.LogDir, o.StateDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fail("creating %s: %v", d, err)
		}
	}

	// One gateway per sandbox: the daemon inherits this flock and holds it
	// while it lives. Taken before the token is written, so that a second
	// start never replaces the token of the gateway that serves.
	lock, err := os.OpenFile(o.lockFile(), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fail("opening the lock %s: %v", o.lockFile(), err)
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return fail("%s", alreadyRunning(lock))
		}
		return fail("locking %s: %v", o.lockFile(), err)
	}
	_ = lock.Truncate(0)

	token := os.Getenv("GATEWAY_ACCESS_TOKEN")
	if token == "" {
		token = rand.Text()
	}
	// Both hold secrets (a server's token, the gateway's): root only.
	if err := writeFileAtomic(o.configFile(), []byte(config), 0o600); err != nil {
		return fail("writing the config: %v", err)
	}
	if err := writeFileAtomic(o.tokenFile(), []byte(token), 0o600); err != nil {
		return fail("writing the token: %v", err)
	}
	logf, err := os.OpenFile(o.logFile(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fail("opening the log %s: %v", o.logFile(), err)
	}
	defer logf.Close()

	pr, pw, err := os.Pipe()
	if err != nil {
		return fail("%v", err)
	}
	defer pr.Close()
	deadline := time.Now().Add(o.Timeout)
	cmd := &exec.Cmd{
		Path: o.Exe,
		Args: append([]string{"mcp-gateway", daemonCmd, "--deadline=" + strconv.FormatInt(deadline.UnixNano(), 10)}, o.flags()...),
		Env:  os.Environ(),
		Dir:  "/",
		// stdin is /dev/null; output goes to the log, not to this command's
		// pipes, which envd would otherwise hold open after it exits.
		Stdout:     logf,
		Stderr:     logf,
		ExtraFiles: []*os.File{pw, lock},
		// Its own session: out of this command's process group, which envd
		// signals when the command is killed or times out.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	err = cmd.Start()
	pw.Close()
	if err != nil {
		return fail("starting the gateway daemon: %v", err)
	}
	pid := cmd.Process.Pid

	rep, err := readReport(pr, deadline.Add(reportGrace))
	switch {
	case err != nil:
		// Timed out or died without a word: make sure it is gone, so the
		// lock and the port are free for the next try.
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		_, _ = cmd.Process.Wait()
		return fail("%v%s", err, logTail(o.logFile(), pid))
	case rep.Error != "":
		// It exits after reporting; waiting frees the lock and the port
		// for the next try.
		waitExit(cmd.Process, exitWait)
		return fail("%s", rep.Error)
	}
	// Ready: leave it running (envd, pid 1, reaps it in the end).
	_ = cmd.Process.Release()
	var parts []string
	for _, s := range rep.Servers {
		parts = append(parts, fmt.Sprintf("%s (%d tools)", s.Name, s.Tools))
	}
	fmt.Fprintf(stdout, "MCP gateway ready: http://%s/mcp, pid %d, servers: %s; log: %s\n", rep.Addr, rep.PID, strings.Join(parts, ", "), o.logFile())
	return 0
}

// exitWait bounds the wait for a daemon that reported a failure to exit.
const exitWait = 10 * time.Second

// waitExit waits for the daemon to exit, and kills its process group when
// it takes longer than d.
func waitExit(p *os.Process, d time.Duration) {
	done := make(chan struct{})
	go func() {
		_, _ = p.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(d):
		_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
		<-done
	}
}

// readReport reads the daemon's report, until the deadline.
func readReport(r *os.File, deadline time.Time) (*readyReport, error) {
	_ = r.SetReadDeadline(deadline)
	line, err := bufio.NewReader(r).ReadBytes('\n')
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return nil, errors.New("the gateway did not become ready in time")
		}
		return nil, errors.New("the gateway exited before it was ready")
	}
	var rep readyReport
	if err := json.Unmarshal(line, &rep); err != nil {
		return nil, fmt.Errorf("the gateway's report is not readable: %w", err)
	}
	return &rep, nil
}

// alreadyRunning is the message that refuses a second gateway.
func alreadyRunning(lock *os.File) string {
	var info lockInfo
	b, _ := io.ReadAll(io.NewSectionReader(lock, 0, 4096))
	if json.Unmarshal(b, &info) == nil && info.PID > 0 {
		return fmt.Sprintf("an MCP gateway is already running in this sandbox (pid %d, listening on %s); it keeps the config it started with: stop it (kill %d) to start another", info.PID, info.Addr, info.PID)
	}
	return "an MCP gateway is already running (or starting) in this sandbox"
}

// logTail is the daemon's last log lines, for a failure it could not report.
func logTail(path string, pid int) string {
	b, err := os.ReadFile(path)
	if err != nil || len(b) == 0 {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return fmt.Sprintf(" (pid %d); the end of %s:\n%s", pid, path, strings.Join(lines, "\n"))
}

// writeFileAtomic writes a file whole or not at all, with its mode from the
// start (never briefly readable by others).
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	if err := f.Chmod(mode); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("renaming into place: %w", err)
	}
	return nil
}
