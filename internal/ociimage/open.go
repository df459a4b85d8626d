package ociimage

import (
	"archive/tar"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Errors callers can test with errors.Is. Every error this package returns
// wraps one of them (or a context error) with the details.
var (
	ErrBadRef      = errors.New("invalid image reference")
	ErrNotFound    = errors.New("image not found")
	ErrAuth        = errors.New("registry authentication required")
	ErrUnreachable = errors.New("registry unreachable")
	ErrPlatform    = errors.New("no image for platform")
	ErrCorrupt     = errors.New("corrupt image")
	ErrUnsafe      = errors.New("unsafe image entry")
	ErrTooLarge    = errors.New("image too large")
)

// layoutRefAnnotation is the OCI index annotation that holds a layout tag.
const layoutRefAnnotation = "org.opencontainers.image.ref.name"

// Options tune Open and Extract.
type Options struct {
	// Platform ("linux/amd64", "linux/arm64/v8") picks an image from an
	// index. Default: the host's GOOS/GOARCH.
	Platform string
	// Keychain gives registry credentials. Default authn.DefaultKeychain
	// (the docker config file), which falls back to anonymous.
	Keychain authn.Keychain
	// Transport is the HTTP transport for registry traffic (tests).
	Transport http.RoundTripper
	// Insecure speaks plain HTTP to the registry. Without it ggcr already
	// does so for localhost, loopback and RFC 1918 addresses only.
	Insecure bool
	// Mirrors redirect pulls from a registry to a mirror (see Mirror):
	// `ubuntu:22.04` with a docker.io mirror is pulled from the mirror as
	// library/ubuntu:22.04. Build them with ParseMirror; Open refuses two
	// for one registry.
	Mirrors []Mirror
	// Restrict, when set, limits where a registry pull (not one through a
	// mirror) may connect, and pulls it without the host's docker
	// credentials unless Keychain gives some (see Restriction).
	Restrict *Restriction
	// MaxBytes bounds the bytes of file content Extract writes; 0 means no
	// bound. Exceeding it fails with ErrTooLarge.
	MaxBytes int64
	// Logger receives warnings (skipped device nodes, dropped xattrs).
	// Default slog.Default().
	Logger *slog.Logger
}

// Config is the part of an image config a template keeps.
type Config struct {
	Env        []string
	User       string
	WorkingDir string
	Entrypoint []string
	Cmd        []string
}

// Image is a resolved image: its manifest and config are read, its layers
// are not fetched until Extract.
type Image struct {
	Ref string
	// Digest identifies the image content ("sha256:…"): the manifest
	// digest for registry and OCI layout images; for docker-archive, which
	// has no manifest, the config digest (the config lists the layers'
	// uncompressed digests, so it changes whenever the content does).
	Digest string
	Config Config
	// Mirror is the base URL of the registry mirror the image is pulled
	// through (Options.Mirrors), "" when none.
	Mirror string
	// Size is the total of the layer bytes Extract reads: compressed blob
	// sizes, or for docker-archive the layer tars as stored. For progress.
	Size int64

	img    v1.Image
	layers []layerSource
	opts   Options
	// refetch re-resolves a registry image with Extract's context, because
	// ggcr binds registry requests to the context given at resolve time.
	refetch func(ctx context.Context) (v1.Image, error)
}

// Open resolves ref (see IsImageRef for the forms) and reads its manifest and
// config. No layer is fetched.
func Open(ctx context.Context, ref string, opts Options) (*Image, error) {
	if opts.Platform == "" {
		opts.Platform = runtime.GOOS + "/" + runtime.GOARCH
	}
	if opts.Keychain == nil {
		opts.Keychain = authn.DefaultKeychain
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if err := ValidateMirrors(opts.Mirrors); err != nil {
		return nil, err
	}
	plat, err := v1.ParsePlatform(opts.Platform)
	if err != nil {
		return nil, fmt.Errorf("%w: platform %q: %w", ErrBadRef, opts.Platform, err)
	}
	src, err := parseRef(ref)
	if err != nil {
		return nil, err
	}
	im := &Image{Ref: ref, opts: opts}
	switch src.kind {
	case "oci":
		err = im.openLayout(src, *plat)
	case "docker-archive":
		err = im.openArchive(src)
	default:
		err = im.openRegistry(ctx, src, *plat)
	}
	if err != nil {
		return nil, err
	}
	cf, err := im.img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("%s: reading config: %w: %w", ref, ErrCorrupt, err)
	}
	// A lone image (no index to choose from) of another platform would only
	// fail later with "exec format error" in the first RUN; say it now.
	if cf.OS != "" && cf.Architecture != "" {
		have := v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
		if !platformMatches(have, *plat) {
			return nil, fmt.Errorf("%s: %w %s: the image is %s", ref, ErrPlatform, opts.Platform, have.String())
		}
	}
	im.Config = Config{
		Env:        cf.Config.Env,
		User:       cf.Config.User,
		WorkingDir: cf.Config.WorkingDir,
		Entrypoint: cf.Config.Entrypoint,
		Cmd:        cf.Config.Cmd,
	}
	if im.layers == nil {
		ls, err := im.img.Layers()
		if err != nil {
			return nil, fmt.Errorf("%s: listing layers: %w: %w", ref, ErrCorrupt, err)
		}
		for i, l := range ls {
			sz, err := l.Size()
			if err != nil {
				return nil, fmt.Errorf("%s: layer %d size: %w", ref, i, err)
			}
			d, err := l.Digest()
			if err != nil {
				return nil, fmt.Errorf("%s: layer %d digest: %w", ref, i, err)
			}
			im.layers = append(im.layers, layerSource{size: sz, digest: d.String(), compressed: true})
			im.Size += sz
		}
	}
	return im, nil
}

func (im *Image) openRegistry(ctx context.Context, src source, plat v1.Platform) error {
	var nopts []name.Option
	if im.opts.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	ref, err := name.ParseReference(src.ref, nopts...)
	if err != nil {
		return fmt.Errorf("%w: %q: %w", ErrBadRef, src.ref, err)
	}
	orig := ref
	mirror, ref, err := mirrorFor(im.opts.Mirrors, ref)
	if err != nil {
		return err
	}
	if mirror != nil {
		im.Mirror = mirror.URL()
	}
	tr := im.opts.Transport
	if mirror != nil && !mirror.PlainHTTP {
		tr = tlsOnly{host: mirror.Host, next: cmp.Or[http.RoundTripper](tr, remote.DefaultTransport)}
	}
	kc := im.opts.Keychain
	if rs := im.opts.Restrict; rs != nil && mirror == nil && !slices.Contains(rs.AllowHosts, ref.Context().RegistryStr()) {
		if tr == nil {
			tr = rs.transport()
		}
		if kc == nil {
			kc = authn.NewMultiKeychain() // anonymous: not the operator's docker login
		}
	}
	resolve := func(ctx context.Context, r name.Reference) (*remote.Descriptor, error) {
		o := []remote.Option{remote.WithContext(ctx), remote.WithAuthFromKeychain(cmp.Or[authn.Keychain](kc, authn.DefaultKeychain)), remote.WithPlatform(plat)}
		if tr != nil {
			o = append(o, remote.WithTransport(tr))
		}
		d, err := remote.Get(r, o...)
		if err != nil {
			if mirror != nil {
				// Name what was asked for and where it was sent: the
				// mirror's address alone would not tell which FROM failed.
				return nil, fmt.Errorf("%s (%s) through registry mirror %s for %s: %w",
					src.ref, orig.Name(), mirror.URL(), mirror.Registry, classifyRemote(r, err))
			}
			return nil, classifyRemote(r, err)
		}
		return d, nil
	}
	desc, err := resolve(ctx, ref)
	if err != nil {
		return err
	}
	if desc.MediaType.IsIndex() {
		idx, err := desc.ImageIndex()
		if err != nil {
			return fmt.Errorf("%s: reading index: %w: %w", src.ref, ErrCorrupt, err)
		}
		child, err := pickPlatform(idx, plat, src.ref)
		if err != nil {
			return err
		}
		ref = ref.Context().Digest(child.Digest.String())
		if desc, err = resolve(ctx, ref); err != nil {
			return err
		}
	}
	img, err := desc.Image()
	if err != nil {
		return fmt.Errorf("%s: %w: %w", src.ref, ErrCorrupt, err)
	}
	im.img = img
	im.Digest = desc.Digest.String()
	pinned := ref.Context().Digest(im.Digest)
	im.refetch = func(ctx context.Context) (v1.Image, error) {
		d, err := resolve(ctx, pinned)
		if err != nil {
			return nil, err
		}
		return d.Image()
	}
	return nil
}

// classifyRemote maps a ggcr registry error to one of this package's errors,
// naming the registry and keeping the cause.
func classifyRemote(ref name.Reference, err error) error {
	reg := ref.Context().RegistryStr()
	var terr *transport.Error
	if errors.As(err, &terr) {
		switch {
		case terr.StatusCode == http.StatusUnauthorized || terr.StatusCode == http.StatusForbidden || hasCode(terr, transport.UnauthorizedErrorCode, transport.DeniedErrorCode):
			return fmt.Errorf("%s: %w by %s (set credentials with docker login): %w", ref, ErrAuth, reg, err)
		case terr.StatusCode == http.StatusNotFound || hasCode(terr, transport.ManifestUnknownErrorCode, transport.NameUnknownErrorCode):
			return fmt.Errorf("%s: %w in %s (manifest unknown): %w", ref, ErrNotFound, reg, err)
		}
		return fmt.Errorf("%s: registry %s: %w", ref, reg, err)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", ref, err)
	}
	if errors.Is(err, ErrPrivateRegistry) {
		var oerr *net.OpError
		if errors.As(err, &oerr) && oerr.Err != nil {
			err = oerr.Err // the dial's own words, without Go's "dial tcp …" wrapping
		}
		return fmt.Errorf("%s: registry %s: %w", ref, reg, err)
	}
	var nerr net.Error
	var oerr *net.OpError
	var derr *net.DNSError
	if errors.As(err, &oerr) || errors.As(err, &derr) || errors.As(err, &nerr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%s: %w: %s: %w", ref, ErrUnreachable, reg, err)
	}
	return fmt.Errorf("%s: registry %s: %w", ref, reg, err)
}

func hasCode(e *transport.Error, codes ...transport.ErrorCode) bool {
	for _, d := range e.Errors {
		if slices.Contains(codes, d.Code) {
			return true
		}
	}
	return false
}

// platformMatches is v1.Platform.Satisfies with an unset variant on either
// side accepted (an index entry "linux/arm64" serves "linux/arm64/v8").
func platformMatches(have, want v1.Platform) bool {
	if have.OS != want.OS || have.Architecture != want.Architecture {
		return false
	}
	return want.Variant == "" || have.Variant == "" || have.Variant == want.Variant
}

// pickPlatform returns the index entry for plat, or an error listing what the
// index has.
func pickPlatform(idx v1.ImageIndex, plat v1.Platform, what string) (v1.Descriptor, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return v1.Descriptor{}, fmt.Errorf("%s: reading index: %w: %w", what, ErrCorrupt, err)
	}
	var have []string
	for _, d := range m.Manifests {
		if d.Platform == nil || d.Platform.OS == "unknown" {
			continue // attestations and the like
		}
		if platformMatches(*d.Platform, plat) && d.MediaType.IsImage() {
			return d, nil
		}
		have = append(have, d.Platform.String())
	}
	return v1.Descriptor{}, fmt.Errorf("%s: %w %s (the index has: %s)", what, ErrPlatform, plat.String(), strings.Join(have, ", "))
}

