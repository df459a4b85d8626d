package ociimage_test

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/compression"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
)

var (
	t0 = time.Date(2024, 3, 1, 12, 0, 0, 0, time.UTC)
	t1 = time.Date(2023, 7, 9, 8, 30, 0, 0, time.UTC)
)

// A valid VFS_CAP_REVISION_2 value: cap_net_bind_service permitted, effective.
var capNetBind = string([]byte{1, 0, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0})

func dir(name string, mode int64, uid, gid int) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: mode, Uid: uid, Gid: gid, ModTime: t1}
}

func file(name string, mode int64, uid, gid int) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: mode, Uid: uid, Gid: gid, ModTime: t0}
}

func symlink(name, target string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeSymlink, Name: name, Linkname: target, Mode: 0o777, ModTime: t1}
}

func hardlink(name, target string) *tar.Header {
	return &tar.Header{Typeflag: tar.TypeLink, Name: name, Linkname: target, Mode: 0o644, ModTime: t0}
}

// richImage is a two-layer image with every kind of entry Extract handles.
func richImage(t *testing.T) v1.Image {
	t.Helper()
	capFile := file("usr/bin/ping", 0o755, 0, 0)
	capFile.PAXRecords = map[string]string{
		"SCHILY.xattr.security.capability": capNetBind,
		"SCHILY.xattr.user.note":           "kept",
		"SCHILY.xattr.trusted.secret":      "dropped",
	}
	l1 := ocitest.TarLayer(t, []*tar.Header{
		dir("./", 0o755, 0, 0),
		dir("etc/", 0o755, 0, 0),
		file("etc/hello", 0o644, 0, 0),
		symlink("etc/hello.abs", "/etc/hello"),
		symlink("etc/dangling", "../nowhere/at/all"),
		dir("usr/", 0o755, 0, 0),
		dir("usr/bin/", 0o755, 0, 0),
		dir("usr/lib/", 0o755, 0, 0),
		symlink("lib", "usr/lib"),
		file("usr/bin/su", 0o4755, 0, 0),
		hardlink("usr/bin/su2", "usr/bin/su"),
		capFile,
		dir("home/", 0o755, 0, 0),
		dir("home/user/", 0o700, 1000, 1000),
		file("home/user/.profile", 0o600, 1000, 1000),
		{Typeflag: tar.TypeFifo, Name: "run/fifo", Mode: 0o620, Uid: 1000, Gid: 5, ModTime: t0},
		{Typeflag: tar.TypeChar, Name: "dev/null", Mode: 0o666, Devmajor: 1, Devminor: 3},
		file("gone", 0o644, 0, 0),
		dir("opq/", 0o755, 0, 0),
		file("opq/old", 0o644, 0, 0),
		dir("opq/sub/", 0o755, 0, 0),
		file("opq/sub/older", 0o644, 0, 0),
		file("h1", 0o640, 0, 0),
		hardlink("h2", "h1"),
		dir("tmp/", 0o1777, 0, 0),
	}, []string{"", "", "hello v1\n", "", "", "", "", "", "", "SU", "", "PING", "", "", "export X=1\n", "", "", "bye", "", "old", "", "older", "shared inode", "", ""})
	l2 := ocitest.TarLayer(t, []*tar.Header{
		file(".wh.gone", 0o644, 0, 0),
		file("opq/.wh..wh..opq", 0o644, 0, 0),
		file("opq/new", 0o644, 0, 0),
		file("opq/sub/newer", 0o644, 0, 0),
		file("etc/hello", 0o600, 1000, 1000),
		file("lib/via-symlink", 0o644, 0, 0),
		file(".wh.h1", 0o644, 0, 0),
	}, []string{"", "", "new", "newer", "hello v2\n", "through lib", ""})
	return ocitest.Build(t, ociimage.Config{
		Env:        []string{"PATH=/usr/bin:/bin", "LANG=C.UTF-8"},
		User:       "1000:1000",
		WorkingDir: "/home/user",
		Cmd:        []string{"/bin/sh"},
	}, l1, l2)
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func lstat(t *testing.T, p string) *syscall.Stat_t {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Lstat(p, &st); err != nil {
		t.Fatalf("lstat %s: %v", p, err)
	}
	return &st
}

func absent(t *testing.T, p string) {
	t.Helper()
	if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s: want absent, got err=%v", p, err)
	}
}

