package buildcontext

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ulikunitz/xz"

	"github.com/airlock-sandbox/airlock/internal/dockerfile"
)

var old = time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, p, data string, mode fs.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(data), mode))
	must(t, os.Chmod(p, mode))
}

// newRootfs builds a small merged-usr image: /bin -> usr/bin, /etc/passwd
// with user 1000, /srv/data 0750 owned by 1000, /opt/abs -> /usr/bin
// (absolute: must resolve inside the rootfs, not on the host).
func newRootfs(t *testing.T) string {
	r := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(r, "usr/bin"), 0o755))
	must(t, os.Chmod(filepath.Join(r, "usr"), 0o751))
	must(t, os.Symlink("usr/bin", filepath.Join(r, "bin")))
	write(t, filepath.Join(r, "etc/passwd"), "root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n", 0o644)
	write(t, filepath.Join(r, "etc/group"), "root:x:0:\nusers:x:100:\nuser:x:1000:\n", 0o644)
	write(t, filepath.Join(r, "etc/file"), "x", 0o644)
	must(t, os.MkdirAll(filepath.Join(r, "srv/data"), 0o750))
	must(t, os.Chmod(filepath.Join(r, "srv/data"), 0o750))
	must(t, os.Chown(filepath.Join(r, "srv/data"), 1000, 1000))
	must(t, os.Chtimes(filepath.Join(r, "srv/data"), old, old))
	must(t, os.MkdirAll(filepath.Join(r, "opt"), 0o755))
	must(t, os.Symlink("/usr/bin", filepath.Join(r, "opt/abs")))
	return r
}

// newContext builds a build context with files, a directory tree, and
// symlinks that point inside, outside, and in a loop.
func newContext(t *testing.T) (string, *Context) {
	d := filepath.Join(t.TempDir(), "ctx")
	write(t, filepath.Join(d, "a.txt"), "hello", 0o644)
	write(t, filepath.Join(d, "b.txt"), "bee", 0o600)
	write(t, filepath.Join(d, "script.sh"), "#!/bin/sh\necho hi\n", 0o755)
	must(t, os.Chtimes(filepath.Join(d, "a.txt"), old, old))
	write(t, filepath.Join(d, "dir/sub/nested.txt"), "nested", 0o640)
	write(t, filepath.Join(d, "dir/top.txt"), "top", 0o644)
	must(t, os.Symlink("../../etc", filepath.Join(d, "dir/outlink")))
	must(t, os.Chmod(filepath.Join(d, "dir"), 0o711))
	write(t, filepath.Join(d, "tree/bin/tool"), "tool", 0o755)
	write(t, filepath.Join(d, "tree/etc/conf"), "conf", 0o644)
	must(t, os.Symlink("/etc/passwd", filepath.Join(d, "abslink")))
	must(t, os.Symlink("../outside.txt", filepath.Join(d, "uplink")))
	must(t, os.Symlink("dir/../a.txt", filepath.Join(d, "oklink")))
	must(t, os.Symlink("loop", filepath.Join(d, "loop")))
	write(t, filepath.Join(d, "../outside.txt"), "secret", 0o644)
	c, err := Open(d)
	must(t, err)
	t.Cleanup(func() { c.Close() })
	return d, c
}

func copyStep(dest string, sources ...string) dockerfile.Step {
	return dockerfile.Step{Line: 1, Kind: dockerfile.StepCopy, Sources: sources, Dest: dest}
}

func stat(t *testing.T, p string) (fs.FileInfo, *syscall.Stat_t) {
	t.Helper()
	fi, err := os.Lstat(p)
	must(t, err)
	return fi, fi.Sys().(*syscall.Stat_t)
}

func exists(p string) bool { _, err := os.Lstat(p); return err == nil }

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	must(t, err)
	return string(b)
}

