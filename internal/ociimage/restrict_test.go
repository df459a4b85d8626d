package ociimage_test

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/ociimage/ocitest"
)

// A restricted pull (an image an API key named) refuses a registry on
// loopback before connecting, whatever the name says, and saying why;
// the operator's allowed registries and mirrors are pulled from as usual.
func TestRestrictedPull(t *testing.T) {
	host := ocitest.Registry(t) // 127.0.0.1:port
	img := ocitest.Build(t, ociimage.Config{Env: []string{"A=1"}}, ocitest.FilesLayer(t, map[string]string{"etc/x": "x"}))
	ref := ocitest.Push(t, host, "guarded:v1", img)
	port := host[strings.LastIndex(host, ":"):]
	ctx := context.Background()
	restrict := &ociimage.Restriction{AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}}

	for _, r := range []string{ref, "localhost" + port + "/guarded:v1"} {
		_, err := ociimage.Open(ctx, r, ociimage.Options{Restrict: restrict})
		if !errors.Is(err, ociimage.ErrPrivateRegistry) || !strings.Contains(err.Error(), "--allow-registry") || !strings.Contains(err.Error(), r) {
			t.Errorf("restricted pull of %s: %v", r, err)
		}
	}
	// Loopback stays closed even when every private range is allowed.
	all := &ociimage.Restriction{AllowPrivate: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}}
	if _, err := ociimage.Open(ctx, ref, ociimage.Options{Restrict: all}); !errors.Is(err, ociimage.ErrPrivateRegistry) {
		t.Errorf("loopback with every private range allowed: %v", err)
	}
	// The operator's registry, by its host:port.
	allowed := &ociimage.Restriction{AllowHosts: []string{host}}
	if _, err := ociimage.Open(ctx, ref, ociimage.Options{Restrict: allowed}); err != nil {
		t.Errorf("an allowed registry: %v", err)
	}
	// A mirror is the operator's too.
	m, err := ociimage.ParseMirror("docker.io=http://" + host)
	if err != nil {
		t.Fatal(err)
	}
	ocitest.Push(t, host, "library/guarded:v1", img)
	if _, err := ociimage.Open(ctx, "guarded:v1", ociimage.Options{Restrict: restrict, Mirrors: []ociimage.Mirror{m}}); err != nil {
		t.Errorf("through a mirror: %v", err)
	}
	// Unrestricted (the operator's own FROM) as before.
	if _, err := ociimage.Open(ctx, ref, ociimage.Options{}); err != nil {
		t.Errorf("unrestricted: %v", err)
	}
}

func TestRestrictionAddresses(t *testing.T) {
	r := &ociimage.Restriction{AllowPrivate: []netip.Prefix{netip.MustParsePrefix("10.1.0.0/16")}}
	for addr, want := range map[string]bool{
		"93.184.216.34": true, "2606:2800:220:1::1": true, "10.1.2.3": true,
		"10.2.0.1": false, "172.16.0.1": false, "192.168.1.1": false, "100.64.0.1": false,
		"169.254.169.254": false, "127.0.0.1": false, "::1": false, "0.0.0.0": false, "::": false,
		"fd00::1": false, "fe80::1": false, "::ffff:127.0.0.1": false, "::ffff:10.1.0.1": true, "224.0.0.1": false,
	} {
		if got := ociimage.RestrictionAllows(r, netip.MustParseAddr(addr)); got != want {
			t.Errorf("%s: allowed %v, want %v", addr, got, want)
		}
	}
}
