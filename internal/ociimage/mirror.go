package ociimage

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
)

// Mirror sends every pull from one registry to another, as Docker's
// registry-mirrors and containerd's hosts.toml do: an air-gapped host pulls
// `ubuntu:22.04` (docker.io/library/ubuntu:22.04) from the operator's mirror.
// The repository path is kept as it is, Docker Hub's "library/" prefix
// included (what Docker Hub mirrors such as `registry:2` in proxy mode,
// Harbor or Artifactory expect); tags and digests are asked for unchanged and
// content is verified against its digests as for any registry.
//
// There is no fallback: when the mirror fails, the pull fails with an error
// that names the image, the mirror and the cause. containerd, by default,
// tries the hosts of hosts.toml in order and then falls back to `server` (the
// upstream); its documented way never to contact the upstream is to set
// `server` to the mirror itself, and that is the behaviour here. The setting
// exists for hosts that cannot reach the upstream, where a fallback would only
// add a slow second failure that hides the mirror's own error, and on an
// isolated network a pull must not quietly leave it.
type Mirror struct {
	// Registry is the registry the mirror stands in for, as image references
	// name it: "docker.io" (index.docker.io is the same), "ghcr.io",
	// "registry.example.com:5000".
	Registry string
	// Host is the mirror's host[:port].
	Host string
	// PlainHTTP is true for an http:// mirror: plain HTTP is allowed for it
	// (and for no other registry). An https:// mirror is spoken to over TLS
	// only, even on a loopback or private address, where go-containerregistry
	// would otherwise also try plain HTTP.
	PlainHTTP bool
}

// URL is the mirror's base URL, as given.
func (m Mirror) URL() string {
	if m.PlainHTTP {
		return "http://" + m.Host
	}
	return "https://" + m.Host
}

// String is the REGISTRY=URL form ParseMirror reads.
func (m Mirror) String() string { return m.Registry + "=" + m.URL() }

// ErrBadMirror wraps every error about a mirror setting.
var ErrBadMirror = errors.New("invalid registry mirror")

// ParseMirror reads "REGISTRY=URL", e.g. "docker.io=http://127.0.0.1:5000":
// REGISTRY a registry host[:port] as in image references, URL http:// or
// https:// with a host[:port] and no path (the mirror serves the registry API
// at /v2/, as every OCI registry does).
func ParseMirror(s string) (Mirror, error) {
	reg, raw, ok := strings.Cut(strings.TrimSpace(s), "=")
	reg, raw = strings.TrimSpace(reg), strings.TrimSpace(raw)
	if !ok || reg == "" || raw == "" {
		return Mirror{}, fmt.Errorf("%w %q: want REGISTRY=URL, e.g. docker.io=http://127.0.0.1:5000", ErrBadMirror, s)
	}
	if strings.Contains(reg, "://") || strings.Contains(reg, "/") {
		return Mirror{}, fmt.Errorf("%w %q: %q is not a registry host (write it as in image references: docker.io, ghcr.io, registry.example.com:5000)", ErrBadMirror, s, reg)
	}
	if _, err := name.NewRegistry(reg, name.StrictValidation); err != nil {
		return Mirror{}, fmt.Errorf("%w %q: registry %q: %w", ErrBadMirror, s, reg, err)
	}
	if !strings.Contains(raw, "://") {
		return Mirror{}, fmt.Errorf("%w %q: the mirror URL %q must start with http:// (plain HTTP) or https:// (TLS)", ErrBadMirror, s, raw)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return Mirror{}, fmt.Errorf("%w %q: %w", ErrBadMirror, s, err)
	}
	m := Mirror{Registry: reg, Host: u.Host}
	switch u.Scheme {
	case "http":
		m.PlainHTTP = true
	case "https":
	default:
		return Mirror{}, fmt.Errorf("%w %q: the mirror URL %q must start with http:// (plain HTTP) or https:// (TLS)", ErrBadMirror, s, raw)
	}
	switch {
	case u.Host == "" || u.Hostname() == "":
		return Mirror{}, fmt.Errorf("%w %q: the mirror URL %q has no host", ErrBadMirror, s, raw)
	case u.User != nil:
		return Mirror{}, fmt.Errorf("%w %q: no credentials in the URL (put them in the docker config file, as for docker login)", ErrBadMirror, s)
	case u.Path != "" && u.Path != "/", u.RawQuery != "", u.Fragment != "":
		return Mirror{}, fmt.Errorf("%w %q: the mirror URL must be scheme://host[:port] with no path: the registry API is always at /v2/", ErrBadMirror, s)
	}
	if _, err := name.NewRegistry(m.Host, name.StrictValidation); err != nil {
		return Mirror{}, fmt.Errorf("%w %q: mirror host %q: %w", ErrBadMirror, s, m.Host, err)
	}
	return m, nil
}

