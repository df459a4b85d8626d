package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/proxy"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func init() { linux.MaybeInit() }

// rig is a real sandbox manager (libcontainer runtime, SQLite store, the built
// base template with a bash kernel for the code interpreter, the real envd).
type rig struct {
	m       *sandbox.Manager
	tpl     sandbox.Template
	rt      *linux.Runtime
	db      *store.SQLite
	dataDir string
}

func (r *rig) Resolve(_ context.Context, name string) (sandbox.Template, error) {
	if name != "base" {
		return sandbox.Template{}, sandbox.ErrTemplateNotFound
	}
	return r.tpl, nil
}

func newRig(t *testing.T) *rig {
	t.Helper()
	testenv.NeedRoot(t)
	rootfs := testenv.BaseRootfs(t)
	dataDir := t.TempDir()
	db, err := store.OpenSQLite(filepath.Join(dataDir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	rt, err := linux.New(filepath.Join(dataDir, "runtime"), nil)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{rt: rt, db: db, dataDir: dataDir, tpl: sandbox.Template{
		ID: "base", Alias: "base", Rootfs: rootfs, CPUCount: 2, MemoryMB: 512,
		DiskSizeMB: 1024, DefaultUser: "user", Kernels: []string{"bash"},
	}}
	m := sandbox.New(sandbox.Options{
		Runtime: rt, Store: db, Templates: r, DataDir: dataDir,
		EnvdPath: testenv.EnvdBinary(t), MaxTimeout: time.Hour,
	})
	m.Start()
	r.m = m
	t.Cleanup(func() {
		m.KillAll(context.Background())
		m.Close()
	})
	return r
}

func (r *rig) create(t *testing.T) sandbox.Info {
	t.Helper()
	info, err := r.m.Create(context.Background(), sandbox.CreateRequest{Template: "base", Timeout: 5 * time.Minute, Secure: true})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return info
}

// startProxy serves the sandbox-traffic proxy on loopback exactly as `airlock
// serve` does (HTTP/1.1 and h2c on one listener); the test fails if the server
// logged a panic by the time it ends.
func startProxy(t *testing.T, m *sandbox.Manager) string {
	t.Helper()
	logs := testenv.NewServerLog(t)
	srv := &http.Server{
		Handler:           h2c.NewHandler(proxy.New(m, logs.Slog()), &http2.Server{}),
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          logs.ErrorLog(),
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// protocols are the two ways SDKs reach the proxy: HTTP/1.1 (keep-alive) and
// h2c with prior knowledge.
var protocols = []string{"http1", "h2c"}

// client returns a fresh client speaking proto that adds the routing headers
// and access token of one sandbox port to every request, as the SDKs do.
func client(t *testing.T, proto string, info sandbox.Info, port int) *http.Client {
	t.Helper()
	tr := &http.Transport{MaxConnsPerHost: 4, DisableCompression: true, ExpectContinueTimeout: time.Second}
	if proto == "h2c" {
		tr.Protocols = new(http.Protocols)
		tr.Protocols.SetUnencryptedHTTP2(true)
	}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: headers{tr, info.ID, strconv.Itoa(port), info.AccessToken}}
}

type headers struct {
	next      http.RoundTripper
	id, port  string
	accessTok string
}

func (h headers) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("E2b-Sandbox-Port", h.port)
	r.Header.Set("X-Access-Token", h.accessTok)
	return h.next.RoundTrip(r)
}

// gone asserts res is the proxy's E2B-style answer for a sandbox that is no
// longer there: 502 with a JSON body naming the sandbox and saying why.
func gone(t *testing.T, what string, res *http.Response, id string) {
	t.Helper()
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Errorf("%s: reading the error body: %v", what, err)
		return
	}
	var e struct {
		SandboxID string `json:"sandboxId"`
		Message   string `json:"message"`
		Code      int    `json:"code"`
	}
	if res.StatusCode != http.StatusBadGateway || json.Unmarshal(b, &e) != nil || e.SandboxID != id || e.Code != 502 || e.Message == "" {
		t.Errorf("%s: want 502 with an E2B-style JSON error for sandbox %s, got %s %q", what, id, res.Status, b)
	}
}

// killProcesses kills every process of a sandbox from the host, as the OOM
// killer or a workload that takes envd down would: the manager still lists
// the sandbox as running, but nothing answers on envd's socket.
func killProcesses(t *testing.T, id string) {
	t.Helper()
	procs := filepath.Join("/sys/fs/cgroup/pids", linux.CgroupParent, id, "cgroup.procs")
	for range 50 {
		b, err := os.ReadFile(procs)
		if err != nil {
			t.Fatalf("sandbox processes: %v", err)
		}
		pids := strings.Fields(string(b))
		if len(pids) == 0 {
			return
		}
		for _, p := range pids {
			pid, _ := strconv.Atoi(p)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("sandbox %s still has processes", id)
}

// smallRequests are requests with a small body, each a kind the SDKs send.
func smallRequest(ctx context.Context, base string, i int) *http.Request {
	switch i % 3 {
	case 0: // a Connect unary call (JSON)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/process.Process/List", strings.NewReader("{}"))
		req.Header.Set("Content-Type", "application/json")
		return req
	case 1: // files.write
		body, ctype := multipartBody("small\n")
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/files?path=/tmp/small-"+strconv.Itoa(i), body)
		req.Header.Set("Content-Type", ctype)
		return req
	default: // files.read
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/files?path=/etc/hostname", nil)
		return req
	}
}

func multipartBody(content string) (io.Reader, string) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	fw, _ := mw.CreateFormFile("file", "f")
	_, _ = io.WriteString(fw, content)
	_ = mw.Close()
	return &b, mw.FormDataContentType()
}

// TestProxyEnvdDiedKeepAlive is the regression test for the panic of issue 11:
// requests with a body to a sandbox whose envd died fail at RoundTrip, the
// proxy answered 502 without the body being read, and net/http's full-duplex
// HTTP/1.1 server then panicked ("invalid concurrent Body.Read call") reading
// the next request of the keep-alive connection. Every request must get the
// E2B-style 502, on one connection after another, and the log no panic.
func TestProxyEnvdDiedKeepAlive(t *testing.T) {
	r := newRig(t)
	proxy := startProxy(t, r.m)
	info := r.create(t)
	killProcesses(t, info.ID)
	for _, proto := range protocols {
		c := client(t, proto, info, 49983)
		for i := range 12 {
			res, err := c.Do(smallRequest(context.Background(), proxy, i))
			if err != nil {
				t.Fatalf("%s request %d: %v", proto, i, err)
			}
			gone(t, fmt.Sprintf("%s request %d", proto, i), res, info.ID)
		}
		// A body larger than the server drains after the response.
		body, ctype := multipartBody(strings.Repeat("x", 1<<20))
		req, _ := http.NewRequest(http.MethodPost, proxy+"/files?path=/tmp/big", body)
		req.Header.Set("Content-Type", ctype)
		res, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s 1 MiB upload: %v", proto, err)
		}
		gone(t, proto+" 1 MiB upload", res, info.ID)
		// The same, waiting for "100 Continue" first (as curl does).
		for i := range 3 {
			body, ctype = multipartBody(strings.Repeat("x", 1<<20))
			req, _ = http.NewRequest(http.MethodPost, proxy+"/files?path=/tmp/big", body)
			req.Header.Set("Content-Type", ctype)
			req.Header.Set("Expect", "100-continue")
			res, err = c.Do(req)
			if err != nil {
				t.Fatalf("%s 1 MiB upload with Expect: 100-continue, %d: %v", proto, i, err)
			}
			gone(t, fmt.Sprintf("%s 1 MiB upload with Expect: 100-continue, %d", proto, i), res, info.ID)
		}
		// The code interpreter (port 49999) goes through the same path.
		ci := client(t, proto, info, 49999)
		for i := range 3 {
			req, _ = http.NewRequest(http.MethodPost, proxy+"/execute", strings.NewReader(`{"code":"echo hi","language":"bash"}`))
			req.Header.Set("Content-Type", "application/json")
			res, err := ci.Do(req)
			if err != nil {
				t.Fatalf("%s execute %d: %v", proto, i, err)
			}
			res.Body.Close()
			if res.StatusCode != http.StatusBadGateway {
				t.Errorf("%s execute %d: %s, want 502", proto, i, res.Status)
			}
		}
	}
}

// commandStream starts a command whose output never ends, through the proxy,
// and returns the stream once the first output arrived.
func commandStream(t *testing.T, c *http.Client, proxy string) *connect.ServerStreamForClient[process.StartResponse] {
	t.Helper()
	pc := processconnect.NewProcessClient(c, proxy)
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "while :; do echo tick; sleep 0.02; done"}},
	})
	stream, err := pc.Start(context.Background(), req)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	for stream.Receive() {
		if stream.Msg().GetEvent().GetData() != nil {
			return stream
		}
	}
	t.Fatalf("stream ended before any output: %v", stream.Err())
	return nil
}

