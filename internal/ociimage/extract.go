package ociimage

import (
	"archive/tar"
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	securejoin "github.com/cyphar/filepath-securejoin"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"
)

// Whiteout names of the OCI layer format.
const (
	whiteoutPrefix = ".wh."
	whiteoutOpaque = ".wh..wh..opq"
	whiteoutMeta   = ".wh..wh." // aufs bookkeeping (.wh..wh.plnk, .wh..wh.aufs): ignored
)

// progressStep is how many bytes Extract reads between progress calls.
const progressStep = 1 << 20

// layerSource is what Open learnt about one layer.
type layerSource struct {
	size   int64  // bytes Extract will read, for progress
	digest string // digest of those bytes, verified at the end of the layer
	// compressed: read the blob (Compressed) and decompress it here, so that
	// progress counts blob bytes; otherwise (a docker-archive layer stored
	// uncompressed, whose Compressed would gzip it) read Uncompressed.
	compressed bool
	// digestUncompressed: digest is of the uncompressed tar (a diff ID, for
	// docker-archive) rather than of the bytes read.
	digestUncompressed bool
}

// hashReader hashes what is read through it.
type hashReader struct {
	io.ReadCloser
	h hash.Hash
}

func (r *hashReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	r.h.Write(p[:n])
	return n, err
}

// Extract writes the image's flattened root filesystem into dst, an existing
// empty directory. It must run as root: owners are kept numerically.
//
// Layers are applied bottom-up, the way Docker and containerd apply them:
// a whiteout deletes what lower layers wrote, an opaque directory drops the
// lower layers' contents of that directory. ggcr's mutate.Extract is not used
// because it walks layers top-down, which breaks hard links whose target an
// upper layer replaced or deleted (the link would miss its target or point at
// the new file).
//
// Safety, for untrusted images: entry names that are absolute or contain a
// ".." element, and hard links whose target name is, are refused (ErrUnsafe).
// Symlinks met in the parent directories of an entry are resolved inside dst
// (scoped with filepath-securejoin, like a chroot: an absolute symlink
// "/etc" in the image means dst/etc), so no entry lands outside dst; the last
// component of an entry is never followed. Device nodes are skipped (a
// sandbox gets its own /dev) and counted in a warning. Of xattrs, user.* and
// security.capability are kept, the rest dropped.
//
// progress, if not nil, is called with the bytes read so far and Size, about
// once per MiB and once at the end. On error or cancellation dst is left
// partly written; the caller removes it.
func (i *Image) Extract(ctx context.Context, dst string, progress func(doneBytes, totalBytes int64)) error {
	root, err := filepath.EvalSymlinks(dst)
	if err != nil {
		return fmt.Errorf("extract %s: %w", i.Ref, err)
	}
	// An image merged into an existing tree would be neither the image nor
	// the tree; refuse rather than guess.
	if ents, err := os.ReadDir(root); err != nil {
		return fmt.Errorf("extract %s: %w", i.Ref, err)
	} else if len(ents) > 0 {
		return fmt.Errorf("extract %s: destination %s is not empty", i.Ref, dst)
	}
	if root, err = filepath.Abs(root); err != nil {
		return fmt.Errorf("extract %s: %w", i.Ref, err)
	}
	img := i.img
	if i.refetch != nil {
		if img, err = i.refetch(ctx); err != nil {
			return fmt.Errorf("extract: %w", err)
		}
	}
	layers, err := img.Layers()
	if err != nil {
		return fmt.Errorf("extract %s: listing layers: %w: %w", i.Ref, ErrCorrupt, err)
	}
	if len(layers) != len(i.layers) {
		return fmt.Errorf("extract %s: %w: %d layers, expected %d", i.Ref, ErrCorrupt, len(layers), len(i.layers))
	}
	x := &extractor{
		root:     root,
		maxBytes: i.opts.MaxBytes,
		dirTimes: map[string]time.Time{},
	}
	// progress is called at most once per progressStep bytes, and at the end.
	var done, told int64
	report := func(n int) {
		done += int64(n)
		if progress != nil && done-told >= progressStep {
			told = done
			progress(min(done, i.Size), i.Size)
		}
	}
	for n, l := range layers {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("extract %s: %w", i.Ref, err)
		}
		if err := x.layer(ctx, l, i.layers[n], report); err != nil {
			via := ""
			if i.Mirror != "" {
				via = " through registry mirror " + i.Mirror
			}
			return fmt.Errorf("extract %s: layer %d (%s)%s: %w", i.Ref, n, i.layers[n].digest, via, err)
		}
	}
	if err := x.finish(); err != nil {
		return fmt.Errorf("extract %s: %w", i.Ref, err)
	}
	if x.devices > 0 {
		i.opts.Logger.Warn("ociimage: skipped device nodes (a sandbox gets its own /dev)", "image", i.Ref, "count", x.devices, "first", x.firstDevice)
	}
	if x.droppedXattrs > 0 {
		i.opts.Logger.Info("ociimage: dropped xattrs other than user.* and security.capability", "image", i.Ref, "count", x.droppedXattrs)
	}
	if progress != nil {
		progress(i.Size, i.Size)
	}
	return nil
}

