package interp

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// fakeKernel interprets a tiny command language so the protocol can be tested
// without a real runtime: "print X", "err X", "result X", "display", "die",
// "block" (until ctx ends), "sleep" (50 ms), "fail".
type fakeKernel struct {
	mu      sync.Mutex
	count   int
	closed  atomic.Bool
	running *atomic.Int32 // shared by the backend's kernels
	maxRun  *atomic.Int32
	cancels *atomic.Int32
}

func (k *fakeKernel) Execute(ctx context.Context, code string, env map[string]string, emit func(Event)) (int, error) {
	if k.closed.Load() {
		return 0, ErrKernelDied
	}
	n := k.running.Add(1)
	defer k.running.Add(-1)
	for {
		m := k.maxRun.Load()
		if n <= m || k.maxRun.CompareAndSwap(m, n) {
			break
		}
	}
	k.mu.Lock()
	k.count++
	c := k.count
	k.mu.Unlock()
	for _, line := range strings.Split(code, ";") {
		cmd, arg, _ := strings.Cut(strings.TrimSpace(line), " ")
		switch cmd {
		case "print":
			emit(Event{Type: "stdout", Text: arg + env["SUFFIX"]})
		case "err":
			emit(Event{Type: "stderr", Text: arg})
		case "result":
			emit(Event{Type: "result", IsMainResult: true, Data: map[string]any{"text/plain": arg, "text/html": "<b>" + arg + "</b>", "application/x-custom": "c"}})
		case "raise":
			emit(Event{Type: "error", Error: &ExecError{Name: "ValueError", Value: arg, Traceback: "line 1\nline 2"}})
		case "die":
			k.closed.Store(true)
			return 0, fmt.Errorf("fake: %w", ErrKernelDied)
		case "fail":
			return 0, errors.New("protocol broke")
		case "block":
			<-ctx.Done()
			k.cancels.Add(1)
			return 0, ctx.Err()
		case "sleep":
			time.Sleep(50 * time.Millisecond)
		}
	}
	return c, nil
}

func (k *fakeKernel) Close() error { k.closed.Store(true); return nil }

type fakeBackend struct {
	starts  atomic.Int32
	running atomic.Int32
	maxRun  atomic.Int32
	cancels atomic.Int32
	last    atomic.Pointer[fakeKernel]
	opts    atomic.Pointer[Options]
	delay   time.Duration
}

var (
	fakeOnce sync.Once
	fakes    = map[string]*fakeBackend{}
)

// registerFakes registers "fake" (works), "fakeslow" (200 ms start) and
// "fakemissing" (ErrUnavailable) once per test binary.
func registerFakes() {
	fakeOnce.Do(func() {
		for _, name := range []string{"fake", "fakeslow"} {
			b := &fakeBackend{}
			if name == "fakeslow" {
				b.delay = 200 * time.Millisecond
			}
			fakes[name] = b
			Register(name, func(ctx context.Context, o Options) (Kernel, error) {
				b.starts.Add(1)
				b.opts.Store(&o)
				time.Sleep(b.delay)
				k := &fakeKernel{running: &b.running, maxRun: &b.maxRun, cancels: &b.cancels}
				b.last.Store(k)
				return k, nil
			})
		}
		Register("fakemissing", func(ctx context.Context, o Options) (Kernel, error) {
			return nil, fmt.Errorf("%w: no fake runtime here", ErrUnavailable)
		})
	})
}

func newTestServer(t *testing.T, keepalive time.Duration) (*Server, *httptest.Server) {
	t.Helper()
	registerFakes()
	for _, b := range fakes {
		b.starts.Store(0)
		b.maxRun.Store(0)
		b.cancels.Store(0)
	}
	run := t.TempDir()
	s := NewServer(Config{
		Defaults: func(context.Context) (Options, error) {
			return Options{Cwd: "/home/user", Home: "/home/user", UID: 1000, GID: 1000, Env: []string{"A=1"}, RunDir: run}, nil
		},
		Authorize: func(r *http.Request) bool { return r.Header.Get("X-Access-Token") != "bad" },
		Keepalive: keepalive,
	})
	hs := testenv.NewHTTPServer(t, s.Handler())
	t.Cleanup(func() { hs.Close(); s.Close() })
	return s, hs
}

func post(t *testing.T, url string, body any) (*http.Response, string) {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp, string(out)
}

func lines(t *testing.T, body string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(l), &m); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		out = append(out, m)
	}
	return out
}

func types(ls []map[string]any) string {
	var ts []string
	for _, l := range ls {
		ts = append(ts, l["type"].(string))
	}
	return strings.Join(ts, ",")
}