func run(t *testing.T, c *Context, st dockerfile.Step, rootfs string) string {
	t.Helper()
	upper := t.TempDir()
	if err := c.CopyInto(context.Background(), st, rootfs, upper); err != nil {
		t.Fatalf("CopyInto(%v -> %s): %v", st.Sources, st.Dest, err)
	}
	return upper
}

func TestCopyMergedUsr(t *testing.T) {
	rootfs := newRootfs(t)
	_, c := newContext(t)
	for _, dest := range []string{"/bin/tool", "/bin/", "/bin", "/opt/abs/"} {
		up := run(t, c, copyStep(dest, "script.sh"), rootfs)
		want := filepath.Join(up, "usr/bin/tool")
		if dest != "/bin/tool" {
			want = filepath.Join(up, "usr/bin/script.sh")
		}
		if readFile(t, want) != "#!/bin/sh\necho hi\n" {
			t.Fatalf("%s: wrong content", dest)
		}
		if exists(filepath.Join(up, "bin")) || exists(filepath.Join(up, "opt")) {
			t.Fatalf("%s: created upper/bin or upper/opt, shadowing the image's symlink", dest)
		}
		// usr was copied up with the image's attributes.
		fi, _ := stat(t, filepath.Join(up, "usr"))
		if fi.Mode().Perm() != 0o751 {
			t.Fatalf("%s: upper/usr mode %v, want 0751 as in rootfs", dest, fi.Mode())
		}
		fi, _ = stat(t, want)
		if fi.Mode().Perm() != 0o755 {
			t.Fatalf("mode %v", fi.Mode())
		}
	}
	// A directory tree holding bin/ copied to / fills usr/bin.
	up := run(t, c, copyStep("/", "tree"), rootfs)
	if readFile(t, filepath.Join(up, "usr/bin/tool")) != "tool" || exists(filepath.Join(up, "bin")) {
		t.Fatal("tree/bin/tool did not land in usr/bin")
	}
	if readFile(t, filepath.Join(up, "etc/conf")) != "conf" {
		t.Fatal("tree/etc/conf missing")
	}
	// Nothing was written into the rootfs.
	if exists(filepath.Join(rootfs, "usr/bin/tool")) {
		t.Fatal("wrote into rootfs")
	}
}

func TestCopyParentsCopiedUp(t *testing.T) {
	rootfs := newRootfs(t)
	_, c := newContext(t)
	up := run(t, c, copyStep("/srv/data/x", "a.txt"), rootfs)
	fi, st := stat(t, filepath.Join(up, "srv/data"))
	if fi.Mode().Perm() != 0o750 || st.Uid != 1000 || st.Gid != 1000 || !fi.ModTime().Equal(old) {
		t.Fatalf("srv/data copied up as %v %d:%d %v, want 0750 1000:1000 %v", fi.Mode(), st.Uid, st.Gid, fi.ModTime(), old)
	}
	fi, st = stat(t, filepath.Join(up, "srv/data/x"))
	if fi.Mode().Perm() != 0o644 || st.Uid != 0 || st.Gid != 0 || !fi.ModTime().Equal(old) {
		t.Fatalf("file %v %d:%d %v", fi.Mode(), st.Uid, st.Gid, fi.ModTime())
	}
	// A file onto an existing directory (no trailing slash) goes inside.
	up = run(t, c, copyStep("/srv/data", "a.txt"), rootfs)
	if readFile(t, filepath.Join(up, "srv/data/a.txt")) != "hello" {
		t.Fatal("file onto existing dir did not go inside")
	}
	// Missing parents: 0755 root, or the --chown owner.
	up = run(t, c, copyStep("/new/deep/f.txt", "a.txt"), rootfs)
	fi, st = stat(t, filepath.Join(up, "new/deep"))
	if fi.Mode().Perm() != 0o755 || st.Uid != 0 {
		t.Fatalf("new parent %v uid %d", fi.Mode(), st.Uid)
	}
	s := copyStep("/new/deep/f.txt", "a.txt")
	s.Chown = "user"
	up = run(t, c, s, rootfs)
	for _, p := range []string{"new", "new/deep", "new/deep/f.txt"} {
		_, st = stat(t, filepath.Join(up, p))
		if st.Uid != 1000 || st.Gid != 1000 {
			t.Fatalf("%s owned %d:%d, want 1000:1000", p, st.Uid, st.Gid)
		}
	}
}

