package envd

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	fspb "github.com/airlock-sandbox/airlock/api/gen/filesystem"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
)

var tokenHdr = map[string]string{"X-Access-Token": testToken}

func TestFileSignatureVector(t *testing.T) {
	if got := envdapi.FileSignature("x.txt", "read", "", "secrettoken", 0); got != "v1_5/cX6NhkjNdMAaxdnbZNgw4Dd42QoOJ2TUZ5KP2USj8" {
		t.Fatalf("signature %s", got)
	}
	if envdapi.FileSignature("x.txt", "read", "", "secrettoken", 1700000000) == envdapi.FileSignature("x.txt", "read", "", "secrettoken", 0) {
		t.Fatal("expiration must change the signature")
	}
}

func TestHealthEnvsMetricsAndAuth(t *testing.T) {
	e := newEnv(t)
	resp, body := e.httpDo("GET", "/health", nil, nil)
	if resp.StatusCode != http.StatusNoContent || body != "" {
		t.Fatalf("health %d %q", resp.StatusCode, body)
	}
	const want401 = `{"code":401,"message":"unauthorized access, please provide a valid access token or method signing if supported"}`
	for _, path := range []string{"/envs", "/metrics"} {
		resp, body = e.httpDo("GET", path, nil, map[string]string{"X-Access-Token": "wrong"})
		if resp.StatusCode != 401 || strings.TrimSpace(body) != want401 {
			t.Fatalf("%s without token: %d %q", path, resp.StatusCode, body)
		}
	}
	resp, body = e.httpDo("GET", "/envs", nil, tokenHdr)
	var envs map[string]string
	must(t, json.Unmarshal([]byte(body), &envs))
	if resp.StatusCode != 200 || envs["SANDBOX_LEVEL"] != "yes" || envs["E2B_SANDBOX_ID"] != "sbxtest" {
		t.Fatalf("envs %d %s", resp.StatusCode, body)
	}
	resp, body = e.httpDo("GET", "/metrics", nil, tokenHdr)
	var m map[string]any
	must(t, json.Unmarshal([]byte(body), &m))
	for _, k := range []string{"ts", "cpu_count", "cpu_used_pct", "mem_total", "mem_used", "mem_cache", "mem_total_mib", "mem_used_mib", "disk_used", "disk_total"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("metrics lacks %s: %s", k, body)
		}
	}
	if m["cpu_count"].(float64) < 1 || m["mem_total"].(float64) <= 0 || m["disk_total"].(float64) <= 0 {
		t.Fatalf("metrics %s", body)
	}

	// RPCs fail with a Connect unauthenticated error, not a plain 401 body.
	resp, body = e.httpDo("POST", "/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/"}`),
		map[string]string{"Content-Type": "application/json"})
	if resp.StatusCode != 401 || !strings.Contains(body, `"code":"unauthenticated"`) {
		t.Fatalf("rpc without token: %d %s", resp.StatusCode, body)
	}

	// CORS preflight needs no token.
	resp, _ = e.httpDo("OPTIONS", "/process.Process/Start", nil, map[string]string{
		"Origin": "http://example.com", "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type,x-access-token"})
	if resp.StatusCode != http.StatusNoContent || resp.Header.Get("Access-Control-Allow-Origin") != "*" ||
		!strings.Contains(resp.Header.Get("Access-Control-Allow-Methods"), "POST") {
		t.Fatalf("preflight %d %v", resp.StatusCode, resp.Header)
	}
}

func TestNoAccessTokenConfigured(t *testing.T) {
	e := newEnv(t, func(c *envdapi.Config) { c.AccessToken = "" })
	resp, _ := e.httpDo("GET", "/envs", nil, nil)
	if resp.StatusCode != 200 {
		t.Fatalf("envs without token configured: %d", resp.StatusCode)
	}
	writeFile(t, filepath.Join(e.home, "f.txt"), "free")
	resp, body := e.httpDo("GET", "/files?path=f.txt", nil, nil)
	if resp.StatusCode != 200 || body != "free" {
		t.Fatalf("files: %d %q", resp.StatusCode, body)
	}
}

type part struct {
	filename string
	content  string
}

func multipartBody(t *testing.T, parts []part) (io.Reader, string) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	for _, p := range parts {
		h := textproto.MIMEHeader{}
		h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename="%s"`, p.filename))
		h.Set("Content-Type", "application/octet-stream")
		w, err := mw.CreatePart(h)
		must(t, err)
		_, _ = io.WriteString(w, p.content)
	}
	must(t, mw.Close())
	return &buf, mw.FormDataContentType()
}

