package envd

import (
	"bytes"
	"io"
	"log/slog"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/textproto"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/testenv"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
)

// Uploading into a full filesystem answers 507 with the text the SDKs map to
// NotEnoughSpaceError. A small tmpfs provides the full disk.
func TestUploadNoSpace(t *testing.T) {
	e := newEnv(t)
	small := filepath.Join(e.root, "small")
	must(t, os.Mkdir(small, 0o755))
	if err := syscall.Mount("tmpfs", small, "tmpfs", 0, "size=64k"); err != nil {
		testenv.Missing(t, "cannot mount a tmpfs here: %v", err)
	}
	t.Cleanup(func() { _ = syscall.Unmount(small, syscall.MNT_DETACH) })
	big := bytes.Repeat([]byte("x"), 1<<20)
	resp, body := e.httpDo("POST", "/files?path="+filepath.Join(small, "big"), bytes.NewReader(big), map[string]string{
		"Content-Type": "application/octet-stream", "X-Access-Token": testToken})
	if resp.StatusCode != http.StatusInsufficientStorage || strings.TrimSpace(body) != `{"code":507,"message":"not enough disk space available"}` {
		t.Fatalf("full disk: %d %s", resp.StatusCode, body)
	}
}

func TestRecoverHTTP(t *testing.T) {
	s := &Server{log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	h := s.recoverHTTP(http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic("boom") }))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", "/x", nil))
	if rec.Code != 500 || !strings.Contains(rec.Body.String(), `"code":500`) {
		t.Fatalf("%d %s", rec.Code, rec.Body.String())
	}
}

