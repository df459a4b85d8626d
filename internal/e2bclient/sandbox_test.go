package e2bclient

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/airlock-sandbox/airlock/api/gen/filesystem"
	"github.com/airlock-sandbox/airlock/api/gen/filesystem/filesystemconnect"
	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// seen is what one request to the fake proxy carried.
type seen struct {
	method, path, query string
	id, port, token     string
	auth, contentType   string
	body                []byte
}

// fakeProxy stands for Airlock's sandbox proxy and what is behind it: envd's
// Connect services and plain endpoints, and the interpreter's /execute. It
// records every request, so tests check the routing and auth headers of each.
type fakeProxy struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []seen
	// execute answers POST /execute.
	execute http.HandlerFunc
}

type fakeProcess struct {
	processconnect.UnimplementedProcessHandler
}

func (fakeProcess) Start(_ context.Context, req *connect.Request[process.StartRequest], st *connect.ServerStream[process.StartResponse]) error {
	send := func(ev *process.ProcessEvent) error { return st.Send(&process.StartResponse{Event: ev}) }
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Start{Start: &process.ProcessEvent_StartEvent{Pid: 42}}}); err != nil {
		return err
	}
	out := []byte(strings.Join(req.Msg.GetProcess().GetArgs(), " "))
	if err := send(&process.ProcessEvent{Event: &process.ProcessEvent_Data{Data: &process.ProcessEvent_DataEvent{
		Output: &process.ProcessEvent_DataEvent_Stdout{Stdout: out}}}}); err != nil {
		return err
	}
	return send(&process.ProcessEvent{Event: &process.ProcessEvent_End{End: &process.ProcessEvent_EndEvent{ExitCode: 3, Exited: true}}})
}

func (fakeProcess) SendSignal(context.Context, *connect.Request[process.SendSignalRequest]) (*connect.Response[process.SendSignalResponse], error) {
	return connect.NewResponse(&process.SendSignalResponse{}), nil
}

type fakeFS struct {
	filesystemconnect.UnimplementedFilesystemHandler
}

func (fakeFS) ListDir(_ context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	if req.Msg.GetPath() == "/missing" {
		return nil, connect.NewError(connect.CodeNotFound, errors.New("path /missing does not exist"))
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: []*filesystem.EntryInfo{{Name: "a", Path: req.Msg.GetPath() + "/a"}}}), nil
}

func newFakeProxy(t *testing.T) *fakeProxy {
	t.Helper()
	p := &fakeProxy{}
	mux := http.NewServeMux()
	mux.Handle(processconnect.NewProcessHandler(fakeProcess{}))
	mux.Handle(filesystemconnect.NewFilesystemHandler(fakeFS{}))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") == "/missing" {
			writeJSON(w, http.StatusNotFound, e2bwire.Error{Code: 404, Message: "path '/missing' does not exist"})
			return
		}
		_, _ = io.WriteString(w, "content of "+r.URL.Query().Get("path"))
	})
	mux.HandleFunc("POST /files", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, []map[string]string{{"name": "x"}})
	})
	mux.HandleFunc("POST /execute", func(w http.ResponseWriter, r *http.Request) { p.execute(w, r) })
	p.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(b))
		p.mu.Lock()
		p.reqs = append(p.reqs, seen{method: r.Method, path: r.URL.Path, query: r.URL.RawQuery,
			id: r.Header.Get("E2b-Sandbox-Id"), port: r.Header.Get("E2b-Sandbox-Port"), token: r.Header.Get("X-Access-Token"),
			auth: r.Header.Get("Authorization"), contentType: r.Header.Get("Content-Type"), body: b})
		p.mu.Unlock()
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(p.Close)
	return p
}

// last returns the requests since the previous call.
func (p *fakeProxy) last() []seen {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := p.reqs
	p.reqs = nil
	return r
}

// one checks that exactly one request arrived since the last check and that it
// was routed to the sandbox's port with its token, and returns it.
func (p *fakeProxy) one(t *testing.T, port string) seen {
	t.Helper()
	reqs := p.last()
	if len(reqs) != 1 {
		t.Fatalf("%d requests, want 1: %+v", len(reqs), reqs)
	}
	r := reqs[0]
	if r.id != "sbx1" || r.port != port || r.token != "tok1" {
		t.Errorf("%s %s routed as id %q port %q token %q", r.method, r.path, r.id, r.port, r.token)
	}
	return r
}

