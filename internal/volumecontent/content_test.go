package volumecontent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/grant"
	"github.com/airlock-sandbox/airlock/internal/grant/granttest"
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// fakeVolumes opens volumes by ID with one token each (volume.Service does
// the same over its records; internal/volume tests it).
type fakeVolumes map[string]volume.Volume

func (f fakeVolumes) Open(_ context.Context, id string, accept func(token, owner string) error) (volume.Volume, error) {
	v, ok := f[id]
	if !ok {
		return volume.Volume{}, fmt.Errorf("%w %s", volume.ErrToken, id)
	}
	if err := accept(v.Token, v.Owner); err != nil {
		return volume.Volume{}, fmt.Errorf("volume %s: %w", id, err)
	}
	return v, nil
}

// setup makes two volumes side by side, "v1" (with a tree whose symlinks
// point out of it) and "v2" (with a secret), and the handler over them.
func setup(t testing.TB) (h *Handler, v1, v2 volume.Volume) {
	t.Helper()
	base := t.TempDir()
	v1 = volume.Volume{ID: "v1", Token: "tok1", Path: filepath.Join(base, "v1"), SizeBytes: 1 << 30}
	v2 = volume.Volume{ID: "v2", Token: "tok2", Path: filepath.Join(base, "v2"), SizeBytes: 1 << 30}
	for _, d := range []string{v1.Path, v2.Path, filepath.Join(v1.Path, "dir", "sub")} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(v2.Path, "secret"), []byte("SECRET"), 0o600))
	must(os.WriteFile(filepath.Join(base, "outside"), []byte("SECRET"), 0o600))
	must(os.WriteFile(filepath.Join(v1.Path, "dir", "a.txt"), []byte("hello"), 0o644))
	must(os.Symlink("/etc", filepath.Join(v1.Path, "abs")))
	must(os.Symlink("../v2", filepath.Join(v1.Path, "rel")))
	must(os.Symlink("../../outside", filepath.Join(v1.Path, "dir", "up")))
	must(os.Symlink("dir/a.txt", filepath.Join(v1.Path, "inside")))
	must(os.Symlink("loop", filepath.Join(v1.Path, "loop")))
	h = New(fakeVolumes{"v1": v1, "v2": v2}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	return h, v1, v2
}

func do(t testing.TB, h http.Handler, method, route, vol, token string, q url.Values, body io.Reader) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, "/volumecontent/"+vol+"/"+route+"?"+q.Encode(), body)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

func wantStatus(t testing.TB, rec *httptest.ResponseRecorder, status int, msgPart string) {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d: %s", rec.Code, status, rec.Body)
	}
	if status < 300 {
		return
	}
	var e e2bwire.VolumeContentError
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code != fmt.Sprint(status) || !strings.Contains(e.Message, msgPart) {
		t.Fatalf("error body %s (%v), want code %q and a message with %q", rec.Body, err, fmt.Sprint(status), msgPart)
	}
}

func p(kv ...string) url.Values {
	q := url.Values{}
	for i := 0; i+1 < len(kv); i += 2 {
		q.Set(kv[i], kv[i+1])
	}
	return q
}

func TestAuth(t *testing.T) {
	h, _, _ := setup(t)
	wantStatus(t, do(t, h, "GET", "path", "v1", "", p("path", "/"), nil), 401, "missing volume token")
	wantStatus(t, do(t, h, "GET", "path", "v1", "tok2", p("path", "/"), nil), 403, `does not open volume "v1"`)
	wantStatus(t, do(t, h, "GET", "file", "v2", "tok1", p("path", "secret"), nil), 403, `does not open volume "v2"`)
	wantStatus(t, do(t, h, "GET", "path", "nope", "tok1", p("path", "/"), nil), 403, "does not open")
	wantStatus(t, do(t, h, "GET", "path", "v1", "tok1", nil, nil), 400, "path is required")
	wantStatus(t, do(t, h, "GET", "nothing", "v1", "tok1", p("path", "/"), nil), 404, "no route")
	wantStatus(t, do(t, h, "POST", "file", "v1", "tok1", p("path", "/"), nil), 404, "no route")
}