func TestUploadMultipart(t *testing.T) {
	e := newEnv(t)
	abs := filepath.Join(e.root, "tmp", "abs.txt")
	body, ctype := multipartBody(t, []part{{abs, "first"}, {"dir/rel.txt", "second"}})
	resp, out := e.httpDo("POST", "/files", body, map[string]string{"Content-Type": ctype, "X-Access-Token": testToken})
	if resp.StatusCode != 200 {
		t.Fatalf("upload %d %s", resp.StatusCode, out)
	}
	var res []map[string]any
	must(t, json.Unmarshal([]byte(out), &res))
	rel := filepath.Join(e.home, "dir/rel.txt")
	if len(res) != 2 || res[0]["path"] != abs || res[0]["name"] != "abs.txt" || res[0]["type"] != "file" || res[1]["path"] != rel {
		t.Fatalf("results %s", out)
	}
	if _, has := res[0]["metadata"]; has {
		t.Fatalf("metadata without X-Metadata headers: %s", out)
	}
	for path, want := range map[string]string{abs: "first", rel: "second"} {
		b, err := os.ReadFile(path)
		must(t, err)
		fi, err := os.Stat(path)
		must(t, err)
		st := fi.Sys().(*syscall.Stat_t)
		if string(b) != want || st.Uid != 1000 || fi.Mode().Perm() != 0o644&^currentUmask() {
			t.Fatalf("%s: %q uid %d mode %v", path, b, st.Uid, fi.Mode())
		}
	}
	if fi, err := os.Stat(filepath.Join(e.home, "dir")); err != nil || fi.Sys().(*syscall.Stat_t).Uid != 1000 {
		t.Fatal("created parent not owned by the user")
	}

	// The path parameter overrides the filename; as root the file lands in /root.
	body, ctype = multipartBody(t, []part{{"ignored.txt", "third"}})
	resp, out = e.httpDo("POST", "/files?path=over.txt&username=root", body, map[string]string{"Content-Type": ctype, "X-Access-Token": testToken})
	if resp.StatusCode != 200 || !strings.Contains(out, filepath.Join(e.rhome, "over.txt")) {
		t.Fatalf("path override %d %s", resp.StatusCode, out)
	}

	// Two parts resolving to one path are refused.
	body, ctype = multipartBody(t, []part{{"same.txt", "a"}, {"~/same.txt", "b"}})
	resp, out = e.httpDo("POST", "/files", body, map[string]string{"Content-Type": ctype, "X-Access-Token": testToken})
	if resp.StatusCode != 400 || !strings.Contains(out, `"code":400`) {
		t.Fatalf("duplicate path %d %s", resp.StatusCode, out)
	}

	// Uploading onto a directory.
	body, ctype = multipartBody(t, []part{{"dir", "x"}})
	resp, out = e.httpDo("POST", "/files", body, map[string]string{"Content-Type": ctype, "X-Access-Token": testToken})
	if resp.StatusCode != 400 || !strings.Contains(out, "is a directory") {
		t.Fatalf("onto dir %d %s", resp.StatusCode, out)
	}

	resp, out = e.httpDo("POST", "/files?path=x", strings.NewReader("x"), map[string]string{"Content-Type": "text/plain", "X-Access-Token": testToken})
	if resp.StatusCode != 400 {
		t.Fatalf("bad content type %d %s", resp.StatusCode, out)
	}
	resp, out = e.httpDo("POST", "/files", strings.NewReader("x"), map[string]string{"Content-Type": "application/octet-stream", "X-Access-Token": testToken})
	if resp.StatusCode != 400 {
		t.Fatalf("octet-stream without path %d %s", resp.StatusCode, out)
	}
	resp, out = e.httpDo("POST", "/files?path=x&username=ghost", strings.NewReader("x"), map[string]string{"Content-Type": "application/octet-stream", "X-Access-Token": testToken})
	if resp.StatusCode != 401 || !strings.Contains(out, "error looking up user 'ghost'") {
		t.Fatalf("unknown user %d %s", resp.StatusCode, out)
	}
}