// countingReader counts and hashes what is read through it, and aborts reads
// once ctx is done.
type countingReader struct {
	ctx    context.Context
	r      io.ReadCloser
	h      hash.Hash
	report func(int)
}

func (c *countingReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	n, err := c.r.Read(p)
	if n > 0 {
		c.h.Write(p[:n])
		c.report(n)
	}
	if err != nil && c.ctx.Err() != nil {
		// The read failed because the context closed the stream.
		return n, c.ctx.Err()
	}
	return n, err
}

func (c *countingReader) Close() error { return c.r.Close() }

// decompress undoes gzip or zstd, told apart by their magic numbers (a
// layer's media type is not trusted, and "compressed" blobs are sometimes
// plain tar). klauspost's decoders are used over the standard library's
// because they are about twice as fast, and they are already in the build
// through ggcr.
func decompress(r io.Reader) (io.ReadCloser, error) {
	br := bufio.NewReaderSize(r, 1<<16)
	magic, err := br.Peek(4)
	if err != nil && !errors.Is(err, io.EOF) {
		return nil, err
	}
	switch {
	case len(magic) >= 2 && magic[0] == 0x1f && magic[1] == 0x8b:
		return gzip.NewReader(br)
	case len(magic) == 4 && magic[0] == 0x28 && magic[1] == 0xb5 && magic[2] == 0x2f && magic[3] == 0xfd:
		d, err := zstd.NewReader(br, zstd.WithDecoderConcurrency(1))
		if err != nil {
			return nil, err
		}
		return d.IOReadCloser(), nil
	}
	return io.NopCloser(br), nil
}

func (x *extractor) layer(ctx context.Context, l v1.Layer, src layerSource, report func(int)) error {
	var raw io.ReadCloser
	var err error
	if src.compressed {
		raw, err = l.Compressed()
	} else {
		raw, err = l.Uncompressed()
	}
	if err != nil {
		return fmt.Errorf("fetching: %w", err)
	}
	defer raw.Close()
	// Closing the stream is what unblocks a read stuck on the network.
	stop := context.AfterFunc(ctx, func() { raw.Close() })
	defer stop()
	cr := &countingReader{ctx: ctx, r: raw, h: sha256.New(), report: report}
	var stream io.ReadCloser = cr
	if src.compressed {
		if stream, err = decompress(cr); err != nil {
			return fmt.Errorf("decompressing: %w: %w", ErrCorrupt, ctxOr(ctx, err))
		}
	}
	defer stream.Close()
	verify := cr.h
	if src.digestUncompressed {
		hr := &hashReader{ReadCloser: stream, h: sha256.New()}
		stream, verify = hr, hr.h
	}
	if err := x.apply(ctx, tar.NewReader(stream)); err != nil {
		return ctxOr(ctx, err)
	}
	// Read what the tar reader left (padding, trailing blocks) so that the
	// whole blob is hashed.
	if _, err := io.Copy(io.Discard, stream); err != nil {
		return fmt.Errorf("reading: %w: %w", ErrCorrupt, ctxOr(ctx, err))
	}
	if _, err := io.Copy(io.Discard, cr); err != nil {
		return fmt.Errorf("reading: %w", ctxOr(ctx, err))
	}
	if want, ok := strings.CutPrefix(src.digest, "sha256:"); ok {
		if got := hex.EncodeToString(verify.Sum(nil)); got != want {
			return fmt.Errorf("%w: content digest sha256:%s does not match %s", ErrCorrupt, got, src.digest)
		}
	}
	return nil
}

// ctxOr prefers the context's error: once it is done, the I/O errors it
// caused (closed body) are noise.
func ctxOr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}

// extractor applies layers to root. Hand-written because no library applies
// OCI layers with these safety rules and without a container runtime (see
// Extract).
type extractor struct {
	root     string
	maxBytes int64
	written  int64
	// dirTimes holds directory mtimes, set at the end because writing into
	// a directory changes its mtime.
	dirTimes map[string]time.Time
	// keep is, within one layer, every host path the layer wrote and all
	// their ancestors: an opaque marker removes the rest of its directory.
	keep   map[string]bool
	opaque []string

	devices       int
	firstDevice   string
	droppedXattrs int
}

