package mcpgateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// gateway runs the test binary as `mcp-gateway <the env's flags> args...`,
// as E2B's SDK runs the command, and returns its output and exit status.
func (e *testEnv) gateway(t *testing.T, token string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var o, er bytes.Buffer
	cmd := exec.Command(e.exe)
	// The env's flags first: a test's own flags, later, win.
	cmd.Args = append(append([]string{"mcp-gateway"}, e.opts.flags()...), args...)
	cmd.Env = append(os.Environ(), "GATEWAY_ACCESS_TOKEN="+token)
	cmd.Stdout, cmd.Stderr = &o, &er
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatal(err)
	}
	return o.String(), er.String(), code
}

// start runs `mcp-gateway --config config` and expects it to succeed; the
// daemon it started is stopped when the test ends.
func (e *testEnv) start(t *testing.T, token, config string) lockInfo {
	t.Helper()
	out, errOut, code := e.gateway(t, token, "--config", config)
	if code != 0 {
		t.Fatalf("mcp-gateway --config: exit %d\nstdout: %s\nstderr: %s\nlog:\n%s", code, out, errOut, readFile(e.opts.logFile()))
	}
	info := e.lockInfo(t)
	if !strings.HasPrefix(out, "MCP gateway ready: http://"+info.Addr+"/mcp, pid ") {
		t.Errorf("stdout = %q", out)
	}
	t.Cleanup(func() { stopDaemon(t, info.PID) })
	return info
}

func (e *testEnv) lockInfo(t *testing.T) lockInfo {
	t.Helper()
	var info lockInfo
	if err := json.Unmarshal([]byte(readFile(e.opts.lockFile())), &info); err != nil || info.PID == 0 {
		t.Fatalf("lock file: %q %v", readFile(e.opts.lockFile()), err)
	}
	return info
}

func readFile(p string) string {
	b, _ := os.ReadFile(p)
	return string(b)
}

// stopDaemon ends a daemon (this process is its subreaper) and reaps it.
func stopDaemon(t *testing.T, pid int) int {
	t.Helper()
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return -1 // already stopped and reaped
	}
	done := make(chan unix.WaitStatus, 1)
	go func() {
		var ws unix.WaitStatus
		for {
			_, err := unix.Wait4(pid, &ws, 0, nil)
			if !errors.Is(err, unix.EINTR) {
				break
			}
		}
		done <- ws
	}()
	select {
	case ws := <-done:
		return ws.ExitStatus()
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(pid, syscall.SIGKILL)
		t.Errorf("daemon %d did not stop on SIGTERM", pid)
		<-done
		return -1
	}
}

func TestStartCommand(t *testing.T) {
	e := newTestEnv(t)
	e.shipRepo(t, "acme", "tools")
	// A repository to clone (the gateway clones from GitHubURL, here a
	// directory): installCmd leaves a mark in the clone.
	remote := filepath.Join(e.dir, "remote", "acme", "cloned")
	gitInit(t, remote)
	config := `{"memory": {}, "github/acme/tools": {"runCmd": "` + strings.ReplaceAll(e.runCmd("gamma"), `"`, `\"`) + `"},
		"github/acme/cloned": {"installCmd": "touch installed-mark; echo installing", "runCmd": "test -f installed-mark && ` + strings.ReplaceAll(e.runCmd("delta"), `"`, `\"`) + `"}}`
	const token = "3f1c1b2e-8d8c-4c43-9f6e-1f2a3b4c5d6e"
	info := e.start(t, token, config)

	// The files the SDK and the daemon read: root only.
	for path, want := range map[string]string{e.opts.tokenFile(): token, e.opts.configFile(): config} {
		fi, err := os.Stat(path)
		if err != nil || fi.Mode().Perm() != 0o600 || readFile(path) != want {
			t.Errorf("%s: %v %v %q", path, fi.Mode(), err, readFile(path))
		}
	}
	if _, err := os.Stat(filepath.Join(e.opts.GitHubDir, "acme", "cloned", "installed-mark")); err != nil {
		t.Errorf("the clone lacks installCmd's mark: %v", err)
	}
	// The daemon is detached: its own session, alive after the command.
	if sid, err := unix.Getsid(info.PID); err != nil || sid != info.PID {
		t.Errorf("daemon's session = %d, %v; want its own (%d)", sid, err, info.PID)
	}

	url := "http://" + info.Addr
	cs := connectWith(t, url, token, "", nil)
	for name, want := range map[string]string{"memory_echo": "beta: e2e", "tools_echo": "gamma: e2e", "cloned_echo": "delta: e2e"} {
		if _, txt := callText(t, cs, name, map[string]any{"text": "e2e"}); txt != want {
			t.Errorf("%s = %q, want %q", name, txt, want)
		}
	}
	if _, txt := callText(t, cs, "memory_env", map[string]any{"name": "GATEWAY_ACCESS_TOKEN"}); txt != "<unset>" {
		t.Errorf("a server saw the gateway's token: %q", txt)
	}
	resp, err := http.Get(url + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health: %v %v", resp, err)
	}
	resp.Body.Close()

	// A second start is refused, and leaves the running gateway's token.
	_, errOut, code := e.gateway(t, "other-token", "--config", `{"memory": {}}`)
	if want := "an MCP gateway is already running in this sandbox (pid " + strconv.Itoa(info.PID) + ", listening on " + info.Addr + ")"; code != 1 || !strings.Contains(errOut, want) {
		t.Errorf("second start: exit %d, stderr %q; want 1 and %q", code, errOut, want)
	}
	if readFile(e.opts.tokenFile()) != token {
		t.Error("the second start replaced the token")
	}

	log := readFile(e.opts.logFile())
	for _, want := range []string{
		`msg="gateway starting"`, `msg="repository directory exists (shipped by the template); not cloning" server=github/acme/tools`,
		`msg=cloning server=github/acme/cloned`, `msg=installCmd server=github/acme/cloned line=installing`,
		`msg="server initialized" server=memory`, `msg="gateway ready"`,
		`msg=stderr server=memory line="test server beta starting (generation 0)"`,
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %s:\n%s", want, log)
		}
	}
	if fi, err := os.Stat(e.opts.logFile()); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("log file mode: %v %v", fi, err)
	}

	// SIGTERM stops it cleanly; the lock is free for the next start.
	if status := stopDaemon(t, info.PID); status != 0 {
		t.Errorf("daemon exited %d", status)
	}
	if !strings.Contains(readFile(e.opts.logFile()), `msg="gateway stopped"`) {
		t.Error("no stop in the log")
	}
	e.start(t, "another", `{"memory": {}}`)
	if readFile(e.opts.tokenFile()) != "another" {
		t.Error("the new start did not write its token")
	}
}