func TestReadWriteStatListRemove(t *testing.T) {
	h, v1, _ := setup(t)
	// A streamed write of a few MiB, then read back whole and by range.
	data := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
	rec := do(t, h, "PUT", "file", "v1", "tok1", p("path", "/big.bin"), bytes.NewReader(data))
	wantStatus(t, rec, 201, "")
	var e e2bwire.VolumeEntryStat
	if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
		t.Fatal(err)
	}
	if e.Name != "big.bin" || e.Path != "/big.bin" || e.Type != "file" || e.Size != int64(len(data)) || e.Mode != 0o644 || e.UID != 1000 || e.GID != 1000 || e.Mtime.IsZero() {
		t.Fatalf("written = %+v", e)
	}
	rec = do(t, h, "GET", "file", "v1", "tok1", p("path", "big.bin"), nil)
	wantStatus(t, rec, 200, "")
	if !bytes.Equal(rec.Body.Bytes(), data) || rec.Header().Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("read back %d bytes, type %q", rec.Body.Len(), rec.Header().Get("Content-Type"))
	}
	// Without force an existing file is kept; with it, replaced.
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "/big.bin"), strings.NewReader("x")), 409, "already exists")
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "/big.bin", "force", "true", "mode", "384", "uid", "0", "gid", "5"), strings.NewReader("small")), 201, "")
	rec = do(t, h, "GET", "path", "v1", "tok1", p("path", "/big.bin"), nil)
	json.Unmarshal(rec.Body.Bytes(), &e)
	if e.Size != 5 || e.Mode != 0o600 || e.UID != 0 || e.GID != 5 {
		t.Fatalf("after forced write: %+v", e)
	}
	// Empty file; missing parent without force; parents made with it.
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "empty"), nil), 201, "")
	if rec := do(t, h, "GET", "file", "v1", "tok1", p("path", "empty"), nil); rec.Code != 200 || rec.Body.Len() != 0 {
		t.Fatalf("empty file: %d %q", rec.Code, rec.Body)
	}
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "/no/such/f"), strings.NewReader("x")), 404, `"/no/such" not found`)
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "/new/deep/f", "force", "true"), strings.NewReader("x")), 201, "")
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "/dir"), strings.NewReader("x")), 409, "is a directory")
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "/dir/a.txt/x"), strings.NewReader("x")), 400, "must be a directory")
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "/"), strings.NewReader("x")), 400, "root")
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "/m", "mode", "99999"), strings.NewReader("x")), 400, "mode must be")
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "/m", "uid", "-1"), strings.NewReader("x")), 400, "uid must be")
	wantStatus(t, do(t, h, "PUT", "file", "v1", "tok1", p("path", "/m", "force", "perhaps"), strings.NewReader("x")), 400, "force must be")
	wantStatus(t, do(t, h, "GET", "file", "v1", "tok1", p("path", "/dir"), nil), 400, "is a directory")
	wantStatus(t, do(t, h, "GET", "file", "v1", "tok1", p("path", "/nope"), nil), 404, `"/nope" not found`)
	// A symlink inside the volume is followed for reads, shown as a symlink by stat.
	if rec := do(t, h, "GET", "file", "v1", "tok1", p("path", "inside"), nil); rec.Code != 200 || rec.Body.String() != "hello" {
		t.Fatalf("read through an inside symlink: %d %s", rec.Code, rec.Body)
	}
	rec = do(t, h, "GET", "path", "v1", "tok1", p("path", "inside"), nil)
	json.Unmarshal(rec.Body.Bytes(), &e)
	if e.Type != "symlink" || e.Target != "dir/a.txt" {
		t.Fatalf("stat of a symlink: %+v", e)
	}

	// Directories.
	wantStatus(t, do(t, h, "POST", "dir", "v1", "tok1", p("path", "/d1"), nil), 201, "")
	wantStatus(t, do(t, h, "POST", "dir", "v1", "tok1", p("path", "/d1"), nil), 409, "already exists")
	wantStatus(t, do(t, h, "POST", "dir", "v1", "tok1", p("path", "/d1", "force", "true"), nil), 201, "")
	wantStatus(t, do(t, h, "POST", "dir", "v1", "tok1", p("path", "/x/y/z"), nil), 404, "not found")
	rec = do(t, h, "POST", "dir", "v1", "tok1", p("path", "/x/y/z", "force", "true", "mode", "448", "uid", "1234", "gid", "4321"), nil)
	wantStatus(t, rec, 201, "")
	json.Unmarshal(rec.Body.Bytes(), &e)
	if e.Type != "directory" || e.Mode != 0o700 || e.UID != 1234 || e.GID != 4321 || e.Path != "/x/y/z" {
		t.Fatalf("made dir: %+v", e)
	}
	wantStatus(t, do(t, h, "POST", "dir", "v1", "tok1", p("path", "/dir/a.txt/q", "force", "true"), nil), 400, "must be a directory")

	// Listing, one level and deep.
	names := func(rec *httptest.ResponseRecorder) string {
		t.Helper()
		var es []e2bwire.VolumeEntryStat
		if err := json.Unmarshal(rec.Body.Bytes(), &es); err != nil {
			t.Fatalf("listing %s: %v", rec.Body, err)
		}
		var out []string
		for _, e := range es {
			out = append(out, e.Path)
		}
		return strings.Join(out, " ")
	}
	rec = do(t, h, "GET", "dir", "v1", "tok1", p("path", "/x"), nil)
	if got := names(rec); got != "/x/y" {
		t.Fatalf("depth 1: %s", got)
	}
	rec = do(t, h, "GET", "dir", "v1", "tok1", p("path", "x", "depth", "3"), nil)
	if got := names(rec); got != "/x/y /x/y/z" {
		t.Fatalf("depth 3: %s", got)
	}
	// Symlinked directories are listed, never entered, whatever the depth.
	rec = do(t, h, "GET", "dir", "v1", "tok1", p("path", "/", "depth", "10"), nil)
	if got := names(rec); strings.Contains(got, "/rel/") || strings.Contains(got, "/abs/") || !strings.Contains(got, "/dir/sub") {
		t.Fatalf("deep listing: %s", got)
	}
	wantStatus(t, do(t, h, "GET", "dir", "v1", "tok1", p("path", "/", "depth", "11"), nil), 400, "depth 11")
	wantStatus(t, do(t, h, "GET", "dir", "v1", "tok1", p("path", "/dir/a.txt"), nil), 400, "must be a directory")
	wantStatus(t, do(t, h, "GET", "dir", "v1", "tok1", p("path", "/gone"), nil), 404, "not found")

	// Metadata.
	rec = do(t, h, "PATCH", "path", "v1", "tok1", p("path", "/dir/a.txt"), strings.NewReader(`{"mode":420,"uid":2000}`))
	wantStatus(t, rec, 200, "")
	json.Unmarshal(rec.Body.Bytes(), &e)
	if e.Mode != 0o644 || e.UID != 2000 {
		t.Fatalf("patched: %+v", e)
	}
	wantStatus(t, do(t, h, "PATCH", "path", "v1", "tok1", p("path", "/dir/a.txt"), strings.NewReader(`{"mode":70000}`)), 400, "not a permission mode")
	wantStatus(t, do(t, h, "PATCH", "path", "v1", "tok1", p("path", "/dir/a.txt"), strings.NewReader(`{"uid":-3}`)), 400, "JSON object")
	wantStatus(t, do(t, h, "PATCH", "path", "v1", "tok1", p("path", "/nope"), strings.NewReader(`{}`)), 404, "not found")

	// Remove.
	wantStatus(t, do(t, h, "DELETE", "path", "v1", "tok1", p("path", "/x"), nil), 204, "")
	wantStatus(t, do(t, h, "DELETE", "path", "v1", "tok1", p("path", "/x"), nil), 404, "not found")
	wantStatus(t, do(t, h, "DELETE", "path", "v1", "tok1", p("path", "/"), nil), 400, "root")
	wantStatus(t, do(t, h, "DELETE", "path", "v1", "tok1", p("path", "/abs"), nil), 204, "") // the link, not /etc
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(v1.Path, "x")); !os.IsNotExist(err) {
		t.Fatalf("removed dir: %v", err)
	}
}

