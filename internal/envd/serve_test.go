package envd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
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

	"connectrpc.com/connect"

	pb "github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func unixClient(sock string, h2c bool) *http.Client {
	tr := &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}
	if h2c {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	return &http.Client{Transport: tr}
}

func TestServeUnixSocketAndH2C(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "run", "envd.sock")
	must(t, os.MkdirAll(filepath.Dir(sock), 0o755))
	// A stale socket from an earlier envd must not stop this one.
	stale, err := net.Listen("unix", sock)
	must(t, err)
	stale.(*net.UnixListener).SetUnlinkOnClose(false)
	stale.Close()

	srv, err := NewServer(envdapi.Config{Listen: []string{"unix:" + sock, "tcp:127.0.0.1:0"}, AccessToken: "t"}, nil)
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("not ready")
	}
	fi, err := os.Stat(sock)
	must(t, err)
	if fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
		t.Fatalf("socket mode %v", fi.Mode())
	}
	for _, h2 := range []bool{false, true} {
		resp, err := unixClient(sock, h2).Get("http://envd/health")
		must(t, err)
		resp.Body.Close()
		if resp.StatusCode != http.StatusNoContent || (h2 && resp.ProtoMajor != 2) {
			t.Fatalf("h2c=%v: %d %s", h2, resp.StatusCode, resp.Proto)
		}
	}
	// Streaming RPC over h2c.
	c := processconnect.NewProcessClient(unixClient(sock, true), "http://envd", connect.WithProtoJSON(),
		connect.WithInterceptors(headerInterceptor{"X-Access-Token": "t"}))
	f := false
	stream, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/echo", Args: []string{"h2"}}, Stdin: &f}))
	must(t, err)
	r := collect(stream)
	if r.stdout != "h2\n" || r.err != nil {
		t.Fatalf("h2c start: %+v", r)
	}
	cancel()
	select {
	case err := <-done:
		must(t, err)
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return")
	}
	if _, err := os.Stat(sock); !os.IsNotExist(err) {
		t.Fatal("socket left behind")
	}
}

func TestNewServerRejectsBadConfig(t *testing.T) {
	if _, err := NewServer(envdapi.Config{Listen: []string{"udp:1.2.3.4:5"}}, nil); err == nil {
		t.Fatal("bad listen address accepted")
	}
	if _, err := NewServer(envdapi.Config{EnvVars: map[string]string{"A=B": "x"}}, nil); err == nil {
		t.Fatal("bad env var name accepted")
	}
}

