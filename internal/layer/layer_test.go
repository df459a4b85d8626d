package layer_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/layer"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// entry is what a tree shows at one path: everything but ctime, nlink and
// atime (hard-linking changes the first two on lower's inodes, reading the
// last).
type entry struct {
	Type         fs.FileMode
	Mode         uint32
	UID, GID     uint32
	Size         int64
	Mtime        int64
	Data, Target string
	Rdev         uint64
	Xattrs       string
}

func snapshot(t *testing.T, root string, withDirMtime bool) map[string]entry {
	t.Helper()
	out := map[string]entry{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return err
		}
		e := entry{Type: d.Type(), Mode: st.Mode, UID: st.Uid, GID: st.Gid, Mtime: st.Mtim.Nano(), Rdev: st.Rdev}
		switch {
		case d.Type().IsRegular():
			e.Size = st.Size
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			// Large (sparse) files: the first and last MiB stand for the data.
			h := sha256.New()
			buf := make([]byte, 1<<20)
			n, _ := f.ReadAt(buf, 0)
			h.Write(buf[:n])
			if st.Size > 1<<20 {
				n, _ = f.ReadAt(buf, st.Size-1<<20)
				h.Write(buf[:n])
			}
			f.Close()
			e.Data = hex.EncodeToString(h.Sum(nil))
		case d.Type()&fs.ModeSymlink != 0:
			e.Target, _ = os.Readlink(p)
		case d.IsDir():
			if !withDirMtime {
				e.Mtime = 0
			}
		}
		if d.Type()&fs.ModeSymlink == 0 {
			e.Xattrs = xattrs(p)
		}
		out[rel] = e
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func xattrs(p string) string {
	sz, _ := unix.Llistxattr(p, nil)
	if sz <= 0 {
		return ""
	}
	buf := make([]byte, sz)
	n, _ := unix.Llistxattr(p, buf)
	var parts []string
	for _, name := range strings.Split(string(buf[:n]), "\x00") {
		if name == "" {
			continue
		}
		v := make([]byte, 4096)
		m, _ := unix.Lgetxattr(p, name, v)
		if m < 0 {
			m = 0
		}
		parts = append(parts, name+"="+string(v[:m]))
	}
	sort.Strings(parts)
	return strings.Join(parts, ";")
}

func diff(t *testing.T, want, got map[string]entry) {
	t.Helper()
	for p, w := range want {
		g, ok := got[p]
		if !ok {
			t.Errorf("missing %q", p)
			continue
		}
		if g != w {
			t.Errorf("%q differs:\n want %+v\n got  %+v", p, w, g)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("unexpected %q", p)
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func write(t *testing.T, p, data string, mode os.FileMode) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(data), 0o600))
	chmod(t, p, uint32(mode))
}

// chmod takes raw mode bits (os.Chmod drops 0o7000 unless given as
// os.ModeSetuid and the like).
func chmod(t *testing.T, p string, mode uint32) {
	t.Helper()
	must(t, unix.Chmod(p, mode))
}

func whiteout(t *testing.T, p string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, unix.Mknod(p, unix.S_IFCHR|0o000, 0))
}

func mkSocket(t *testing.T, p string) {
	t.Helper()
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: p, Net: "unix"})
	must(t, err)
	l.SetUnlinkOnClose(false)
	l.Close()
}

const weird = "we\nird \xff\x01name*"