// Nothing outside the volume is reachable: ".." above the root, absolute
// symlinks, relative symlinks into a neighbour volume or beyond.
func TestPathEscapes(t *testing.T) {
	h, _, v2 := setup(t)
	cases := []struct {
		method, route, path string
		status              int
		msg                 string
	}{
		{"GET", "file", "../v2/secret", 400, "escapes the volume"},
		{"GET", "file", "/../../outside", 400, "escapes the volume"},
		{"GET", "file", "dir/../../outside", 400, "escapes the volume"},
		{"GET", "file", "abs/passwd", 400, "leads outside the volume"},
		{"GET", "file", "rel/secret", 400, "leads outside the volume"},
		{"GET", "file", "dir/up", 400, "leads outside the volume"},
		{"GET", "dir", "abs", 400, "leads outside the volume"},
		{"GET", "dir", "rel", 400, "leads outside the volume"},
		{"GET", "path", "rel/secret", 400, "leads outside the volume"},
		{"PUT", "file", "rel/new", 400, "leads outside the volume"},
		{"PUT", "file", "abs/new", 400, "leads outside the volume"},
		{"PUT", "file", "rel/new2", 400, "leads outside the volume"},
		{"POST", "dir", "rel/newdir", 400, "leads outside the volume"},
		{"POST", "dir", "abs/x/y", 400, "leads outside the volume"},
		{"PATCH", "path", "rel/secret", 400, "leads outside the volume"},
		{"PATCH", "path", "dir/up", 400, "leads outside the volume"},
		{"DELETE", "path", "rel/secret", 400, "leads outside the volume"},
		{"GET", "file", "loop", 400, "..."},
		{"GET", "file", "a\x00b", 400, "NUL"},
	}
	for _, c := range cases {
		var body io.Reader
		switch c.method {
		case "PUT":
			body = strings.NewReader("x")
		case "PATCH":
			body = strings.NewReader(`{"mode":511,"uid":0}`)
		}
		rec := do(t, h, c.method, c.route, "v1", "tok1", p("path", c.path), body)
		if rec.Code != c.status || (c.msg != "..." && !strings.Contains(rec.Body.String(), c.msg)) {
			t.Errorf("%s %s %q: %d %s", c.method, c.route, c.path, rec.Code, rec.Body)
		}
		if strings.Contains(rec.Body.String(), "SECRET") {
			t.Errorf("%s %s %q leaked the secret", c.method, c.route, c.path)
		}
	}
	// The neighbour and the outside file are as they were.
	st, err := os.Stat(filepath.Join(v2.Path, "secret"))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("neighbour's secret: %v %v", st, err)
	}
	if es, _ := os.ReadDir(v2.Path); len(es) != 1 {
		t.Fatalf("neighbour volume has %d entries", len(es))
	}
}