// TestStartCommandRandomToken: without GATEWAY_ACCESS_TOKEN the gateway
// makes one, which the token file holds.
func TestStartCommandRandomToken(t *testing.T) {
	e := newTestEnv(t)
	e.start(t, "", `{}`)
	if tok := readFile(e.opts.tokenFile()); len(tok) < 20 {
		t.Errorf("token %q", tok)
	}
}

func TestStartCommandFailures(t *testing.T) {
	e := newTestEnv(t)
	e.shipRepo(t, "acme", "broken")
	gitInit(t, filepath.Join(e.dir, "remote", "acme", "needs-make"))
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		name, config string
		flags        []string
		want         []string
	}{
		{name: "config", config: `{"slack": {}, "filesystem": {"paths": "/"}}`,
			want: []string{`"filesystem": "paths" must be an array of strings` + "\n" + `"slack": unknown MCP server`}},
		{name: "no config", config: ``, want: []string{"--config is required"}},
		{name: "server exits", config: `{"memory": {}, "github/acme/broken": {"runCmd": "` + strings.ReplaceAll(e.runCmd("failstart"), `"`, `\"`) + `"}}`,
			want: []string{`MCP server "github/acme/broken" exited before it answered initialize: exit status 7; its stderr ended with:` + "\n" + `boom: no API key configured`}},
		{name: "server hangs past the start's bound", config: `{"github/acme/broken": {"runCmd": "` + strings.ReplaceAll(e.runCmd("hang"), `"`, `\"`) + `"}}`,
			flags: []string{"--timeout=1s"},
			want:  []string{`the gateway did not start within 1s: MCP server "github/acme/broken" did not answer initialize before the start's time ran out`}},
		{name: "clone fails", config: `{"github/acme/nope": {"runCmd": "x"}}`,
			want: []string{`MCP server "github/acme/nope": git clone file://` + filepath.Join(e.dir, "remote") + `/acme/nope failed (exit status 128); its output ended with:`, "does not appear to be a git repository"}},
		{name: "installCmd fails", config: `{"github/acme/needs-make": {"installCmd": "echo compiling; echo 'error: no toolchain' >&2; exit 2", "runCmd": "x"}}`,
			want: []string{`MCP server "github/acme/needs-make": installCmd "echo compiling; echo 'error: no toolchain' >&2; exit 2" failed (exit status 2); its output ended with:` + "\ncompiling\nerror: no toolchain"}},
		{name: "port in use", config: `{"memory": {}}`, flags: []string{"--listen=" + busy.Addr().String()},
			want: []string{"listening on " + busy.Addr().String() + ": ", "address already in use"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			out, errOut, code := e.gateway(t, "tok", append([]string{"--config", tc.config}, tc.flags...)...)
			if code == 0 {
				stopDaemon(t, e.lockInfo(t).PID)
			}
			if code != 1 {
				t.Fatalf("exit %d; stdout %q stderr %q", code, out, errOut)
			}
			for _, w := range tc.want {
				if !strings.Contains(errOut, w) {
					t.Errorf("stderr lacks %q:\n%s", w, errOut)
				}
			}
			if d := time.Since(start); d > 10*time.Second {
				t.Errorf("failing took %s", d)
			}
		})
	}
	// Nothing is left holding the lock: a good config starts.
	e.start(t, "tok", `{"memory": {}}`)
}

func TestHelpAndVersion(t *testing.T) {
	e := newTestEnv(t)
	out, _, code := e.gateway(t, "", "--version")
	if code != 0 || out != "mcp-gateway "+Version+" (Airlock)\n" {
		t.Errorf("--version: %d %q", code, out)
	}
	out, _, code = e.gateway(t, "", "--help")
	if code != 0 || !strings.Contains(out, "mcp-gateway --config '<json>'") || !strings.Contains(out, "everything, filesystem, github, memory, sequentialthinking") || !strings.Contains(out, "-catalog-dir") {
		t.Errorf("--help: %d %q", code, out)
	}
	_, errOut, code := e.gateway(t, "", "frobnicate")
	if code != 2 || !strings.Contains(errOut, `unknown command "frobnicate"`) {
		t.Errorf("unknown command: %d %q", code, errOut)
	}
}

// gitInit makes a repository with one commit at dir.
func gitInit(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "README"), []byte("a server\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"init", "-q"}, {"add", "README"},
		{"-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "init"},
	} {
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
}
