package tplbuild

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
)

// DefaultMaxUpload bounds one uploaded archive (the SDK gzips it).
const DefaultMaxUpload = 1 << 30

// DefaultMaxContext bounds what one build's uploads may unpack to together,
// so a small gzip bomb cannot fill the data dir.
const DefaultMaxContext = 4 << 30

// ErrTooLarge is an upload beyond the limit (413 on the wire).
var ErrTooLarge = errors.New("upload too large")

// files keeps uploads content-addressed by the SDK's hash, apart per API key:
// <dir>/<owner>/<hash>. Apart, because "present" for a hash would otherwise
// tell one key that another uploaded those exact files. The bytes cannot be checked against the hash when they arrive, because the
// SDK's hash also covers the COPY's src and dest, which only the build
// request carries; they are checked when a build uses them (extract).
type files struct {
	dir string
	max int64
}

// operatorFiles holds the uploads of builds without an owner (in-process
// callers); owners are [a-z0-9] (OwnerOf digests are hex), so it names no
// key's directory.
const operatorFiles = "_operator"

// ownerDir is the directory of owner's uploads; owner is an OwnerOf digest.
func (f files) ownerDir(owner string) (string, error) {
	if owner == "" {
		return filepath.Join(f.dir, operatorFiles), nil
	}
	for _, c := range owner {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'z') || len(owner) > 64 {
			return "", fmt.Errorf("%w: upload owner %q is not a key digest", ErrInvalid, owner)
		}
	}
	return filepath.Join(f.dir, owner), nil
}

func (f files) path(owner, hash string) string {
	d, err := f.ownerDir(owner)
	if err != nil {
		return filepath.Join(f.dir, operatorFiles, ".invalid") // never a file
	}
	return filepath.Join(d, hash)
}

func (f files) present(owner, hash string) bool {
	st, err := os.Stat(f.path(owner, hash))
	return err == nil && st.Mode().IsRegular()
}

// put stores r under hash: to a temp file first, renamed into place once
// whole and synced, so a present hash is never a partial upload.
func (f files) put(owner, hash string, r io.Reader) error {
	if !ValidHash(hash) {
		return fmt.Errorf("%w: files hash %q is not a hex sha256", ErrInvalid, hash)
	}
	dir, err := f.ownerDir(owner)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("uploads dir: %w", err)
	}
	tmp, err := os.CreateTemp(dir, ".tmp-"+hash+"-*")
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op once renamed
	defer tmp.Close()
	n, err := io.Copy(tmp, io.LimitReader(r, f.max+1))
	if err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	if n > f.max {
		return fmt.Errorf("%w: more than %d bytes", ErrTooLarge, f.max)
	}
	if n == 0 {
		return fmt.Errorf("%w: empty upload", ErrInvalid)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(dir, hash)); err != nil {
		return fmt.Errorf("upload: %w", err)
	}
	return nil
}

// entry is one archive member as the SDK's hash sees it.
type entry struct {
	rel    string // relative posix path, as the SDK hashes it
	mode   int64  // st_mode: type bits | permission bits
	size   int64
	link   string // symlink target
	isDir  bool
	isFile bool
}

const (
	sIFREG = 0o100000
	sIFDIR = 0o040000
	sIFLNK = 0o120000
)

