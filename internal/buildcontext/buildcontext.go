// Package buildcontext is the build context a template's COPY and ADD read
// from: a host directory opened with os.OpenRoot, so that nothing outside it
// is ever read, through symlinks included.
//
// Sources are resolved here by hand (each symlink read and followed within
// the context) rather than left to os.Root alone, so that a source leaving
// the context is reported as such ("COPY source X is outside the build
// context") instead of as an opaque path error; every read still goes
// through the os.Root, which refuses escapes even if the tree changes while
// we read it.
package buildcontext

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"
	"syscall"
)

var (
	// ErrOutside: a source names something outside the build context.
	ErrOutside = errors.New("outside the build context")
	// ErrNoMatch: a source matches nothing in the build context.
	ErrNoMatch = errors.New("no match")
	// ErrNoSources: COPY/ADD without sources.
	ErrNoSources = errors.New("no source files were specified")
)

// maxLinks bounds symlink resolution, as the kernel's ELOOP does.
const maxLinks = 40

// Context is an open build context directory.
type Context struct {
	root *os.Root
}

// Open opens dir as a build context.
func Open(dir string) (*Context, error) {
	r, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("opening build context: %w", err)
	}
	return &Context{root: r}, nil
}

// Close releases the context's directory.
func (c *Context) Close() error { return c.root.Close() }

// match is one path a source matched.
type match struct {
	src  string      // the source as written
	rel  string      // the resolved path in the context, symlink-free ("." = its root)
	name string      // the name it lands under in a directory destination
	info fs.FileInfo // Lstat of rel (never a symlink)
}

func outside(src string) error { return fmt.Errorf("COPY source %s is %w", src, ErrOutside) }

// matches expands sources (globs with path.Match semantics, as Docker) into
// the context paths they name, in source order and sorted within a glob.
func (c *Context) matches(sources []string) ([]match, error) {
	if len(sources) == 0 {
		return nil, ErrNoSources
	}
	var out []match
	for _, src := range sources {
		if path.IsAbs(src) {
			return nil, outside(src)
		}
		clean := path.Clean(src)
		if clean == ".." || strings.HasPrefix(clean, "../") {
			return nil, outside(src)
		}
		if _, err := path.Match(clean, ""); err != nil {
			return nil, fmt.Errorf("COPY source %s: bad pattern: %w", src, err)
		}
		found, err := c.glob(src, clean)
		if err != nil {
			return nil, err
		}
		if len(found) == 0 {
			return nil, fmt.Errorf("%w for %s in the build context", ErrNoMatch, src)
		}
		out = append(out, found...)
	}
	return out, nil
}

// glob walks pattern one component at a time; a component with wildcards
// is matched against the names of the directory reached so far.
func (c *Context) glob(src, pattern string) ([]match, error) {
	type partial struct{ written, rel string }
	cur := []partial{{".", "."}}
	parts := strings.Split(pattern, "/")
	for i, comp := range parts {
		last := i == len(parts)-1
		var next []partial
		for _, p := range cur {
			var names []string
			if hasMeta(comp) {
				ents, err := c.readDir(p.rel)
				if err != nil {
					continue // not a directory: matches nothing
				}
				for _, e := range ents {
					if ok, _ := path.Match(comp, e.Name()); ok {
						names = append(names, e.Name())
					}
				}
			} else {
				names = []string{unescape(comp)}
			}
			for _, name := range names {
				written := path.Join(p.written, name)
				rel, err := c.resolve(src, path.Join(p.rel, name))
				if errors.Is(err, ErrOutside) {
					return nil, err
				}
				if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
					continue
				}
				if err != nil {
					return nil, fmt.Errorf("COPY source %s: %w", src, err)
				}
				if !last {
					if fi, err := c.root.Lstat(rel); err != nil || !fi.IsDir() {
						continue
					}
				}
				next = append(next, partial{written, rel})
			}
		}
		cur = next
	}
	var out []match
	for _, p := range cur {
		fi, err := c.root.Lstat(p.rel)
		if err != nil {
			return nil, fmt.Errorf("COPY source %s: %w", src, err)
		}
		out = append(out, match{src: src, rel: p.rel, name: path.Base(p.written), info: fi})
	}
	return out, nil
}