func statUID(st os.FileInfo) int {
	if s, ok := st.Sys().(*syscall.Stat_t); ok {
		return int(s.Uid)
	}
	return -1
}

func TestGrants(t *testing.T) {
	base := t.TempDir()
	v1 := volume.Volume{ID: "v1", Owner: "t1", Token: "tok1", Path: base, SizeBytes: 1 << 30}
	if err := os.WriteFile(filepath.Join(base, "f"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	h := New(fakeVolumes{"v1": v1}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	// Team t1 owns v1 and has a writer, a reader and a revoked key; team
	// t2 has a writer.
	h.SetGrants(grant.Checker{Keys: granttest.Keys{Live: map[string]apikey.Principal{
		"w": {KeyID: "w", KeyName: "writer", Team: "t1", Scopes: apikey.All},
		"r": {KeyID: "r", KeyName: "reader", Team: "t1", Scopes: []apikey.Scope{apikey.VolumesRead}},
		"o": {KeyID: "o", KeyName: "other", Team: "t2", Scopes: apikey.All},
	}, Revoked: map[string]apikey.Principal{"revoked": {KeyID: "revoked", Team: "t1"}}}})
	read := func(token string) *httptest.ResponseRecorder {
		return do(t, h, "GET", "file", "v1", token, p("path", "f"), nil)
	}
	write := func(token string) *httptest.ResponseRecorder {
		return do(t, h, "PUT", "file", "v1", token, p("path", "g"), strings.NewReader("new"))
	}
	wantStatus(t, read(grant.Token("tok1", "w")), 200, "")
	wantStatus(t, write(grant.Token("tok1", "w")), 201, "")
	wantStatus(t, read(grant.Token("tok1", "r")), 200, "")
	wantStatus(t, write(grant.Token("tok1", "r")), 403, "lacks the scope volumes:write")
	wantStatus(t, read(grant.Token("tok1", "revoked")), 401, "revoked")
	wantStatus(t, read("tok1"), 403, `does not open volume "v1"`) // the volume's own token is not handed out
	// Another team's grant answers as a volume that does not exist.
	other := read(grant.Token("tok1", "o"))
	wantStatus(t, other, 403, `does not open volume "v1"`)
	unknown := do(t, h, "GET", "file", "v9", grant.Token("tok1", "o"), p("path", "f"), nil)
	if strings.ReplaceAll(unknown.Body.String(), "v9", "v1") != other.Body.String() || unknown.Code != other.Code {
		t.Fatalf("another team's volume %d %s, an unknown one %d %s", other.Code, other.Body, unknown.Code, unknown.Body)
	}
}
