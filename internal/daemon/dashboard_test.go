package daemon_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// browser is a dashboard client: a cookie jar and the session's CSRF token.
type browser struct {
	t    *testing.T
	base string
	hc   *http.Client
	csrf string
}

func newBrowser(t *testing.T, base string) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, base: base, hc: &http.Client{Jar: jar, Timeout: 30 * time.Second}}
}

// do sends a request (with the CSRF token when it has one) and returns the
// status and body.
func (b *browser) do(method, path string, body io.Reader, header http.Header) (int, []byte) {
	b.t.Helper()
	req, err := http.NewRequest(method, b.base+path, body)
	if err != nil {
		b.t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	if b.csrf != "" && req.Header.Get("X-Airlock-CSRF") == "" && method != http.MethodGet {
		req.Header.Set("X-Airlock-CSRF", b.csrf)
	}
	if body != nil && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := b.hc.Do(req)
	if err != nil {
		b.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

func (b *browser) json(method, path, body string, wantStatus int, out any) {
	b.t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	st, got := b.do(method, path, rd, nil)
	if st != wantStatus {
		b.t.Fatalf("%s %s = %d %s, want %d", method, path, st, got, wantStatus)
	}
	if out != nil {
		if err := json.Unmarshal(got, out); err != nil {
			b.t.Fatalf("%s %s: %v in %s", method, path, err, got)
		}
	}
}

func (b *browser) signIn(key string) {
	b.t.Helper()
	var s struct{ CSRFToken string }
	b.json(http.MethodPost, "/dashboard/api/session", `{"apiKey":"`+key+`"}`, http.StatusOK, &s)
	if s.CSRFToken == "" {
		b.t.Fatal("sign-in gave no CSRF token")
	}
	b.csrf = s.CSRFToken
}

type apiErr struct {
	Code    int
	Message string
	Gone    bool
}

// The dashboard's API as a browser uses it, against a real server and real
// sandboxes: sign-in and its cookie, CSRF, one key never seeing or reaching
// another's sandbox, the terminal over a WebSocket, files both ways, and a
// sandbox killed from the page saying it is gone.
func TestDashboard(t *testing.T) {
	d := daemontest.Start(t, func(c *daemon.Config) { c.APIKeys = append(c.APIKeys, otherKey) })
	ctx := context.Background()
	b := newBrowser(t, d.APIURL)

	// Sign-in: wrong and empty keys are told so; the session is a cookie
	// the page's scripts cannot read.
	var e apiErr
	b.json(http.MethodPost, "/dashboard/api/session", `{"apiKey":"e2b_wrong"}`, http.StatusUnauthorized, &e)
	if e.Message != "Invalid API key" {
		t.Errorf("wrong key: message %q", e.Message)
	}
	b.json(http.MethodPost, "/dashboard/api/session", `{"apiKey":" "}`, http.StatusBadRequest, nil)
	b.json(http.MethodGet, "/dashboard/api/sandboxes", "", http.StatusUnauthorized, nil)
	req, _ := http.NewRequest(http.MethodPost, d.APIURL+"/dashboard/api/session", strings.NewReader(`{"apiKey":"`+daemontest.Key+`"}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	cookie := resp.Header.Get("Set-Cookie")
	for _, want := range []string{"airlock_dashboard=", "HttpOnly", "SameSite=Strict", "Path=/dashboard"} {
		if !strings.Contains(cookie, want) {
			t.Errorf("session cookie %q lacks %s", cookie, want)
		}
	}
	b.signIn(daemontest.Key)

	mine := e2bclient.New(e2bclient.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: daemontest.Key})
	theirs := e2bclient.New(e2bclient.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: otherKey})
	a, err := mine.Create(ctx, e2bwire.NewSandbox{TemplateID: "base", Metadata: map[string]any{"team": "blue"}})
	if err != nil {
		t.Fatal(err)
	}
	o, err := theirs.Create(ctx, e2bwire.NewSandbox{TemplateID: "base"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = theirs.Kill(context.Background(), o.SandboxID) })

	// The list holds the key's sandbox only, and its filters work.
	type list struct {
		Total     int
		Sandboxes []struct {
			SandboxID, State string
			Metadata         map[string]string
		}
	}
	var l list
	b.json(http.MethodGet, "/dashboard/api/sandboxes", "", http.StatusOK, &l)
	if l.Total != 1 || len(l.Sandboxes) != 1 || l.Sandboxes[0].SandboxID != a.SandboxID || l.Sandboxes[0].Metadata["team"] != "blue" {
		t.Fatalf("list = %+v, want only %s", l, a.SandboxID)
	}
	b.json(http.MethodGet, "/dashboard/api/sandboxes?metadata="+url.QueryEscape("team=red"), "", http.StatusOK, &l)
	if l.Total != 0 {
		t.Errorf("metadata team=red matched %+v", l)
	}
	b.json(http.MethodGet, "/dashboard/api/sandboxes?state=paused", "", http.StatusOK, &l)
	if l.Total != 0 {
		t.Errorf("state=paused matched %+v", l)
	}
	b.json(http.MethodGet, "/dashboard/api/sandboxes?state=dead", "", http.StatusBadRequest, &e)
	if !strings.Contains(e.Message, "dead") {
		t.Errorf("bad state: message %q", e.Message)
	}

	// The other key's sandbox answers as one that never existed, on every
	// route, and survives the attempt to kill it.
	for _, r := range []struct{ method, path string }{
		{http.MethodGet, ""}, {http.MethodGet, "/metrics"}, {http.MethodGet, "/dir"},
		{http.MethodGet, "/files?path=/etc/hostname"}, {http.MethodGet, "/processes"},
		{http.MethodPost, "/kill"}, {http.MethodPost, "/pause"}, {http.MethodPost, "/fork"},
	} {
		st, body := b.do(r.method, "/dashboard/api/sandboxes/"+o.SandboxID+r.path, nil, nil)
		if st != http.StatusNotFound || bytes.Contains(body, []byte("gone")) {
			t.Errorf("%s other key's sandbox%s = %d %s, want 404 as for none", r.method, r.path, st, body)
		}
	}
	if _, err := theirs.Get(ctx, o.SandboxID); err != nil {
		t.Fatalf("the other key's sandbox after the dashboard's attempts: %v", err)
	}
	var evs struct{ Events []any }
	b.json(http.MethodGet, "/dashboard/api/sandboxes/"+o.SandboxID+"/events", "", http.StatusOK, &evs)
	if len(evs.Events) != 0 {
		t.Errorf("the other key's events reached the dashboard: %v", evs.Events)
	}

	// Changes need the session's CSRF token and this origin.
	path := "/dashboard/api/sandboxes/" + a.SandboxID
	if st, body := b.do(http.MethodPost, path+"/timeout", strings.NewReader(`{"timeout":600}`), http.Header{"X-Airlock-Csrf": {"forged"}}); st != http.StatusForbidden {
		t.Errorf("timeout with a wrong CSRF token = %d %s, want 403", st, body)
	}
	if st, body := b.do(http.MethodPost, path+"/timeout", strings.NewReader(`{"timeout":600}`), http.Header{"Origin": {"http://evil.example"}}); st != http.StatusForbidden {
		t.Errorf("timeout from another origin = %d %s, want 403", st, body)
	}
	b.json(http.MethodPost, path+"/timeout", `{"timeout":600}`, http.StatusNoContent, nil)

	// A fork from the page lives long enough to be looked at (the API's
	// own default is seconds), and its answer carries no token.
	var forks struct {
		Sandboxes []struct{ SandboxID, Error string }
	}
	st, body := b.do(http.MethodPost, path+"/fork", strings.NewReader(`{"count":1}`), nil)
	if err := json.Unmarshal(body, &forks); st != http.StatusOK || err != nil || len(forks.Sandboxes) != 1 || forks.Sandboxes[0].SandboxID == "" {
		t.Fatalf("fork = %d %s", st, body)
	}
	if bytes.Contains(body, []byte("oken")) {
		t.Errorf("fork answer holds a token: %s", body)
	}
	fork, err := mine.Get(ctx, forks.Sandboxes[0].SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(fork.EndAt); left < 200*time.Second {
		t.Errorf("fork from the page ends in %v, want about 300 s", left)
	}
	b.json(http.MethodPost, "/dashboard/api/sandboxes/"+fork.SandboxID+"/kill", "", http.StatusNoContent, nil)

	// Files: an upload lands in the sandbox, the listing shows it, the
	// download gives it back.
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	fw, _ := mw.CreateFormFile("file", "hello.txt")
	fw.Write([]byte("hello from the dashboard\n"))
	mw.Close()
	if st, body := b.do(http.MethodPost, path+"/files?path=/home/user/hello.txt", &form, http.Header{"Content-Type": {mw.FormDataContentType()}}); st != http.StatusNoContent {
		t.Fatalf("upload = %d %s", st, body)
	}
	var dir struct {
		Entries []struct{ Name, Type string }
	}
	b.json(http.MethodGet, path+"/dir?path=/home/user", "", http.StatusOK, &dir)
	found := false
	for _, en := range dir.Entries {
		found = found || (en.Name == "hello.txt" && en.Type == "file")
	}
	if !found {
		t.Errorf("listing of /home/user after the upload: %+v", dir.Entries)
	}
	if st, body := b.do(http.MethodGet, path+"/files?path=/home/user/hello.txt", nil, nil); st != http.StatusOK || string(body) != "hello from the dashboard\n" {
		t.Errorf("download = %d %q", st, body)
	}
	b.json(http.MethodGet, path+"/dir?path=relative", "", http.StatusBadRequest, nil)

	// The terminal: a shell on a PTY over a WebSocket.
	u, _ := url.Parse(d.APIURL)
	wsURL := "ws://" + u.Host + path + "/terminal?cols=100&rows=30&csrf=" + url.QueryEscape(b.csrf)
	dial := func(target string) (*websocket.Conn, error) {
		hdr := http.Header{"Origin": {d.APIURL}}
		for _, c := range b.hc.Jar.Cookies(&url.URL{Scheme: "http", Host: u.Host, Path: "/dashboard/"}) {
			hdr.Add("Cookie", c.Name+"="+c.Value)
		}
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		c, _, err := websocket.Dial(dctx, target, &websocket.DialOptions{HTTPHeader: hdr})
		return c, err
	}
	ws, err := dial(wsURL)
	if err != nil {
		t.Fatalf("terminal: %v", err)
	}
	send := func(v any) {
		msg, _ := json.Marshal(v)
		if err := ws.Write(ctx, websocket.MessageText, msg); err != nil {
			t.Fatalf("terminal write: %v", err)
		}
	}
	send(map[string]any{"type": "resize", "cols": 120, "rows": 40})
	send(map[string]any{"type": "input", "data": "echo dash-$((6*7)); stty size\r"})
	var screen strings.Builder
	rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	for !strings.Contains(screen.String(), "dash-42") || !strings.Contains(screen.String(), "40 120") {
		_, data, err := ws.Read(rctx)
		if err != nil {
			cancel()
			t.Fatalf("terminal read: %v; screen so far: %q", err, screen.String())
		}
		screen.Write(data)
	}
	cancel()
	var procs struct{ Processes []struct{ PID int } }
	b.json(http.MethodGet, path+"/processes", "", http.StatusOK, &procs)
	if len(procs.Processes) != 1 {
		t.Errorf("processes with the terminal open: %+v, want its shell", procs.Processes)
	}
	ws.Close(websocket.StatusNormalClosure, "")
	waitFor(t, "the terminal's shell to end with its socket", func() bool {
		b.json(http.MethodGet, path+"/processes", "", http.StatusOK, &procs)
		return len(procs.Processes) == 0
	})

	// A terminal without the CSRF parameter, or for the other key's
	// sandbox, is closed with a code that says why.
	closeCode := func(target string) websocket.StatusCode {
		c, err := dial(target)
		if err != nil {
			t.Fatalf("dial %s: %v", target, err)
		}
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, _, err = c.Read(rctx)
		return websocket.CloseStatus(err)
	}
	if got := closeCode("ws://" + u.Host + path + "/terminal"); got != 4403 {
		t.Errorf("terminal without csrf closed with %d, want 4403", got)
	}
	if got := closeCode("ws://" + u.Host + "/dashboard/api/sandboxes/" + o.SandboxID + "/terminal?csrf=" + url.QueryEscape(b.csrf)); got != 4404 {
		t.Errorf("terminal of the other key's sandbox closed with %d, want 4404", got)
	}

	// Killed from the page: gone from the list, and its page says so.
	b.json(http.MethodPost, path+"/kill", "", http.StatusNoContent, nil)
	b.json(http.MethodGet, "/dashboard/api/sandboxes", "", http.StatusOK, &l)
	if l.Total != 0 {
		t.Errorf("list after the kill: %+v", l)
	}
	b.json(http.MethodGet, path, "", http.StatusNotFound, &e)
	if !e.Gone || !strings.Contains(e.Message, "killed") {
		t.Errorf("killed sandbox's page: %+v, want gone, killed", e)
	}
	b.json(http.MethodGet, path+"/events", "", http.StatusOK, &evs)
	if len(evs.Events) < 2 {
		t.Errorf("events of the killed sandbox: %v", evs.Events)
	}
	if got := closeCode(wsURL); got != 4404 {
		t.Errorf("terminal of the killed sandbox closed with %d, want 4404", got)
	}

	// Signing out ends the session.
	b.json(http.MethodDelete, "/dashboard/api/session", "", http.StatusNoContent, nil)
	b.json(http.MethodGet, "/dashboard/api/session", "", http.StatusUnauthorized, nil)
}

// waitFor polls cond for up to 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