func TestEtcUserDB(t *testing.T) {
	root := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(root, "etc"), 0o755))
	passwd := filepath.Join(root, "etc/passwd")
	must(t, os.WriteFile(passwd, []byte("# comment\nuser:x:1000:1000::/home/user:/bin/bash\nbroken line\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(root, "etc/group"), []byte("user:x:1000:\nsudo:x:27:other,user\ndocker:x:999:other\n"), 0o644))
	db := &unixuser.EtcUserDB{Root: root}
	u, err := db.LookupUser("user")
	must(t, err)
	if u.UID != 1000 || u.GID != 1000 || u.Home != "/home/user" || len(u.Groups) != 2 || u.Groups[1] != 27 {
		t.Fatalf("user %+v", u)
	}
	// root resolves even when the rootfs's passwd lacks it.
	if r, err := db.LookupUser("root"); err != nil || r.UID != 0 || r.Home != "/root" {
		t.Fatalf("root %+v %v", r, err)
	}
	if _, err := db.LookupUser("ghost"); err == nil {
		t.Fatal("ghost found")
	}
	if n, ok := db.GroupName(27); !ok || n != "sudo" {
		t.Fatal("group name")
	}
	if _, ok := db.UserName(4242); ok {
		t.Fatal("unknown uid named")
	}
	// Accounts added while envd runs (useradd in the sandbox) are seen.
	time.Sleep(10 * time.Millisecond)
	must(t, os.WriteFile(passwd, []byte("user:x:1000:1000::/home/user:/bin/bash\nnew:x:1001:1001::/home/new:/bin/sh\n"), 0o644))
	if n, ok := db.UserName(1001); !ok || n != "new" {
		t.Fatal("new user not seen")
	}
}

func TestDefaultUserFallsBackToRoot(t *testing.T) {
	e := newEnv(t, func(c *envdapi.Config) { c.DefaultUser = "absent" })
	u, err := e.srv.lookupUser("")
	if err != nil || u.Name != "root" {
		t.Fatalf("fallback %+v %v", u, err)
	}
	e2 := newEnv(t, func(c *envdapi.Config) { c.DefaultUser = ""; c.DefaultWorkdir = "/srv/work" })
	u, err = e2.srv.lookupUser("")
	if err != nil || u.Name != "root" {
		t.Fatalf("empty default %+v %v", u, err)
	}
	if got := e2.srv.resolvePath("", u); got != "/srv/work" {
		t.Fatalf("empty path resolves to %q", got)
	}
	if got := e2.srv.resolvePath("a/../b", u); got != filepath.Join(e2.rhome, "b") {
		t.Fatalf("relative path resolves to %q", got)
	}
	if got := e2.srv.resolvePath("/x/./y/", u); got != "/x/y" {
		t.Fatalf("absolute path resolves to %q", got)
	}
}

func TestDispositionFilename(t *testing.T) {
	for cd, want := range map[string]string{
		`form-data; name="file"; filename="/tmp/dir/x.txt"`:          "/tmp/dir/x.txt",
		`form-data; name="file"; filename="rel/y"`:                   "rel/y",
		`form-data; name="file"; filename="a\b; c.txt"`:              `a\b; c.txt`,
		`form-data; name="file"; filename="q%22uote"`:                `q"uote`,
		`form-data; name="file"; filename*=UTF-8''%C3%A9t%C3%A9.txt`: "été.txt",
		`form-data; name="file"; filename=plain.txt`:                 "plain.txt",
	} {
		h := http.Header{}
		h.Set("Content-Disposition", cd)
		got, ok := partFileName(&multipart.Part{Header: textprotoHeader(h)})
		if !ok || got != want {
			t.Errorf("%s: got %q %v, want %q", cd, got, ok, want)
		}
	}
}

func textprotoHeader(h http.Header) textproto.MIMEHeader { return textproto.MIMEHeader(h) }

// Hostile or malformed input gets a clear client error, never a panic (which the
// recover middleware would turn into "internal error").
func TestMalformedInputNeverPanics(t *testing.T) {
	e := newEnv(t)
	procs := []string{
		"/process.Process/List", "/process.Process/Update", "/process.Process/SendInput", "/process.Process/SendSignal",
		"/process.Process/CloseStdin", "/filesystem.Filesystem/Stat", "/filesystem.Filesystem/MakeDir",
		"/filesystem.Filesystem/Move", "/filesystem.Filesystem/ListDir", "/filesystem.Filesystem/Remove",
		"/filesystem.Filesystem/CreateWatcher", "/filesystem.Filesystem/GetWatcherEvents", "/filesystem.Filesystem/RemoveWatcher",
	}
	bodies := []string{``, `{`, `[]`, `null`, `{"path":"a\u0000b","source":"\u0000","destination":"x","process":{"pid":4294967295},"input":{"stdin":"!!"}}`,
		`{"path":"` + strings.Repeat("x/", 3000) + `"}`, `{"process":{"tag":""},"pty":{"size":{"cols":0,"rows":99999999}}}`, `{"watcherId":"../../etc"}`}
	for _, p := range procs {
		for _, b := range bodies {
			resp, body := e.httpDo("POST", p, strings.NewReader(b), map[string]string{"Content-Type": "application/json", "X-Access-Token": testToken})
			// 501 is SendSignal's documented answer to an unsupported signal.
			if (resp.StatusCode >= 500 && resp.StatusCode != 501) || strings.Contains(body, "internal error") {
				t.Errorf("%s %.60q: %d %.200s", p, b, resp.StatusCode, body)
			}
		}
	}
	for _, q := range []string{"path=%00", "path=" + strings.Repeat("a", 5000), "path=/proc/self/status", "path=/dev/null", "username=%00"} {
		resp, body := e.httpDo("GET", "/files?"+q, nil, tokenHdr)
		if resp.StatusCode >= 500 {
			t.Errorf("GET /files?%.40s: %d %.200s", q, resp.StatusCode, body)
		}
		resp, body = e.httpDo("POST", "/files?"+q, strings.NewReader("x"), map[string]string{"Content-Type": "application/octet-stream", "X-Access-Token": testToken})
		if resp.StatusCode >= 500 && !strings.Contains(q, "proc") {
			t.Errorf("POST /files?%.40s: %d %.200s", q, resp.StatusCode, body)
		}
	}
	for _, ct := range []string{"multipart/form-data", "multipart/form-data; boundary=zz", "a/b; ===", "application/octet-stream; charset"} {
		resp, body := e.httpDo("POST", "/files?path=m", strings.NewReader("--zz\r\nContent-Disposition: form-data; name=file; filename=\"\x00\"\r\n\r\nx\r\n--zz--"), map[string]string{"Content-Type": ct, "X-Access-Token": testToken})
		if resp.StatusCode >= 500 {
			t.Errorf("content type %q: %d %.200s", ct, resp.StatusCode, body)
		}
	}
}
