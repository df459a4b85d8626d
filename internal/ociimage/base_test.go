package ociimage_test

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestBaseRootfsRoundTrip turns the built base template (~300 MB) into an
// image, serves it from the in-process registry, extracts it, and compares
// the result with the original tree: the path the template builder takes for
// `FROM <registry>/<image>`. It logs the timings.
func TestBaseRootfsRoundTrip(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: skips the 300 MB round trip")
	}
	testenv.NeedRoot(t)
	src := testenv.BaseRootfs(t)
	ctx := context.Background()

	start := time.Now()
	img := ocitest.ImageFromDir(t, src, ociimage.Config{Env: []string{"PATH=/usr/bin:/bin"}})
	tImage := time.Since(start)

	host := ocitest.Registry(t)
	start = time.Now()
	ref := ocitest.Push(t, host, "base", img)
	tPush := time.Since(start)

	start = time.Now()
	im, err := ociimage.Open(ctx, ref, ociimage.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tOpen := time.Since(start)

	dst := t.TempDir()
	start = time.Now()
	if err := im.Extract(ctx, dst, nil); err != nil {
		t.Fatal(err)
	}
	tExtract := time.Since(start)

	// Baseline in the same run: a plain copy of the tree.
	start = time.Now()
	if out, err := exec.Command("cp", "-a", src, filepath.Join(t.TempDir(), "copy")).CombinedOutput(); err != nil {
		t.Fatalf("cp -a: %v: %s", err, out)
	}
	tCopy := time.Since(start)
	t.Logf("base rootfs: image from dir %v, push %v, open %v, extract %v (%d MB compressed); baseline cp -a %v",
		tImage.Round(time.Millisecond), tPush.Round(time.Millisecond), tOpen.Round(time.Millisecond),
		tExtract.Round(time.Millisecond), im.Size>>20, tCopy.Round(time.Millisecond))

	compareTrees(t, src, dst)
}

// compareTrees checks that every entry of want exists in got with the same
// type, mode, owner, size, mtime (non-directories), link target and content,
// device nodes excepted, and that got holds nothing more.
func compareTrees(t *testing.T, want, got string) {
	t.Helper()
	n := 0
	seen := map[string]bool{}
	links := map[uint64]uint64{} // source inode -> extracted inode
	err := filepath.WalkDir(want, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(want, p)
		if rel == "." {
			return nil
		}
		var ws, gs syscall.Stat_t
		if err := syscall.Lstat(p, &ws); err != nil {
			return err
		}
		if ws.Mode&syscall.S_IFMT == syscall.S_IFCHR || ws.Mode&syscall.S_IFMT == syscall.S_IFBLK {
			return nil
		}
		seen[rel] = true
		n++
		q := filepath.Join(got, rel)
		if err := syscall.Lstat(q, &gs); err != nil {
			t.Errorf("%s: %v", rel, err)
			return nil
		}
		if ws.Mode != gs.Mode || ws.Uid != gs.Uid || ws.Gid != gs.Gid {
			t.Errorf("%s: mode %o uid %d gid %d, want %o %d %d", rel, gs.Mode, gs.Uid, gs.Gid, ws.Mode, ws.Uid, ws.Gid)
		}
		switch ws.Mode & syscall.S_IFMT {
		case syscall.S_IFDIR:
			if ws.Mtim.Sec != gs.Mtim.Sec {
				t.Errorf("%s: dir mtime %d want %d", rel, gs.Mtim.Sec, ws.Mtim.Sec)
			}
		case syscall.S_IFLNK:
			wl, _ := os.Readlink(p)
			gl, _ := os.Readlink(q)
			if wl != gl {
				t.Errorf("%s: -> %q want %q", rel, gl, wl)
			}
		case syscall.S_IFREG:
			if ws.Size != gs.Size || ws.Mtim.Sec != gs.Mtim.Sec {
				t.Errorf("%s: size %d mtime %d, want %d %d", rel, gs.Size, gs.Mtim.Sec, ws.Size, ws.Mtim.Sec)
			}
			// Template layers share files with other layers by hard links, so a
			// source file's link count says nothing about the image; what must
			// hold is that names sharing an inode in the tree share one after.
			if first, ok := links[ws.Ino]; ok {
				if first != gs.Ino {
					t.Errorf("%s: not hard-linked to its earlier name as in the source", rel)
				}
			} else {
				links[ws.Ino] = gs.Ino
			}
			wb, err1 := os.ReadFile(p)
			gb, err2 := os.ReadFile(q)
			if err1 != nil || err2 != nil || !bytes.Equal(wb, gb) {
				t.Errorf("%s: content differs (%v %v)", rel, err1, err2)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	extra := 0
	filepath.WalkDir(got, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(got, p)
		if rel != "." && !seen[rel] {
			extra++
			if extra < 5 {
				t.Errorf("extra entry %s", rel)
			}
		}
		return nil
	})
	t.Logf("compared %d entries", n)
}