// checkRich asserts the flattened filesystem of richImage.
func checkRich(t *testing.T, root string) {
	t.Helper()
	if got := readFile(t, filepath.Join(root, "etc/hello")); got != "hello v2\n" {
		t.Errorf("etc/hello = %q, want the upper layer's", got)
	}
	if st := lstat(t, filepath.Join(root, "etc/hello")); st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o600 {
		t.Errorf("etc/hello: uid %d gid %d mode %o", st.Uid, st.Gid, st.Mode&0o7777)
	}
	if l, err := os.Readlink(filepath.Join(root, "etc/hello.abs")); err != nil || l != "/etc/hello" {
		t.Errorf("etc/hello.abs -> %q, %v; want /etc/hello verbatim", l, err)
	}
	if l, err := os.Readlink(filepath.Join(root, "etc/dangling")); err != nil || l != "../nowhere/at/all" {
		t.Errorf("etc/dangling -> %q, %v", l, err)
	}
	if st := lstat(t, filepath.Join(root, "etc/hello.abs")); st.Mtim.Sec != t1.Unix() {
		t.Errorf("symlink mtime %d, want %d", st.Mtim.Sec, t1.Unix())
	}
	su := lstat(t, filepath.Join(root, "usr/bin/su"))
	if su.Mode&0o7777 != 0o4755 {
		t.Errorf("su mode %o, want 4755 (setuid)", su.Mode&0o7777)
	}
	if su.Mtim.Sec != t0.Unix() {
		t.Errorf("su mtime %d, want %d", su.Mtim.Sec, t0.Unix())
	}
	if su2 := lstat(t, filepath.Join(root, "usr/bin/su2")); su2.Ino != su.Ino || su.Nlink != 2 {
		t.Errorf("su2 not a hard link of su (ino %d vs %d, nlink %d)", su2.Ino, su.Ino, su.Nlink)
	}
	buf := make([]byte, 64)
	if n, err := unix.Lgetxattr(filepath.Join(root, "usr/bin/ping"), "security.capability", buf); err != nil || string(buf[:n]) != capNetBind {
		t.Errorf("security.capability: %q, %v", buf[:max(n, 0)], err)
	}
	if n, err := unix.Lgetxattr(filepath.Join(root, "usr/bin/ping"), "user.note", buf); err != nil || string(buf[:n]) != "kept" {
		t.Errorf("user.note: %q, %v", buf[:max(n, 0)], err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(root, "usr/bin/ping"), "trusted.secret", buf); err == nil {
		t.Errorf("trusted.secret xattr was kept")
	}
	if st := lstat(t, filepath.Join(root, "home/user")); st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o7777 != 0o700 || st.Mtim.Sec != t1.Unix() {
		t.Errorf("home/user: uid %d gid %d mode %o mtime %d", st.Uid, st.Gid, st.Mode&0o7777, st.Mtim.Sec)
	}
	if st := lstat(t, filepath.Join(root, "tmp")); st.Mode&0o7777 != 0o1777 {
		t.Errorf("tmp mode %o, want 1777", st.Mode&0o7777)
	}
	if st := lstat(t, filepath.Join(root, "etc")); st.Mtim.Sec != t1.Unix() {
		t.Errorf("etc mtime %d, want %d (set after its files)", st.Mtim.Sec, t1.Unix())
	}
	if st := lstat(t, filepath.Join(root, "run/fifo")); st.Mode&unix.S_IFMT != unix.S_IFIFO || st.Mode&0o7777 != 0o620 || st.Uid != 1000 || st.Gid != 5 {
		t.Errorf("run/fifo: mode %o uid %d gid %d", st.Mode, st.Uid, st.Gid)
	}
	absent(t, filepath.Join(root, "dev/null"))
	absent(t, filepath.Join(root, "gone"))
	absent(t, filepath.Join(root, ".wh.gone"))
	absent(t, filepath.Join(root, "opq/old"))
	absent(t, filepath.Join(root, "opq/sub/older"))
	absent(t, filepath.Join(root, "opq/.wh..wh..opq"))
	if got := readFile(t, filepath.Join(root, "opq/new")); got != "new" {
		t.Errorf("opq/new = %q", got)
	}
	if got := readFile(t, filepath.Join(root, "opq/sub/newer")); got != "newer" {
		t.Errorf("opq/sub/newer = %q", got)
	}
	if l, err := os.Readlink(filepath.Join(root, "lib")); err != nil || l != "usr/lib" {
		t.Errorf("lib -> %q, %v; want the symlink kept", l, err)
	}
	if got := readFile(t, filepath.Join(root, "usr/lib/via-symlink")); got != "through lib" {
		t.Errorf("usr/lib/via-symlink = %q", got)
	}
	// h1 was whited out in the upper layer; its hard link h2 keeps the data.
	absent(t, filepath.Join(root, "h1"))
	if got := readFile(t, filepath.Join(root, "h2")); got != "shared inode" {
		t.Errorf("h2 = %q", got)
	}
}

func TestIsImageRef(t *testing.T) {
	for ref, want := range map[string]bool{
		"base":                           false,
		"debian:bookworm":                false,
		"debian:bookworm-slim":           false,
		"library/debian":                 false,
		"oci:/tmp/layout":                true,
		"oci:/tmp/layout:v1":             true,
		"docker-archive:/tmp/x.tar":      true,
		"docker://debian:bookworm":       true,
		"ghcr.io/org/img:1":              true,
		"localhost/img":                  true,
		"localhost:5000/img":             true,
		"127.0.0.1:5000/img@sha256:abcd": true,
		"registry.example.com/a/b":       true,
		"my-template":                    false,
	} {
		if got := ociimage.IsImageRef(ref); got != want {
			t.Errorf("IsImageRef(%q) = %v, want %v", ref, got, want)
		}
	}
}

func TestRegistryExtract(t *testing.T) {
	host := ocitest.Registry(t)
	img := richImage(t)
	ref := ocitest.Push(t, host, "rich:v1", img)
	want, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	im, err := ociimage.Open(ctx, ref, ociimage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if im.Digest != want.String() {
		t.Errorf("digest %s, want the pushed manifest's %s", im.Digest, want)
	}
	if im.Config.User != "1000:1000" || im.Config.WorkingDir != "/home/user" || strings.Join(im.Config.Env, ",") != "PATH=/usr/bin:/bin,LANG=C.UTF-8" || strings.Join(im.Config.Cmd, " ") != "/bin/sh" {
		t.Errorf("config %+v", im.Config)
	}
	if im.Size <= 0 {
		t.Errorf("size %d", im.Size)
	}
	var last, total int64
	calls := 0
	dst := t.TempDir()
	if err := im.Extract(ctx, dst, func(d, tot int64) { last, total = d, tot; calls++ }); err != nil {
		t.Fatal(err)
	}
	if calls < 1 || last != im.Size || total != im.Size {
		t.Errorf("progress: %d calls, last %d/%d, want %d", calls, last, total, im.Size)
	}
	checkRich(t, dst)
	if err := im.Extract(ctx, dst, nil); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("extract into a non-empty dir: %v", err)
	}

	// The same reference with docker:// and by digest resolves the same.
	for _, r := range []string{"docker://" + ref, host + "/rich@" + want.String()} {
		im2, err := ociimage.Open(ctx, r, ociimage.Options{})
		if err != nil {
			t.Fatalf("%s: %v", r, err)
		}
		if im2.Digest != im.Digest {
			t.Errorf("%s: digest %s, want %s", r, im2.Digest, im.Digest)
		}
	}
}

func TestDigestStableAndChanges(t *testing.T) {
	host := ocitest.Registry(t)
	mk := func(content string) v1.Image {
		return ocitest.Build(t, ociimage.Config{Env: []string{"A=1"}}, ocitest.FilesLayer(t, map[string]string{"etc/x": content}))
	}
	ctx := context.Background()
	open := func(ref string) string {
		im, err := ociimage.Open(ctx, ref, ociimage.Options{})
		if err != nil {
			t.Fatal(err)
		}
		return im.Digest
	}
	a := open(ocitest.Push(t, host, "d:a", mk("one")))
	a2 := open(ocitest.Push(t, host, "d:a2", mk("one")))
	b := open(ocitest.Push(t, host, "d:b", mk("two")))
	if a != a2 {
		t.Errorf("same content, different digests %s %s", a, a2)
	}
	if a == b {
		t.Errorf("changed content, same digest %s", a)
	}
	if again := open(host + "/d:a"); again != a {
		t.Errorf("digest not stable: %s then %s", a, again)
	}
}

func platformImage(t *testing.T, plat, marker string) v1.Image {
	return ocitest.BuildFor(t, plat, ociimage.Config{}, ocitest.FilesLayer(t, map[string]string{"arch": marker}))
}

func TestPlatformIndex(t *testing.T) {
	host := ocitest.Registry(t)
	amd := platformImage(t, "linux/amd64", "amd64")
	arm := platformImage(t, "linux/arm64", "arm64")
	ref := ocitest.PushIndex(t, host, "multi:1", ocitest.Index(t, map[string]v1.Image{"linux/amd64": amd, "linux/arm64": arm}))
	ctx := context.Background()
	for plat, img := range map[string]v1.Image{"linux/amd64": amd, "linux/arm64": arm, "linux/arm64/v8": arm} {
		im, err := ociimage.Open(ctx, ref, ociimage.Options{Platform: plat})
		if err != nil {
			t.Fatalf("%s: %v", plat, err)
		}
		want, _ := img.Digest()
		if im.Digest != want.String() {
			t.Errorf("%s: digest %s, want the platform image's %s", plat, im.Digest, want)
		}
		dst := t.TempDir()
		if err := im.Extract(ctx, dst, nil); err != nil {
			t.Fatal(err)
		}
		if got := readFile(t, filepath.Join(dst, "arch")); !strings.HasPrefix(plat, "linux/"+got) {
			t.Errorf("%s: extracted the %s image", plat, got)
		}
	}
	_, err := ociimage.Open(ctx, ref, ociimage.Options{Platform: "linux/s390x"})
	if !errors.Is(err, ociimage.ErrPlatform) || !strings.Contains(err.Error(), "linux/amd64") || !strings.Contains(err.Error(), "linux/arm64") {
		t.Errorf("s390x: %v; want ErrPlatform listing linux/amd64 and linux/arm64", err)
	}
	// A lone image of another platform is refused too.
	lone := ocitest.Push(t, host, "lone:1", arm)
	if _, err := ociimage.Open(ctx, lone, ociimage.Options{Platform: "linux/amd64"}); !errors.Is(err, ociimage.ErrPlatform) {
		t.Errorf("lone arm64 image as amd64: %v, want ErrPlatform", err)
	}
}

func TestOCILayout(t *testing.T) {
	ctx := context.Background()
	lay := filepath.Join(t.TempDir(), "layout")
	img := richImage(t)
	other := ocitest.Build(t, ociimage.Config{}, ocitest.FilesLayer(t, map[string]string{"other": "x"}))
	ref := ocitest.WriteLayout(t, lay, "v1", img)
	ocitest.WriteLayout(t, lay, "v2", other)
	if ref != "oci:"+lay+":v1" {
		t.Fatalf("ref %q", ref)
	}
	im, err := ociimage.Open(ctx, ref, ociimage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	want, _ := img.Digest()
	if im.Digest != want.String() {
		t.Errorf("digest %s want %s", im.Digest, want)
	}
	dst := t.TempDir()
	if err := im.Extract(ctx, dst, nil); err != nil {
		t.Fatal(err)
	}
	checkRich(t, dst)

	byDigest, err := ociimage.Open(ctx, "oci:"+lay+"@"+want.String(), ociimage.Options{})
	if err != nil || byDigest.Digest != im.Digest {
		t.Errorf("by digest: %v %v", byDigest, err)
	}
	if _, err := ociimage.Open(ctx, "oci:"+lay, ociimage.Options{}); !errors.Is(err, ociimage.ErrBadRef) || !strings.Contains(err.Error(), "v2") {
		t.Errorf("two images, no tag: %v; want ErrBadRef listing the tags", err)
	}
	if _, err := ociimage.Open(ctx, "oci:"+lay+":v9", ociimage.Options{}); !errors.Is(err, ociimage.ErrNotFound) || !strings.Contains(err.Error(), "v1, v2") {
		t.Errorf("unknown tag: %v; want ErrNotFound listing v1, v2", err)
	}
	if _, err := ociimage.Open(ctx, "oci:"+filepath.Join(t.TempDir(), "nope"), ociimage.Options{}); !errors.Is(err, ociimage.ErrNotFound) {
		t.Errorf("missing layout: %v; want ErrNotFound", err)
	}

	// One untagged image is the default; an index picks by platform.
	single := filepath.Join(t.TempDir(), "single")
	ocitest.WriteLayout(t, single, "", other)
	if _, err := ociimage.Open(ctx, "oci:"+single, ociimage.Options{}); err != nil {
		t.Errorf("single image layout: %v", err)
	}
	multi := filepath.Join(t.TempDir(), "multi")
	arm := platformImage(t, "linux/arm64", "arm64")
	mref := ocitest.WriteLayoutIndex(t, multi, "m", ocitest.Index(t, map[string]v1.Image{
		"linux/amd64": platformImage(t, "linux/amd64", "amd64"), "linux/arm64": arm,
	}))
	im, err = ociimage.Open(ctx, mref, ociimage.Options{Platform: "linux/arm64"})
	if err != nil {
		t.Fatal(err)
	}
	armDigest, _ := arm.Digest()
	if im.Digest != armDigest.String() {
		t.Errorf("layout index arm64: %s want %s", im.Digest, armDigest)
	}
	if err := im.Extract(ctx, t.TempDir(), nil); err != nil {
		t.Error(err)
	}
	if im, err := ociimage.Open(ctx, "oci:"+multi+"@"+armDigest.String(), ociimage.Options{Platform: "linux/arm64"}); err != nil || im.Digest != armDigest.String() {
		t.Errorf("nested image by digest: %v", err)
	}
	if _, err := ociimage.Open(ctx, mref, ociimage.Options{Platform: "windows/amd64"}); !errors.Is(err, ociimage.ErrPlatform) {
		t.Errorf("windows: %v", err)
	}
}

func TestOCILayoutCorruptBlob(t *testing.T) {
	ctx := context.Background()
	lay := filepath.Join(t.TempDir(), "layout")
	img := ocitest.Build(t, ociimage.Config{}, ocitest.FilesLayer(t, map[string]string{"a": strings.Repeat("data", 1000)}))
	ref := ocitest.WriteLayout(t, lay, "", img)
	ls, _ := img.Layers()
	d, _ := ls[0].Digest()
	blob := filepath.Join(lay, "blobs", d.Algorithm, d.Hex)
	b, err := os.ReadFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-12] ^= 0xff // inside the gzip trailer's CRC or data
	if err := os.WriteFile(blob, b, 0o644); err != nil {
		t.Fatal(err)
	}
	im, err := ociimage.Open(ctx, ref, ociimage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Extract(ctx, t.TempDir(), nil); !errors.Is(err, ociimage.ErrCorrupt) {
		t.Errorf("corrupt blob: %v; want ErrCorrupt", err)
	}
}

func TestDockerArchive(t *testing.T) {
	ctx := context.Background()
	tmp := t.TempDir()
	img := richImage(t)
	ref := ocitest.WriteDockerArchive(t, filepath.Join(tmp, "img.tar"), "example/rich:1.0", img)
	im, err := ociimage.Open(ctx, ref, ociimage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	cn, _ := img.ConfigName()
	if im.Digest != cn.String() {
		t.Errorf("digest %s, want the config digest %s", im.Digest, cn)
	}
	if im.Config.WorkingDir != "/home/user" {
		t.Errorf("config %+v", im.Config)
	}
	var last int64
	dst := t.TempDir()
	if err := im.Extract(ctx, dst, func(d, _ int64) { last = d }); err != nil {
		t.Fatal(err)
	}
	if last != im.Size || im.Size == 0 {
		t.Errorf("progress ended at %d of %d", last, im.Size)
	}
	checkRich(t, dst)

	tagged, err := ociimage.Open(ctx, ref+":example/rich:1.0", ociimage.Options{})
	if err != nil || tagged.Digest != im.Digest {
		t.Errorf("with tag: %v", err)
	}
	if _, err := ociimage.Open(ctx, ref+":example/rich:2.0", ociimage.Options{}); !errors.Is(err, ociimage.ErrNotFound) || !strings.Contains(err.Error(), "example/rich:1.0") {
		t.Errorf("wrong tag: %v; want ErrNotFound listing example/rich:1.0", err)
	}

	// A changed image changes the digest; the same image keeps it.
	other := ocitest.WriteDockerArchive(t, filepath.Join(tmp, "other.tar"), "example/rich:1.0", ocitest.Build(t, ociimage.Config{}, ocitest.FilesLayer(t, map[string]string{"x": "y"})))
	if im2, err := ociimage.Open(ctx, other, ociimage.Options{}); err != nil || im2.Digest == im.Digest {
		t.Errorf("other archive: %v, digest %v", err, im2)
	}
	again := ocitest.WriteDockerArchive(t, filepath.Join(tmp, "again.tar"), "x/y:z", img)
	if im3, err := ociimage.Open(ctx, again, ociimage.Options{}); err != nil || im3.Digest != im.Digest {
		t.Errorf("same image in another archive: %v", err)
	}

	// Corrupt: garbage, and a truncated archive.
	garbage := filepath.Join(tmp, "garbage.tar")
	os.WriteFile(garbage, bytes.Repeat([]byte("not a tar"), 200), 0o644)
	if _, err := ociimage.Open(ctx, "docker-archive:"+garbage, ociimage.Options{}); !errors.Is(err, ociimage.ErrCorrupt) {
		t.Errorf("garbage: %v; want ErrCorrupt", err)
	}
	whole, _ := os.ReadFile(filepath.Join(tmp, "img.tar"))
	trunc := filepath.Join(tmp, "trunc.tar")
	os.WriteFile(trunc, whole[:len(whole)/2], 0o644)
	if im, err := ociimage.Open(ctx, "docker-archive:"+trunc, ociimage.Options{}); err == nil {
		if err := im.Extract(ctx, t.TempDir(), nil); err == nil {
			t.Errorf("truncated archive extracted without error")
		}
	} else if !errors.Is(err, ociimage.ErrCorrupt) {
		t.Errorf("truncated: %v; want ErrCorrupt", err)
	}
	if _, err := ociimage.Open(ctx, "docker-archive:"+filepath.Join(tmp, "missing.tar"), ociimage.Options{}); !errors.Is(err, ociimage.ErrNotFound) {
		t.Errorf("missing archive: %v; want ErrNotFound", err)
	}
}

func TestRegistryErrors(t *testing.T) {
	ctx := context.Background()
	host := ocitest.Registry(t)
	ocitest.Push(t, host, "present:1", ocitest.Build(t, ociimage.Config{}, ocitest.FilesLayer(t, map[string]string{"a": "b"})))
	if _, err := ociimage.Open(ctx, host+"/present:2", ociimage.Options{}); !errors.Is(err, ociimage.ErrNotFound) {
		t.Errorf("unknown tag: %v; want ErrNotFound", err)
	}
	if _, err := ociimage.Open(ctx, host+"/absent:1", ociimage.Options{}); !errors.Is(err, ociimage.ErrNotFound) {
		t.Errorf("unknown repo: %v; want ErrNotFound", err)
	}

	// A port nothing listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	_, err = ociimage.Open(ctx, dead+"/x:1", ociimage.Options{})
	if !errors.Is(err, ociimage.ErrUnreachable) || !strings.Contains(err.Error(), dead) || !strings.Contains(err.Error(), "refused") {
		t.Errorf("dead registry: %v; want ErrUnreachable naming %s and the cause", err, dead)
	}

	// A registry that wants credentials.
	auth := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
		w.WriteHeader(http.StatusUnauthorized)
	}))
	t.Cleanup(auth.Close)
	authHost := strings.TrimPrefix(auth.URL, "http://")
	if _, err := ociimage.Open(ctx, authHost+"/private:1", ociimage.Options{}); !errors.Is(err, ociimage.ErrAuth) {
		t.Errorf("auth: %v; want ErrAuth", err)
	}

	for _, bad := range []string{"ftp://x/y", "containers-storage:foo", "UPPER/Case::x", "oci:"} {
		if _, err := ociimage.Open(ctx, bad, ociimage.Options{}); !errors.Is(err, ociimage.ErrBadRef) {
			t.Errorf("%q: %v; want ErrBadRef", bad, err)
		}
	}
}