func currentUmask() os.FileMode {
	m := syscall.Umask(0)
	syscall.Umask(m)
	return os.FileMode(m)
}

func TestUploadOctetStreamGzipAndMetadata(t *testing.T) {
	e := newEnv(t)
	ctx := ctxTimeout(t, 10*time.Second)
	target := filepath.Join(e.root, "tmp", "z")
	resp, out := e.httpDo("POST", "/files?path="+url.QueryEscape(target), strings.NewReader("raw bytes"), map[string]string{
		"Content-Type": "application/octet-stream", "X-Access-Token": testToken, "X-Metadata-Foo": "bar", "X-Metadata-Second-Key": "v2"})
	if resp.StatusCode != 200 {
		t.Fatalf("octet upload %d %s", resp.StatusCode, out)
	}
	var res []uploadResult
	must(t, json.Unmarshal([]byte(out), &res))
	if len(res) != 1 || res[0].Metadata["foo"] != "bar" || res[0].Metadata["second-key"] != "v2" {
		t.Fatalf("result %s", out)
	}
	st, err := e.fs.Stat(ctx, connect.NewRequest(&fspb.StatRequest{Path: target}))
	must(t, err)
	if md := st.Msg.GetEntry().GetMetadata(); md["foo"] != "bar" || md["second-key"] != "v2" || len(md) != 2 {
		t.Fatalf("entry metadata %v", md)
	}

	// A new upload replaces the metadata; its body arrives gzip-compressed.
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write([]byte("decompressed content"))
	must(t, zw.Close())
	resp, out = e.httpDo("POST", "/files?path="+url.QueryEscape(target)+"&username=root", &gz, map[string]string{
		"Content-Type": "application/octet-stream", "Content-Encoding": "gzip", "X-Access-Token": testToken, "X-Metadata-Only": "this"})
	if resp.StatusCode != 200 {
		t.Fatalf("gzip upload %d %s", resp.StatusCode, out)
	}
	b, err := os.ReadFile(target)
	must(t, err)
	if string(b) != "decompressed content" {
		t.Fatalf("content %q", b)
	}
	if md := readMetadata(target); len(md) != 1 || md["only"] != "this" {
		t.Fatalf("metadata after replace %v", md)
	}
	resp, out = e.httpDo("POST", "/files?path=bad.gz", strings.NewReader("not gzip"), map[string]string{
		"Content-Type": "application/octet-stream", "Content-Encoding": "gzip", "X-Access-Token": testToken})
	if resp.StatusCode != 400 {
		t.Fatalf("bad gzip %d %s", resp.StatusCode, out)
	}
	resp, out = e.httpDo("POST", "/files?path=m", strings.NewReader("x"), map[string]string{
		"Content-Type": "application/octet-stream", "X-Access-Token": testToken, "X-Metadata-K": strings.Repeat("v", 5000)})
	if resp.StatusCode != 400 {
		t.Fatalf("oversized metadata %d %s", resp.StatusCode, out)
	}
	resp, out = e.httpDo("POST", "/files?path=m", strings.NewReader("x"), map[string]string{
		"Content-Type": "application/octet-stream", "X-Access-Token": testToken, "X-Metadata-" + strings.Repeat("k", 250): "v"})
	if resp.StatusCode != 400 {
		t.Fatalf("oversized metadata key %d %s", resp.StatusCode, out)
	}
}