// extract unpacks the upload for hash into dst (created) and checks the bytes
// against the hash the way the SDK computes it (calculateFilesHash in the npm
// package): sha256 of "COPY <src> <dest>", then for every file in path order
// its relative path, mode and size as decimal text, and a file's content or a
// symlink's target. A mismatch removes the upload (so the SDK uploads again on
// a retry) and is ErrInvalid.
//
// A directory's size in that hash is the client filesystem's st_size, which
// no archive carries. Archives without directories are checked exactly; for
// the others the usual sizes are tried (4096: ext4, xfs and most others;
// btrfs's sum of name lengths), and when none matches verified is false: the
// files are used, and the build log says they were not verified.
//
// budget is what the archive may unpack to (the build's context bound less
// what its other uploads took); size is what it did.
func (f files) extract(ctx context.Context, owner string, c Copy, dst string, budget int64) (verified bool, size int64, err error) {
	src, err := os.Open(f.path(owner, c.Hash))
	if errors.Is(err, fs.ErrNotExist) {
		return false, 0, fmt.Errorf("%w: step %d: files %s (COPY %s) were never uploaded", ErrInvalid, c.Step, c.Hash, c.Src)
	}
	if err != nil {
		return false, 0, fmt.Errorf("open upload: %w", err)
	}
	defer src.Close()
	entries, size, err := untar(ctx, src, dst, budget)
	if errors.Is(err, ErrTooLarge) {
		_ = os.RemoveAll(dst)
		return false, 0, fmt.Errorf("step %d: COPY %s: %w", c.Step, c.Src, err)
	}
	if err != nil {
		_ = os.RemoveAll(dst)
		f.drop(owner, c.Hash)
		return false, 0, fmt.Errorf("%w: step %d: files %s: %w", ErrInvalid, c.Step, c.Hash, err)
	}
	ok, exact, err := matchHash(c, entries, dst)
	if err != nil {
		_ = os.RemoveAll(dst)
		return false, 0, err
	}
	if !ok && exact {
		_ = os.RemoveAll(dst)
		f.drop(owner, c.Hash)
		return false, 0, fmt.Errorf("%w: step %d: the files uploaded for COPY %s %s do not match their hash %s", ErrInvalid, c.Step, c.Src, c.Dest, c.Hash)
	}
	if err := linkSource(c, entries); err != nil {
		_ = os.RemoveAll(dst)
		return false, 0, err
	}
	return ok, size, nil
}

// linkSource refuses a COPY whose source, named without a pattern, is a
// symlink in the upload (the SDK's copy of a link without resolveSymlinks).
// E2B's builder copies the link itself; Airlock's COPY follows a source
// link, as Docker's does, and what the link points to is not in the upload
// (the SDK packs the link alone), so the build would fail on "no match".
// A link inside a copied directory, or matched by a pattern, is copied as a
// link (see Convert) and is fine.
func linkSource(c Copy, entries []entry) error {
	src := path.Clean(c.Src)
	if _, pattern := globBase(src); pattern {
		return nil
	}
	for _, e := range entries {
		if e.rel == src && e.link != "" && !e.isFile && !e.isDir {
			return fmt.Errorf("%w: step %d: COPY %s: the source is a symlink (to %s), which Airlock's COPY would follow, and its target was not uploaded; copy it with resolveSymlinks: true, or copy the directory that holds it", ErrInvalid, c.Step, c.Src, e.link)
		}
	}
	return nil
}

func (f files) drop(owner, hash string) { _ = os.Remove(f.path(owner, hash)) }

// matchHash recomputes the SDK's hash; exact says whether the archive held
// everything the hash covers (no directories).
// File contents are read back from dir, where the archive was extracted, in
// the SDK's order rather than the archive's.
func matchHash(c Copy, entries []entry, dir string) (ok, exact bool, err error) {
	sort.Slice(entries, func(i, j int) bool { return entries[i].rel < entries[j].rel })
	hasDir := false
	for _, e := range entries {
		hasDir = hasDir || e.isDir
	}
	sizes := []func(e entry) int64{func(entry) int64 { return 4096 }}
	if hasDir {
		sizes = append(sizes, func(e entry) int64 { return btrfsDirSize(e, entries) })
	}
	for _, dirSize := range sizes {
		sum, err := filesHash(c, entries, dirSize, dir)
		if err != nil {
			return false, false, err
		}
		if hex.EncodeToString(sum) == c.Hash {
			return true, true, nil
		}
	}
	return false, !hasDir, nil
}

func filesHash(c Copy, entries []entry, dirSize func(entry) int64, dir string) ([]byte, error) {
	h := sha256.New()
	io.WriteString(h, "COPY "+c.Src+" "+c.Dest)
	for _, e := range entries {
		io.WriteString(h, e.rel)
		size := e.size
		if e.isDir {
			size = dirSize(e)
		}
		io.WriteString(h, strconv.FormatInt(e.mode, 10))
		io.WriteString(h, strconv.FormatInt(size, 10))
		switch {
		case e.link != "" && !e.isFile && !e.isDir:
			io.WriteString(h, e.link)
		case e.isFile:
			if err := hashFile(h, filepath.Join(dir, filepath.FromSlash(e.rel))); err != nil {
				return nil, err
			}
		}
	}
	return h.Sum(nil), nil
}

func hashFile(w io.Writer, name string) error {
	// O_NOFOLLOW: the entry is a regular file the archive made; a symlink
	// there now would be the archive replacing it, which untar refuses.
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("hash %s: %w", name, err)
	}
	defer f.Close()
	if _, err := io.Copy(w, f); err != nil {
		return fmt.Errorf("hash %s: %w", name, err)
	}
	return nil
}