func TestMaxBytes(t *testing.T) {
	ctx := context.Background()
	lay := filepath.Join(t.TempDir(), "l")
	ref := ocitest.WriteLayout(t, lay, "", ocitest.Build(t, ociimage.Config{}, ocitest.FilesLayer(t, map[string]string{
		"a": strings.Repeat("a", 4000), "b": strings.Repeat("b", 4000),
	})))
	im, err := ociimage.Open(ctx, ref, ociimage.Options{MaxBytes: 6000})
	if err != nil {
		t.Fatal(err)
	}
	if err := im.Extract(ctx, t.TempDir(), nil); !errors.Is(err, ociimage.ErrTooLarge) {
		t.Errorf("over MaxBytes: %v; want ErrTooLarge", err)
	}
	im, _ = ociimage.Open(ctx, ref, ociimage.Options{MaxBytes: 8000})
	if err := im.Extract(ctx, t.TempDir(), nil); err != nil {
		t.Errorf("at MaxBytes: %v", err)
	}
}

func TestCancelMidExtract(t *testing.T) {
	host := ocitest.Registry(t)
	// 64 files of 1 MiB of poorly compressible bytes.
	files := map[string]string{}
	seed := uint32(1)
	for i := range 64 {
		b := make([]byte, 1<<20)
		for j := range b {
			seed = seed*1664525 + 1013904223
			b[j] = byte(seed >> 24)
		}
		files[filepath.Join("big", string(rune('a'+i/26)), string(rune('a'+i%26)))] = string(b)
	}
	ref := ocitest.Push(t, host, "big:1", ocitest.Build(t, ociimage.Config{}, ocitest.FilesLayer(t, files)))
	im, err := ociimage.Open(context.Background(), ref, ociimage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var seen int64
	start := time.Now()
	err = im.Extract(ctx, t.TempDir(), func(d, tot int64) {
		seen = d
		if d > tot/8 {
			cancel()
		}
	})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("extract after cancel: %v; want context.Canceled", err)
	}
	if seen >= im.Size {
		t.Errorf("read everything (%d of %d) despite cancel", seen, im.Size)
	}
	t.Logf("cancelled after %d of %d bytes, returned in %v", seen, im.Size, time.Since(start))
}