func (x *extractor) apply(ctx context.Context, tr *tar.Reader) error {
	x.keep = map[string]bool{}
	x.opaque = x.opaque[:0]
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("reading tar: %w: %w", ErrCorrupt, err)
		}
		if err := x.entry(ctx, tr, h); err != nil {
			return err
		}
	}
	for _, d := range x.opaque {
		if err := x.clearOpaque(d); err != nil {
			return err
		}
	}
	return nil
}

// cleanName validates an archive path and returns it relative to the root
// ("" for the root itself).
func cleanName(name string) (string, error) {
	if strings.HasPrefix(name, "/") {
		return "", fmt.Errorf("%w: absolute path %q", ErrUnsafe, name)
	}
	for _, el := range strings.Split(name, "/") {
		if el == ".." {
			return "", fmt.Errorf("%w: path %q contains \"..\"", ErrUnsafe, name)
		}
	}
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: path %q contains NUL", ErrUnsafe, name)
	}
	c := path.Clean(name)
	if c == "." {
		return "", nil
	}
	return c, nil
}

// resolveParent returns the host path of dir (an archive path), resolving
// symlinks inside root and creating missing directories.
func (x *extractor) resolveParent(dir string) (string, error) {
	if dir == "." || dir == "" {
		return x.root, nil
	}
	p, err := securejoin.SecureJoin(x.root, dir)
	if err != nil {
		return "", fmt.Errorf("resolving %q: %w", dir, err)
	}
	if err := os.MkdirAll(p, 0o755); err != nil {
		return "", fmt.Errorf("creating parent %q: %w", dir, err)
	}
	return p, nil
}

func (x *extractor) markKeep(p string) {
	for p != x.root && !x.keep[p] {
		x.keep[p] = true
		p = filepath.Dir(p)
	}
}

func (x *extractor) entry(ctx context.Context, tr *tar.Reader, h *tar.Header) error {
	name, err := cleanName(h.Name)
	if err != nil {
		return err
	}
	if name == "" {
		return nil // the root: dst keeps the caller's owner and mode
	}
	dir, base := path.Dir(name), path.Base(name)

	if base == whiteoutOpaque {
		x.opaque = append(x.opaque, dir)
		return nil
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil
	}
	if victim, ok := strings.CutPrefix(base, whiteoutPrefix); ok {
		if victim == "" || victim == "." || victim == ".." {
			return fmt.Errorf("%w: whiteout %q", ErrUnsafe, h.Name)
		}
		parent, err := securejoin.SecureJoin(x.root, dir)
		if err != nil {
			return fmt.Errorf("whiteout %q: %w", h.Name, err)
		}
		target := filepath.Join(parent, victim)
		// RemoveAll does not follow a symlink it is given.
		if err := os.RemoveAll(target); err != nil {
			return fmt.Errorf("whiteout %q: %w", h.Name, err)
		}
		return nil
	}

	if h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock {
		if x.devices == 0 {
			x.firstDevice = name
		}
		x.devices++
		return nil
	}

	parent, err := x.resolveParent(dir)
	if err != nil {
		return err
	}
	target := filepath.Join(parent, base)

	// Replace what lower layers left, unless both are directories (then
	// the directory keeps its contents and takes the new metadata).
	if fi, err := os.Lstat(target); err == nil {
		if !(fi.IsDir() && h.Typeflag == tar.TypeDir) {
			if err := os.RemoveAll(target); err != nil {
				return fmt.Errorf("replacing %q: %w", name, err)
			}
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%q: %w", name, err)
	}
	x.markKeep(target)

	switch h.Typeflag {
	case tar.TypeDir:
		if err := os.Mkdir(target, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return fmt.Errorf("mkdir %q: %w", name, err)
		}
	case tar.TypeReg, tar.TypeRegA, tar.TypeGNUSparse:
		if err := x.writeFile(ctx, target, name, tr, h.Size); err != nil {
			return err
		}
	case tar.TypeSymlink:
		if strings.ContainsRune(h.Linkname, 0) {
			return fmt.Errorf("%w: symlink %q target contains NUL", ErrUnsafe, name)
		}
		// The target is kept verbatim: it is read inside the sandbox's root.
		if err := os.Symlink(h.Linkname, target); err != nil {
			return fmt.Errorf("symlink %q: %w", name, err)
		}
	case tar.TypeLink:
		return x.hardlink(target, name, h.Linkname)
	case tar.TypeFifo:
		if err := unix.Mkfifo(target, uint32(h.Mode&0o7777)); err != nil {
			return fmt.Errorf("mkfifo %q: %w", name, err)
		}
	default:
		return fmt.Errorf("%w: %q has unsupported tar type %q", ErrCorrupt, name, string(h.Typeflag))
	}
	return x.metadata(target, name, h)
}

func (x *extractor) writeFile(ctx context.Context, target, name string, r io.Reader, size int64) error {
	if x.maxBytes > 0 && x.written+size > x.maxBytes {
		return fmt.Errorf("%w: more than %d bytes of files (at %q)", ErrTooLarge, x.maxBytes, name)
	}
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("create %q: %w", name, err)
	}
	n, err := io.Copy(f, r)
	x.written += n
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write %q: %w", name, ctxOr(ctx, err))
	}
	return nil
}