// drainStream reads a stream until it ends, within limit, and returns how it
// ended.
func drainStream(t *testing.T, what string, stream *connect.ServerStreamForClient[process.StartResponse], limit time.Duration) error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		for stream.Receive() {
			if stream.Msg().GetEvent().GetEnd() != nil {
				done <- errors.New("the stream reported an end event of a command that was killed with its sandbox")
				return
			}
		}
		done <- stream.Err()
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(limit):
		t.Fatalf("%s: the stream did not end within %v of the sandbox's kill", what, limit)
		return nil
	}
}

// TestProxyKillMidStream kills sandboxes under streaming commands.run calls
// (Connect server streams): each client's stream must end with an error soon
// after, and the server must not panic.
func TestProxyKillMidStream(t *testing.T) {
	r := newRig(t)
	proxy := startProxy(t, r.m)
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			info := r.create(t)
			c := client(t, proto, info, 49983)
			streams := []*connect.ServerStreamForClient[process.StartResponse]{commandStream(t, c, proxy), commandStream(t, c, proxy)}
			if err := r.m.Kill(context.Background(), info.ID); err != nil {
				t.Fatal(err)
			}
			for i, s := range streams {
				// The stream ends with the Connect protocol's own error
				// message, not a truncated response.
				err := drainStream(t, fmt.Sprintf("stream %d", i), s, 10*time.Second)
				if connect.CodeOf(err) != connect.CodeUnavailable || !strings.Contains(err.Error(), "sandbox "+info.ID+" stopped answering") {
					t.Errorf("stream %d ended with %v, want unavailable: the sandbox stopped answering", i, err)
				}
				t.Logf("stream %d: %v", i, err)
				s.Close()
			}
			// The sandbox is gone: a new call gets the E2B-style 502.
			res, err := c.Do(smallRequest(context.Background(), proxy, 0))
			if err != nil {
				t.Fatal(err)
			}
			gone(t, "after the kill", res, info.ID)
		})
	}
}