// TestBinaryAsPID1 builds the real envd binary and runs it as pid 1 of a new pid
// namespace, as the host does: the config arrives on stdin, pid 1 forks the
// server before Go starts (cmd/envd/pid1.c), commands keep their exit
// statuses, orphans get reaped, and SIGTERM reaches the server.
func TestBinaryAsPID1(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the envd binary")
	}
	if os.Geteuid() != 0 {
		testenv.Missing(t, "needs root for a pid namespace")
	}
	dir := t.TempDir()
	bin := filepath.Join(dir, "envd")
	if err := testenv.BuildEnvd(bin); err != nil {
		t.Fatal(err)
	}
	sock := filepath.Join(dir, "envd.sock")
	cfg, _ := json.Marshal(envdapi.Config{SandboxID: "pid1", Listen: []string{"unix:" + sock}})
	cmd := exec.Command(bin)
	cmd.Stdin = bytes.NewReader(cfg)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWPID}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		if errors.Is(err, syscall.EPERM) || errors.Is(err, syscall.EINVAL) {
			testenv.Missing(t, "cannot create a pid namespace here: %v", err)
		}
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Kill()
		<-exited
	}()
	client := unixClient(sock, false)
	testenv.Eventually(t, 10*time.Second, "envd to answer /health", func() bool {
		resp, err := client.Get("http://envd/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusNoContent
	})
	t.Logf("exec to healthy over the socket: %v", time.Since(start))
	checkCReaper(t, cmd.Process.Pid)

	c := processconnect.NewProcessClient(client, "http://envd", connect.WithProtoJSON())
	ctx := ctxTimeout(t, 20*time.Second)
	f := false
	// The orphaned sleep is re-parented to pid 1 and must be reaped there, while
	// the shell's own exit status still reaches the server.
	stream, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "(sleep 0.2 &) ; echo $E2B_SANDBOX_ID; exit 5"}}, Stdin: &f}))
	must(t, err)
	r := collect(stream)
	if r.end.GetExitCode() != 5 || r.stdout != "pid1\n" {
		t.Fatalf("run under pid 1: %+v\n%s", r, logs.String())
	}
	time.Sleep(400 * time.Millisecond)
	// Orphans of the namespace are re-parented to envd's pid 1 (host pid
	// cmd.Process.Pid); none of its children may be left a zombie.
	out, _ := exec.Command("ps", "-eo", "stat,ppid,comm").Output()
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && strings.HasPrefix(f[0], "Z") && f[1] == strconv.Itoa(cmd.Process.Pid) {
			t.Fatalf("zombie left unreaped: %s", line)
		}
	}

	// SIGTERM to pid 1 is forwarded; the server shuts down and pid 1 exits 0.
	must(t, cmd.Process.Signal(syscall.SIGTERM))
	select {
	case err := <-exited:
		exited <- err
		if err != nil {
			t.Fatalf("envd exit: %v\n%s", err, logs.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("envd did not exit on SIGTERM\n%s", logs.String())
	}
}

// A warm-pool envd serves nothing but /health until the host's one /init over
// the unix socket gives it its token and env vars.
func TestAwaitInit(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "envd.sock")
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	tcpAddr := tcp.Addr().String()
	tcp.Close()
	srv, err := NewServer(envdapi.Config{SandboxID: "pooled", Listen: []string{"unix:" + sock, "tcp:" + tcpAddr}, AwaitInit: true}, nil)
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	<-srv.Ready()

	uc := unixClient(sock, false)
	do := func(c *http.Client, method, url, body string, hdr map[string]string) (*http.Response, string) {
		req, _ := http.NewRequest(method, url, strings.NewReader(body))
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := c.Do(req)
		must(t, err)
		defer resp.Body.Close()
		b := new(bytes.Buffer)
		_, _ = b.ReadFrom(resp.Body)
		return resp, b.String()
	}
	if resp, _ := do(uc, "GET", "http://envd/health", "", nil); resp.StatusCode != 204 {
		t.Fatalf("health before init: %d", resp.StatusCode)
	}
	for _, path := range []string{"/envs", "/files?path=/etc/hostname"} {
		if resp, _ := do(uc, "GET", "http://envd"+path, "", nil); resp.StatusCode != 503 {
			t.Fatalf("%s before init: %d", path, resp.StatusCode)
		}
	}
	if resp, body := do(http.DefaultClient, "POST", "http://"+tcpAddr+"/process.Process/List", "{}", map[string]string{"Content-Type": "application/json"}); resp.StatusCode != 503 {
		t.Fatalf("rpc over tcp before init: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(uc, "POST", "http://envd/filesystem.Filesystem/Stat", `{"path":"/"}`, map[string]string{"Content-Type": "application/json"}); resp.StatusCode != 503 {
		t.Fatalf("filesystem rpc before init: %d %s", resp.StatusCode, body)
	}
	// The host runs a template's start command before the claim: the process
	// service answers over the unix socket, and the process keeps running
	// (and listed) after /init, with the env it was started with.
	pre := processconnect.NewProcessClient(uc, "http://envd", connect.WithProtoJSON())
	f := false
	tag := "start_cmd"
	preCtx, preDetach := context.WithCancel(ctx)
	preStream, err := pre.Start(preCtx, connect.NewRequest(&pb.StartRequest{
		Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo \"[$FROM_INIT]\"; exec sleep 30"}}, Stdin: &f, Tag: &tag}))
	must(t, err)
	if !preStream.Receive() || preStream.Msg().GetEvent().GetStart() == nil {
		t.Fatalf("start before init: %v", preStream.Err())
	}
	if !preStream.Receive() || string(preStream.Msg().GetEvent().GetData().GetStdout()) != "[]\n" {
		t.Fatalf("pre-init process output: %v %v", preStream.Msg(), preStream.Err())
	}
	preDetach()
	preStream.Close()
	initBody := `{"accessToken":"claimed","envVars":{"FROM_INIT":"1"}}`
	// Processes in the sandbox reach envd over TCP; they must not be able to init it.
	if resp, _ := do(http.DefaultClient, "POST", "http://"+tcpAddr+"/init", initBody, nil); resp.StatusCode != 403 {
		t.Fatalf("init over tcp: %d", resp.StatusCode)
	}
	resp, body := do(uc, "POST", "http://envd/init", initBody, nil)
	if resp.StatusCode != 204 || resp.Header.Get("X-Envd-Version") != envdapi.Version {
		t.Fatalf("init: %d %s", resp.StatusCode, body)
	}
	if resp, _ := do(uc, "POST", "http://envd/init", `{"accessToken":"stolen"}`, nil); resp.StatusCode != 409 {
		t.Fatalf("second init: %d", resp.StatusCode)
	}
	if resp, _ := do(uc, "GET", "http://envd/envs", "", nil); resp.StatusCode != 401 {
		t.Fatalf("envs without the new token: %d", resp.StatusCode)
	}
	resp, body = do(uc, "GET", "http://envd/envs", "", map[string]string{"X-Access-Token": "claimed"})
	if resp.StatusCode != 200 || !strings.Contains(body, `"FROM_INIT":"1"`) || !strings.Contains(body, `"E2B_SANDBOX_ID":"pooled"`) {
		t.Fatalf("envs after init: %d %s", resp.StatusCode, body)
	}
	c := processconnect.NewProcessClient(uc, "http://envd", connect.WithProtoJSON(),
		connect.WithInterceptors(headerInterceptor{"X-Access-Token": "claimed"}))
	if _, err := pre.List(ctx, connect.NewRequest(&pb.ListRequest{})); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("rpc without the token after init: %v", err)
	}
	list, err := c.List(ctx, connect.NewRequest(&pb.ListRequest{}))
	must(t, err)
	if ps := list.Msg.GetProcesses(); len(ps) != 1 || ps[0].GetTag() != tag {
		t.Fatalf("process list after init: %v", ps)
	}
	stream, err := c.Start(ctx, connect.NewRequest(&pb.StartRequest{Process: &pb.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo $FROM_INIT"}}, Stdin: &f}))
	must(t, err)
	if r := collect(stream); r.stdout != "1\n" {
		t.Fatalf("process env after init: %+v", r)
	}
}

// TestInitKey: with an InitKey (a sandbox Pod, whose host cannot reach the
// unix socket), /init over TCP needs the key as a bearer token: none, or a
// wrong one, is refused; the right one inits once, and a second /init with
// it is refused like any other.
func TestInitKey(t *testing.T) {
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := tcp.Addr().String()
	tcp.Close()
	srv, err := NewServer(envdapi.Config{SandboxID: "pod", Listen: []string{"tcp:" + addr}, AwaitInit: true, InitKey: "the-init-key"}, nil)
	must(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	defer func() { cancel(); <-done }()
	<-srv.Ready()
	initWith := func(auth string) int {
		req, _ := http.NewRequest("POST", "http://"+addr+"/init", strings.NewReader(`{"accessToken":"claimed"}`))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := http.DefaultClient.Do(req)
		must(t, err)
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, auth := range []string{"", "Bearer wrong", "the-init-key", "Bearer the-init-ke"} {
		if got := initWith(auth); got != http.StatusForbidden {
			t.Fatalf("init with %q: %d, want 403", auth, got)
		}
	}
	if got := initWith("Bearer the-init-key"); got != http.StatusNoContent {
		t.Fatalf("init with the key: %d", got)
	}
	if got := initWith("Bearer the-init-key"); got != http.StatusConflict {
		t.Fatalf("a second init: %d", got)
	}
	req, _ := http.NewRequest("GET", "http://"+addr+"/envs", nil)
	req.Header.Set("X-Access-Token", "claimed")
	resp, err := http.DefaultClient.Do(req)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("envs with the token /init set: %d", resp.StatusCode)
	}
}

func TestInitRefusedWithoutAwaitInit(t *testing.T) {
	e := newEnv(t)
	resp, _ := e.httpDo("POST", "/init", strings.NewReader(`{"accessToken":"x"}`), tokenHdr)
	if resp.StatusCode != http.StatusForbidden {
		t.Fatalf("init: %d", resp.StatusCode)
	}
}

// checkCReaper checks that the sandbox's pid 1 (host pid pid) is the C reaper
// and not a Go runtime: one thread, its stdio dropped, a few pages of private
// memory of its own (a Go envd as pid 1 held about 1.3 MiB and 5 threads),
// and the Go server as its child.
func checkCReaper(t *testing.T, pid int) {
	t.Helper()
	proc := fmt.Sprintf("/proc/%d/", pid)
	status, err := os.ReadFile(proc + "status")
	must(t, err)
	if !strings.Contains(string(status), "\nThreads:\t1\n") {
		t.Errorf("pid 1 is not single-threaded (a Go runtime?):\n%s", status)
	}
	for fd := 0; fd <= 2; fd++ {
		if target, err := os.Readlink(fmt.Sprintf("%sfd/%d", proc, fd)); err != nil || target != "/dev/null" {
			t.Errorf("pid 1's fd %d is %q (%v), want /dev/null: a checkpoint cannot save a descriptor that leads out of the sandbox", fd, target, err)
		}
	}
	rollup, err := os.ReadFile(proc + "smaps_rollup")
	must(t, err)
	var private int64
	for _, line := range strings.Split(string(rollup), "\n") {
		f := strings.Fields(line)
		if len(f) == 3 && (f[0] == "Private_Clean:" || f[0] == "Private_Dirty:") {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			must(t, err)
			private += kb
		}
	}
	t.Logf("pid 1: %d KiB private", private)
	if private > 512 {
		t.Errorf("pid 1 holds %d KiB of private memory, want at most 512:\n%s", private, rollup)
	}
	children, err := os.ReadFile(fmt.Sprintf("%stask/%d/children", proc, pid))
	must(t, err)
	if len(strings.Fields(string(children))) != 1 {
		t.Errorf("pid 1's children %q, want the server alone", children)
	}
}