func (x *extractor) hardlink(target, name, linkname string) error {
	ln, err := cleanName(linkname)
	if err != nil {
		return fmt.Errorf("hard link %q: %w", name, err)
	}
	if ln == "" {
		return fmt.Errorf("%w: hard link %q to the root", ErrUnsafe, name)
	}
	lp, err := securejoin.SecureJoin(x.root, path.Dir(ln))
	if err != nil {
		return fmt.Errorf("hard link %q: %w", name, err)
	}
	src := filepath.Join(lp, path.Base(ln))
	fi, err := os.Lstat(src)
	if err != nil {
		return fmt.Errorf("%w: hard link %q to %q: target missing: %w", ErrCorrupt, name, linkname, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("%w: hard link %q to directory %q", ErrUnsafe, name, linkname)
	}
	// No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink itself.
	if err := unix.Linkat(unix.AT_FDCWD, src, unix.AT_FDCWD, target, 0); err != nil {
		return fmt.Errorf("hard link %q to %q: %w", name, linkname, err)
	}
	// The inode's owner, mode and times are the target's.
	return nil
}

// metadata sets owner, mode, xattrs and times, in that order: chown clears
// setuid bits and security.capability, so those come after it.
func (x *extractor) metadata(target, name string, h *tar.Header) error {
	if err := os.Lchown(target, h.Uid, h.Gid); err != nil {
		return fmt.Errorf("chown %q: %w", name, err)
	}
	isLink := h.Typeflag == tar.TypeSymlink
	if !isLink {
		if err := unix.Fchmodat(unix.AT_FDCWD, target, uint32(h.Mode&0o7777), 0); err != nil {
			return fmt.Errorf("chmod %q: %w", name, err)
		}
	}
	for k, v := range h.PAXRecords {
		attr, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok {
			continue
		}
		switch {
		case attr == "security.capability" && !isLink,
			strings.HasPrefix(attr, "user.") && !isLink && h.Typeflag != tar.TypeFifo:
			if err := unix.Lsetxattr(target, attr, []byte(v), 0); err != nil {
				return fmt.Errorf("setxattr %q %s: %w", name, attr, err)
			}
		default:
			x.droppedXattrs++
		}
	}
	if h.Typeflag == tar.TypeDir {
		x.dirTimes[target] = h.ModTime
		return nil
	}
	return setTimes(target, h.ModTime)
}

func setTimes(target string, mtime time.Time) error {
	ts := unix.NsecToTimespec(mtime.UnixNano())
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, target, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times %q: %w", target, err)
	}
	return nil
}

// clearOpaque removes from dir (an archive path) whatever this layer did not
// write: the lower layers' contents.
func (x *extractor) clearOpaque(dir string) error {
	p, err := securejoin.SecureJoin(x.root, dir)
	if err != nil {
		return fmt.Errorf("opaque %q: %w", dir, err)
	}
	fi, err := os.Lstat(p)
	if err != nil || !fi.IsDir() {
		return nil // nothing below to hide
	}
	var walk func(string) error
	walk = func(d string) error {
		ents, err := os.ReadDir(d)
		if err != nil {
			return fmt.Errorf("opaque %q: %w", dir, err)
		}
		for _, e := range ents {
			c := filepath.Join(d, e.Name())
			if !x.keep[c] {
				if err := os.RemoveAll(c); err != nil {
					return fmt.Errorf("opaque %q: %w", dir, err)
				}
				continue
			}
			if e.IsDir() {
				if err := walk(c); err != nil {
					return err
				}
			}
		}
		return nil
	}
	return walk(p)
}

// finish sets directory times, now that nothing more is written into them.
func (x *extractor) finish() error {
	for p, t := range x.dirTimes {
		fi, err := os.Lstat(p)
		if err != nil || !fi.IsDir() {
			continue // removed or replaced by a later layer
		}
		if err := setTimes(p, t); err != nil {
			return err
		}
	}
	return nil
}
