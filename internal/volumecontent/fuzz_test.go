package volumecontent

import (
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzVolumePath drives arbitrary paths through cleanPath and every verb of
// the content API against a volume whose tree holds symlinks out of it (to
// /etc, to a neighbour volume, to a file beside both). Whatever the path:
// no 500, nothing outside the volume is read, written, changed or removed,
// and cleanPath's result names a place inside the volume.
// CI runs it bounded (scripts/test.sh, "bounded fuzzing").
func FuzzVolumePath(f *testing.F) {
	for _, seed := range []string{
		"/", ".", "", "a", "/dir/a.txt", "dir//a.txt", "./dir/./sub", "..", "../v2/secret", "/../outside",
		"dir/../../outside", "dir/sub/../../..", "abs/passwd", "rel/secret", "dir/up", "inside", "loop/x",
		"a\x00b", "/x/../dir/a.txt", strings.Repeat("a/", 100), "%2e%2e/v2", "dir\\..\\..\\outside", "rel", "abs",
	} {
		for op := range uint8(7) {
			f.Add(seed, op)
		}
	}
	h, v1, v2 := setup(f)
	outside := filepath.Join(filepath.Dir(v1.Path), "outside")
	f.Fuzz(func(t *testing.T, path string, op uint8) {
		rel, err := cleanPath(path)
		if err == nil {
			if rel != "." && (strings.HasPrefix(rel, "/") || strings.HasSuffix(rel, "/")) {
				t.Fatalf("cleanPath(%q) = %q: not relative and clean", path, rel)
			}
			for c := range strings.SplitSeq(rel, "/") {
				if c == "" || c == ".." || (c == "." && rel != ".") {
					t.Fatalf("cleanPath(%q) = %q has component %q", path, rel, c)
				}
			}
			if again, err := cleanPath(display(rel)); err != nil || again != rel {
				t.Fatalf("cleanPath(display(%q)) = %q, %v", rel, again, err)
			}
			if !filepath.IsLocal(rel) && rel != "." {
				t.Fatalf("cleanPath(%q) = %q is not local", path, rel)
			}
		}

		var rec interface {
			Result() *http.Response
		}
		switch op % 7 {
		case 0:
			rec = do(t, h, "GET", "path", "v1", "tok1", p("path", path), nil)
		case 1:
			rec = do(t, h, "GET", "file", "v1", "tok1", p("path", path), nil)
		case 2:
			rec = do(t, h, "GET", "dir", "v1", "tok1", p("path", path, "depth", "3"), nil)
		case 3:
			rec = do(t, h, "PUT", "file", "v1", "tok1", p("path", path, "force", "true"), strings.NewReader("fuzz"))
		case 4:
			rec = do(t, h, "POST", "dir", "v1", "tok1", p("path", path, "force", "true"), nil)
		case 5:
			rec = do(t, h, "PATCH", "path", "v1", "tok1", p("path", path), strings.NewReader(`{"mode":511,"uid":0,"gid":0}`))
		case 6:
			// Removal gets a fresh volume each time, so the symlinks out
			// are always there to be tried.
			fh, fv1, fv2 := setup(t)
			rec = do(t, fh, "DELETE", "path", "v1", "tok1", p("path", path), nil)
			checkIntact(t, fv1.Path, fv2.Path, filepath.Join(filepath.Dir(fv1.Path), "outside"))
		}
		res := rec.Result()
		body := make([]byte, 1<<16)
		n, _ := res.Body.Read(body)
		if res.StatusCode >= 500 {
			t.Fatalf("op %d path %q: %d %s", op%7, path, res.StatusCode, body[:n])
		}
		if strings.Contains(string(body[:n]), "SECRET") {
			t.Fatalf("op %d path %q leaked the secret", op%7, path)
		}
		checkIntact(t, v1.Path, v2.Path, outside)
	})
}

// checkIntact fails when anything outside the volume v1 changed: the
// neighbour volume's only file and the file beside both.
func checkIntact(t *testing.T, v1, v2, outside string) {
	t.Helper()
	for _, f := range []string{filepath.Join(v2, "secret"), outside} {
		st, err := os.Lstat(f)
		if err != nil || st.Mode() != 0o600 || st.Size() != int64(len("SECRET")) {
			t.Fatalf("%s changed: %v %v", f, st, err)
		}
		if uid := statUID(st); uid != os.Geteuid() {
			t.Fatalf("%s changed owner to %d", f, uid)
		}
	}
	if es, err := os.ReadDir(v2); err != nil || len(es) != 1 {
		t.Fatalf("the neighbour volume changed: %v %v", es, err)
	}
	if es, err := os.ReadDir(filepath.Dir(v1)); err != nil || len(es) != 3 {
		t.Fatalf("the directory of the volumes changed: %v %v", es, err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatalf("/etc/passwd: %v", err)
	}
}