func TestSandboxTraffic(t *testing.T) {
	p := newFakeProxy(t)
	c := New(Config{APIURL: "http://unused", SandboxURL: p.URL + "/"})
	sb := c.Sandbox("sbx1", "tok1")
	ctx := context.Background()

	if err := sb.Health(ctx); err != nil {
		t.Fatal(err)
	}
	if r := p.one(t, "49983"); r.path != "/health" || r.auth != "" {
		t.Errorf("health: %+v", r)
	}

	// process.Start: the stream, with routing on the Connect request.
	stream, err := sb.Start(ctx, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", "x"}}})
	if err != nil {
		t.Fatal(err)
	}
	var out string
	var code int32
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		out += string(ev.GetData().GetStdout())
		if end := ev.GetEnd(); end != nil {
			code = end.GetExitCode()
		}
	}
	if err := stream.Close(); err != nil || out != "-c x" || code != 3 {
		t.Errorf("start: %q exit %d, %v", out, code, err)
	}
	if r := p.one(t, "49983"); r.path != processconnect.ProcessStartProcedure || r.contentType != "application/connect+json" {
		t.Errorf("start: %+v", r)
	}

	if err := sb.SendSignal(ctx, &process.SendSignalRequest{Signal: process.Signal_SIGNAL_SIGKILL}); err != nil {
		t.Fatal(err)
	}
	p.one(t, "49983")

	// The undecoded Start sends the same Connect envelope and hands back its
	// raw stream.
	raw, err := sb.StartUndecoded(ctx, &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/true"}})
	if err != nil {
		t.Fatal(err)
	}
	rawOut, _ := io.ReadAll(raw)
	raw.Close()
	if !bytes.Contains(rawOut, []byte(`"pid":42`)) {
		t.Errorf("raw stream %q", rawOut)
	}
	r := p.one(t, "49983")
	if len(r.body) < 5 || int(binary.BigEndian.Uint32(r.body[1:5])) != len(r.body)-5 {
		t.Fatalf("undecoded start: not one Connect envelope: %q", r.body)
	}
	var msg process.StartRequest
	if err := protojson.Unmarshal(r.body[5:], &msg); err != nil || msg.GetProcess().GetCmd() != "/bin/true" {
		t.Errorf("undecoded start message %q: %v", r.body[5:], err)
	}

	entries, err := sb.ListDir(ctx, &filesystem.ListDirRequest{Path: "/tmp", Depth: 1})
	if err != nil || len(entries.GetEntries()) != 1 || entries.GetEntries()[0].GetPath() != "/tmp/a" {
		t.Fatalf("list dir: %v, %v", entries, err)
	}
	p.one(t, "49983")
	_, err = sb.ListDir(ctx, &filesystem.ListDirRequest{Path: "/missing"})
	if connect.CodeOf(err) != connect.CodeNotFound {
		t.Errorf("list missing: %v", err)
	}
	p.last()

	f, err := sb.ReadFile(ctx, "/etc/x y")
	if err != nil {
		t.Fatal(err)
	}
	content, _ := io.ReadAll(f)
	f.Close()
	if string(content) != "content of /etc/x y" {
		t.Errorf("read: %q", content)
	}
	if r := p.one(t, "49983"); r.query != "path=%2Fetc%2Fx+y" {
		t.Errorf("read query %q", r.query)
	}
	_, err = sb.ReadFile(ctx, "/missing")
	var e *Error
	if !errors.As(err, &e) || e.Status != 404 || err.Error() != "path '/missing' does not exist (HTTP 404)" {
		t.Errorf("read missing: %v", err)
	}
	p.last()

	if err := sb.WriteFile(ctx, "/tmp/w", strings.NewReader("data")); err != nil {
		t.Fatal(err)
	}
	if r := p.one(t, "49983"); r.method != "POST" || r.query != "path=%2Ftmp%2Fw" || r.contentType != "application/octet-stream" || string(r.body) != "data" {
		t.Errorf("write: %+v", r)
	}
}

// TestSandboxUser: a user goes to envd as Basic auth on RPCs and as the
// username parameter on /files (docs/E2B-WIRE.md §3.6), and never to the interpreter.
func TestSandboxUser(t *testing.T) {
	p := newFakeProxy(t)
	p.execute = func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `{"type":"end_of_execution"}`+"\n")
	}
	sb := New(Config{SandboxURL: p.URL}).Sandbox("sbx1", "tok1").As("root")
	ctx := context.Background()
	basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("root:"))

	if _, err := sb.ListDir(ctx, &filesystem.ListDirRequest{Path: "/"}); err != nil {
		t.Fatal(err)
	}
	if r := p.one(t, "49983"); r.auth != basic {
		t.Errorf("RPC Authorization %q", r.auth)
	}
	if err := sb.WriteFile(ctx, "f", strings.NewReader("")); err != nil {
		t.Fatal(err)
	}
	if r := p.one(t, "49983"); r.query != "path=f&username=root" {
		t.Errorf("files query %q", r.query)
	}
	if err := sb.Execute(ctx, e2bwire.ExecuteRequest{Code: "1"}, func(Event) error { return nil }); err != nil {
		t.Fatal(err)
	}
	if r := p.one(t, "49999"); r.auth != "" {
		t.Errorf("interpreter got Authorization %q", r.auth)
	}
}

