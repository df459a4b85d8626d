package template

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	securejoin "github.com/cyphar/filepath-securejoin"
	"github.com/google/go-containerregistry/pkg/authn"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/ociimage"
)

// source is where a template's first layer comes from: the FROM line.
type source struct {
	ref  string
	kind string // "debootstrap", "oci" or "template"
	// key is the first layer's key: a template's own top layer, or a new layer
	// made by make.
	key    string
	config ImageConfig
	// make fills a new rootfs directory; nil for FROM <template>.
	make func(ctx context.Context, rootfs string, p *progress) error
	// parent is the template a FROM <template> names.
	parent *Template
}

// defaultPath is the PATH of Debian's own images, which a debootstrap base has no
// image config to carry.
const defaultPath = "PATH=" + envdapi.DefaultPath

// debianImages are the FROM names built with debootstrap instead of pulled.
var debianImages = map[string]struct {
	suite string
	slim  bool
}{
	"debian:bookworm":      {"bookworm", false},
	"debian:bookworm-slim": {"bookworm", true},
}

// resolveFrom finds the source a FROM line names: a Debian base, another template
// (a built-in is built first when needed), or an OCI image, pulled with kc's
// credentials when kc is set.
//
// An untrusted build's image (an API key named it) is pulled under the
// Restriction: no private registry but the operator's, no docker login of
// the host's.
func (s *Store) resolveFrom(ctx context.Context, ref string, line int, kc authn.Keychain, untrusted bool, p *progress) (*source, error) {
	bad := func(format string, a ...any) error {
		return fmt.Errorf("%w: Dockerfile line %d: FROM %s: %s", ErrInvalid, line, ref, fmt.Sprintf(format, a...))
	}
	if d, ok := debianImages[ref]; ok {
		return &source{
			ref: ref, kind: "debootstrap",
			key:    layerKey("debootstrap", d.suite, "minbase", fmt.Sprint(d.slim)),
			config: ImageConfig{Env: []string{defaultPath}},
			make: func(ctx context.Context, rootfs string, p *progress) error {
				return s.debootstrap(ctx, d.suite, d.slim, rootfs, p)
			},
		}, nil
	}
	if strings.HasPrefix(ref, "debian:") {
		return nil, bad("Airlock builds only debian:bookworm and debian:bookworm-slim itself (with debootstrap); for another Debian image name a registry (docker.io/library/%s), an oci:<dir> layout or a docker-archive:<file>", ref)
	}
	// name:tag is a build of a user template when the template has that tag;
	// otherwise it is an image (node:20 must stay Docker Hub's node, not the
	// built-in template, which has only "default").
	if name, _, ok := strings.Cut(ref, ":"); ok && ValidName(name) == nil && !s.IsBuiltin(name) {
		if t, err := s.Get(ref); err == nil {
			return &source{ref: ref, kind: "template", key: t.Key, config: t.Config, parent: &t}, nil
		}
	}
	if ValidName(ref) == nil {
		var t Template
		var err error
		if s.IsBuiltin(ref) {
			t, err = s.Ensure(ctx, ref, p.out)
		} else {
			t, err = s.Get(ref)
		}
		if errors.Is(err, ErrNotFound) {
			return nil, bad("no template is named %q (FROM takes a template name, debian:bookworm[-slim], a registry image such as ubuntu:24.04 or docker.io/library/ubuntu:24.04 (a tag is needed), oci:<dir> or docker-archive:<file>)", ref)
		}
		if err != nil {
			return nil, fmt.Errorf("Dockerfile line %d: FROM %s: %w", line, ref, err)
		}
		return &source{ref: ref, kind: "template", key: t.Key, config: t.Config, parent: &t}, nil
	}
	// A Docker Hub short name with a tag or digest (ubuntu:22.04,
	// e2bdev/base:latest) is pulled from Docker Hub, or its mirror, as Docker
	// does; a bare name was a template's above.
	if !ociimage.IsImageRef(ref) && !ociimage.IsDockerHubRef(ref) {
		return nil, bad("not a template name, debian:bookworm[-slim], or an image reference (ubuntu:22.04, a registry host such as docker.io/..., oci:<dir>, docker-archive:<file>)")
	}
	p.setPhase("resolving image " + ref)
	opts := s.ImageOptions()
	if kc != nil {
		opts.Keychain = kc
	}
	if untrusted {
		opts.Restrict = &ociimage.Restriction{AllowPrivate: s.opts.AllowPrivate, AllowHosts: s.opts.AllowRegistries}
	}
	img, err := ociimage.Open(ctx, ref, opts)
	if err != nil {
		return nil, fmt.Errorf("Dockerfile line %d: FROM %s: %w", line, ref, err)
	}
	what := ref
	if img.Mirror != "" {
		what += " from the registry mirror " + img.Mirror
		p.note("FROM %s: pulling through the registry mirror %s", ref, img.Mirror)
	}
	cfg := ImageConfig{Env: img.Config.Env, User: img.Config.User, Workdir: img.Config.WorkingDir}
	if len(cfg.Env) == 0 {
		cfg.Env = []string{defaultPath}
	}
	return &source{
		ref: ref, kind: "oci", key: layerKey("oci", img.Digest), config: cfg,
		make: func(ctx context.Context, rootfs string, p *progress) error {
			if err := os.Mkdir(rootfs, 0o755); err != nil {
				return err
			}
			p.setPhase("extracting " + what)
			return img.Extract(ctx, rootfs, func(done, total int64) {
				p.setPhase(fmt.Sprintf("extracting %s: %s of %s", what, formatSize(done), formatSize(total)))
			})
		},
	}, nil
}

