package envd

import (
	"bytes"
	"mime/multipart"
	"net/textproto"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/unixuser"
)

// FuzzResolvePath checks the invariants every file and process path rests on:
// whatever a client sends, the result is absolute and clean, and a relative
// path without ".." stays inside the user's home. (Containment in the sandbox
// itself comes from envd running pivot_root'ed, not from this function.)
func FuzzResolvePath(f *testing.F) {
	for _, seed := range []string{"", "~", "~/", "~/a/b", "a/b", "/etc/passwd", "../../etc", "~/../x", "a//b/./c", "/", "~user", "\x00", "//x"} {
		f.Add(seed)
	}
	s := &Server{}
	u := &unixuser.User{Name: "user", Home: "/home/user"}
	f.Fuzz(func(t *testing.T, p string) {
		got := s.resolvePath(p, u)
		if !filepath.IsAbs(got) || filepath.Clean(got) != got {
			t.Fatalf("resolvePath(%q) = %q: not absolute and clean", p, got)
		}
		if !filepath.IsAbs(p) && !strings.Contains(p, "..") {
			if got != u.Home && !strings.HasPrefix(got, u.Home+"/") {
				t.Fatalf("resolvePath(%q) = %q left the home directory", p, got)
			}
		}
	})
}

// formEscape is how browsers and undici (the SDKs' fetch) encode a filename in
// multipart/form-data: only '"', CR and LF are escaped.
var formEscape = strings.NewReplacer(`"`, "%22", "\r", "%0D", "\n", "%0A")

// FuzzPartFileName feeds arbitrary Content-Disposition values to the
// hand-written parser (it must never panic) and checks that any full path the
// SDKs can send survives the round trip unchanged.
func FuzzPartFileName(f *testing.F) {
	for _, seed := range []string{"/home/user/a.txt", `dir\with"quote`, "semi;colon=x", "", "ünï/cødé", "a%22b", "\r\n", `"`} {
		f.Add(seed, `form-data; name="file"; filename="`+seed+`"`)
	}
	f.Fuzz(func(t *testing.T, name, rawDisposition string) {
		// Arbitrary header: no panic, and a file part is named by what was sent.
		if p, ok := newPart(t, rawDisposition); ok {
			_, _ = partFileName(p)
		}
		// Round trip of what a client encodes. The encoding cannot carry a
		// literal "%22"/"%0D"/"%0A" distinct from the escaped characters, and
		// a header value cannot hold other control characters; skip those.
		lower := strings.ToLower(name)
		if strings.Contains(lower, "%22") || strings.Contains(lower, "%0d") || strings.Contains(lower, "%0a") || hasControl(name) {
			return
		}
		disposition := `form-data; name="file"; filename="` + formEscape.Replace(name) + `"`
		p, ok := newPart(t, disposition)
		if !ok {
			t.Fatalf("a client-encoded disposition %q did not survive multipart framing", disposition)
		}
		got, isFile := partFileName(p)
		if !isFile || got != name {
			t.Fatalf("filename %q came back as %q (file=%v) from %q", name, got, isFile, disposition)
		}
	})
}

// newPart builds a one-part multipart body with the given Content-Disposition
// and returns that part as the server's reader sees it; ok is false when the
// value cannot be framed as a header at all.
func newPart(t *testing.T, disposition string) (_ *multipart.Part, ok bool) {
	t.Helper()
	var body bytes.Buffer
	w := multipart.NewWriter(&body)
	h := textproto.MIMEHeader{}
	h.Set("Content-Disposition", disposition)
	pw, err := w.CreatePart(h)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = pw.Write([]byte("x"))
	_ = w.Close()
	p, err := multipart.NewReader(&body, w.Boundary()).NextPart()
	if err != nil {
		return nil, false
	}
	return p, true
}

func hasControl(s string) bool {
	return strings.ContainsFunc(s, func(r rune) bool { return r != '\r' && r != '\n' && (r < 0x20 || r == 0x7f) })
}