func (im *Image) openLayout(src source, plat v1.Platform) error {
	st, err := os.Stat(src.path)
	if err != nil {
		return fmt.Errorf("%w: OCI layout %s: %w", ErrNotFound, src.path, err)
	}
	if !st.IsDir() {
		return fmt.Errorf("%w: OCI layout %s is not a directory", ErrNotFound, src.path)
	}
	p, err := layout.FromPath(src.path)
	if err != nil {
		return fmt.Errorf("%w: OCI layout %s: %w", ErrNotFound, src.path, err)
	}
	root, err := p.ImageIndex()
	if err != nil {
		return fmt.Errorf("OCI layout %s: %w: %w", src.path, ErrCorrupt, err)
	}
	rm, err := root.IndexManifest()
	if err != nil {
		return fmt.Errorf("OCI layout %s: index.json: %w: %w", src.path, ErrCorrupt, err)
	}
	var desc *v1.Descriptor
	var tags []string
	for i, d := range rm.Manifests {
		t := d.Annotations[layoutRefAnnotation]
		if t != "" {
			tags = append(tags, t)
		}
		switch {
		case src.dgst != "" && d.Digest.String() == src.dgst,
			src.tag != "" && t == src.tag:
			desc = &rm.Manifests[i]
		}
	}
	what := "OCI layout " + src.path
	cur := root // the index that lists desc
	switch {
	case desc != nil:
	case src.dgst != "":
		// Not a top-level entry: it may be an image inside an index.
		cur, desc = findInLayout(root, src.dgst, 0)
		if desc == nil {
			return fmt.Errorf("%w: %s not in OCI layout %s", ErrNotFound, src.dgst, src.path)
		}
	case src.tag != "":
		return fmt.Errorf("%w: tag %q not in OCI layout %s (tags: %s)", ErrNotFound, src.tag, src.path, strings.Join(tags, ", "))
	case len(rm.Manifests) == 1:
		desc = &rm.Manifests[0]
	case len(rm.Manifests) == 0:
		return fmt.Errorf("%w: OCI layout %s holds no image", ErrNotFound, src.path)
	default:
		return fmt.Errorf("%w: OCI layout %s holds %d images; name one with :<tag> or @<digest> (tags: %s)", ErrBadRef, src.path, len(rm.Manifests), strings.Join(tags, ", "))
	}
	for depth := 0; desc.MediaType.IsIndex(); depth++ {
		if depth > 4 {
			return fmt.Errorf("%s: %w: indexes nested too deep", what, ErrCorrupt)
		}
		idx, err := cur.ImageIndex(desc.Digest)
		if err != nil {
			return fmt.Errorf("%s: index %s: %w: %w", what, desc.Digest, ErrCorrupt, err)
		}
		d, err := pickPlatform(idx, plat, what)
		if err != nil {
			return err
		}
		cur, desc = idx, &d
	}
	if !desc.MediaType.IsImage() {
		return fmt.Errorf("%s: %s has media type %s, not an image", what, desc.Digest, desc.MediaType)
	}
	img, err := cur.Image(desc.Digest)
	if err != nil {
		return fmt.Errorf("%s: image %s: %w: %w", what, desc.Digest, ErrCorrupt, err)
	}
	im.img, im.Digest = img, desc.Digest.String()
	return nil
}

