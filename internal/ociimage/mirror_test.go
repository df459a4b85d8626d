package ociimage_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
)

func TestParseMirror(t *testing.T) {
	for in, want := range map[string]ociimage.Mirror{
		"docker.io=http://127.0.0.1:5000":              {Registry: "docker.io", Host: "127.0.0.1:5000", PlainHTTP: true},
		" ghcr.io = https://mirror.example.com/ ":      {Registry: "ghcr.io", Host: "mirror.example.com"},
		"registry.example.com:5000=https://[::1]:8443": {Registry: "registry.example.com:5000", Host: "[::1]:8443"},
	} {
		got, err := ociimage.ParseMirror(in)
		if err != nil || got != want {
			t.Errorf("ParseMirror(%q) = %+v, %v; want %+v", in, got, err, want)
		}
	}
	for in, why := range map[string]string{
		"docker.io":              "REGISTRY=URL",
		"=http://127.0.0.1:5000": "REGISTRY=URL",
		"docker.io=":             "REGISTRY=URL",
		"https://docker.io=http://127.0.0.1:5000":        "not a registry host",
		"docker.io=127.0.0.1:5000":                       "must start with http://",
		"docker.io=ftp://127.0.0.1":                      "must start with http://",
		"docker.io=http://":                              "has no host",
		"docker.io=https://u:p@mirror.example.com":       "no credentials",
		"docker.io=https://mirror.example.com/v2/docker": "no path",
		"docker.io=https://mirror.example.com?x=1":       "no path",
	} {
		_, err := ociimage.ParseMirror(in)
		if !errors.Is(err, ociimage.ErrBadMirror) || !strings.Contains(err.Error(), why) {
			t.Errorf("ParseMirror(%q) = %v; want ErrBadMirror saying %q", in, err, why)
		}
	}
	_, err := ociimage.ParseMirrors([]string{"docker.io=http://127.0.0.1:5000", "index.docker.io=http://127.0.0.1:5001"})
	if !errors.Is(err, ociimage.ErrBadMirror) || !strings.Contains(err.Error(), "two mirrors") {
		t.Errorf("two mirrors for Docker Hub: %v", err)
	}
}

func TestIsDockerHubRef(t *testing.T) {
	for ref, want := range map[string]bool{
		"ubuntu:22.04":       true,
		"e2bdev/base:latest": true,
		"library/ubuntu@sha256:" + strings.Repeat("a", 64): true,
		"ubuntu":                         false, // bare: a template name
		"docker.io/library/ubuntu:22.04": false, // already a registry reference
		"ghcr.io/x/y:1":                  false,
		"oci:/tmp/x:1":                   false,
		"Ubuntu:22.04":                   false,
	} {
		if got := ociimage.IsDockerHubRef(ref); got != want {
			t.Errorf("IsDockerHubRef(%q) = %v, want %v", ref, got, want)
		}
	}
}

// loopbackOnly is a transport that dials loopback IP addresses only: anything
// else (index.docker.io above all) is refused before any DNS lookup, and
// recorded, so these tests never send a packet off the host.
func loopbackOnly() (http.RoundTripper, func() []string) {
	var mu sync.Mutex
	var refused []string
	tr := &http.Transport{
		Proxy: nil,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			host, _, err := net.SplitHostPort(addr)
			if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
				mu.Lock()
				refused = append(refused, addr)
				mu.Unlock()
				return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("test transport: %s is not a loopback address", addr)}
			}
			var d net.Dialer
			return d.DialContext(ctx, network, addr)
		},
	}
	return tr, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), refused...)
	}
}