// btrfsDirSize is st_size of a btrfs directory: twice the sum of its
// entries' name lengths (each name is indexed twice).
func btrfsDirSize(dir entry, all []entry) int64 {
	var n int64
	prefix := dir.rel + "/"
	for _, e := range all {
		if rest, ok := strings.CutPrefix(e.rel, prefix); ok && !strings.Contains(rest, "/") {
			n += 2 * int64(len(rest))
		}
	}
	return n
}

// untar unpacks a tar or gzipped tar into dst. Only regular files,
// directories and symlinks are taken; names must stay inside dst, and
// writes go through an os.Root so no symlink of the archive can lead out.
func untar(ctx context.Context, r io.Reader, dst string, budget int64) ([]entry, int64, error) {
	br := bufio.NewReader(r)
	var rd io.Reader = br
	if head, _ := br.Peek(2); bytes.Equal(head, []byte{0x1f, 0x8b}) {
		gz, err := gzip.NewReader(br)
		if err != nil {
			return nil, 0, fmt.Errorf("gzip: %w", err)
		}
		defer gz.Close()
		rd = gz
	}
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return nil, 0, fmt.Errorf("extract: %w", err)
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return nil, 0, fmt.Errorf("extract: %w", err)
	}
	defer root.Close()
	tr := tar.NewReader(rd)
	var out []entry
	var total int64
	seen := map[string]bool{}
	for {
		if err := ctx.Err(); err != nil {
			return nil, 0, err
		}
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, 0, fmt.Errorf("not a tar archive: %w", err)
		}
		name := strings.TrimSuffix(strings.TrimPrefix(hdr.Name, "./"), "/")
		clean := path.Clean(name)
		if name == "" || clean != name || path.IsAbs(name) || clean == ".." || strings.HasPrefix(clean, "../") {
			return nil, 0, fmt.Errorf("archive entry %q is outside the context", hdr.Name)
		}
		if seen[name] {
			return nil, 0, fmt.Errorf("archive entry %q appears twice", hdr.Name)
		}
		seen[name] = true
		perm := hdr.Mode & 0o7777
		e := entry{rel: name}
		if err := mkParents(root, name); err != nil {
			return nil, 0, err
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			e.isDir, e.mode = true, sIFDIR|perm
			if err := root.Mkdir(name, 0o755); err != nil && !errors.Is(err, fs.ErrExist) {
				return nil, 0, fmt.Errorf("extract %s: %w", name, err)
			}
			if err := root.Chmod(name, fs.FileMode(perm)&fs.ModePerm|0o700); err != nil {
				return nil, 0, fmt.Errorf("extract %s: %w", name, err)
			}
		case tar.TypeReg:
			total += hdr.Size
			if total > budget {
				return nil, 0, fmt.Errorf("%w: the build context unpacks to more than %d bytes, the server's bound for one build (serve --build-context-max)", ErrTooLarge, budget)
			}
			e.isFile, e.mode, e.size = true, sIFREG|perm, hdr.Size
			w, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, fs.FileMode(perm)&fs.ModePerm|0o600)
			if err != nil {
				return nil, 0, fmt.Errorf("extract %s: %w", name, err)
			}
			_, err = io.Copy(w, tr)
			w.Close()
			if err != nil {
				return nil, 0, fmt.Errorf("extract %s: %w", name, err)
			}
			if err := root.Chmod(name, fs.FileMode(perm)&fs.ModePerm); err != nil {
				return nil, 0, fmt.Errorf("extract %s: %w", name, err)
			}
		case tar.TypeSymlink:
			e.mode, e.link, e.size = sIFLNK|0o777, hdr.Linkname, int64(len(hdr.Linkname))
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return nil, 0, fmt.Errorf("extract %s: %w", name, err)
			}
		default:
			return nil, 0, fmt.Errorf("archive entry %q: type %q is not a file, directory or symlink", hdr.Name, hdr.Typeflag)
		}
		out = append(out, e)
	}
	if len(out) == 0 {
		return nil, 0, errors.New("the archive is empty")
	}
	return out, total, nil
}

// mkParents makes name's parent directories inside root (an archive need not
// list them).
func mkParents(root *os.Root, name string) error {
	dir := path.Dir(name)
	if dir == "." {
		return nil
	}
	if err := root.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("extract %s: %w", name, err)
	}
	return nil
}