func hasMeta(s string) bool { return strings.ContainsAny(s, `*?[\`) }

// unescape drops the backslashes path.Match treats as escapes, for a
// component without wildcards.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func (c *Context) readDir(rel string) ([]fs.DirEntry, error) {
	ents, err := fs.ReadDir(c.root.FS(), rel)
	if err != nil {
		return nil, err
	}
	slices.SortFunc(ents, func(a, b fs.DirEntry) int { return strings.Compare(a.Name(), b.Name()) })
	return ents, nil
}

// resolve follows every symlink in p (including the last component, as
// Docker does for a COPY source) within the context and returns the
// symlink-free path. A link that is absolute or climbs above the context is
// ErrOutside; too many links is ELOOP.
func (c *Context) resolve(src, p string) (string, error) {
	todo := splitPath(p)
	cur := ""
	links := 0
	for len(todo) > 0 {
		name := todo[0]
		todo = todo[1:]
		switch name {
		case "", ".":
			continue
		case "..":
			if cur == "" {
				return "", outside(src)
			}
			cur = parentOf(cur)
			continue
		}
		next := path.Join(cur, name)
		fi, err := c.root.Lstat(next)
		if err != nil {
			return "", err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			links++
			if links > maxLinks {
				return "", fmt.Errorf("%s: %w", next, syscall.ELOOP)
			}
			target, err := c.root.Readlink(next)
			if err != nil {
				return "", err
			}
			if path.IsAbs(target) {
				return "", outside(src)
			}
			todo = append(splitPath(target), todo...)
			continue
		}
		if len(todo) > 0 && !fi.IsDir() {
			return "", fmt.Errorf("%s: %w", next, syscall.ENOTDIR)
		}
		cur = next
	}
	if cur == "" {
		return ".", nil
	}
	return cur, nil
}

func splitPath(p string) []string { return strings.Split(p, "/") }

func parentOf(p string) string {
	d := path.Dir(p)
	if d == "." {
		return ""
	}
	return d
}

// copyable reports the file types COPY takes. Sockets, FIFOs and devices
// are left out: reading a FIFO would block, and a device node must never
// reach a layer (a 0/0 character device in an overlay upper is a whiteout).
func copyable(m fs.FileMode) bool {
	return m.IsRegular() || m.IsDir() || m&fs.ModeSymlink != 0
}

// Digest is a sha256 over what sources match: per source, its text; per
// match, its name and, for every file under it in lexical order, the
// relative name, type, permission bits, and contents or symlink target.
// Owners and times are left out (COPY sets the owner; Docker's cache key
// also ignores times).
func (c *Context) Digest(sources []string) (string, error) {
	ms, err := c.matches(sources)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, m := range ms {
		fmt.Fprintf(h, "match\x00%s\x00%s\x00", m.src, m.name)
		if !copyable(m.info.Mode()) {
			return "", fmt.Errorf("COPY source %s: %s is not a regular file, directory or symlink", m.src, m.rel)
		}
		err := fs.WalkDir(c.root.FS(), m.rel, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if !copyable(fi.Mode()) {
				return nil
			}
			rel := "."
			switch {
			case m.rel == ".":
				rel = p
			case p != m.rel:
				rel = strings.TrimPrefix(p, m.rel+"/")
			}
			fmt.Fprintf(h, "%s\x00%s\x00%o\x00", rel, typeChar(fi.Mode()), modeBits(fi.Mode()))
			switch {
			case fi.Mode().IsRegular():
				fmt.Fprintf(h, "%d\x00", fi.Size())
				return c.hashFile(h, p)
			case fi.Mode()&fs.ModeSymlink != 0:
				target, err := c.root.Readlink(p)
				if err != nil {
					return err
				}
				fmt.Fprintf(h, "%s\x00", target)
			}
			return nil
		})
		if err != nil {
			return "", fmt.Errorf("COPY source %s: %w", m.src, err)
		}
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

func (c *Context) hashFile(w io.Writer, rel string) error {
	f, err := c.openRegular(rel)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(w, f)
	return err
}

// openRegular opens a regular file without following a final symlink and
// without blocking should it have been swapped for a FIFO since we looked.
func (c *Context) openRegular(rel string) (*os.File, error) {
	f, err := c.root.OpenFile(rel, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, fmt.Errorf("%s is no longer a regular file", rel)
	}
	return f, nil
}

func typeChar(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "d"
	case m&fs.ModeSymlink != 0:
		return "l"
	default:
		return "f"
	}
}

// modeBits is the permission part of a mode in Unix octal form.
func modeBits(m fs.FileMode) uint32 {
	b := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// goMode turns Unix octal permission bits into an fs.FileMode for chmod.
func goMode(b uint32) fs.FileMode {
	m := fs.FileMode(b & 0o777)
	if b&0o4000 != 0 {
		m |= fs.ModeSetuid
	}
	if b&0o2000 != 0 {
		m |= fs.ModeSetgid
	}
	if b&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}
