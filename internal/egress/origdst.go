package egress

import (
	"fmt"
	"net"
	"net/netip"
	"unsafe"

	"golang.org/x/sys/unix"
)

// originalDst is where the sandbox meant to connect before the firewall's
// redirect: conntrack's original destination (SO_ORIGINAL_DST).
func originalDst(c *net.TCPConn) (netip.AddrPort, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return netip.AddrPort{}, err
	}
	var out netip.AddrPort
	var serr error
	err = raw.Control(func(fd uintptr) {
		var sa unix.RawSockaddrInet4
		l := uint32(unsafe.Sizeof(sa))
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, fd, unix.SOL_IP, unix.SO_ORIGINAL_DST,
			uintptr(unsafe.Pointer(&sa)), uintptr(unsafe.Pointer(&l)), 0)
		if errno != 0 {
			serr = errno
			return
		}
		pb := (*[2]byte)(unsafe.Pointer(&sa.Port)) // network byte order
		port := uint16(pb[0])<<8 | uint16(pb[1])
		out = netip.AddrPortFrom(netip.AddrFrom4(sa.Addr), port)
	})
	if err != nil {
		return netip.AddrPort{}, err
	}
	if serr != nil {
		return netip.AddrPort{}, fmt.Errorf("SO_ORIGINAL_DST: %w", serr)
	}
	return out, nil
}
