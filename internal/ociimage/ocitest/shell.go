package ocitest

import (
	"archive/tar"
	"debug/elf"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
)

// ShellImage is a small image (a few MB) in which a build step can run: /bin/sh
// and the programs named (paths inside rootfs, e.g. "/bin/cat"), each with the
// shared libraries and dynamic loader it needs, copied from rootfs (the built
// base template's, a Debian tree), plus a root-only /etc/passwd and /etc/group,
// /tmp, and files (path → content, as FilesLayer's, in the same layer). The
// host has no static busybox to use instead, and the whole base rootfs as an
// image costs seconds to push and extract.
func ShellImage(t testing.TB, rootfs string, cfg ociimage.Config, programs []string, files map[string]string) v1.Image {
	t.Helper()
	c := &treeCopy{root: rootfs, entries: map[string]*tar.Header{}, bodies: map[string]string{}}
	for _, p := range append([]string{"/bin/sh"}, programs...) {
		if err := c.program(p); err != nil {
			t.Fatalf("ocitest: shell image: %v", err)
		}
	}
	all := map[string]string{
		"etc/passwd": "root:x:0:0:root:/root:/bin/sh\n",
		"etc/group":  "root:x:0:\n",
	}
	for n, v := range files {
		all[n] = v
	}
	for n, v := range all {
		for d := path.Dir(n); d != "." && c.entries[d] == nil; d = path.Dir(d) {
			c.entries[d] = &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}
		}
		c.entries[n] = &tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644}
		c.bodies[n] = v
	}
	for _, d := range []string{"tmp", "root"} {
		if c.entries[d] == nil {
			c.entries[d] = &tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}
		}
	}
	c.entries["tmp"].Mode = 0o1777
	names := make([]string, 0, len(c.entries))
	for n := range c.entries {
		names = append(names, n)
	}
	sort.Strings(names) // parents first
	hs := make([]*tar.Header, len(names))
	bodies := make([]string, len(names))
	for i, n := range names {
		hs[i], bodies[i] = c.entries[n], c.bodies[n]
	}
	return Build(t, cfg, TarLayer(t, hs, bodies))
}

// treeCopy collects entries of a tree by path (relative, no trailing '/').
type treeCopy struct {
	root    string
	entries map[string]*tar.Header
	bodies  map[string]string
	done    map[string]bool
}

// program adds the file at p (absolute inside root) and, for an ELF file, its
// loader and DT_NEEDED libraries, recursively.
func (c *treeCopy) program(p string) error {
	if c.done == nil {
		c.done = map[string]bool{}
	}
	rel, err := c.add(p, 0)
	if err != nil {
		return err
	}
	if c.done[rel] {
		return nil
	}
	c.done[rel] = true
	f, err := elf.Open(filepath.Join(c.root, rel))
	if err != nil {
		return nil // a script or data file: nothing to follow
	}
	defer f.Close()
	var deps []string
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			b := make([]byte, prog.Filesz)
			if _, err := prog.ReadAt(b, 0); err != nil {
				return fmt.Errorf("%s: interpreter: %w", p, err)
			}
			deps = append(deps, strings.TrimRight(string(b), "\x00"))
		}
	}
	libs, err := f.ImportedLibraries()
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	for _, l := range libs {
		found := ""
		for _, dir := range c.libDirs() {
			if _, err := os.Stat(filepath.Join(c.root, dir, l)); err == nil {
				found = "/" + path.Join(dir, l)
				break
			}
		}
		if found == "" {
			return fmt.Errorf("%s needs %s, not found under %s", p, l, c.root)
		}
		deps = append(deps, found)
	}
	for _, d := range deps {
		if err := c.program(d); err != nil {
			return err
		}
	}
	return nil
}

func (c *treeCopy) libDirs() []string {
	dirs, _ := filepath.Glob(filepath.Join(c.root, "usr/lib/*-linux-gnu"))
	out := []string{}
	for _, d := range dirs {
		rel, _ := filepath.Rel(c.root, d)
		out = append(out, filepath.ToSlash(rel))
	}
	return append(out, "usr/lib", "lib64", "usr/lib64")
}

// add adds p's parents, symlinks met on the way (followed inside root) and p
// itself, and returns the path of the file it ends at.
func (c *treeCopy) add(p string, depth int) (string, error) {
	if depth > 16 {
		return "", fmt.Errorf("%s: too many symlinks", p)
	}
	parts := strings.Split(strings.Trim(path.Clean("/"+p), "/"), "/")
	cur := ""
	for i, part := range parts {
		next := path.Join(cur, part)
		fi, err := os.Lstat(filepath.Join(c.root, next))
		if err != nil {
			return "", err
		}
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(filepath.Join(c.root, next))
			if err != nil {
				return "", err
			}
			c.entries[next] = &tar.Header{Typeflag: tar.TypeSymlink, Name: next, Linkname: target, Mode: 0o777}
			if !path.IsAbs(target) {
				target = path.Join("/", cur, target)
			}
			return c.add(path.Join(append([]string{target}, parts[i+1:]...)...), depth+1)
		case fi.IsDir():
			if c.entries[next] == nil {
				c.entries[next] = &tar.Header{Typeflag: tar.TypeDir, Name: next + "/", Mode: int64(fi.Mode().Perm())}
			}
		default:
			if i != len(parts)-1 {
				return "", fmt.Errorf("%s: %s is not a directory", p, next)
			}
			b, err := os.ReadFile(filepath.Join(c.root, next))
			if err != nil {
				return "", err
			}
			c.entries[next] = &tar.Header{Typeflag: tar.TypeReg, Name: next, Mode: int64(fi.Mode().Perm())}
			c.bodies[next] = string(b)
		}
		cur = next
	}
	return cur, nil
}
