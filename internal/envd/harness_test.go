package envd

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/filesystem/filesystemconnect"
	pb "github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/testenv"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
	"github.com/airlock-sandbox/airlock/internal/unixuser/unixusertest"
)

const testToken = "secrettoken"

// env is one in-process envd with a fake sandbox root: a temp dir holding
// etc/passwd, etc/group and the users' homes, so tests can run processes as uid
// 1000 without that account existing on the host.
type env struct {
	t     testing.TB
	root  string
	srv   *Server
	ts    *httptest.Server
	proc  processconnect.ProcessClient
	fs    filesystemconnect.FilesystemClient
	home  string // /home/user inside root
	rhome string // root's home inside root
}

type envOption func(*envdapi.Config)

func newEnv(t testing.TB, opts ...envOption) *env {
	t.Helper()
	if os.Geteuid() != 0 {
		testenv.Missing(t, "envd tests switch users and chown files; run them as root")
	}
	fake := unixusertest.New(t)
	root, home, rhome := fake.Dir, fake.Home, fake.RootHome

	cfg := envdapi.Config{
		SandboxID:   "sbxtest",
		TemplateID:  "base",
		AccessToken: testToken,
		EnvVars:     map[string]string{"SANDBOX_LEVEL": "yes", "OVERRIDE_ME": "sandbox"},
		DefaultUser: "user",
	}
	for _, o := range opts {
		o(&cfg)
	}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() && !isBenchmark(t) {
		logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	srv, err := NewServer(cfg, logger, WithUserDB(&unixuser.EtcUserDB{Root: root}))
	if err != nil {
		t.Fatal(err)
	}
	ts := testenv.NewHTTPServer(t, srv.Handler())
	t.Cleanup(func() {
		srv.procs.killAll()
		srv.watchers.closeAll()
		ts.CloseClientConnections()
		ts.Close()
	})
	e := &env{t: t, root: root, srv: srv, ts: ts, home: home, rhome: rhome}
	hdr := connect.WithInterceptors(headerInterceptor{"X-Access-Token": testToken})
	// Like the E2B SDKs: JSON codec, no compression.
	noGzip := connect.WithAcceptCompression("gzip", nil, nil)
	e.proc = processconnect.NewProcessClient(ts.Client(), ts.URL, connect.WithProtoJSON(), hdr, noGzip)
	e.fs = filesystemconnect.NewFilesystemClient(ts.Client(), ts.URL, connect.WithProtoJSON(), hdr, noGzip)
	return e
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

// headerInterceptor adds fixed headers to every client request, the way the SDKs
// add X-Access-Token and Authorization.
type headerInterceptor map[string]string

func (h headerInterceptor) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		for k, v := range h {
			req.Header().Set(k, v)
		}
		return next(ctx, req)
	}
}

func (h headerInterceptor) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return func(ctx context.Context, spec connect.Spec) connect.StreamingClientConn {
		conn := next(ctx, spec)
		for k, v := range h {
			conn.RequestHeader().Set(k, v)
		}
		return conn
	}
}

func (h headerInterceptor) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return next
}

func basicUser(name string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(name+":"))
}

// asUser returns request-header setters for a user, as the SDK's `user` option.
func withUser[T any](req *connect.Request[T], name string) *connect.Request[T] {
	req.Header().Set("Authorization", basicUser(name))
	return req
}

// result is everything a Start/Connect stream delivered.
type result struct {
	pid        uint32
	stdout     string
	stderr     string
	pty        string
	end        *pb.ProcessEvent_EndEvent
	keepalives int
	err        error
	first      string // kind of the first event
}

func collect[T interface{ GetEvent() *pb.ProcessEvent }](stream interface {
	Receive() bool
	Msg() T
	Err() error
}) result {
	var r result
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		kind := ""
		switch e := ev.GetEvent().(type) {
		case *pb.ProcessEvent_Start:
			kind = "start"
			r.pid = e.Start.GetPid()
		case *pb.ProcessEvent_Data:
			kind = "data"
			r.stdout += string(e.Data.GetStdout())
			r.stderr += string(e.Data.GetStderr())
			r.pty += string(e.Data.GetPty())
		case *pb.ProcessEvent_End:
			kind = "end"
			r.end = e.End
		case *pb.ProcessEvent_Keepalive:
			kind = "keepalive"
			r.keepalives++
		}
		if r.first == "" {
			r.first = kind
		}
	}
	r.err = stream.Err()
	return r
}

func (e *env) run(ctx context.Context, req *connect.Request[pb.StartRequest]) result {
	e.t.Helper()
	stream, err := e.proc.Start(ctx, req)
	if err != nil {
		return result{err: err}
	}
	defer stream.Close()
	return collect(stream)
}

func bash(script string) *pb.ProcessConfig {
	return &pb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", script}}
}

func startReq(cfg *pb.ProcessConfig) *connect.Request[pb.StartRequest] {
	f := false
	return connect.NewRequest(&pb.StartRequest{Process: cfg, Stdin: &f})
}

func ctxTimeout(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// rawStream posts one Connect streaming request by hand and decodes the response
// envelopes, to check wire details the generated client hides (end-stream JSON,
// server-side timeouts without a client deadline).
type rawResult struct {
	msgs   []map[string]any
	endRaw string
	status int
}

func (e *env) rawStream(ctx context.Context, procedure string, body any, hdr map[string]string) rawResult {
	e.t.Helper()
	payload, err := json.Marshal(body)
	must(e.t, err)
	var buf bytes.Buffer
	buf.WriteByte(0)
	_ = binary.Write(&buf, binary.BigEndian, uint32(len(payload)))
	buf.Write(payload)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.ts.URL+procedure, &buf)
	must(e.t, err)
	req.Header.Set("Content-Type", "application/connect+json")
	req.Header.Set("Connect-Protocol-Version", "1")
	req.Header.Set("X-Access-Token", testToken)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.ts.Client().Do(req)
	must(e.t, err)
	defer resp.Body.Close()
	out := rawResult{status: resp.StatusCode}
	br := bufio.NewReader(resp.Body)
	for {
		var head [5]byte
		if _, err := io.ReadFull(br, head[:]); err != nil {
			return out
		}
		n := binary.BigEndian.Uint32(head[1:])
		data := make([]byte, n)
		if _, err := io.ReadFull(br, data); err != nil {
			e.t.Fatalf("short envelope: %v", err)
		}
		if head[0]&2 != 0 {
			out.endRaw = string(data)
			return out
		}
		var m map[string]any
		must(e.t, json.Unmarshal(data, &m))
		out.msgs = append(out.msgs, m)
	}
}

// httpDo sends a plain HTTP request to the server.
func (e *env) httpDo(method, path string, body io.Reader, hdr map[string]string) (*http.Response, string) {
	e.t.Helper()
	req, err := http.NewRequest(method, e.ts.URL+path, body)
	must(e.t, err)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := e.ts.Client().Do(req)
	must(e.t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	must(e.t, err)
	return resp, string(b)
}

func codeOf(err error) connect.Code {
	return connect.CodeOf(err)
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func isBenchmark(t testing.TB) bool {
	_, ok := t.(*testing.B)
	return ok
}
