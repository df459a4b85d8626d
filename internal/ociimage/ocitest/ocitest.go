// Package ocitest makes OCI images for tests and serves them from an
// in-process registry on 127.0.0.1, or writes them as an OCI layout directory
// or a docker-archive tarball. Nothing here talks to a public registry.
package ocitest

import (
	"archive/tar"
	"bytes"
	"io"
	"io/fs"
	"log"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"syscall"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	// klauspost's gzip writes about twice as fast as the standard library's,
	// which matters for a rootfs of hundreds of MB.
	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
)

// ImageFromDir returns an image whose first layer is the tree at dir (owners,
// modes, times, symlinks, hard links, device nodes and security.capability /
// user.* xattrs as on disk), with cfg as its config, for the host's platform.
// Each extra map adds one layer of small files: path (relative, '/'
// separated) → content, mode 0644, owned by root; missing parent directories
// are implied. A name ".wh.x" whites out x, and "d/.wh..wh..opq" makes d
// opaque.
//
// The tree is written once as a gzip'd tar into a temporary file (not held in
// memory), so a rootfs of hundreds of MB is fine.
func ImageFromDir(t testing.TB, dir string, cfg ociimage.Config, extra ...map[string]string) v1.Image {
	t.Helper()
	blob := filepath.Join(t.TempDir(), "layer.tar.gz")
	f, err := os.Create(blob)
	if err != nil {
		t.Fatal(err)
	}
	zw, err := gzip.NewWriterLevel(f, gzip.BestSpeed)
	if err != nil {
		t.Fatal(err)
	}
	if err := WriteTree(zw, dir); err != nil {
		t.Fatalf("ocitest: tar of %s: %v", dir, err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	base, err := tarball.LayerFromFile(blob)
	if err != nil {
		t.Fatal(err)
	}
	layers := []v1.Layer{base}
	for _, files := range extra {
		layers = append(layers, FilesLayer(t, files))
	}
	return Build(t, cfg, layers...)
}

// Build makes an image of layers (bottom first) with cfg as its config, for
// the host's platform.
func Build(t testing.TB, cfg ociimage.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	return BuildFor(t, goruntime.GOOS+"/"+goruntime.GOARCH, cfg, layers...)
}

// BuildFor is Build for another platform ("linux/arm64").
func BuildFor(t testing.TB, platform string, cfg ociimage.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	p, err := v1.ParsePlatform(platform)
	if err != nil {
		t.Fatal(err)
	}
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.OS, p.Architecture, p.Variant
	cf.Config.Env = cfg.Env
	cf.Config.User = cfg.User
	cf.Config.WorkingDir = cfg.WorkingDir
	cf.Config.Entrypoint = cfg.Entrypoint
	cf.Config.Cmd = cfg.Cmd
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// FilesLayer is a layer of regular files (see ImageFromDir's extra).
func FilesLayer(t testing.TB, files map[string]string) v1.Layer {
	t.Helper()
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	var hs []*tar.Header
	var bodies []string
	for _, n := range names {
		hs = append(hs, &tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(files[n]))})
		bodies = append(bodies, files[n])
	}
	return TarLayer(t, hs, bodies)
}

// TarLayer is a gzip'd layer made of exactly these tar headers; a regular
// file's content is the body of the same index (Size is set from it).
func TarLayer(t testing.TB, hs []*tar.Header, bodies []string) v1.Layer {
	t.Helper()
	b := TarBytes(t, hs, bodies)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// TarBytes is the uncompressed tar stream of TarLayer.
func TarBytes(t testing.TB, hs []*tar.Header, bodies []string) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for i, h := range hs {
		var body string
		if i < len(bodies) {
			body = bodies[i]
		}
		if h.Typeflag == tar.TypeReg {
			h.Size = int64(len(body))
		}
		if h.Format == tar.FormatUnknown {
			h.Format = tar.FormatPAX
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatalf("ocitest: header %q: %v", h.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := io.WriteString(tw, body); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// WriteTree writes the tree at dir to w as a tar stream, names relative to
// dir, numeric owners, hard links as links to their first name.
func WriteTree(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	seen := map[[2]uint64]string{} // dev, ino → first name
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if rel == "." {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		var link string
		if fi.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		}
		h, err := tar.FileInfoHeader(fi, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		if fi.IsDir() {
			h.Name += "/"
		}
		h.Uname, h.Gname = "", ""
		h.Format = tar.FormatPAX
		st := fi.Sys().(*syscall.Stat_t)
		if fi.Mode().IsRegular() && st.Nlink > 1 {
			key := [2]uint64{st.Dev, st.Ino}
			if first, ok := seen[key]; ok {
				h.Typeflag, h.Linkname, h.Size = tar.TypeLink, first, 0
			} else {
				seen[key] = h.Name
			}
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			for _, attr := range listXattrs(p) {
				if attr != "security.capability" && !strings.HasPrefix(attr, "user.") {
					continue
				}
				if v, ok := getXattr(p, attr); ok {
					if h.PAXRecords == nil {
						h.PAXRecords = map[string]string{}
					}
					h.PAXRecords["SCHILY.xattr."+attr] = v
				}
			}
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if h.Typeflag == tar.TypeReg && h.Size > 0 {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.CopyN(tw, f, h.Size)
			f.Close()
			if err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func listXattrs(p string) []string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n <= 0 {
		return nil
	}
	var out []string
	for _, a := range strings.Split(string(buf[:n]), "\x00") {
		if a != "" {
			out = append(out, a)
		}
	}
	return out
}

func getXattr(p, attr string) (string, bool) {
	buf := make([]byte, 4096)
	n, err := unix.Lgetxattr(p, attr, buf)
	if err != nil {
		return "", false
	}
	return string(buf[:n]), true
}

// Registry starts an in-process registry on 127.0.0.1 (blobs on disk under
// a temporary directory) and returns its host:port. It stops at cleanup.
func Registry(t testing.TB) string {
	t.Helper()
	h := registry.New(
		registry.Logger(log.New(io.Discard, "", 0)),
		registry.WithBlobHandler(registry.NewDiskBlobHandler(t.TempDir())),
	)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.Listener.Close()
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return ln.Addr().String()
}

// Push pushes img to host (from Registry) as repo ("name" or "name:tag",
// default tag latest) and returns the reference "host/repo:tag".
func Push(t testing.TB, host, repo string, img v1.Image) string {
	t.Helper()
	ref := refFor(t, host, repo)
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("ocitest: push %s: %v", ref, err)
	}
	return ref.String()
}

// PushIndex pushes a multi-platform index to host as repo and returns its
// reference.
func PushIndex(t testing.TB, host, repo string, idx v1.ImageIndex) string {
	t.Helper()
	ref := refFor(t, host, repo)
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatalf("ocitest: push index %s: %v", ref, err)
	}
	return ref.String()
}

func refFor(t testing.TB, host, repo string) name.Reference {
	t.Helper()
	if !strings.Contains(repo, ":") && !strings.Contains(repo, "@") {
		repo += ":latest"
	}
	ref, err := name.ParseReference(host + "/" + repo)
	if err != nil {
		t.Fatal(err)
	}
	return ref
}

// Index makes a multi-platform index of images keyed by platform
// ("linux/amd64").
func Index(t testing.TB, images map[string]v1.Image) v1.ImageIndex {
	t.Helper()
	var adds []mutate.IndexAddendum
	plats := make([]string, 0, len(images))
	for p := range images {
		plats = append(plats, p)
	}
	sort.Strings(plats)
	for _, ps := range plats {
		p, err := v1.ParsePlatform(ps)
		if err != nil {
			t.Fatal(err)
		}
		adds = append(adds, mutate.IndexAddendum{Add: images[ps], Descriptor: v1.Descriptor{Platform: p}})
	}
	return mutate.AppendManifests(empty.Index, adds...)
}

// WriteLayout writes img into the OCI layout directory dir (created or
// appended to) with tag in the org.opencontainers.image.ref.name annotation
// (none if tag is ""), and returns the reference "oci:dir[:tag]".
func WriteLayout(t testing.TB, dir, tag string, img v1.Image) string {
	t.Helper()
	p := layoutPath(t, dir)
	var opts []layout.Option
	if tag != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag}))
	}
	if err := p.AppendImage(img, opts...); err != nil {
		t.Fatalf("ocitest: layout %s: %v", dir, err)
	}
	return layoutRef(dir, tag)
}

// WriteLayoutIndex is WriteLayout for a multi-platform index.
func WriteLayoutIndex(t testing.TB, dir, tag string, idx v1.ImageIndex) string {
	t.Helper()
	p := layoutPath(t, dir)
	var opts []layout.Option
	if tag != "" {
		opts = append(opts, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": tag}))
	}
	if err := p.AppendIndex(idx, opts...); err != nil {
		t.Fatalf("ocitest: layout %s: %v", dir, err)
	}
	return layoutRef(dir, tag)
}

func layoutPath(t testing.TB, dir string) layout.Path {
	t.Helper()
	if p, err := layout.FromPath(dir); err == nil {
		return p
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatalf("ocitest: layout %s: %v", dir, err)
	}
	return p
}

func layoutRef(dir, tag string) string {
	if tag == "" {
		return "oci:" + dir
	}
	return "oci:" + dir + ":" + tag
}

// WriteDockerArchive writes img as a `docker save` tarball at file, tagged
// repoTag ("name:tag"), and returns the reference "docker-archive:file".
func WriteDockerArchive(t testing.TB, file, repoTag string, img v1.Image) string {
	t.Helper()
	tag, err := name.NewTag(repoTag)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.Write(tag, img, f); err != nil {
		f.Close()
		t.Fatalf("ocitest: docker-archive %s: %v", file, err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return "docker-archive:" + file
}