// buildLower makes a lower tree with every kind of entry.
func buildLower(t *testing.T, lower string) {
	write(t, filepath.Join(lower, "keep"), "unchanged", 0o644)
	write(t, filepath.Join(lower, "gone"), "deleted by a whiteout", 0o644)
	write(t, filepath.Join(lower, "d", "old"), "old in d", 0o600)
	write(t, filepath.Join(lower, "d", "edit"), "before", 0o644)
	write(t, filepath.Join(lower, "dir2file", "x"), "x", 0o644)
	write(t, filepath.Join(lower, "file2dir"), "was a file", 0o644)
	write(t, filepath.Join(lower, "opq", "hidden"), "hidden by opaque", 0o644)
	write(t, filepath.Join(lower, "gonedir", "a", "b"), "b", 0o644)
	write(t, filepath.Join(lower, "suid"), "#!/bin/sh\n", 0o4755)
	write(t, filepath.Join(lower, weird), "weird", 0o644)
	must(t, os.Symlink("keep", filepath.Join(lower, "link")))
	must(t, os.Symlink("/etc/passwd", filepath.Join(lower, "abslink")))
	must(t, os.Link(filepath.Join(lower, "keep"), filepath.Join(lower, "keep-hard")))
	must(t, unix.Mkfifo(filepath.Join(lower, "fifo"), 0o640))
	mkSocket(t, filepath.Join(lower, "sock"))
	must(t, os.Mkdir(filepath.Join(lower, "sticky"), 0o755))
	chmod(t, filepath.Join(lower, "sticky"), 0o1777)
	must(t, os.Mkdir(filepath.Join(lower, "setgid-dir"), 0o755))
	must(t, os.Chown(filepath.Join(lower, "setgid-dir"), 0, 50))
	chmod(t, filepath.Join(lower, "setgid-dir"), 0o2775)
	must(t, os.Chown(filepath.Join(lower, "d"), 1000, 1000))
	must(t, unix.Lsetxattr(filepath.Join(lower, "d"), "user.tag", []byte("lower"), 0))
	// Sparse 3 GiB file: must cost nothing to apply.
	f, err := os.Create(filepath.Join(lower, "sparse"))
	must(t, err)
	_, err = f.WriteAt([]byte("end"), 3<<30)
	must(t, err)
	f.Close()
	old := time.Date(2020, 1, 2, 3, 4, 5, 6, time.UTC)
	must(t, os.Chtimes(filepath.Join(lower, "d"), old, old))
}

func TestApplySynthetic(t *testing.T) {
	testenv.NeedRoot(t)
	base := t.TempDir()
	lower, upper, dst := filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "dst")
	buildLower(t, lower)
	must(t, os.Mkdir(upper, 0o755))
	whiteout(t, filepath.Join(upper, "gone"))
	whiteout(t, filepath.Join(upper, "gonedir"))
	whiteout(t, filepath.Join(upper, "never-existed"))
	write(t, filepath.Join(upper, "d", "new"), "new in d", 0o640)
	write(t, filepath.Join(upper, "d", "edit"), "after", 0o644)
	must(t, unix.Setxattr(filepath.Join(upper, "d", "edit"), "trusted.overlay.origin", []byte("x"), 0))
	must(t, os.Chmod(filepath.Join(upper, "d"), 0o750))
	must(t, unix.Setxattr(filepath.Join(upper, "d"), "trusted.overlay.impure", []byte("y"), 0))
	must(t, unix.Setxattr(filepath.Join(upper, "d"), "user.tag", []byte("upper"), 0))
	write(t, filepath.Join(upper, "dir2file"), "now a file", 0o600)
	write(t, filepath.Join(upper, "file2dir", "inside"), "now a dir", 0o644)
	write(t, filepath.Join(upper, "opq", "only"), "only upper", 0o644)
	must(t, unix.Setxattr(filepath.Join(upper, "opq"), "trusted.overlay.opaque", []byte("y"), 0))
	write(t, filepath.Join(upper, "u1"), "hard linked in upper", 0o4711)
	must(t, os.Mkdir(filepath.Join(upper, "sub"), 0o755))
	must(t, os.Link(filepath.Join(upper, "u1"), filepath.Join(upper, "sub", "u2")))
	must(t, os.Symlink("../keep", filepath.Join(upper, "sub", "ulink")))
	must(t, unix.Mkfifo(filepath.Join(upper, "ufifo"), 0o600))
	write(t, filepath.Join(upper, weird+"2"), "weird upper", 0o644)
	must(t, os.Chown(filepath.Join(upper, "u1"), 1000, 1001))
	chmod(t, filepath.Join(upper, "u1"), 0o4711) // chown cleared setuid

	before := snapshot(t, lower, true)
	upperView := snapshot(t, upper, true)
	keepIno := stat(t, filepath.Join(lower, "keep"))

	start := time.Now()
	must(t, layer.Apply(lower, upper, dst))
	t.Logf("Apply: %v", time.Since(start))

	diff(t, before, snapshot(t, lower, true))

	got := snapshot(t, dst, true)
	want := map[string]entry{}
	for p, e := range before {
		want[p] = e
	}
	for _, p := range []string{"gone", "gonedir", "gonedir/a", "gonedir/a/b", "dir2file/x", "opq/hidden", "file2dir"} {
		delete(want, p)
	}
	for p, e := range upperView {
		if e.Type&fs.ModeCharDevice != 0 && e.Rdev == 0 {
			continue
		}
		e.Xattrs = stripOverlay(e.Xattrs)
		want[p] = e
	}
	want["."] = upperView["."]
	diff(t, want, got)

	if !os.SameFile(stat(t, filepath.Join(dst, "keep")), keepIno) {
		t.Errorf("an unchanged lower file was copied, not hard-linked")
	}
	if !os.SameFile(stat(t, filepath.Join(dst, "keep-hard")), keepIno) {
		t.Errorf("a hard link of lower is not one inode in dst")
	}
	if !os.SameFile(stat(t, filepath.Join(dst, "u1")), stat(t, filepath.Join(dst, "sub", "u2"))) {
		t.Errorf("hard links inside upper are no longer one inode")
	}
	if st := stat(t, filepath.Join(dst, "u1")); st.Mode()&os.ModeSetuid == 0 {
		t.Errorf("setuid bit of an upper file lost")
	}
	var sst unix.Stat_t
	must(t, unix.Stat(filepath.Join(dst, "sparse"), &sst))
	if sst.Blocks*512 > 1<<20 {
		t.Errorf("the sparse file takes %d bytes in dst", sst.Blocks*512)
	}
	if err := layer.Apply(lower, t.TempDir(), dst); err == nil {
		t.Errorf("Apply over an existing dst succeeded")
	}
}

