package buildcontext

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/bzip2"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"

	"github.com/ulikunitz/xz"
)

// decompress wraps r by its content's magic number, as Docker detects
// ADD archives by content and not by name.
func decompress(r io.Reader) (io.Reader, error) {
	br := bufio.NewReader(r)
	head, _ := br.Peek(6)
	switch {
	case bytes.HasPrefix(head, []byte{0x1f, 0x8b}):
		return gzip.NewReader(br)
	case bytes.HasPrefix(head, []byte("BZh")):
		return bzip2.NewReader(br), nil
	case bytes.HasPrefix(head, []byte{0xfd, '7', 'z', 'X', 'Z', 0x00}):
		return xz.NewReader(br)
	}
	return br, nil
}

// isArchive reports whether the context file rel is a tar archive (plain,
// gzip, bzip2 or xz): ADD extracts those and copies anything else as is.
func (c *Context) isArchive(rel string) (bool, error) {
	f, err := c.openRegular(rel)
	if err != nil {
		return false, err
	}
	defer f.Close()
	r, err := decompress(f)
	if err != nil {
		return false, nil // compressed-looking but not: a plain file
	}
	_, err = tar.NewReader(r).Next()
	return err == nil, nil
}

// extract unpacks the archive m into the upper directory dest. Entries may
// not leave dest: absolute names, names climbing out with "..", and names
// (or hard-link targets) passing through a symlink the archive itself made
// are refused. Symlinks already in rootfs are followed, scoped to rootfs,
// as for COPY (an archive of bin/... into / fills usr/bin).
//
// Ownership and modes come from the archive unless --chown/--chmod are
// given. Device nodes and FIFOs are skipped: a sandbox gets its own /dev,
// and a 0/0 character device in an overlay upper is a whiteout.
func (w *writer) extract(m match, dest string) error {
	f, err := w.c.openRegular(m.rel)
	if err != nil {
		return fmt.Errorf("ADD %s: %w", m.src, err)
	}
	defer f.Close()
	r, err := decompress(f)
	if err != nil {
		return fmt.Errorf("ADD %s: %w", m.src, err)
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("ADD %s: refusing archive: %s", m.src, fmt.Sprintf(format, args...))
	}
	links := map[string]bool{}     // archive paths that are symlinks
	written := map[string]string{} // archive path -> upper path, for hard links
	// checkName validates an archive path and returns it clean and relative
	// to dest ("" for dest itself).
	checkName := func(what, name string) (string, error) {
		if strings.HasPrefix(name, "/") {
			return "", bad("%s %q is an absolute path", what, name)
		}
		p := path.Clean(name)
		if p == ".." || strings.HasPrefix(p, "../") {
			return "", bad("%s %q leaves the destination", what, name)
		}
		if p == "." {
			return "", nil
		}
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if links[d] {
				return "", bad("%s %q passes through the archive's symlink %q", what, name, d)
			}
		}
		return p, nil
	}
	tr := tar.NewReader(r)
	for {
		if err := w.ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("ADD %s: reading archive: %w", m.src, err)
		}
		p, err := checkName("entry", h.Name)
		if err != nil {
			return err
		}
		if p == "" {
			continue // the archive's root: dest exists already
		}
		uid, gid := h.Uid, h.Gid
		if w.chown {
			uid, gid = w.uid, w.gid
		}
		mode := goMode(uint32(h.Mode & 0o7777))
		if w.chmod != nil {
			mode = *w.chmod
		}
		parent, err := w.resolve("/" + path.Join(dest, path.Dir(p)))
		if err != nil {
			return err
		}
		if err := w.ensureDir(parent, nil); err != nil {
			return err
		}
		target := path.Join(parent, path.Base(p))
		delete(links, p)
		switch h.Typeflag {
		case tar.TypeDir:
			d, err := w.resolve("/" + path.Join(dest, p))
			if err != nil {
				return err
			}
			exists, err := w.isDir(d)
			if err != nil {
				return err
			}
			if !exists {
				if err := w.ensureDir(path.Dir(d), nil); err != nil {
					return err
				}
				if err := w.mkdir(d, mode, uid, gid, h.ModTime); err != nil {
					return err
				}
			}
		case tar.TypeReg:
			if err := w.clearTarget(target); err != nil {
				return err
			}
			if err := w.writeFile(target, tr, mode, uid, gid, h.ModTime); err != nil {
				return err
			}
			written[p] = target
		case tar.TypeSymlink:
			if err := w.clearTarget(target); err != nil {
				return err
			}
			if err := w.symlink(h.Linkname, target, uid, gid, h.ModTime); err != nil {
				return err
			}
			links[p] = true
			written[p] = target
		case tar.TypeLink:
			old, err := checkName("hard link target", h.Linkname)
			if err != nil {
				return err
			}
			src, ok := written[old]
			if !ok || old == "" {
				return bad("hard link %q points to %q, which is not an earlier file of the archive", h.Name, h.Linkname)
			}
			if err := w.clearTarget(target); err != nil {
				return err
			}
			if err := w.up.Link(src, target); err != nil {
				return fmt.Errorf("ADD %s: %w", m.src, err)
			}
			written[p] = target
		case tar.TypeChar, tar.TypeBlock, tar.TypeFifo:
			// Skipped (see above).
		default:
			return fmt.Errorf("ADD %s: archive entry %q has an unsupported type %q", m.src, h.Name, h.Typeflag)
		}
	}
	return nil
}