// outsideTree makes a directory beside dst with a file in it, and returns a
// function asserting it is untouched.
func outsideTree(t *testing.T) (string, func()) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "outside")
	if err := os.MkdirAll(out, 0o755); err != nil {
		t.Fatal(err)
	}
	secret := filepath.Join(out, "secret")
	if err := os.WriteFile(secret, []byte("untouched"), 0o600); err != nil {
		t.Fatal(err)
	}
	return out, func() {
		t.Helper()
		ents, err := os.ReadDir(out)
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) != 1 || ents[0].Name() != "secret" {
			var names []string
			for _, e := range ents {
				names = append(names, e.Name())
			}
			t.Errorf("outside dir now holds %v", names)
		}
		if got := readFile(t, secret); got != "untouched" {
			t.Errorf("outside secret = %q", got)
		}
		if st := lstat(t, secret); st.Nlink != 1 || st.Mode&0o7777 != 0o600 || st.Uid != 0 {
			t.Errorf("outside secret: nlink %d mode %o uid %d", st.Nlink, st.Mode&0o7777, st.Uid)
		}
	}
}

func TestMaliciousLayers(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		// layers gets the outside dir (absolute), and the relative path
		// from dst's entries to it.
		layers func(out, rel string) [][]*tar.Header
		// wantErr: the image is refused; otherwise it extracts and the
		// entry is re-rooted inside dst.
		wantErr error
		inside  string // re-rooted: this path inside dst holds the write
	}{
		{name: "dotdot", wantErr: ociimage.ErrUnsafe, layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{file(rel+"/pwned", 0o644, 0, 0)}}
		}},
		{name: "dotdot-in-middle", wantErr: ociimage.ErrUnsafe, layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{dir("a/", 0o755, 0, 0), file("a/../../"+rel+"/pwned", 0o644, 0, 0)}}
		}},
		{name: "absolute", wantErr: ociimage.ErrUnsafe, layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{file(out+"/pwned", 0o644, 0, 0)}}
		}},
		{name: "symlink-abs-then-write", inside: "OUT/pwned", layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{symlink("evil", out)}, {file("evil/pwned", 0o644, 0, 0)}}
		}},
		{name: "symlink-abs-same-layer", inside: "OUT/pwned", layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{symlink("evil", out), file("evil/pwned", 0o644, 0, 0)}}
		}},
		{name: "symlink-rel-then-write", inside: "REL/pwned", layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{symlink("evil", rel)}, {file("evil/pwned", 0o644, 0, 0)}}
		}},
		{name: "symlink-then-overwrite-secret", inside: "OUT/secret", layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{symlink("evil", out)}, {file("evil/secret", 0o777, 1000, 1000)}}
		}},
		{name: "symlink-then-whiteout", layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{symlink("evil", out)}, {file("evil/.wh.secret", 0o644, 0, 0)}}
		}},
		{name: "symlink-then-opaque", layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{symlink("evil", out)}, {file("evil/.wh..wh..opq", 0o644, 0, 0)}}
		}},
		{name: "symlink-then-dir-chmod", layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{symlink("evil", out)}, {dir("evil/", 0o777, 1000, 1000)}}
		}},
		{name: "hardlink-dotdot", wantErr: ociimage.ErrUnsafe, layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{hardlink("hl", rel+"/secret")}}
		}},
		{name: "hardlink-absolute", wantErr: ociimage.ErrUnsafe, layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{hardlink("hl", out+"/secret")}}
		}},
		{name: "hardlink-through-symlink", wantErr: ociimage.ErrCorrupt, layers: func(out, rel string) [][]*tar.Header {
			// Resolved inside dst, where no secret exists: refused, not
			// linked to the host's file.
			return [][]*tar.Header{{symlink("evil", out)}, {hardlink("hl", "evil/secret")}}
		}},
		{name: "hardlink-to-symlink-to-outside", layers: func(out, rel string) [][]*tar.Header {
			// Links the symlink itself, never the file it names.
			return [][]*tar.Header{{symlink("s", out+"/secret"), hardlink("hl", "s")}}
		}},
		{name: "whiteout-dotdot", wantErr: ociimage.ErrUnsafe, layers: func(out, rel string) [][]*tar.Header {
			return [][]*tar.Header{{dir("a/", 0o755, 0, 0)}, {file("a/.wh..", 0o644, 0, 0)}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, check := outsideTree(t)
			dst := filepath.Join(t.TempDir(), "a", "b", "dst")
			if err := os.MkdirAll(dst, 0o755); err != nil {
				t.Fatal(err)
			}
			rel, err := filepath.Rel(dst, out)
			if err != nil {
				t.Fatal(err)
			}
			var layers []v1.Layer
			for _, hs := range tc.layers(out, rel) {
				bodies := make([]string, len(hs))
				for i := range bodies {
					bodies[i] = "pwned"
				}
				layers = append(layers, ocitest.TarLayer(t, hs, bodies))
			}
			lay := filepath.Join(t.TempDir(), "layout")
			ref := ocitest.WriteLayout(t, lay, "", ocitest.Build(t, ociimage.Config{}, layers...))
			im, err := ociimage.Open(ctx, ref, ociimage.Options{})
			if err != nil {
				t.Fatal(err)
			}
			err = im.Extract(ctx, dst, nil)
			check()
			switch {
			case tc.wantErr != nil && !errors.Is(err, tc.wantErr):
				t.Errorf("extract: %v; want %v", err, tc.wantErr)
			case tc.wantErr == nil && err != nil:
				t.Errorf("extract: %v; want it re-rooted inside dst", err)
			case tc.inside != "":
				p := filepath.Join(dst, strings.ReplaceAll(tc.inside, "OUT", strings.TrimPrefix(out, "/")))
				if tc.inside == "REL/pwned" {
					// ".." at the root stays at the root, as in a chroot.
					p = filepath.Join(dst, strings.TrimLeft(strings.ReplaceAll(rel, "../", ""), "/"), "pwned")
				}
				if got := readFile(t, p); got != "pwned" {
					t.Errorf("re-rooted write %s = %q", p, got)
				}
			}
			if err != nil {
				t.Logf("refused: %v", err)
			}
		})
	}
}