// ParseMirrors reads several REGISTRY=URL settings; a registry may have one
// mirror.
func ParseMirrors(list []string) ([]Mirror, error) {
	var out []Mirror
	for _, s := range list {
		m, err := ParseMirror(s)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	if err := ValidateMirrors(out); err != nil {
		return nil, err
	}
	return out, nil
}

// ValidateMirrors checks mirrors made without ParseMirror, and refuses two
// mirrors for one registry (docker.io and index.docker.io are one): which one
// would win would be a guess.
func ValidateMirrors(ms []Mirror) error {
	seen := map[string]Mirror{}
	for _, m := range ms {
		r, err := name.NewRegistry(m.Registry, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("%w %q: registry: %w", ErrBadMirror, m.String(), err)
		}
		if _, err := name.NewRegistry(m.Host, name.StrictValidation); err != nil {
			return fmt.Errorf("%w %q: mirror host: %w", ErrBadMirror, m.String(), err)
		}
		if prev, dup := seen[r.RegistryStr()]; dup {
			return fmt.Errorf("%w: two mirrors for %s (%s and %s); give one", ErrBadMirror, m.Registry, prev.URL(), m.URL())
		}
		seen[r.RegistryStr()] = m
	}
	return nil
}

// mirrorFor returns the mirror of ref's registry, if any, and ref rewritten
// to it (same repository path, tag or digest).
func mirrorFor(ms []Mirror, ref name.Reference) (*Mirror, name.Reference, error) {
	reg := ref.Context().RegistryStr()
	for i, m := range ms {
		r, err := name.NewRegistry(m.Registry, name.StrictValidation)
		if err != nil || r.RegistryStr() != reg {
			continue
		}
		var opts []name.Option
		if m.PlainHTTP {
			opts = append(opts, name.Insecure)
		}
		mreg, err := name.NewRegistry(m.Host, opts...)
		if err != nil {
			return nil, nil, fmt.Errorf("%w %q: %w", ErrBadMirror, m.String(), err)
		}
		repo := mreg.Repo(ref.Context().RepositoryStr())
		switch r := ref.(type) {
		case name.Digest:
			return &ms[i], repo.Digest(r.DigestStr()), nil
		case name.Tag:
			return &ms[i], repo.Tag(r.TagStr()), nil
		default:
			return nil, nil, fmt.Errorf("%w: %s: neither a tag nor a digest", ErrBadRef, ref)
		}
	}
	return nil, ref, nil
}

// tlsOnly refuses plain-HTTP requests to an https:// mirror. go-containerregistry
// falls back to plain HTTP for loopback and private addresses on its own; an
// operator who wrote https:// asked for TLS.
type tlsOnly struct {
	host string
	next http.RoundTripper
}

func (t tlsOnly) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.URL.Scheme == "http" && strings.EqualFold(req.URL.Host, t.host) {
		return nil, fmt.Errorf("registry mirror https://%s: refusing plain HTTP to a mirror given as https://", t.host)
	}
	return t.next.RoundTrip(req)
}