// debootstrap builds a Debian root filesystem. slim drops documentation, man pages
// and translations, now and (through dpkg's path excludes) for later installs, as
// Debian's -slim images do.
func (s *Store) debootstrap(ctx context.Context, suite string, slim bool, rootfs string, p *progress) error {
	args := []string{"--variant=minbase", suite, rootfs, s.opts.Mirror}
	p.setPhase(phaseResolve)
	p.note("+ debootstrap %s", strings.Join(args, " "))
	env := append(hostEnv(), "LC_ALL=C", "DEBIAN_FRONTEND=noninteractive")
	// A private mount namespace makes the /proc and /sys that debootstrap mounts inside the
	// target vanish with it, even when it is killed before its own cleanup runs.
	if err := runCommand(ctx, p, env, syscall.CLONE_NEWNS, "debootstrap", args...); err != nil {
		appendDebootstrapLog(rootfs, p)
		return fmt.Errorf("debootstrap %s from %s: %w", suite, s.opts.Mirror, err)
	}
	// Package lists are minutes old and bulky; a RUN that needs them runs apt-get update.
	for _, glob := range []string{"var/lib/apt/lists/*_*", "var/cache/apt/*.bin", "var/cache/apt/archives/*.deb"} {
		matches, _ := filepath.Glob(filepath.Join(rootfs, glob))
		for _, m := range matches {
			if err := os.RemoveAll(m); err != nil {
				return err
			}
		}
	}
	// debootstrap leaves the host's resolv.conf and hosts behind; a template carries
	// neutral ones (sandboxes with a network get theirs bound over them).
	for name, content := range map[string]string{
		"etc/hostname":    "airlock\n",
		"etc/hosts":       "127.0.0.1 localhost\n127.0.1.1 airlock\n::1 localhost ip6-localhost ip6-loopback\nff02::1 ip6-allnodes\nff02::2 ip6-allrouters\n",
		"etc/resolv.conf": "",
	} {
		p := filepath.Join(rootfs, name)
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			return err
		}
	}
	if slim {
		return slimDown(rootfs)
	}
	return nil
}

// slimExcludes is the dpkg configuration of Debian's slim images, in spirit.
const slimExcludes = `# Airlock slim image: no documentation, man pages or translations.
path-exclude /usr/share/doc/*
path-include /usr/share/doc/*/copyright
path-exclude /usr/share/man/*
path-exclude /usr/share/info/*
path-exclude /usr/share/locale/*
path-include /usr/share/locale/locale.alias
`

func slimDown(rootfs string) error {
	if err := os.WriteFile(filepath.Join(rootfs, "etc/dpkg/dpkg.cfg.d/airlock-slim"), []byte(slimExcludes), 0o644); err != nil {
		return fmt.Errorf("slim: %w", err)
	}
	// Our own debootstrap output: no symlinks lead out of it, but Lstat-based
	// walking keeps it that way regardless.
	doc := filepath.Join(rootfs, "usr/share/doc")
	err := filepath.WalkDir(doc, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == doc {
			return err
		}
		if !d.IsDir() && d.Name() != "copyright" {
			return os.Remove(p)
		}
		return nil
	})
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("slim: %w", err)
	}
	for _, dir := range []string{"usr/share/man", "usr/share/info", "usr/share/locale"} {
		entries, err := os.ReadDir(filepath.Join(rootfs, dir))
		if err != nil {
			continue
		}
		for _, e := range entries {
			if dir == "usr/share/locale" && e.Name() == "locale.alias" {
				continue
			}
			if err := os.RemoveAll(filepath.Join(rootfs, dir, e.Name())); err != nil {
				return fmt.Errorf("slim: %w", err)
			}
		}
	}
	return nil
}

// appendDebootstrapLog copies debootstrap's own detailed log (dpkg's output) into the
// build log and tail: its stdout only says "see debootstrap.log", which is about to be
// deleted with the failed build.
func appendDebootstrapLog(rootfs string, p *progress) {
	data, err := os.ReadFile(filepath.Join(rootfs, "debootstrap", "debootstrap.log"))
	if err != nil || len(data) == 0 {
		return
	}
	p.note("--- debootstrap/debootstrap.log ---")
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.log != nil {
		_, _ = p.log.Write(data)
	}
	if len(lines) > tailLines/2 {
		lines = lines[len(lines)-tailLines/2:]
	}
	for _, l := range lines {
		p.addTail(l)
	}
}

// mountPoints are the paths every sandbox binds over (envd, also as mcp-gateway, its socket dir, DNS and
// hosts files, the sudo shim). A first layer gets them, so that creating a sandbox
// never has to make them in its upper layer (a copy-up per create) and build steps
// don't leave them behind in layers.
var mountPoints = []struct {
	path string
	dir  bool
}{
	{envdapi.BinaryPath, false},
	{envdapi.MCPGatewayPath, false},
	{envdapi.RunDir, true},
	{"/etc/resolv.conf", false},
	{"/etc/hosts", false},
}

// addMountPoints creates the missing mount points in a first layer. Paths resolve
// inside rootfs (an image's /etc may be a symlink) and never outside it.
func addMountPoints(rootfs string) error {
	for _, m := range mountPoints {
		p, err := securejoin.SecureJoin(rootfs, m.path)
		if err != nil {
			return fmt.Errorf("mount point %s: %w", m.path, err)
		}
		if _, err := os.Lstat(p); err == nil {
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("mount point %s: %w", m.path, err)
		}
		if m.dir {
			err = os.Mkdir(p, 0o755)
		} else {
			err = os.WriteFile(p, nil, 0o644)
		}
		if err != nil {
			return fmt.Errorf("mount point %s: %w", m.path, err)
		}
	}
	return nil
}