func TestImageFromDir(t *testing.T) {
	src := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(src, "etc/sub"), 0o755))
	must(os.WriteFile(filepath.Join(src, "etc/a"), []byte("A"), 0o640))
	must(os.Link(filepath.Join(src, "etc/a"), filepath.Join(src, "etc/a-link")))
	must(os.Symlink("a", filepath.Join(src, "etc/a-sym")))
	must(os.WriteFile(filepath.Join(src, "etc/sub/owned"), []byte("O"), 0o600))
	must(os.Lchown(filepath.Join(src, "etc/sub/owned"), 1000, 1000))
	must(os.WriteFile(filepath.Join(src, "etc/gone"), []byte("G"), 0o600))
	must(unix.Mknod(filepath.Join(src, "etc/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	img := ocitest.ImageFromDir(t, src, ociimage.Config{User: "nobody"},
		map[string]string{"etc/added": "new", "etc/.wh.gone": ""},
		map[string]string{"opt/x/y": "deep"})
	host := ocitest.Registry(t)
	ref := ocitest.Push(t, host, "fromdir", img)
	ctx := context.Background()
	im, err := ociimage.Open(ctx, ref, ociimage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if im.Config.User != "nobody" {
		t.Errorf("user %q", im.Config.User)
	}
	dst := t.TempDir()
	must(im.Extract(ctx, dst, nil))
	if a, l := lstat(t, filepath.Join(dst, "etc/a")), lstat(t, filepath.Join(dst, "etc/a-link")); a.Ino != l.Ino || a.Mode&0o777 != 0o640 {
		t.Errorf("hard link lost or mode %o", a.Mode&0o777)
	}
	if l, _ := os.Readlink(filepath.Join(dst, "etc/a-sym")); l != "a" {
		t.Errorf("symlink -> %q", l)
	}
	if st := lstat(t, filepath.Join(dst, "etc/sub/owned")); st.Uid != 1000 || st.Gid != 1000 {
		t.Errorf("owner %d:%d", st.Uid, st.Gid)
	}
	absent(t, filepath.Join(dst, "etc/gone"))
	absent(t, filepath.Join(dst, "etc/null"))
	if readFile(t, filepath.Join(dst, "etc/added")) != "new" || readFile(t, filepath.Join(dst, "opt/x/y")) != "deep" {
		t.Errorf("extra layers missing")
	}
}

func TestLayerCompressions(t *testing.T) {
	gz := ocitest.TarLayer(t, []*tar.Header{file("gz", 0o644, 0, 0), file("old", 0o644, 0, 0)}, []string{"gzip", "old"})
	zb := ocitest.TarBytes(t, []*tar.Header{file("zst", 0o644, 0, 0)}, []string{"zstd"})
	zst, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(zb)), nil },
		tarball.WithCompression(compression.ZStd), tarball.WithMediaType(types.OCILayerZStd))
	if err != nil {
		t.Fatal(err)
	}
	plain := static.NewLayer(ocitest.TarBytes(t, []*tar.Header{file("plain", 0o644, 0, 0), file(".wh.old", 0, 0, 0)}, []string{"tar", ""}), types.OCIUncompressedLayer)
	host := ocitest.Registry(t)
	ref := ocitest.Push(t, host, "comp", ocitest.Build(t, ociimage.Config{}, gz, zst, plain))
	ctx := context.Background()
	im, err := ociimage.Open(ctx, ref, ociimage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := im.Extract(ctx, dst, nil); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"gz": "gzip", "zst": "zstd", "plain": "tar"} {
		if got := readFile(t, filepath.Join(dst, f)); got != want {
			t.Errorf("%s = %q", f, got)
		}
	}
	absent(t, filepath.Join(dst, "old"))
}