func TestCopyDirectoryContents(t *testing.T) {
	rootfs := newRootfs(t)
	_, c := newContext(t)
	up := run(t, c, copyStep("/dst", "dir"), rootfs)
	if readFile(t, filepath.Join(up, "dst/sub/nested.txt")) != "nested" || readFile(t, filepath.Join(up, "dst/top.txt")) != "top" {
		t.Fatal("contents not copied")
	}
	if exists(filepath.Join(up, "dst/dir")) {
		t.Fatal("copied the directory itself, not its contents")
	}
	fi, _ := stat(t, filepath.Join(up, "dst"))
	if fi.Mode().Perm() != 0o711 {
		t.Fatalf("new dest dir mode %v, want the source dir's 0711", fi.Mode())
	}
	fi, _ = stat(t, filepath.Join(up, "dst/sub/nested.txt"))
	if fi.Mode().Perm() != 0o640 {
		t.Fatalf("mode not preserved: %v", fi.Mode())
	}
	// A symlink inside a copied directory is copied as a symlink, not
	// followed, whatever it points to.
	target, err := os.Readlink(filepath.Join(up, "dst/outlink"))
	if err != nil || target != "../../etc" {
		t.Fatalf("outlink = %q %v", target, err)
	}
	// "." copies the whole context.
	up = run(t, c, copyStep("/app/", "."), rootfs)
	if readFile(t, filepath.Join(up, "app/a.txt")) != "hello" || readFile(t, filepath.Join(up, "app/dir/top.txt")) != "top" {
		t.Fatal("COPY . missed files")
	}
	if l, _ := os.Readlink(filepath.Join(up, "app/abslink")); l != "/etc/passwd" {
		t.Fatalf("abslink copied as %q", l)
	}
	// A symlink loop inside a copied directory is just a symlink.
	if l, _ := os.Readlink(filepath.Join(up, "app/loop")); l != "loop" {
		t.Fatalf("loop copied as %q", l)
	}
	// Hidden files count in the digest of "." under their full name.
	d1, err := c.Digest([]string{"."})
	must(t, err)
	write(t, filepath.Join(c.root.Name(), ".hidden"), "h", 0o644)
	d2, err := c.Digest([]string{"."})
	must(t, err)
	must(t, os.Rename(filepath.Join(c.root.Name(), ".hidden"), filepath.Join(c.root.Name(), "hidden")))
	d3, err := c.Digest([]string{"."})
	must(t, err)
	if d1 == d2 || d2 == d3 {
		t.Fatal("hidden files are not distinguished in the digest")
	}
}

func TestCopyChownChmod(t *testing.T) {
	rootfs := newRootfs(t)
	_, c := newContext(t)
	cases := []struct {
		chown    string
		uid, gid uint32
	}{
		{"user:users", 1000, 100},
		{"user", 1000, 1000},
		{"2000:3000", 2000, 3000},
		{"4000", 4000, 4000},
		{"user:5", 1000, 5},
	}
	for _, cs := range cases {
		s := copyStep("/x", "a.txt")
		s.Chown, s.Chmod = cs.chown, "4750"
		up := run(t, c, s, rootfs)
		fi, st := stat(t, filepath.Join(up, "x"))
		if st.Uid != cs.uid || st.Gid != cs.gid {
			t.Errorf("--chown=%s gave %d:%d", cs.chown, st.Uid, st.Gid)
		}
		if fi.Mode()&(fs.ModePerm|fs.ModeSetuid) != 0o750|fs.ModeSetuid {
			t.Errorf("--chmod=4750 gave %v", fi.Mode())
		}
	}
	for _, bad := range []string{"nobody", "user:nogroup"} {
		s := copyStep("/x", "a.txt")
		s.Chown = bad
		err := c.CopyInto(context.Background(), s, rootfs, t.TempDir())
		if err == nil || !strings.Contains(err.Error(), "unknown") {
			t.Errorf("--chown=%s: err = %v", bad, err)
		}
	}
	// No /etc/passwd in the image.
	s := copyStep("/x", "a.txt")
	s.Chown = "user"
	err := c.CopyInto(context.Background(), s, t.TempDir(), t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "has no /etc/passwd") {
		t.Errorf("no passwd: err = %v", err)
	}
}

