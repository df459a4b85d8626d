package netguard

import (
	"errors"
	"net/netip"
	"testing"
)

func TestPublic(t *testing.T) {
	for addr, want := range map[string]bool{
		"8.8.8.8": true, "1.1.1.1": true, "2001:4860:4860::8888": true, "::ffff:8.8.8.8": true,
		"127.0.0.1": false, "127.8.9.10": false, "::1": false,
		"10.0.0.1": false, "172.16.5.4": false, "192.168.1.1": false, "fd12::1": false,
		"100.64.0.1": false, "100.127.255.254": false,
		"169.254.169.254": false, "fe80::1": false,
		"0.0.0.0": false, "::": false, "0.1.2.3": false,
		"224.0.0.1": false, "ff02::1": false,
		"255.255.255.255": false, "240.0.0.1": false,
		"::ffff:127.0.0.1": false, "::ffff:10.0.0.1": false,
	} {
		if got := Public(netip.MustParseAddr(addr)); got != want {
			t.Errorf("Public(%s) = %v, want %v", addr, got, want)
		}
	}
	if Public(netip.Addr{}) {
		t.Error("the zero Addr is public")
	}
}

func TestControl(t *testing.T) {
	c := Control(Public, "; hint")
	if err := c("tcp4", "8.8.8.8:443", nil); err != nil {
		t.Errorf("public address refused: %v", err)
	}
	err := c("tcp4", "127.0.0.1:80", nil)
	if !errors.Is(err, ErrRefused) || err.Error() != "address refused: 127.0.0.1 is a loopback, private, link-local or otherwise non-public address; hint" {
		t.Errorf("loopback: %v", err)
	}
	if err := c("tcp6", "[::ffff:10.1.1.1]:80", nil); !errors.Is(err, ErrRefused) {
		t.Errorf("mapped private address: %v", err)
	}
	if err := c("tcp", "not-an-address", nil); !errors.Is(err, ErrRefused) {
		t.Errorf("garbage: %v", err)
	}
}