// TestProxyKillMidExecute kills sandboxes under a code-interpreter /execute
// (an NDJSON stream through port 49999).
func TestProxyKillMidExecute(t *testing.T) {
	r := newRig(t)
	proxy := startProxy(t, r.m)
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			info := r.create(t)
			c := client(t, proto, info, 49999)
			req, _ := http.NewRequest(http.MethodPost, proxy+"/execute",
				strings.NewReader(`{"code":"for i in $(seq 1 100000); do echo line $i; sleep 0.02; done","language":"bash"}`))
			req.Header.Set("Content-Type", "application/json")
			res, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer res.Body.Close()
			if res.StatusCode != 200 {
				t.Fatalf("execute: %s", res.Status)
			}
			br := bufio.NewReader(res.Body)
			for {
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("execute stream ended before any output: %v", err)
				}
				if strings.Contains(line, `"stdout"`) {
					break
				}
			}
			if err := r.m.Kill(context.Background(), info.ID); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() {
				for {
					line, err := br.ReadString('\n')
					if strings.Contains(line, "end_of_execution") {
						done <- errors.New("the stream reported end_of_execution of code killed with its sandbox")
						return
					}
					if err != nil {
						done <- err
						return
					}
				}
			}()
			select {
			case err := <-done:
				if err == nil || err == io.EOF {
					t.Errorf("execute stream ended cleanly (%v) after the sandbox was killed", err)
				}
				t.Logf("execute stream: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("the execute stream did not end within 10 s of the sandbox's kill")
			}
		})
	}
}

// slowBody is an endless upload: it produces data until stopped, and signals
// once a given amount went out. A stalling one then sends nothing more until
// released, as a client waiting on something else would.
type slowBody struct {
	sent, after int64
	reached     chan struct{}
	once        sync.Once
	stall       chan struct{} // nil: keep sending
}

func (b *slowBody) Read(p []byte) (int, error) {
	if len(p) > 64<<10 {
		p = p[:64<<10]
	}
	for i := range p {
		p[i] = 'a'
	}
	if b.sent >= b.after {
		b.once.Do(func() { close(b.reached) })
		if b.stall != nil {
			<-b.stall
			return 0, io.ErrUnexpectedEOF
		}
		time.Sleep(time.Millisecond) // ~64 MB/s: the kill lands mid-upload
	}
	b.sent += int64(len(p))
	return len(p), nil
}