func TestCopyMultipleAndGlobs(t *testing.T) {
	rootfs := newRootfs(t)
	_, c := newContext(t)
	up := run(t, c, copyStep("/m/", "a.txt", "script.sh"), rootfs)
	if readFile(t, filepath.Join(up, "m/a.txt")) != "hello" || !exists(filepath.Join(up, "m/script.sh")) {
		t.Fatal("multiple sources")
	}
	up = run(t, c, copyStep("/g", "*.txt"), rootfs) // a glob matching two: dest is a dir
	if readFile(t, filepath.Join(up, "g/a.txt")) != "hello" || readFile(t, filepath.Join(up, "g/b.txt")) != "bee" {
		t.Fatal("glob *.txt")
	}
	up = run(t, c, copyStep("/g2/", "d?r/s*/*.txt"), rootfs)
	if readFile(t, filepath.Join(up, "g2/nested.txt")) != "nested" {
		t.Fatal("nested glob")
	}
	up = run(t, c, copyStep("/one", "[a]*.txt"), rootfs) // a glob matching one file, no slash: a file
	if readFile(t, filepath.Join(up, "one")) != "hello" {
		t.Fatal("single-match glob")
	}
	// A symlink source is followed (top level), under its own name.
	up = run(t, c, copyStep("/l/", "oklink"), rootfs)
	fi, _ := stat(t, filepath.Join(up, "l/oklink"))
	if !fi.Mode().IsRegular() || readFile(t, filepath.Join(up, "l/oklink")) != "hello" {
		t.Fatal("top-level symlink source not followed")
	}
	for _, srcs := range [][]string{{"*.nope"}, {"missing.txt"}, {"a.txt", "nope/*"}} {
		_, err := c.Digest(srcs)
		if !errors.Is(err, ErrNoMatch) || !strings.Contains(err.Error(), "no match for") {
			t.Errorf("%v: err = %v", srcs, err)
		}
	}
	if _, err := c.Digest(nil); !errors.Is(err, ErrNoSources) || err.Error() != "no source files were specified" {
		t.Errorf("no sources: %v", err)
	}
}

func TestEscapes(t *testing.T) {
	rootfs := newRootfs(t)
	_, c := newContext(t)
	for _, src := range []string{"../outside.txt", "dir/../../outside.txt", "/etc/passwd", "abslink", "uplink", "dir/outlink/passwd", "*link"} {
		_, err := c.Digest([]string{src})
		if !errors.Is(err, ErrOutside) {
			t.Errorf("Digest(%s) = %v, want outside", src, err)
			continue
		}
		if !strings.HasPrefix(err.Error(), "COPY source ") || !strings.HasSuffix(err.Error(), " is outside the build context") {
			t.Errorf("message %q", err)
		}
		err = c.CopyInto(context.Background(), copyStep("/x/", src), rootfs, t.TempDir())
		if !errors.Is(err, ErrOutside) {
			t.Errorf("CopyInto(%s) = %v, want outside", src, err)
		}
	}
	_, err := c.Digest([]string{"loop"})
	if !errors.Is(err, syscall.ELOOP) {
		t.Errorf("loop: %v", err)
	}
	// Destinations cannot leave the rootfs either: /../.. is /.
	up := run(t, c, copyStep("/../../escaped.txt", "a.txt"), rootfs)
	if !exists(filepath.Join(up, "escaped.txt")) {
		t.Error("dest /../../x not clamped to /x")
	}
	// A file where a directory is needed.
	err = c.CopyInto(context.Background(), copyStep("/etc/file/x", "a.txt"), rootfs, t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("dest under a file: %v", err)
	}
	err = c.CopyInto(context.Background(), copyStep("/srv", "a.txt", "b.txt"), rootfs, t.TempDir())
	if err != nil {
		t.Errorf("two files into an existing dir: %v", err)
	}
	err = c.CopyInto(context.Background(), copyStep("/etc/file", "dir"), rootfs, t.TempDir())
	if err == nil {
		t.Error("directory onto a file: no error")
	}
}

