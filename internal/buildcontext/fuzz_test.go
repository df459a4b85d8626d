package buildcontext

import (
	"archive/tar"
	"context"
	"os"
	"path/filepath"
	"testing"
)

// FuzzExtract: ADD of an arbitrary archive never panics and never writes
// outside the upper directory (the sandbox dir holds only ctx, rootfs and
// upper, and rootfs stays as it was).
func FuzzExtract(f *testing.F) {
	seed := func(hdrs []tar.Header, bodies map[string]string) {
		f.Add(tarball(f, hdrs, bodies))
	}
	seed([]tar.Header{{Name: "a/", Typeflag: tar.TypeDir, Mode: 0o755}, {Name: "a/f", Typeflag: tar.TypeReg, Mode: 0o644}}, map[string]string{"a/f": "x"})
	seed([]tar.Header{{Name: "l", Typeflag: tar.TypeSymlink, Linkname: "../../.."}, {Name: "l/x", Typeflag: tar.TypeReg}}, nil)
	seed([]tar.Header{{Name: "f", Typeflag: tar.TypeReg}, {Name: "h", Typeflag: tar.TypeLink, Linkname: "f"}, {Name: "bin/t", Typeflag: tar.TypeReg}}, nil)
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		box := t.TempDir()
		ctxDir, rootfs, upper := filepath.Join(box, "ctx"), filepath.Join(box, "rootfs"), filepath.Join(box, "upper")
		for _, d := range []string{ctxDir, filepath.Join(rootfs, "usr/bin"), upper} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.Symlink("usr/bin", filepath.Join(rootfs, "bin")); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(ctxDir, "a.tar"), data, 0o644); err != nil {
			t.Fatal(err)
		}
		c, err := Open(ctxDir)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		_ = c.CopyInto(context.Background(), addStep("/opt/", "a.tar"), rootfs, upper)
		ents, _ := os.ReadDir(box)
		if len(ents) != 3 {
			t.Fatalf("wrote outside upper: %v", ents)
		}
		var inRootfs []string
		filepath.WalkDir(rootfs, func(p string, d os.DirEntry, err error) error {
			inRootfs = append(inRootfs, p)
			return nil
		})
		if len(inRootfs) != 4 { // rootfs, bin, usr, usr/bin
			t.Fatalf("rootfs changed: %v", inRootfs)
		}
	})
}