func TestExecuteValidation(t *testing.T) {
	_, hs := newTestServer(t, 0)
	cases := []struct {
		body   any
		token  string
		status int
		want   string
	}{
		{map[string]any{"code": "x", "context_id": "abc", "language": "fake"}, "", 400, "Only one of context_id or language can be provided"},
		{map[string]any{"code": "x", "context_id": "nope"}, "", 404, "Context nope not found"},
		{map[string]any{"code": "x", "language": "fake"}, "bad", 401, "unauthorized"},
		{map[string]any{"code": "x", "language": "fake", "env_vars": map[string]string{"A=B": "1"}}, "", 400, "Invalid environment variable"},
		{"not an object", "", 400, "Invalid request body"},
	}
	for _, c := range cases {
		b, _ := json.Marshal(c.body)
		req, _ := http.NewRequest("POST", hs.URL+"/execute", strings.NewReader(string(b)))
		if c.token != "" {
			req.Header.Set("X-Access-Token", c.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		out, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.status || !strings.HasPrefix(string(out), c.want) {
			t.Errorf("%v: got %d %q, want %d %q", c.body, resp.StatusCode, out, c.status, c.want)
		}
	}
	// An unknown language: an error line (the SDKs drop a 400's body) naming the
	// registered languages.
	resp, out := post(t, hs.URL+"/execute", map[string]any{"code": "x", "language": "cobol"})
	if ls := lines(t, out); resp.StatusCode != 200 || types(ls) != "error,end_of_execution" || ls[0]["name"] != "UnknownLanguage" ||
		!strings.Contains(ls[0]["value"].(string), `Language "cobol" is not supported; supported languages: `) ||
		!strings.Contains(out, "bash") || !strings.Contains(out, "fake") {
		t.Errorf("unknown language: %d %q", resp.StatusCode, out)
	}
	// A language this sandbox lacks: an error line the SDK shows.
	resp, out = post(t, hs.URL+"/execute", map[string]any{"code": "x", "language": "fakemissing"})
	ls := lines(t, out)
	if resp.StatusCode != 200 || types(ls) != "error,end_of_execution" || ls[0]["name"] != "LanguageUnavailable" || !strings.Contains(ls[0]["value"].(string), "no fake runtime") {
		t.Errorf("unavailable: %d %q", resp.StatusCode, out)
	}
	resp, out = post(t, hs.URL+"/contexts", map[string]any{"language": "fakemissing"})
	if resp.StatusCode != 400 || !strings.Contains(out, "no fake runtime") {
		t.Errorf("unavailable context: %d %q", resp.StatusCode, out)
	}
}

func TestExecuteStream(t *testing.T) {
	_, hs := newTestServer(t, 0)
	resp, out := post(t, hs.URL+"/execute", map[string]any{"code": "print hi;err oops;result 'two';raise bad", "language": "FAKE", "env_vars": map[string]string{"SUFFIX": "!"}})
	if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	ls := lines(t, out)
	if got := types(ls); got != "stdout,stderr,result,error,number_of_executions,end_of_execution" {
		t.Fatalf("types %s", got)
	}
	if ls[0]["text"] != "hi!" || ls[1]["text"] != "oops" {
		t.Errorf("text lines %v %v", ls[0], ls[1])
	}
	if ts, _ := ls[0]["timestamp"].(string); ts == "" {
		t.Errorf("no timestamp: %v", ls[0])
	} else if _, err := time.Parse(time.RFC3339Nano, ts); err != nil {
		t.Errorf("timestamp %q: %v", ts, err)
	}
	r := ls[2]
	if r["text"] != "two" || r["html"] != "<b>'two'</b>" || r["is_main_result"] != true || r["extra"].(map[string]any)["application/x-custom"] != "c" {
		t.Errorf("result %v", r)
	}
	if e := ls[3]; e["name"] != "ValueError" || e["value"] != "bad" || e["traceback"] != "line 1\nline 2" {
		t.Errorf("error %v", e)
	}
	if ls[4]["execution_count"] != float64(1) {
		t.Errorf("count %v", ls[4])
	}
	// Same default context: state (the counter) persists; js/ts normalise.
	_, out = post(t, hs.URL+"/execute", map[string]any{"code": "print x", "language": "fake"})
	if ls := lines(t, out); ls[1]["execution_count"] != float64(2) {
		t.Errorf("second count %v", ls)
	}
	if NormalizeLanguage("JS") != "javascript" || NormalizeLanguage("ts") != "typescript" || NormalizeLanguage("") != "python" {
		t.Error("normalisation")
	}
}

func TestResultMapping(t *testing.T) {
	l := resultLine(map[string]any{"text/plain": `"q"`, "image/png": "AAA\n", "image/svg+xml": "<svg/>\n", "e2b/chart": map[string]any{"type": "line"}, "application/json": map[string]any{"a": 1.0}}, false)
	if l["text"] != "q" || l["png"] != "AAA" || l["svg"] != "<svg/>\n" || l["chart"].(map[string]any)["type"] != "line" || l["is_main_result"] != false || l["json"].(map[string]any)["a"] != 1.0 {
		t.Errorf("%v", l)
	}
	if stripQuotes("'") != "'" || stripQuotes("'a'b'") != "a'b" || stripQuotes("x") != "x" {
		t.Error("stripQuotes")
	}
}

func TestKeepalive(t *testing.T) {
	_, hs := newTestServer(t, 20*time.Millisecond)
	_, out := post(t, hs.URL+"/execute", map[string]any{"code": "sleep;sleep;sleep;print done", "language": "fake"})
	ls := lines(t, out)
	if !strings.Contains(types(ls), "keepalive") || ls[len(ls)-1]["type"] != "end_of_execution" {
		t.Errorf("no keepalive in %s", types(ls))
	}
}

func TestDisconnectCancelsAndKeepsContext(t *testing.T) {
	_, hs := newTestServer(t, 0)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", hs.URL+"/execute", strings.NewReader(`{"code":"block","language":"fake"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(5 * time.Second)
	for fakes["fake"].cancels.Load() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if fakes["fake"].cancels.Load() != 1 {
		t.Fatal("kernel's ctx was not cancelled on disconnect")
	}
	// The context and its kernel survive.
	_, out := post(t, hs.URL+"/execute", map[string]any{"code": "print again", "language": "fake"})
	if ls := lines(t, out); types(ls) != "stdout,number_of_executions,end_of_execution" || ls[1]["execution_count"] != float64(2) {
		t.Errorf("after disconnect: %s", out)
	}
	if fakes["fake"].starts.Load() != 1 {
		t.Errorf("kernel restarted: %d starts", fakes["fake"].starts.Load())
	}
}

func TestKernelDeathThenRestart(t *testing.T) {
	_, hs := newTestServer(t, 0)
	for _, code := range []string{"die", "fail"} {
		_, out := post(t, hs.URL+"/execute", map[string]any{"code": "print a;" + code, "language": "fake"})
		ls := lines(t, out)
		want := map[string]string{"die": "KernelDied", "fail": "UnexpectedEndOfExecution"}[code]
		if types(ls) != "stdout,error,end_of_execution" || ls[1]["name"] != want {
			t.Fatalf("%s: %s", code, out)
		}
		_, out = post(t, hs.URL+"/execute", map[string]any{"code": "print b", "language": "fake"})
		if ls := lines(t, out); types(ls) != "stdout,number_of_executions,end_of_execution" || ls[1]["execution_count"] != float64(1) {
			t.Fatalf("after %s: %s", code, out)
		}
	}
	if n := fakes["fake"].starts.Load(); n != 3 {
		t.Errorf("starts %d, want 3", n)
	}
}

func TestContextsAPI(t *testing.T) {
	_, hs := newTestServer(t, 0)
	resp, out := post(t, hs.URL+"/contexts", map[string]any{"language": "fake", "cwd": "/tmp"})
	var c contextInfo
	if err := json.Unmarshal([]byte(out), &c); resp.StatusCode != 200 || err != nil || c.Language != "fake" || c.Cwd != "/tmp" || len(c.ID) != 36 {
		t.Fatalf("create: %d %q", resp.StatusCode, out)
	}
	if o := fakes["fake"].opts.Load(); o.Cwd != "/tmp" || o.Language != "fake" || o.UID != 1000 || !strings.HasPrefix(o.RunDir, "/") {
		t.Errorf("kernel options %+v", o)
	}
	resp, out = post(t, hs.URL+"/contexts", map[string]any{"language": "nope"})
	if resp.StatusCode != 400 {
		t.Errorf("bad language: %d %q", resp.StatusCode, out)
	}
	// A cwd no kernel could start in is the client's mistake, said before any
	// kernel starts.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, cwd := range []string{"/nonexistent-airlock-dir", file} {
		starts := fakes["fake"].starts.Load()
		resp, out = post(t, hs.URL+"/contexts", map[string]any{"language": "fake", "cwd": cwd})
		if resp.StatusCode != 400 || !strings.Contains(out, cwd) {
			t.Errorf("cwd %s: %d %q, want 400 naming it", cwd, resp.StatusCode, out)
		}
		if fakes["fake"].starts.Load() != starts {
			t.Errorf("cwd %s: a kernel was started", cwd)
		}
	}
	// Default cwd: the default user's home.
	_, out = post(t, hs.URL+"/contexts", map[string]any{"language": "fake"})
	var c2 contextInfo
	_ = json.Unmarshal([]byte(out), &c2)
	if c2.Cwd != "/home/user" || c2.ID == c.ID {
		t.Errorf("second context %+v", c2)
	}
	// Contexts are isolated: separate counters.
	post(t, hs.URL+"/execute", map[string]any{"code": "print 1", "context_id": c.ID})
	_, out = post(t, hs.URL+"/execute", map[string]any{"code": "print 1", "context_id": c.ID})
	if !strings.Contains(out, `"execution_count":2`) {
		t.Errorf("state: %s", out)
	}
	_, out = post(t, hs.URL+"/execute", map[string]any{"code": "print 1", "context_id": c2.ID})
	if !strings.Contains(out, `"execution_count":1`) {
		t.Errorf("isolation: %s", out)
	}
	// Restart resets the state.
	resp, out = post(t, hs.URL+"/contexts/"+c.ID+"/restart", nil)
	if resp.StatusCode != 200 || strings.TrimSpace(out) != "null" {
		t.Errorf("restart: %d %q", resp.StatusCode, out)
	}
	_, out = post(t, hs.URL+"/execute", map[string]any{"code": "print 1", "context_id": c.ID})
	if !strings.Contains(out, `"execution_count":1`) {
		t.Errorf("after restart: %s", out)
	}
	if resp, out = post(t, hs.URL+"/contexts/nope/restart", nil); resp.StatusCode != 404 || out != "Context nope not found" {
		t.Errorf("restart unknown: %d %q", resp.StatusCode, out)
	}
	// List, delete.
	r, _ := http.Get(hs.URL + "/contexts")
	var list []contextInfo
	_ = json.NewDecoder(r.Body).Decode(&list)
	r.Body.Close()
	if len(list) != 2 || list[0].ID != c.ID || list[1].ID != c2.ID {
		t.Errorf("list %+v", list)
	}
	del := func(id string) (int, string) {
		req, _ := http.NewRequest("DELETE", hs.URL+"/contexts/"+id, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if st, _ := del(c.ID); st != 200 {
		t.Errorf("delete %d", st)
	}
	if st, b := del(c.ID); st != 404 || b != "Context "+c.ID+" not found" {
		t.Errorf("delete again %d %q", st, b)
	}
	if _, out := post(t, hs.URL+"/execute", map[string]any{"code": "x", "context_id": c.ID}); out != "Context "+c.ID+" not found" {
		t.Errorf("execute deleted: %q", out)
	}
	r, _ = http.Get(hs.URL + "/health")
	b, _ := io.ReadAll(r.Body)
	if r.StatusCode != 200 || strings.TrimSpace(string(b)) != `"OK"` {
		t.Errorf("health %d %q", r.StatusCode, b)
	}
}

// Executions on one context run one at a time; on different contexts in parallel.
func TestSerialisedAndParallel(t *testing.T) {
	_, hs := newTestServer(t, 0)
	var ids []string
	for range 2 {
		_, out := post(t, hs.URL+"/contexts", map[string]any{"language": "fake"})
		var c contextInfo
		_ = json.Unmarshal([]byte(out), &c)
		ids = append(ids, c.ID)
	}
	exec := func(id string, wg *sync.WaitGroup) {
		defer wg.Done()
		post(t, hs.URL+"/execute", map[string]any{"code": "sleep;sleep", "context_id": id})
	}
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go exec(ids[0], &wg)
	}
	wg.Wait()
	// fakeKernel counts concurrency per backend; one context → never 2 at once.
	if m := fakes["fake"].maxRun.Load(); m != 1 {
		t.Errorf("one context ran %d executions at once", m)
	}
	// Two contexts: block both kernels at once, which only parallel execution allows.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	started := make(chan struct{}, 2)
	for _, id := range ids {
		go func() {
			req, _ := http.NewRequestWithContext(ctx, "POST", hs.URL+"/execute", strings.NewReader(`{"code":"block","context_id":"`+id+`"}`))
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				started <- struct{}{}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}()
	}
	for range 2 {
		<-started
	}
	deadline := time.Now().Add(5 * time.Second)
	for fakes["fake"].maxRun.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if m := fakes["fake"].maxRun.Load(); m != 2 {
		t.Errorf("two contexts: max %d at once", m)
	}
}

// Prewarm starts the default kernel once; an execute during the start waits for
// it instead of starting another.
func TestPrewarm(t *testing.T) {
	s, hs := newTestServer(t, 0)
	s.Prewarm([]string{"fakeslow", "unknown"})
	time.Sleep(20 * time.Millisecond)
	_, out := post(t, hs.URL+"/execute", map[string]any{"code": "print hi", "language": "fakeslow"})
	if !strings.Contains(out, `"hi"`) {
		t.Fatalf("%s", out)
	}
	if n := fakes["fakeslow"].starts.Load(); n != 1 {
		t.Errorf("starts %d", n)
	}
	r, _ := http.Get(hs.URL + "/contexts")
	sc := bufio.NewScanner(r.Body)
	sc.Scan()
	r.Body.Close()
	if !strings.Contains(sc.Text(), `"language":"fakeslow"`) {
		t.Errorf("list: %s", sc.Text())
	}
}