// TestProxyKillMidUpload kills sandboxes under a large multipart POST /files:
// the client, still sending or stalled mid-body, gets the E2B-style 502 (the
// response had not started) and the server does not panic. The stalled case
// is the proxy cutting the transport's read of the body that blocks on the
// client before its handler returns.
func TestProxyKillMidUpload(t *testing.T) {
	r := newRig(t)
	proxy := startProxy(t, r.m)
	for _, tc := range []struct {
		proto string
		stall bool
	}{{"http1", false}, {"h2c", false}, {"http1", true}, {"h2c", true}} {
		name := tc.proto
		if tc.stall {
			name += "/stalled"
		}
		t.Run(name, func(t *testing.T) {
			proto := tc.proto
			info := r.create(t)
			c := client(t, proto, info, 49983)
			mw := multipart.NewWriter(io.Discard)
			body := &slowBody{after: 8 << 20, reached: make(chan struct{})}
			release := func() {}
			if tc.stall {
				body.stall = make(chan struct{})
				// Go's h2 client waits for the request body's writer when
				// the response body is closed: let it end then.
				release = sync.OnceFunc(func() { close(body.stall) })
				defer release()
			}
			head := fmt.Sprintf("--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"big\"\r\nContent-Type: application/octet-stream\r\n\r\n", mw.Boundary())
			req, _ := http.NewRequest(http.MethodPost, proxy+"/files?path=/tmp/big", io.MultiReader(strings.NewReader(head), body))
			req.Header.Set("Content-Type", mw.FormDataContentType())
			go func() {
				select {
				case <-body.reached:
					if tc.stall {
						// Let the proxy forward all it has and wait on
						// the client for more.
						time.Sleep(500 * time.Millisecond)
					}
					_ = r.m.Kill(context.Background(), info.ID)
				case <-time.After(30 * time.Second):
				}
			}()
			type result struct {
				res *http.Response
				err error
			}
			done := make(chan result, 1)
			go func() {
				res, err := c.Do(req)
				done <- result{res, err}
			}()
			select {
			case got := <-done:
				release()
				if got.err != nil {
					t.Fatalf("upload: %v (want the E2B-style 502)", got.err)
				}
				gone(t, "upload", got.res, info.ID)
			case <-time.After(30 * time.Second):
				t.Fatal("upload got no answer within 30 s")
			}
		})
	}
}

// TestProxyKillMidDownload kills sandboxes under a large GET /files: the
// client's read of the body fails (the response had started), soon.
func TestProxyKillMidDownload(t *testing.T) {
	r := newRig(t)
	proxy := startProxy(t, r.m)
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			info := r.create(t)
			tr, err := r.m.EnvdTransport(info.ID)
			if err != nil {
				t.Fatal(err)
			}
			if out, code := testenv.RunCommand(t, tr, info.AccessToken, "head -c 256M /dev/zero > /tmp/big"); code != 0 {
				t.Fatalf("make the file: %q", out)
			}
			c := client(t, proto, info, 49983)
			res, err := c.Get(proxy + "/files?path=/tmp/big")
			if err != nil {
				t.Fatal(err)
			}
			n, err := readPastKill(t, r, info, res)
			switch {
			case err == nil && n < 256<<20:
				t.Errorf("the body ended cleanly after %d bytes of 256 MiB", n)
			case err == nil:
				// The whole file made it out before the kill (buffers): not
				// what this test is for, but not wrong.
				t.Log("the download completed before the kill took effect")
			default:
				t.Logf("download: %v", err)
			}
		})
	}
}

// TestProxyConcurrentWhileDying sends requests of every kind from many
// clients, over both protocols, while the sandbox is killed: every request
// gets an answer (200 before the kill, the E2B-style 502 after; a stream or
// body already under way may break), none hangs, the server does not panic.
func TestProxyConcurrentWhileDying(t *testing.T) {
	r := newRig(t)
	proxy := startProxy(t, r.m)
	for round, kill := range []func(sandbox.Info){
		func(info sandbox.Info) { _ = r.m.Kill(context.Background(), info.ID) },
		func(info sandbox.Info) { killProcesses(t, info.ID) },
	} {
		info := r.create(t)
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var mu sync.Mutex
		counts := map[string]int{}
		for w := range 12 {
			proto := protocols[w%2]
			c := client(t, proto, info, 49983)
			wg.Go(func() {
				for i := w; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
					res, err := c.Do(smallRequest(ctx, proxy, i))
					if err != nil {
						cancel()
						t.Errorf("round %d %s request %d: no answer: %v", round, proto, i, err)
						return
					}
					b, err := io.ReadAll(res.Body)
					res.Body.Close()
					cancel()
					mu.Lock()
					counts[strconv.Itoa(res.StatusCode)]++
					mu.Unlock()
					switch {
					case res.StatusCode == 200:
					case res.StatusCode == 502 && err == nil && bytes.Contains(b, []byte(`"sandboxId":"`+info.ID+`"`)):
					default:
						t.Errorf("round %d %s request %d: %s %q (%v)", round, proto, i, res.Status, b, err)
						return
					}
				}
			})
		}
		time.Sleep(time.Second)
		kill(info)
		time.Sleep(2 * time.Second)
		close(stop)
		wg.Wait()
		t.Logf("round %d answers by status: %v", round, counts)
		if counts["200"] == 0 || counts["502"] == 0 {
			t.Errorf("round %d: want answers from before and after the kill, got %v", round, counts)
		}
	}
}

