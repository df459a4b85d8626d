package listeners

import (
	"net"
	"strings"
	"testing"
)

// TestOpen: all listeners or none, the failing address named.
func TestOpen(t *testing.T) {
	lns, err := Open("127.0.0.1:0", "127.0.0.1:0")
	if err != nil || len(lns) != 2 {
		t.Fatalf("Open: %v %v", lns, err)
	}
	taken := lns[0].Addr().String()
	defer lns[1].Close()
	free := "127.0.0.1:0"
	if got, err := Open(free, taken); err == nil || got != nil || !strings.Contains(err.Error(), "listen on "+taken) {
		t.Fatalf("Open with a taken address: %v %v", got, err)
	}
	lns[0].Close()
}

// TestLoopback: an unspecified host is dialled on 127.0.0.1, a given one
// as it is.
func TestLoopback(t *testing.T) {
	for _, c := range []struct {
		addr net.Addr
		want string
	}{
		{&net.TCPAddr{IP: net.IPv4zero, Port: 3000}, "127.0.0.1:3000"},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 3000}, "127.0.0.1:3000"},
		{&net.TCPAddr{Port: 3001}, "127.0.0.1:3001"},
		{&net.TCPAddr{IP: net.ParseIP("10.0.0.5"), Port: 80}, "10.0.0.5:80"},
		{&net.TCPAddr{IP: net.ParseIP("::1"), Port: 80}, "[::1]:80"},
		{&net.UnixAddr{Name: "/run/x.sock", Net: "unix"}, "/run/x.sock"},
	} {
		if got := LoopbackHost(c.addr); got != c.want {
			t.Errorf("LoopbackHost(%v) = %q, want %q", c.addr, got, c.want)
		}
	}
	if got := LoopbackURL(&net.TCPAddr{Port: 9}); got != "http://127.0.0.1:9" {
		t.Errorf("LoopbackURL = %q", got)
	}
}