func TestDownload(t *testing.T) {
	e := newEnv(t)
	writeFile(t, filepath.Join(e.home, "notes.txt"), "plain text content")
	writeFile(t, filepath.Join(e.home, "noext"), "<html><body>hi</body></html>")
	must(t, os.MkdirAll(filepath.Join(e.home, "adir"), 0o755))

	resp, body := e.httpDo("GET", "/files?path=notes.txt", nil, tokenHdr)
	if resp.StatusCode != 200 || body != "plain text content" {
		t.Fatalf("download %d %q", resp.StatusCode, body)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		t.Fatalf("content type %q", ct)
	}
	if cd := resp.Header.Get("Content-Disposition"); cd != "inline; filename=notes.txt" {
		t.Fatalf("content disposition %q", cd)
	}
	if resp.Header.Get("Vary") != "Accept-Encoding" {
		t.Fatalf("headers %v", resp.Header)
	}
	// Go's client asked for gzip and decompressed transparently above, as undici
	// does for the JS SDK; identity must come with a length.
	resp, body = e.httpDo("GET", "/files?path=notes.txt", nil, map[string]string{"X-Access-Token": testToken, "Accept-Encoding": "identity"})
	if body != "plain text content" || resp.Header.Get("Content-Length") != "18" || resp.Header.Get("Content-Encoding") != "" {
		t.Fatalf("identity download %q %v", body, resp.Header)
	}
	resp, _ = e.httpDo("GET", "/files?path=noext", nil, tokenHdr)
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/html") {
		t.Fatalf("sniffed content type %q", ct)
	}

	// gzip on request. Setting Accept-Encoding by hand stops Go's client from
	// decompressing transparently, so the raw encoding is visible.
	resp, body = e.httpDo("GET", "/files?path=notes.txt", nil, map[string]string{"X-Access-Token": testToken, "Accept-Encoding": "gzip"})
	if resp.StatusCode != 200 || resp.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip download %d %v", resp.StatusCode, resp.Header)
	}
	zr, err := gzip.NewReader(strings.NewReader(body))
	must(t, err)
	plain, err := io.ReadAll(zr)
	must(t, err)
	if string(plain) != "plain text content" {
		t.Fatalf("gunzipped %q", plain)
	}
	resp, _ = e.httpDo("GET", "/files?path=notes.txt", nil, map[string]string{"X-Access-Token": testToken, "Accept-Encoding": "br, identity;q=0"})
	if resp.StatusCode != http.StatusNotAcceptable {
		t.Fatalf("no acceptable encoding: %d", resp.StatusCode)
	}
	resp, body = e.httpDo("GET", "/files?path=notes.txt", nil, map[string]string{"X-Access-Token": testToken, "Range": "bytes=0-4"})
	if resp.StatusCode != http.StatusPartialContent || body != "plain" {
		t.Fatalf("range %d %q", resp.StatusCode, body)
	}
	writeFile(t, filepath.Join(e.home, "empty"), "")
	resp, body = e.httpDo("GET", "/files?path=empty", nil, map[string]string{"X-Access-Token": testToken, "Accept-Encoding": "identity"})
	if resp.StatusCode != 200 || body != "" || resp.Header.Get("Content-Length") != "0" {
		t.Fatalf("empty %d %q %v", resp.StatusCode, body, resp.Header)
	}

	resp, body = e.httpDo("GET", "/files?path=missing.txt", nil, tokenHdr)
	want := fmt.Sprintf(`{"code":404,"message":"path '%s' does not exist"}`, filepath.Join(e.home, "missing.txt"))
	if resp.StatusCode != 404 || strings.TrimSpace(body) != want {
		t.Fatalf("missing %d %s", resp.StatusCode, body)
	}
	resp, body = e.httpDo("GET", "/files?path=adir", nil, tokenHdr)
	if resp.StatusCode != 400 || !strings.Contains(body, "is a directory") {
		t.Fatalf("dir %d %s", resp.StatusCode, body)
	}
	resp, body = e.httpDo("GET", "/files?path=notes.txt&username=ghost", nil, tokenHdr)
	if resp.StatusCode != 401 {
		t.Fatalf("unknown user %d %s", resp.StatusCode, body)
	}
}