func stripOverlay(x string) string {
	var keep []string
	for _, p := range strings.Split(x, ";") {
		if p != "" && !strings.HasPrefix(p, "trusted.overlay.") {
			keep = append(keep, p)
		}
	}
	return strings.Join(keep, ";")
}

func stat(t *testing.T, p string) os.FileInfo {
	t.Helper()
	fi, err := os.Lstat(p)
	must(t, err)
	return fi
}

// TestApplyRefusesRedirect: an upper with an overlayfs redirect is not a
// self-contained diff.
func TestApplyRefusesRedirect(t *testing.T) {
	testenv.NeedRoot(t)
	base := t.TempDir()
	lower, upper := filepath.Join(base, "lower"), filepath.Join(base, "upper")
	write(t, filepath.Join(lower, "a", "f"), "f", 0o644)
	must(t, os.MkdirAll(filepath.Join(upper, "b"), 0o755))
	must(t, unix.Setxattr(filepath.Join(upper, "b"), "trusted.overlay.redirect", []byte("/a"), 0))
	dst := filepath.Join(base, "dst")
	if err := layer.Apply(lower, upper, dst); err == nil || !strings.Contains(err.Error(), "redirect") {
		t.Fatalf("Apply = %v, want a redirect error", err)
	}
	if _, err := os.Lstat(dst); err == nil {
		t.Errorf("a failed Apply left dst behind")
	}
}