func TestDigest(t *testing.T) {
	d, c := newContext(t)
	dg := func(srcs ...string) string {
		t.Helper()
		s, err := c.Digest(srcs)
		must(t, err)
		return s
	}
	base := dg("dir", "a.txt")
	if base != dg("dir", "a.txt") || !strings.HasPrefix(base, "sha256:") {
		t.Fatal("not deterministic")
	}
	write(t, filepath.Join(d, "b.txt"), "unrelated change", 0o600)
	if dg("dir", "a.txt") != base {
		t.Fatal("an unrelated file changed the digest")
	}
	must(t, os.Chtimes(filepath.Join(d, "a.txt"), time.Now(), time.Now()))
	if dg("dir", "a.txt") != base {
		t.Fatal("an mtime changed the digest")
	}
	write(t, filepath.Join(d, "dir/sub/nested.txt"), "nesteD", 0o640)
	c1 := dg("dir", "a.txt")
	if c1 == base {
		t.Fatal("a content change kept the digest")
	}
	must(t, os.Chmod(filepath.Join(d, "dir/sub/nested.txt"), 0o644))
	c2 := dg("dir", "a.txt")
	if c2 == c1 {
		t.Fatal("a mode change kept the digest")
	}
	must(t, os.Remove(filepath.Join(d, "dir/outlink")))
	must(t, os.Symlink("elsewhere", filepath.Join(d, "dir/outlink")))
	c3 := dg("dir", "a.txt")
	if c3 == c2 {
		t.Fatal("a symlink target change kept the digest")
	}
	write(t, filepath.Join(d, "dir/new"), "", 0o644)
	if dg("dir", "a.txt") == c3 {
		t.Fatal("a new file kept the digest")
	}
	if dg("a.txt", "dir") == dg("dir", "a.txt") {
		t.Fatal("source order ignored")
	}
	// Renaming a source changes where it lands, so the digest.
	if dg("a.txt") == dg("oklink") {
		t.Fatal("a source's name is not in the digest")
	}
}

func tarball(t testing.TB, entries []tar.Header, bodies map[string]string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, h := range entries {
		h := h
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(bodies[h.Name]))
		}
		if h.ModTime.IsZero() {
			h.ModTime = old
		}
		must(t, tw.WriteHeader(&h))
		if h.Typeflag == tar.TypeReg {
			_, err := tw.Write([]byte(bodies[h.Name]))
			must(t, err)
		}
	}
	must(t, tw.Close())
	return buf.Bytes()
}

func addStep(dest string, sources ...string) dockerfile.Step {
	s := copyStep(dest, sources...)
	s.Add = true
	return s
}

