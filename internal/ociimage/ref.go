// Package ociimage resolves an OCI image named by a template's FROM line and
// extracts its flattened root filesystem into a directory.
//
// It reads images from a registry, an OCI image layout directory, or a
// `docker save` tarball through github.com/google/go-containerregistry, and
// writes the layers itself (see extract.go) because the result must keep
// owners, modes, hard links and capabilities exactly while refusing anything
// that would write outside the destination: the extraction runs as root on the
// host with untrusted images.
package ociimage

import (
	"fmt"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// Transport prefixes accepted by Open.
const (
	prefixOCI           = "oci:"
	prefixDockerArchive = "docker-archive:"
	prefixDocker        = "docker://"
)

// IsImageRef reports whether s names an OCI image rather than an Airlock
// template or a debootstrap suite. It is true for the oci:, docker-archive:
// and docker:// forms and for references whose first path component names a
// registry host (contains '.' or ':' or is "localhost"). Bare names such as
// "base" or "debian:bookworm" are false: the caller resolves those first and
// may still pass them to Open with the docker:// prefix.
func IsImageRef(s string) bool {
	if strings.HasPrefix(s, prefixOCI) || strings.HasPrefix(s, prefixDockerArchive) || strings.HasPrefix(s, prefixDocker) {
		return true
	}
	host, _, ok := strings.Cut(s, "/")
	if !ok || host == "" {
		return false
	}
	return host == "localhost" || strings.ContainsAny(host, ".:")
}

// IsLocalRef reports whether s names an image on this host's disk (an
// oci:<dir> layout or a docker-archive:<file>) rather than in a registry.
func IsLocalRef(s string) bool {
	return strings.HasPrefix(s, prefixOCI) || strings.HasPrefix(s, prefixDockerArchive)
}

// source is a parsed reference.
type source struct {
	kind string // "oci", "docker-archive" or "registry"
	path string // layout dir or archive file
	tag  string // layout tag, archive repo:tag; "" for the default
	dgst string // layout digest "sha256:…"
	ref  string // registry reference
}

func parseRef(s string) (source, error) {
	switch {
	case strings.HasPrefix(s, prefixOCI):
		rest := strings.TrimPrefix(s, prefixOCI)
		src := source{kind: "oci", path: rest}
		if i := strings.LastIndex(rest, "@"); i >= 0 && strings.Contains(rest[i+1:], ":") {
			src.path, src.dgst = rest[:i], rest[i+1:]
		} else if i := strings.LastIndex(rest, ":"); i >= 0 && !strings.Contains(rest[i+1:], "/") {
			src.path, src.tag = rest[:i], rest[i+1:]
		}
		if src.path == "" {
			return source{}, fmt.Errorf("%w: %q: empty layout directory", ErrBadRef, s)
		}
		return src, nil
	case strings.HasPrefix(s, prefixDockerArchive):
		rest := strings.TrimPrefix(s, prefixDockerArchive)
		src := source{kind: "docker-archive", path: rest}
		// The tag itself has a ':' (repo:tag) and a file name may too, so
		// the file is the shortest prefix before a ':' that exists.
		if _, err := os.Stat(rest); err != nil {
			for i := 0; i < len(rest); i++ {
				if rest[i] != ':' {
					continue
				}
				if st, err := os.Stat(rest[:i]); err == nil && st.Mode().IsRegular() {
					src.path, src.tag = rest[:i], rest[i+1:]
					break
				}
			}
		}
		if src.path == "" {
			return source{}, fmt.Errorf("%w: %q: empty archive path", ErrBadRef, s)
		}
		return src, nil
	case strings.HasPrefix(s, prefixDocker):
		return source{kind: "registry", ref: strings.TrimPrefix(s, prefixDocker)}, nil
	}
	if i := strings.Index(s, "://"); i > 0 {
		return source{}, fmt.Errorf("%w: unknown transport %q in %q (want oci:, docker-archive: or docker://)", ErrBadRef, s[:i], s)
	}
	// Transports of skopeo/podman that look like "name:rest" would otherwise
	// be read as a Docker Hub repository with a strange tag.
	if t, _, ok := strings.Cut(s, ":"); ok {
		switch t {
		case "oci-archive", "docker-daemon", "containers-storage", "dir", "sif", "ostree":
			return source{}, fmt.Errorf("%w: unknown transport %q in %q (want oci:, docker-archive: or docker://)", ErrBadRef, t, s)
		}
	}
	return source{kind: "registry", ref: s}, nil
}

// IsDockerHubRef reports whether s is a Docker Hub short name with a tag or a
// digest, such as "ubuntu:22.04", "e2bdev/base:latest" or "alpine@sha256:…",
// which `docker pull` reads as docker.io/library/ubuntu:22.04 and
// docker.io/e2bdev/base:latest. A bare "ubuntu" is false: a template builder
// reads bare names as its own templates' names, and a typo there must not
// turn into a pull.
func IsDockerHubRef(s string) bool {
	if IsImageRef(s) || strings.Contains(s, "://") || !strings.ContainsAny(s, ":@") {
		return false
	}
	ref, err := name.ParseReference(s)
	return err == nil && ref.Context().RegistryStr() == name.DefaultRegistry
}