// TestNoToken: a sandbox created without an access token gets no header.
func TestNoToken(t *testing.T) {
	p := newFakeProxy(t)
	if err := New(Config{SandboxURL: p.URL}).Sandbox("sbx1", "").Health(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := p.last()
	if len(r) != 1 || r[0].token != "" || r[0].id != "sbx1" {
		t.Errorf("%+v", r)
	}
}

func TestExecute(t *testing.T) {
	p := newFakeProxy(t)
	sb := New(Config{SandboxURL: p.URL}).Sandbox("sbx1", "tok1")
	ctx := context.Background()
	lines := func(ls ...string) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			for _, l := range ls {
				_, _ = io.WriteString(w, l+"\n")
			}
		}
	}
	collect := func(body e2bwire.ExecuteRequest) ([]Event, error) {
		var evs []Event
		err := sb.Execute(ctx, body, func(ev Event) error {
			evs = append(evs, ev)
			return nil
		})
		return evs, err
	}

	p.execute = lines(
		`{"type":"number_of_executions","execution_count":1}`,
		`{"type":"stdout","text":"hi\n","timestamp":"2026-01-01T00:00:00Z"}`,
		`{"type":"keepalive"}`,
		`{"type":"result","is_main_result":true,"text":"2","png":"iVBO","json":{"a":1},"extra":{}}`,
		`{"type":"error","name":"ZeroDivisionError","value":"division by zero","traceback":"tb"}`,
		`{"type":"end_of_execution"}`,
		`{"type":"stdout","text":"after the end"}`,
	)
	lang := "python"
	evs, err := collect(e2bwire.ExecuteRequest{Code: "1+1", Language: &lang})
	if err != nil {
		t.Fatal(err)
	}
	r := p.one(t, "49999")
	if r.path != "/execute" || r.contentType != "application/json" || string(r.body) != `{"code":"1+1","language":"python"}` {
		t.Errorf("execute request: %+v body %s", r, r.body)
	}
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	if got := strings.Join(types, ","); got != "number_of_executions,stdout,keepalive,result,error" {
		t.Fatalf("events %s", got)
	}
	if evs[1].Text != "hi\n" {
		t.Errorf("stdout %+v", evs[1])
	}
	res := evs[3]
	if !res.IsMainResult || res.Text != "2" {
		t.Errorf("result %+v", res)
	}
	if f := res.Formats(); len(f) != 3 || f["text"] != "2" || f["png"] != "iVBO" || f["json"] != `{"a":1}` {
		t.Errorf("formats %v", f)
	}
	if e := evs[4]; e.Name != "ZeroDivisionError" || e.Value != "division by zero" || e.Traceback != "tb" {
		t.Errorf("error %+v", e)
	}

	// fn's error ends the execution as it is.
	stop := errors.New("stop")
	p.execute = lines(`{"type":"stdout","text":"x"}`, `{"type":"end_of_execution"}`)
	if err := sb.Execute(ctx, e2bwire.ExecuteRequest{Code: "x"}, func(Event) error { return stop }); err != stop {
		t.Errorf("fn error: %v", err)
	}

	for _, c := range []struct {
		name    string
		handler http.HandlerFunc
		want    string
		status  int
	}{
		{"no end", lines(`{"type":"stdout","text":"x"}`), "code interpreter: the stream ended without end_of_execution", 0},
		{"bad line", lines(`{"type":`), "code interpreter: bad event line: ", 0},
		{"plain-text 404", func(w http.ResponseWriter, r *http.Request) {
			http.Error(w, "Context ctx1 not found", http.StatusNotFound)
		}, "code interpreter: Context ctx1 not found (HTTP 404)", 404},
		{"proxy 502", func(w http.ResponseWriter, r *http.Request) {
			writeJSON(w, http.StatusBadGateway, map[string]any{"sandboxId": "sbx1", "message": "The sandbox was not found", "code": 502})
		}, "code interpreter: The sandbox was not found (HTTP 502)", 502},
	} {
		p.execute = c.handler
		_, err := collect(e2bwire.ExecuteRequest{Code: "x"})
		if err == nil || !strings.HasPrefix(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		}
		var e *Error
		if got := errors.As(err, &e); got != (c.status != 0) || (got && e.Status != c.status) {
			t.Errorf("%s: *Error %v (%#v)", c.name, got, e)
		}
	}
}

func ExampleSandbox_Execute() {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, `{"type":"result","is_main_result":true,"text":"2"}`)
		fmt.Fprintln(w, `{"type":"end_of_execution"}`)
	}))
	defer srv.Close()
	sb := New(Config{SandboxURL: srv.URL}).Sandbox("sbx1", "token")
	_ = sb.Execute(context.Background(), e2bwire.ExecuteRequest{Code: "1+1"}, func(ev Event) error {
		fmt.Println(ev.Type, ev.Text)
		return nil
	})
	// Output: result 2
}
