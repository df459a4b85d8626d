package daemon

import (
	"net"
	"strconv"
)

// loopbackURL is how the server reaches one of its own listeners: an
// unspecified listen address (0.0.0.0) is dialled on 127.0.0.1.
func loopbackURL(a net.Addr) string {
	tcp, ok := a.(*net.TCPAddr)
	if !ok {
		return "http://" + a.String()
	}
	ip := tcp.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return "http://" + net.JoinHostPort(ip.String(), strconv.Itoa(tcp.Port))
}