// findInLayout finds the descriptor with digest dgst in idx or an index it
// lists, and returns it with the index that lists it.
func findInLayout(idx v1.ImageIndex, dgst string, depth int) (v1.ImageIndex, *v1.Descriptor) {
	m, err := idx.IndexManifest()
	if err != nil || depth > 4 {
		return nil, nil
	}
	for i, d := range m.Manifests {
		if d.Digest.String() == dgst {
			return idx, &m.Manifests[i]
		}
	}
	for _, d := range m.Manifests {
		if !d.MediaType.IsIndex() {
			continue
		}
		if child, err := idx.ImageIndex(d.Digest); err == nil {
			if c, found := findInLayout(child, dgst, depth+1); found != nil {
				return c, found
			}
		}
	}
	return nil, nil
}

func (im *Image) openArchive(src source) error {
	f, err := os.Open(src.path)
	if err != nil {
		return fmt.Errorf("%w: docker-archive %s: %w", ErrNotFound, src.path, err)
	}
	f.Close()
	opener := func() (io.ReadCloser, error) { return os.Open(src.path) }
	man, err := tarball.LoadManifest(opener)
	if err != nil {
		return fmt.Errorf("docker-archive %s: reading manifest.json: %w: %w", src.path, ErrCorrupt, err)
	}
	var all []string
	for _, d := range man {
		all = append(all, d.RepoTags...)
	}
	var tag *name.Tag
	var desc *tarball.Descriptor
	switch {
	case src.tag != "":
		t, err := name.NewTag(src.tag)
		if err != nil {
			return fmt.Errorf("%w: tag %q: %w", ErrBadRef, src.tag, err)
		}
		tag = &t
		for i, d := range man {
			for _, rt := range d.RepoTags {
				if x, err := name.NewTag(rt); err == nil && x.Name() == t.Name() {
					desc = &man[i]
				}
			}
		}
		if desc == nil {
			return fmt.Errorf("%w: tag %q not in docker-archive %s (tags: %s)", ErrNotFound, src.tag, src.path, strings.Join(all, ", "))
		}
	case len(man) == 1:
		desc = &man[0]
	case len(man) == 0:
		return fmt.Errorf("%w: docker-archive %s holds no image", ErrNotFound, src.path)
	default:
		return fmt.Errorf("%w: docker-archive %s holds %d images; name one with :<repo:tag> (tags: %s)", ErrBadRef, src.path, len(man), strings.Join(all, ", "))
	}
	img, err := tarball.Image(opener, tag)
	if err != nil {
		return fmt.Errorf("docker-archive %s: %w: %w", src.path, ErrCorrupt, err)
	}
	// Not img.Digest(): ggcr computes a manifest for an archive by
	// gzipping every layer, which costs seconds per hundred MB.
	cn, err := img.ConfigName()
	if err != nil {
		return fmt.Errorf("docker-archive %s: config: %w: %w", src.path, ErrCorrupt, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("docker-archive %s: config: %w: %w", src.path, ErrCorrupt, err)
	}
	if len(cf.RootFS.DiffIDs) != len(desc.Layers) {
		return fmt.Errorf("docker-archive %s: %w: %d layers in manifest.json, %d in config", src.path, ErrCorrupt, len(desc.Layers), len(cf.RootFS.DiffIDs))
	}
	members, err := archiveMembers(src.path, desc.Layers)
	if err != nil {
		return err
	}
	im.img, im.Digest = img, cn.String()
	for i, p := range desc.Layers {
		m := members[strings.TrimPrefix(p, "./")]
		im.layers = append(im.layers, layerSource{
			size:               m.size,
			digest:             cf.RootFS.DiffIDs[i].String(),
			compressed:         m.compressed,
			digestUncompressed: true,
		})
		im.Size += m.size
	}
	return nil
}

type archiveMember struct {
	size       int64
	compressed bool // gzip or zstd
}

// archiveMembers returns the stored size of each named member of a tar file
// and whether it is compressed.
func archiveMembers(path string, names []string) (map[string]archiveMember, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("docker-archive %s: %w", path, err)
	}
	defer f.Close()
	want := map[string]bool{}
	for _, n := range names {
		want[strings.TrimPrefix(n, "./")] = true
	}
	out := map[string]archiveMember{}
	tr := tar.NewReader(f)
	for len(out) < len(want) {
		h, err := tr.Next()
		if err != nil {
			return nil, fmt.Errorf("docker-archive %s: scanning layers: %w: %w", path, ErrCorrupt, err)
		}
		n := strings.TrimPrefix(h.Name, "./")
		if !want[n] {
			continue
		}
		var magic [4]byte
		k, _ := io.ReadFull(tr, magic[:])
		gz := k >= 2 && magic[0] == 0x1f && magic[1] == 0x8b
		zst := k == 4 && magic == [4]byte{0x28, 0xb5, 0x2f, 0xfd}
		out[n] = archiveMember{size: h.Size, compressed: gz || zst}
	}
	return out, nil
}