func TestAddArchives(t *testing.T) {
	rootfs := newRootfs(t)
	d, c := newContext(t)
	plain := tarball(t, []tar.Header{
		{Name: "./", Typeflag: tar.TypeDir, Mode: 0o700},
		{Name: "pkg/", Typeflag: tar.TypeDir, Mode: 0o750, Uid: 7, Gid: 8},
		{Name: "pkg/file", Typeflag: tar.TypeReg, Mode: 0o640, Uid: 7, Gid: 8},
		{Name: "pkg/link", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
		{Name: "pkg/hard", Typeflag: tar.TypeLink, Linkname: "pkg/file"},
		{Name: "bin/tool", Typeflag: tar.TypeReg, Mode: 0o755},
		{Name: "dev/null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3},
	}, map[string]string{"pkg/file": "payload", "bin/tool": "t"})
	var gz, xzb bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, err := zw.Write(plain)
	must(t, err)
	must(t, zw.Close())
	xw, err := xz.NewWriter(&xzb)
	must(t, err)
	_, err = xw.Write(plain)
	must(t, err)
	must(t, xw.Close())
	files := map[string][]byte{"a.tar": plain, "a.tgz": gz.Bytes(), "a.tar.xz": xzb.Bytes()}
	if bz, err := exec.LookPath("bzip2"); err == nil {
		cmd := exec.Command(bz, "-c")
		cmd.Stdin = bytes.NewReader(plain)
		out, err := cmd.Output()
		must(t, err)
		files["a.tbz"] = out
	} else {
		t.Log("bzip2 not installed: .tar.bz2 not tested")
	}
	for name, data := range files {
		write(t, filepath.Join(d, name), string(data), 0o644)
		up := run(t, c, addStep("/", name), rootfs)
		if got := readFile(t, filepath.Join(up, "pkg/file")); got != "payload" {
			t.Fatalf("%s: pkg/file = %q", name, got)
		}
		fi, st := stat(t, filepath.Join(up, "pkg/file"))
		if fi.Mode().Perm() != 0o640 || st.Uid != 7 || st.Gid != 8 || !fi.ModTime().Equal(old) {
			t.Fatalf("%s: pkg/file %v %d:%d %v", name, fi.Mode(), st.Uid, st.Gid, fi.ModTime())
		}
		if l, _ := os.Readlink(filepath.Join(up, "pkg/link")); l != "/etc/passwd" {
			t.Fatalf("%s: link %q", name, l)
		}
		_, hst := stat(t, filepath.Join(up, "pkg/hard"))
		if hst.Ino != st.Ino {
			t.Fatalf("%s: hard link not linked", name)
		}
		if readFile(t, filepath.Join(up, "usr/bin/tool")) != "t" || exists(filepath.Join(up, "bin")) {
			t.Fatalf("%s: bin/tool did not land in usr/bin", name)
		}
		if exists(filepath.Join(up, "dev/null")) {
			t.Fatalf("%s: device node created", name)
		}
		// The archive root entry does not change / in upper.
		if fi, err := os.Lstat(up); err != nil || fi.Mode().Perm() == 0o700 {
			t.Fatalf("%s: upper root took the archive's ./ mode", name)
		}
	}
	// --chown overrides archive owners.
	s := addStep("/opt/x/", "a.tgz")
	s.Chown = "user"
	up := run(t, c, s, rootfs)
	if _, st := stat(t, filepath.Join(up, "opt/x/pkg/file")); st.Uid != 1000 {
		t.Fatalf("--chown on ADD archive: uid %d", st.Uid)
	}
	// COPY does not extract; ADD of a non-archive (even gzip) copies.
	up = run(t, c, copyStep("/c/", "a.tgz"), rootfs)
	if !bytes.Equal([]byte(readFile(t, filepath.Join(up, "c/a.tgz"))), gz.Bytes()) {
		t.Fatal("COPY extracted")
	}
	var gzText bytes.Buffer
	zw = gzip.NewWriter(&gzText)
	zw.Write([]byte("just text, not a tar"))
	must(t, zw.Close())
	write(t, filepath.Join(d, "notes.gz"), gzText.String(), 0o644)
	up = run(t, c, addStep("/n/", "notes.gz", "a.txt"), rootfs)
	if readFile(t, filepath.Join(up, "n/notes.gz")) != gzText.String() || readFile(t, filepath.Join(up, "n/a.txt")) != "hello" {
		t.Fatal("ADD of non-archives")
	}
}

func TestAddHostileArchives(t *testing.T) {
	rootfs := newRootfs(t)
	d, c := newContext(t)
	cases := map[string][]tar.Header{
		"dotdot":       {{Name: "../../evil", Typeflag: tar.TypeReg}},
		"inner dotdot": {{Name: "a/../../evil", Typeflag: tar.TypeReg}},
		"absolute":     {{Name: "/etc/evil", Typeflag: tar.TypeReg}},
		"through symlink": {
			{Name: "esc", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			{Name: "esc/evil", Typeflag: tar.TypeReg},
		},
		"through relative symlink": {
			{Name: "d/", Typeflag: tar.TypeDir, Mode: 0o755},
			{Name: "d/up", Typeflag: tar.TypeSymlink, Linkname: "../.."},
			{Name: "d/up/evil", Typeflag: tar.TypeReg},
		},
		"hard link out":        {{Name: "h", Typeflag: tar.TypeLink, Linkname: "../../etc/passwd"}},
		"hard link absolute":   {{Name: "h", Typeflag: tar.TypeLink, Linkname: "/etc/passwd"}},
		"hard link to nothing": {{Name: "h", Typeflag: tar.TypeLink, Linkname: "nothing"}},
		"hard link via symlink": {
			{Name: "s", Typeflag: tar.TypeSymlink, Linkname: "/etc"},
			{Name: "h", Typeflag: tar.TypeLink, Linkname: "s/passwd"},
		},
	}
	for name, hdrs := range cases {
		write(t, filepath.Join(d, "evil.tar"), string(tarball(t, hdrs, nil)), 0o644)
		upper := t.TempDir()
		err := c.CopyInto(context.Background(), addStep("/opt/app/", "evil.tar"), rootfs, upper)
		if err == nil || !strings.Contains(err.Error(), "refusing archive") {
			t.Errorf("%s: err = %v", name, err)
		}
		for _, p := range []string{filepath.Join(upper, "../evil"), filepath.Join(rootfs, "etc/evil"), filepath.Join(upper, "etc/evil")} {
			if exists(p) {
				t.Errorf("%s: wrote %s", name, p)
			}
		}
	}
}

func TestCancel(t *testing.T) {
	rootfs := newRootfs(t)
	_, c := newContext(t)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err := c.CopyInto(ctx, copyStep("/x/", "dir"), rootfs, t.TempDir())
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v", err)
	}
}

// TestFromDockerfile runs a planned COPY end to end: relative dest against
// WORKDIR, --chown by name, variables.
func TestFromDockerfile(t *testing.T) {
	rootfs := newRootfs(t)
	_, c := newContext(t)
	f, err := dockerfile.Parse(strings.NewReader("FROM base\nARG OWNER=user\nWORKDIR /srv/data\nCOPY --chown=${OWNER}:users --chmod=600 *.txt ./\n"))
	must(t, err)
	steps, _, err := f.Plan(dockerfile.Config{}, nil)
	must(t, err)
	up := run(t, c, steps[1], rootfs)
	fi, st := stat(t, filepath.Join(up, "srv/data/b.txt"))
	if fi.Mode().Perm() != 0o600 || st.Uid != 1000 || st.Gid != 100 {
		t.Fatalf("b.txt %v %d:%d", fi.Mode(), st.Uid, st.Gid)
	}
	// srv/data kept the image's attributes (copy-up), not the chown.
	_, st = stat(t, filepath.Join(up, "srv/data"))
	if st.Uid != 1000 || st.Gid != 1000 {
		t.Fatalf("srv/data %d:%d", st.Uid, st.Gid)
	}
}