// TestApplyDeep: trees deeper than PATH_MAX, in lower and in upper.
func TestApplyDeep(t *testing.T) {
	testenv.NeedRoot(t)
	base := t.TempDir()
	lower, upper, dst := filepath.Join(base, "lower"), filepath.Join(base, "upper"), filepath.Join(base, "dst")
	name := strings.Repeat("d", 60)
	const depth = 100 // 6 KB of path
	mkdeep := func(root, leaf string) {
		must(t, os.MkdirAll(root, 0o755))
		fd, err := unix.Open(root, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		for range depth {
			must(t, unix.Mkdirat(fd, name, 0o755))
			nfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
			must(t, err)
			unix.Close(fd)
			fd = nfd
		}
		f, err := unix.Openat(fd, leaf, unix.O_CREAT|unix.O_WRONLY, 0o644)
		must(t, err)
		unix.Close(f)
		unix.Close(fd)
	}
	mkdeep(lower, "lowerleaf")
	mkdeep(upper, "upperleaf")
	must(t, layer.Apply(lower, upper, dst))
	fd, err := unix.Open(dst, unix.O_RDONLY|unix.O_DIRECTORY, 0)
	must(t, err)
	for range depth {
		nfd, err := unix.Openat(fd, name, unix.O_RDONLY|unix.O_DIRECTORY, 0)
		must(t, err)
		unix.Close(fd)
		fd = nfd
	}
	defer unix.Close(fd)
	for _, leaf := range []string{"lowerleaf", "upperleaf"} {
		var st unix.Stat_t
		if err := unix.Fstatat(fd, leaf, &st, 0); err != nil {
			t.Errorf("%s at depth %d: %v", leaf, depth, err)
		}
	}
}

func TestShiftOwnership(t *testing.T) {
	testenv.NeedRoot(t)
	base := t.TempDir()
	up := filepath.Join(base, "upper")
	outside := filepath.Join(base, "host-file")
	write(t, outside, "host", 0o644)
	write(t, filepath.Join(up, "rootfile"), "r", 0o644)
	write(t, filepath.Join(up, "home", "u", "userfile"), "u", 0o600)
	write(t, filepath.Join(up, "suid"), "s", 0o6755)
	write(t, filepath.Join(up, "odd"), "o", 0o644)
	write(t, filepath.Join(up, "capfile"), "c", 0o755)
	must(t, os.Symlink(outside, filepath.Join(up, "link")))
	must(t, os.Chown(up, 100000, 100000))
	must(t, os.Chown(filepath.Join(up, "rootfile"), 100000, 100000))
	must(t, os.Chown(filepath.Join(up, "home", "u"), 101000, 101000))
	must(t, os.Chown(filepath.Join(up, "home", "u", "userfile"), 101000, 100050))
	must(t, os.Chown(filepath.Join(up, "suid"), 100000, 100000))
	chmod(t, filepath.Join(up, "suid"), 0o6755)
	must(t, os.Chown(filepath.Join(up, "odd"), 5, 300000))
	must(t, os.Chown(filepath.Join(up, "capfile"), 100000, 100000))
	must(t, os.Lchown(filepath.Join(up, "link"), 100000, 100000))
	// A v3 capability (cap_net_bind_service) for the namespace's root.
	capv := []byte{0, 0, 0, 3 | 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa0, 0x86, 0x01, 0x00}
	capv[0] = 1 // effective
	if err := unix.Setxattr(filepath.Join(up, "capfile"), "security.capability", capv, 0); err != nil {
		t.Fatalf("set v3 capability: %v", err)
	}

	must(t, layer.ShiftOwnership(up, 100000, 65536))

	check := func(p string, uid, gid uint32, mode os.FileMode) {
		t.Helper()
		var st unix.Stat_t
		must(t, unix.Lstat(p, &st))
		if st.Uid != uid || st.Gid != gid {
			t.Errorf("%s owned by %d:%d, want %d:%d", p, st.Uid, st.Gid, uid, gid)
		}
		if mode != 0 && os.FileMode(st.Mode&07777) != mode&07777 {
			t.Errorf("%s mode %o, want %o", p, st.Mode&07777, mode)
		}
	}
	check(up, 0, 0, 0)
	check(filepath.Join(up, "rootfile"), 0, 0, 0o644)
	check(filepath.Join(up, "home", "u"), 1000, 1000, 0)
	check(filepath.Join(up, "home", "u", "userfile"), 1000, 50, 0o600)
	check(filepath.Join(up, "suid"), 0, 0, 0o6755)
	check(filepath.Join(up, "odd"), 5, 300000, 0o644)
	check(filepath.Join(up, "link"), 0, 0, 0)
	check(outside, 0, 0, 0o644)
	v := make([]byte, 64)
	n, err := unix.Getxattr(filepath.Join(up, "capfile"), "security.capability", v)
	if err != nil {
		t.Fatalf("file capability dropped by the shift: %v", err)
	}
	if n != 20 || v[3] != 2 || v[4] != 0 || v[5] != 4 {
		t.Errorf("capability after the shift = % x, want the v2 form of cap_net_bind_service", v[:n])
	}
}

// TestApplyRealOverlay: changes made through a real overlay mount, applied
// with Apply, give what the merged view showed.
func TestApplyRealOverlay(t *testing.T) {
	testenv.NeedRoot(t)
	base := t.TempDir()
	lower, upper, work, merged, dst := filepath.Join(base, "lower"), filepath.Join(base, "upper"),
		filepath.Join(base, "work"), filepath.Join(base, "merged"), filepath.Join(base, "dst")
	buildLower(t, lower)
	for _, d := range []string{upper, work, merged} {
		must(t, os.Mkdir(d, 0o755))
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",redirect_dir=off,metacopy=off"
	must(t, unix.Mount("overlay", merged, "overlay", 0, opts))
	mounted := true
	defer func() {
		if mounted {
			_ = unix.Unmount(merged, unix.MNT_DETACH)
		}
	}()
	script := `set -e
cd "$1"
rm gone
rm -r gonedir
mv d/old d/moved
mv dir2file moved-dir
echo appended >> d/edit
chmod 0700 d
chown 1234:5678 keep-hard
rm -r opq
mkdir opq
echo fresh > opq/fresh
rm file2dir
mkdir -p file2dir/sub
ln suid suid-hard
ln -s /nowhere newlink
chmod u-s suid
mkdir -p new/deeper && echo n > new/deeper/f
touch -d 2001-01-01 new
`
	if out, err := exec.Command("sh", "-c", script, "sh", merged).CombinedOutput(); err != nil {
		t.Fatalf("changes in the merged view: %v\n%s", err, out)
	}
	view := snapshot(t, merged, true)
	must(t, unix.Unmount(merged, 0))
	mounted = false
	before := snapshot(t, lower, true)
	must(t, layer.Apply(lower, upper, dst))
	diff(t, view, snapshot(t, dst, true))
	diff(t, before, snapshot(t, lower, true))
	if !os.SameFile(stat(t, filepath.Join(dst, "fifo")), stat(t, filepath.Join(lower, "fifo"))) {
		t.Errorf("untouched fifo not hard-linked")
	}
}

// TestApplyBaseTemplate measures Apply on the base template's rootfs with a
// small diff, and checks the template is untouched.
func TestApplyBaseTemplate(t *testing.T) {
	testenv.NeedRoot(t)
	lower := testenv.BaseRootfs(t)
	// dst must be on the template's filesystem (hard links).
	work, err := os.MkdirTemp(filepath.Dir(filepath.Dir(lower)), ".layer-test-")
	must(t, err)
	defer os.RemoveAll(work)
	upper, dst := filepath.Join(work, "upper"), filepath.Join(work, "dst")
	write(t, filepath.Join(upper, "etc", "airlock-layer-test"), "x", 0o644)
	whiteout(t, filepath.Join(upper, "etc", "issue"))
	var lst unix.Stat_t
	must(t, unix.Lstat(lower, &lst))
	chmod(t, upper, lst.Mode&0o7777)
	must(t, os.Chmod(filepath.Join(upper, "etc"), 0o755))
	before := snapshot(t, lower, true)
	start := time.Now()
	must(t, layer.Apply(lower, upper, dst))
	elapsed := time.Since(start)
	after := snapshot(t, dst, false)
	diff(t, before, snapshot(t, lower, true))
	n := len(after)
	t.Logf("Apply of the base template (%d entries): %v", n, elapsed)
	if _, err := os.Lstat(filepath.Join(dst, "etc", "issue")); err == nil {
		t.Errorf("whiteout not applied")
	}
	if n < len(before)-1 {
		t.Errorf("dst has %d entries, lower %d", n, len(before))
	}
	// du counts an inode once: what dst costs beyond lower.
	out, _ := exec.Command("du", "-sh", lower, dst).CombinedOutput()
	t.Logf("du (shared inodes counted once):\n%s", out)
}
