// Package listeners opens a server's TCP listeners and says how the server
// reaches them itself; the box's server (internal/daemon) and a replica of
// the control plane (internal/replica) open theirs alike.
package listeners

import (
	"fmt"
	"net"
	"strconv"
)

// Open listens on each address, in order; if one fails, it closes those it
// opened and says which address failed.
func Open(addrs ...string) ([]net.Listener, error) {
	var lns []net.Listener
	for _, addr := range addrs {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		lns = append(lns, ln)
	}
	return lns, nil
}

// LoopbackHost is host:port at which this process reaches a listener: an
// unspecified listen address (0.0.0.0) is dialled on 127.0.0.1.
func LoopbackHost(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return a.String()
	}
	ip := tcp.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return net.JoinHostPort(ip.String(), strconv.Itoa(tcp.Port))
}

// LoopbackURL is LoopbackHost as an http:// URL.
func LoopbackURL(a net.Addr) string { return "http://" + LoopbackHost(a) }