// closedPort is a loopback address nothing listens on.
func closedPort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func mustMirror(t *testing.T, s string) ociimage.Mirror {
	t.Helper()
	m, err := ociimage.ParseMirror(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestRegistryMirror pulls Docker Hub names through a mirror. The in-process
// registry on 127.0.0.1 stands in for the operator's Docker Hub mirror: it
// holds images made here under Docker Hub's paths (library/ubuntu:22.04,
// e2bdev/base:latest). Docker Hub itself is never dialled.
func TestRegistryMirror(t *testing.T) {
	ctx := context.Background()
	hub := ocitest.Registry(t) // stands in for a Docker Hub mirror
	ubuntu := ocitest.Build(t, ociimage.Config{Env: []string{"PATH=/bin"}},
		ocitest.FilesLayer(t, map[string]string{"etc/marker": "ubuntu from the mirror\n"}))
	base := ocitest.Build(t, ociimage.Config{}, ocitest.FilesLayer(t, map[string]string{"etc/marker": "e2bdev/base from the mirror\n"}))
	ocitest.Push(t, hub, "library/ubuntu:22.04", ubuntu)
	ocitest.Push(t, hub, "e2bdev/base:latest", base)
	ubuntuDigest, err := ubuntu.Digest()
	if err != nil {
		t.Fatal(err)
	}
	tr, refused := loopbackOnly()
	opts := ociimage.Options{Transport: tr, Mirrors: []ociimage.Mirror{mustMirror(t, "docker.io=http://"+hub)}}

	for ref, marker := range map[string]string{
		"ubuntu:22.04":                         "ubuntu from the mirror\n",
		"docker.io/library/ubuntu:22.04":       "ubuntu from the mirror\n",
		"index.docker.io/library/ubuntu:22.04": "ubuntu from the mirror\n",
		"docker://ubuntu:22.04":                "ubuntu from the mirror\n",
		"ubuntu@" + ubuntuDigest.String():      "ubuntu from the mirror\n",
		"e2bdev/base:latest":                   "e2bdev/base from the mirror\n",
		"docker.io/e2bdev/base:latest":         "e2bdev/base from the mirror\n",
	} {
		im, err := ociimage.Open(ctx, ref, opts)
		if err != nil {
			t.Errorf("%s through the mirror: %v", ref, err)
			continue
		}
		if im.Mirror != "http://"+hub {
			t.Errorf("%s: Image.Mirror = %q", ref, im.Mirror)
		}
		dst := t.TempDir()
		if err := im.Extract(ctx, dst, nil); err != nil {
			t.Errorf("%s: extract: %v", ref, err)
			continue
		}
		if got := readFile(t, filepath.Join(dst, "etc/marker")); got != marker {
			t.Errorf("%s: /etc/marker = %q, want %q", ref, got, marker)
		}
		if strings.HasPrefix(ref, "ubuntu") && im.Digest != ubuntuDigest.String() {
			t.Errorf("%s: digest %s, pushed %s", ref, im.Digest, ubuntuDigest)
		}
	}

	// A tag the mirror lacks: not found, naming the image and the mirror.
	_, err = ociimage.Open(ctx, "ubuntu:24.04", opts)
	if !errors.Is(err, ociimage.ErrNotFound) || !strings.Contains(err.Error(), "ubuntu:24.04") || !strings.Contains(err.Error(), "http://"+hub) {
		t.Errorf("missing tag through the mirror: %v", err)
	}
	// Another registry is not redirected (and here not reachable).
	_, err = ociimage.Open(ctx, "ghcr.io/e2b-dev/base:1", opts)
	if !errors.Is(err, ociimage.ErrUnreachable) || strings.Contains(err.Error(), hub) {
		t.Errorf("ghcr.io with a docker.io mirror: %v", err)
	}
	if r := refused(); len(r) != 1 || r[0] != "ghcr.io:443" {
		t.Errorf("dials refused = %v, want only ghcr.io:443", r)
	}
}

// TestRegistryMirrorFailures: without a mirror Docker Hub names go to Docker
// Hub (refused here before any lookup); a mirror that is down fails fast with
// the image, the mirror and the cause, and never falls back to Docker Hub; an
// https:// mirror is never spoken to in plain HTTP.
func TestRegistryMirrorFailures(t *testing.T) {
	ctx := context.Background()
	tr, refused := loopbackOnly()

	start := time.Now()
	_, err := ociimage.Open(ctx, "ubuntu:22.04", ociimage.Options{Transport: tr})
	if !errors.Is(err, ociimage.ErrUnreachable) || !strings.Contains(err.Error(), "ubuntu:22.04") {
		t.Errorf("no mirror: %v", err)
	}
	if r := refused(); len(r) == 0 || r[0] != "index.docker.io:443" {
		t.Errorf("no mirror: dials refused = %v, want index.docker.io:443", r)
	}
	t.Logf("no mirror, %v: %v", time.Since(start).Round(time.Millisecond), err)

	tr, refused = loopbackOnly()
	down := closedPort(t)
	opts := ociimage.Options{Transport: tr, Mirrors: []ociimage.Mirror{mustMirror(t, "docker.io=http://"+down)}}
	start = time.Now()
	_, err = ociimage.Open(ctx, "ubuntu:22.04", opts)
	took := time.Since(start)
	if !errors.Is(err, ociimage.ErrUnreachable) {
		t.Errorf("mirror down: %v", err)
	}
	for _, want := range []string{"ubuntu:22.04", "index.docker.io/library/ubuntu:22.04", "registry mirror http://" + down, "for docker.io", "connection refused"} {
		if err != nil && !strings.Contains(err.Error(), want) {
			t.Errorf("mirror down: %q does not say %q", err, want)
		}
	}
	if took > 10*time.Second {
		t.Errorf("mirror down: failed after %v", took)
	}
	if r := refused(); len(r) != 0 {
		t.Errorf("mirror down: fell back to dialling %v", r)
	}
	t.Logf("mirror down, %v: %v", took.Round(time.Millisecond), err)

	// https:// on a plain-HTTP registry at a loopback address: ggcr alone
	// would fall back to HTTP there; the mirror refuses to.
	hub := ocitest.Registry(t)
	ocitest.Push(t, hub, "library/ubuntu:22.04", ocitest.Build(t, ociimage.Config{}, ocitest.FilesLayer(t, map[string]string{"etc/marker": "x\n"})))
	opts.Mirrors = []ociimage.Mirror{mustMirror(t, "docker.io=https://"+hub)}
	_, err = ociimage.Open(ctx, "ubuntu:22.04", opts)
	if err == nil || !strings.Contains(err.Error(), "refusing plain HTTP") {
		t.Errorf("https:// mirror serving plain HTTP: %v", err)
	}
}

// TestRegistryMirrorVerifies: a mirror that serves altered layer bytes fails
// the extraction; the digests are checked as for any registry.
func TestRegistryMirrorVerifies(t *testing.T) {
	ctx := context.Background()
	hub := ocitest.Registry(t)
	img := ocitest.Build(t, ociimage.Config{}, ocitest.FilesLayer(t, map[string]string{"etc/marker": strings.Repeat("genuine\n", 100)}))
	ocitest.Push(t, hub, "library/ubuntu:22.04", img)
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	layerDigest, err := ls[0].Digest()
	if err != nil {
		t.Fatal(err)
	}
	// A proxy in front of the registry answers the layer blob with another,
	// well-formed layer: only its digest can tell.
	evil, err := ocitest.FilesLayer(t, map[string]string{"etc/marker": "forged\n"}).Compressed()
	if err != nil {
		t.Fatal(err)
	}
	forged, err := io.ReadAll(evil)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: "http", Host: hub})
	proxy.ModifyResponse = func(r *http.Response) error {
		if !strings.HasSuffix(r.Request.URL.Path, "/blobs/"+layerDigest.String()) || r.StatusCode != http.StatusOK {
			return nil
		}
		r.Body.Close()
		r.Body = io.NopCloser(bytes.NewReader(forged))
		r.ContentLength = -1 // sent chunked: no length to give it away early
		r.Header.Del("Content-Length")
		return nil
	}
	srv := httptest.NewServer(proxy)
	defer srv.Close()
	tr, _ := loopbackOnly()
	mirror := "http://" + strings.TrimPrefix(srv.URL, "http://")
	im, err := ociimage.Open(ctx, "ubuntu:22.04", ociimage.Options{Transport: tr, Mirrors: []ociimage.Mirror{mustMirror(t, "docker.io="+mirror)}})
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	err = im.Extract(ctx, dst, nil)
	if !errors.Is(err, ociimage.ErrCorrupt) || !strings.Contains(err.Error(), "through registry mirror "+mirror) {
		t.Fatalf("altered layer from the mirror: %v", err)
	}
	t.Logf("altered layer: %v", err)
	// Extract streams, so dst holds what was written before the check
	// failed; callers (the template builder) discard it on any error.
}