func TestFilesSignatures(t *testing.T) {
	e := newEnv(t)
	writeFile(t, filepath.Join(e.home, "x.txt"), "signed read")
	get := func(query string, hdr map[string]string) (int, string) {
		resp, body := e.httpDo("GET", "/files?"+query, nil, hdr)
		return resp.StatusCode, strings.TrimSpace(body)
	}
	// The verified vector: path x.txt, read, no user, token "secrettoken".
	code, body := get("path=x.txt&signature="+url.QueryEscape("v1_5/cX6NhkjNdMAaxdnbZNgw4Dd42QoOJ2TUZ5KP2USj8"), nil)
	if code != 200 || body != "signed read" {
		t.Fatalf("signed read %d %s", code, body)
	}
	code, body = get("path=x.txt", nil)
	if code != 401 || body != `{"code":401,"message":"missing signature query parameter"}` {
		t.Fatalf("unsigned %d %s", code, body)
	}
	code, body = get("path=x.txt&signature=v1_bogus", nil)
	if code != 401 || body != `{"code":401,"message":"invalid signature"}` {
		t.Fatalf("bad signature %d %s", code, body)
	}
	// The signature binds the operation: a read signature cannot write.
	resp, out := e.httpDo("POST", "/files?path=x.txt&signature="+url.QueryEscape(envdapi.FileSignature("x.txt", "read", "", testToken, 0)),
		strings.NewReader("w"), map[string]string{"Content-Type": "application/octet-stream"})
	if resp.StatusCode != 401 {
		t.Fatalf("read signature used for write: %d %s", resp.StatusCode, out)
	}
	// With a user and a future expiration.
	exp := time.Now().Add(time.Minute).Unix()
	sig := envdapi.FileSignature("x.txt", "read", "root", testToken, exp)
	code, _ = get(fmt.Sprintf("path=x.txt&username=root&signature=%s&signature_expiration=%d", url.QueryEscape(sig), exp), nil)
	if code != 404 { // signed correctly; root's home has no x.txt
		t.Fatalf("signed with user and expiration: %d", code)
	}
	past := time.Now().Add(-time.Minute).Unix()
	sig = envdapi.FileSignature("x.txt", "read", "", testToken, past)
	code, body = get(fmt.Sprintf("path=x.txt&signature=%s&signature_expiration=%d", url.QueryEscape(sig), past), nil)
	if code != 401 || body != `{"code":401,"message":"signature is already expired"}` {
		t.Fatalf("expired %d %s", code, body)
	}
	code, body = get("path=x.txt", map[string]string{"X-Access-Token": "wrong"})
	if code != 401 || body != `{"code":401,"message":"access token present in header but does not match"}` {
		t.Fatalf("wrong header %d %s", code, body)
	}
	// Signed write.
	wsig := envdapi.FileSignature("up.txt", "write", "", testToken, 0)
	resp, out = e.httpDo("POST", "/files?path=up.txt&signature="+url.QueryEscape(wsig), strings.NewReader("uploaded"),
		map[string]string{"Content-Type": "application/octet-stream"})
	if resp.StatusCode != 200 {
		t.Fatalf("signed write %d %s", resp.StatusCode, out)
	}
	req, _ := http.NewRequest("POST", "/files?path=up.txt&signature="+url.QueryEscape(wsig), nil)
	if !FilesSignatureValid(req, testToken) || FilesSignatureValid(req, "other") {
		t.Fatal("FilesSignatureValid disagrees with the server")
	}
}