// netManager is a manager whose sandboxes have a network (a /24 of their own
// per run, this test's own nftables table and veth prefix, no egress), so the
// proxy reaches their user ports.
func netManager(t *testing.T) *rig {
	t.Helper()
	r := newRig(t)
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	n, err := netpolicy.New(netpolicy.Config{
		CIDR:     netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 150+int(b[0])%50, b[1])),
		StateDir: filepath.Join(t.TempDir(), "network"),
		Table:    "airlock_test_proxy" + hex.EncodeToString(b),
		IfPrefix: "alx",
		NoEgress: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		_ = n.RemoveTable()
	})
	// Replace the rig's manager by one over the network (cleanups run in
	// reverse: this manager's sandboxes go before the network).
	m := sandbox.New(sandbox.Options{
		Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir,
		EnvdPath: testenv.EnvdBinary(t), MaxTimeout: time.Hour, Network: n,
	})
	m.Start()
	r.m = m
	t.Cleanup(func() {
		m.KillAll(context.Background())
		m.Close()
	})
	return r
}

// TestProxyUserPortDies: requests with a body to a user port nothing listens
// on get the E2B-style 502 on one keep-alive connection after another (the
// same unread-body path as a dead envd), and a large download from a server in
// the sandbox fails mid-way when the sandbox is killed.
func TestProxyUserPortDies(t *testing.T) {
	r := netManager(t)
	proxy := startProxy(t, r.m)
	for _, proto := range protocols {
		t.Run(proto, func(t *testing.T) {
			info := r.create(t)
			if !info.Addr.IsValid() {
				t.Fatal("the sandbox has no address")
			}
			closed := client(t, proto, info, 8001)
			for i := range 6 {
				req, _ := http.NewRequest(http.MethodPost, proxy+"/submit", strings.NewReader(`{"n":1}`))
				res, err := closed.Do(req)
				if err != nil {
					t.Fatalf("closed port, request %d: %v", i, err)
				}
				gone(t, fmt.Sprintf("closed port, request %d", i), res, info.ID)
			}
			tr, err := r.m.EnvdTransport(info.ID)
			if err != nil {
				t.Fatal(err)
			}
			if out, code := testenv.RunCommand(t, tr, info.AccessToken,
				"head -c 256M /dev/zero > /tmp/big && cd /tmp && (setsid nohup python3 -m http.server 8000 >/dev/null 2>&1 </dev/null &) && "+
					"for i in $(seq 1 100); do curl -s -o /dev/null http://127.0.0.1:8000/ && exit 0; sleep 0.1; done; exit 1"); code != 0 {
				t.Fatalf("http.server in the sandbox: %q", out)
			}
			res, err := client(t, proto, info, 8000).Get(proxy + "/big")
			if err != nil {
				t.Fatal(err)
			}
			n, err := readPastKill(t, r, info, res)
			if err == nil {
				t.Errorf("the body ended cleanly after %d bytes", n)
			} else if !strings.Contains(err.Error(), "unexpected EOF") && !strings.Contains(err.Error(), "stream error") {
				t.Errorf("download from a killed sandbox: %v, want a truncated body", err)
			}
		})
	}
}

// readPastKill reads the first MiB of a download, kills its sandbox, and reads
// on: it returns how many bytes came in all and how the body ended, failing t
// if it had not ended 10 s after the kill.
func readPastKill(t *testing.T, r *rig, info sandbox.Info, res *http.Response) (int64, error) {
	t.Helper()
	defer res.Body.Close()
	if res.StatusCode != 200 {
		t.Fatalf("download: %s", res.Status)
	}
	if _, err := io.CopyN(io.Discard, res.Body, 1<<20); err != nil {
		t.Fatalf("first MiB: %v", err)
	}
	if err := r.m.Kill(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	type result struct {
		n   int64
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := io.Copy(io.Discard, res.Body)
		done <- result{n + 1<<20, err}
	}()
	select {
	case got := <-done:
		return got.n, got.err
	case <-time.After(10 * time.Second):
		t.Fatal("the download did not end within 10 s of the sandbox's kill")
		return 0, nil
	}
}
