// Package netpolicytest builds a stand-in "internet" for network tests: a
// network namespace the test owns, joined to the host by a veth, holding
// addresses from the documentation ranges (TEST-NET-2 198.51.100.0/24 and
// TEST-NET-3 203.0.113.0/24, which public networks do not route; only the
// stand-in's own hosts get host routes, since a machine's real gateway or
// proxy may sit in these ranges) with a web server and a DNS server in it.
// Traffic never leaves the machine.
//
// It also holds private test hosts (Private*): addresses in the private
// ranges a sandbox must not reach by default, routed to this namespace by
// host routes of their own (/32 and /128; the link itself is the ULA
// fdaa:a1c0:250::/64) so that no real private network is ever touched. They
// avoid the ranges Airlock and its tests use for sandboxes (10.77/16,
// 10.100-249.x), the host's resolver (10.255.255.53 on the project's
// machines) and the host's own IPv6 network (fd00::/64).
//
// The IPv6 stand-in public internet is in the documentation range
// 2001:db8::/32 (Web6, Allowed6, Blocked6), which Airlock leaves open like
// any public address for this reason; only /128 host routes lead there.
package netpolicytest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/nsfile"
)

// Addresses of the stand-in internet. Every web server answers
// "hello from <its address>".
var (
	HostSide = netip.MustParseAddr("198.51.100.1")  // the host's end of the link
	Web1     = netip.MustParseAddr("198.51.100.10") // web server
	Web2     = netip.MustParseAddr("198.51.100.20") // web server
	Allowed  = netip.MustParseAddr("203.0.113.10")  // allowed.test
	Blocked  = netip.MustParseAddr("203.0.113.20")  // blocked.test
	DNS      = netip.MustParseAddr("203.0.113.53")  // authoritative for *.test
	Metadata = netip.MustParseAddr("169.254.77.77") // a cloud-metadata look-alike

	Private192 = netip.MustParseAddr("192.168.250.2")    // private.test
	Private10  = netip.MustParseAddr("10.251.0.2")       // outside every sandbox range
	Private172 = netip.MustParseAddr("172.29.250.2")     // RFC 1918's middle range
	Private100 = netip.MustParseAddr("100.66.250.2")     // shared address space (CGNAT)
	Private6   = netip.MustParseAddr("fdaa:a1c0:250::2") // IPv6 unique-local, on the link
	Reserved4  = netip.MustParseAddr("240.77.0.2")       // reserved 240.0.0.0/4 (class E)

	// The IPv6 stand-in internet (documentation range, public-looking).
	Web6     = netip.MustParseAddr("2001:db8:a1c0::10")
	Web6b    = netip.MustParseAddr("2001:db8:a1c0::20")
	Allowed6 = netip.MustParseAddr("2001:db8:a1c0::a") // allowed6.test
	Blocked6 = netip.MustParseAddr("2001:db8:a1c0::b") // blocked6.test

	// Private IPv6 test hosts beyond the link.
	Private6b  = netip.MustParseAddr("fdaa:a1c0:251::2")  // unique-local, another /64
	SiteLocal6 = netip.MustParseAddr("fec0:a1c0::2")      // deprecated site-local
	NAT64Priv  = netip.MustParseAddr("64:ff9b::afb:2")    // 64:ff9b::10.251.0.2, Private10 through NAT64
	SixToFour  = netip.MustParseAddr("2002:c0a8:fa02::2") // 6to4 form of Private192
)

// PrivateHosts are the private IPv4 test hosts.
var PrivateHosts = []netip.Addr{Private192, Private10, Private172, Private100, Reserved4}

// PrivateHosts6 are the private IPv6 test hosts (Private6 included).
var PrivateHosts6 = []netip.Addr{Private6, Private6b, SiteLocal6, NAT64Priv, SixToFour}

// PublicHosts6 are the public-looking IPv6 test hosts.
var PublicHosts6 = []netip.Addr{Web6, Web6b, Allowed6, Blocked6}

// Names6 are the names the DNS server answers AAAA for (TTL 60 s); no name
// has both an A and an AAAA record, so tests over IPv4 are not moved to IPv6.
var Names6 = map[string]netip.Addr{
	"allowed6.test.":     Allowed6,
	"www.allowed6.test.": Allowed6,
	"blocked6.test.":     Blocked6,
	"private6.test.":     Private6, // a public-looking name rebound to a unique-local address
}

// Names the DNS server answers (TTL 60 s).
var Names = map[string]netip.Addr{
	"allowed.test.":     Allowed,
	"www.allowed.test.": Allowed,
	"blocked.test.":     Blocked,
	"private.test.":     Private192, // an allowed-looking name with a private address
}

// lockPath is the lock one stand-in internet at a time holds.
const lockPath = "/run/airlock-netpolicytest.lock"

// Internet is a running stand-in internet.
type Internet struct {
	HostIf  string
	nsPath  string
	closers []func()

	mu      sync.Mutex
	udpSeen map[string][]netip.Addr // payload -> source addresses it arrived from
}

// UDPSink and UDPSink6 are where the stand-in internet records UDP
// datagrams: each payload with the source address it arrived from (after the
// host's masquerade).
var (
	UDPSink  = netip.AddrPortFrom(Web1, 9999)
	UDPSink6 = netip.AddrPortFrom(Web6, 9999)
)

// UDPFrom returns the source addresses a payload arrived from at UDPSink.
func (in *Internet) UDPFrom(payload string) []netip.Addr {
	in.mu.Lock()
	defer in.mu.Unlock()
	return append([]netip.Addr(nil), in.udpSeen[payload]...)
}

// DNSUpstream is the "ip:port" of the stand-in's DNS server.
func (in *Internet) DNSUpstream() string { return netip.AddrPortFrom(DNS, 53).String() }

// TB is the part of testing.TB that Start and StartEgress use (the
// package does not import testing, so `airlock bench egress` can run the
// stand-in too).
type TB interface {
	Helper()
	Fatal(args ...any)
	Cleanup(func())
	TempDir() string
	Logf(format string, args ...any)
}

// Start creates the stand-in internet; everything is removed at test cleanup,
// also when the test fails half-way.
func Start(t TB) *Internet {
	t.Helper()
	in, err := Open(filepath.Join(t.TempDir(), "internet"), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(in.Close)
	return in
}

// Open creates the stand-in internet, its namespace bind-mounted at nsPath,
// outside a test; Close removes everything, and Open removes what it made
// when it fails half-way. logf (may be nil) hears about waiting for another
// stand-in to go.
func Open(nsPath string, logf func(format string, args ...any)) (in *Internet, err error) {
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	in = &Internet{HostIf: "lkn" + hex.EncodeToString(b), nsPath: nsPath}
	defer func() {
		if err != nil {
			in.Close()
			in = nil
		}
	}()
	// One stand-in internet per machine at a time: its host routes (the
	// TEST-NET-3 range, the private test hosts) exist once, and test
	// binaries of several packages run in parallel under go test ./....
	lock, err := os.OpenFile(lockPath, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("stand-in internet: %w", err)
	}
	in.closers = append(in.closers, func() { lock.Close() }) // runs last
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		if logf != nil {
			logf("waiting for another test's stand-in internet to go (%s)", lockPath)
		}
		if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX); err != nil {
			return nil, fmt.Errorf("stand-in internet: lock %s: %w", lockPath, err)
		}
	}
	ns, err := nsfile.Make(in.nsPath)
	if err != nil {
		return nil, fmt.Errorf("stand-in internet: %w", err)
	}
	in.closers = append(in.closers, func() { _ = nsfile.Remove(in.nsPath) })
	defer ns.Close()
	if err := in.link(ns); err != nil {
		return nil, err
	}
	if err := in.serve(ns); err != nil {
		return nil, err
	}
	return in, nil
}

// Close stops the stand-in's servers and removes its namespace, veth and
// routes (the routes go with the veth).
func (in *Internet) Close() {
	for i := len(in.closers) - 1; i >= 0; i-- {
		in.closers[i]()
	}
	in.closers = nil
}

func (in *Internet) link(ns netns.NsHandle) error {
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: in.HostIf}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("internet veth: %w", err)
	}
	in.closers = append(in.closers, func() {
		if l, err := netlink.LinkByName(in.HostIf); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	host, err := netlink.LinkByName(in.HostIf)
	if err != nil {
		return err
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: prefixNet("198.51.100.1/24")}); err != nil {
		return fmt.Errorf("internet host address: %w", err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return err
	}
	if err := netlink.AddrAdd(host, &netlink.Addr{IPNet: prefixNet("fdaa:a1c0:250::1/64"), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("internet host IPv6 address: %w", err)
	}
	// The second range's hosts, the metadata address and the private hosts
	// sit behind the first. Host routes, never the whole 203.0.113.0/24: on
	// some machines the real outside world is reached through an address in
	// it (this project's machine kind resolves deb.debian.org, the npm
	// registry and the Go proxy to 203.0.113.80), and a /24 route would cut
	// every build and download on the machine off while a test runs.
	dsts := []string{Allowed.String() + "/32", Blocked.String() + "/32", DNS.String() + "/32", "169.254.77.77/32"}
	for _, a := range PrivateHosts {
		dsts = append(dsts, a.String()+"/32")
	}
	for _, dst := range dsts {
		r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: prefixNet(dst), Gw: net.IP(Web1.AsSlice())}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("route %s: %w", dst, err)
		}
	}
	// IPv6: /128 host routes only, through the stand-in's link address.
	for _, a := range append(append([]netip.Addr(nil), PublicHosts6...), PrivateHosts6[1:]...) {
		r := &netlink.Route{LinkIndex: host.Attrs().Index, Dst: prefixNet(a.String() + "/128"), Gw: net.IP(Private6.AsSlice())}
		if err := netlink.RouteAdd(r); err != nil {
			return fmt.Errorf("route %s: %w", a, err)
		}
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	lo, _ := h.LinkByName("lo")
	eth, err := h.LinkByName("eth0")
	if err != nil {
		return err
	}
	addrs := []string{"198.51.100.10/24", "198.51.100.20/24", "203.0.113.10/24", "203.0.113.20/24", "203.0.113.53/24", "169.254.77.77/32"}
	for _, a := range PrivateHosts {
		addrs = append(addrs, a.String()+"/32")
	}
	for _, a := range addrs {
		if err := h.AddrAdd(eth, &netlink.Addr{IPNet: prefixNet(a)}); err != nil {
			return fmt.Errorf("internet address %s: %w", a, err)
		}
	}
	// No duplicate address detection: the address is usable at once.
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: prefixNet(Private6.String() + "/64"), Flags: unix.IFA_F_NODAD}); err != nil {
		return fmt.Errorf("internet address %s: %w", Private6, err)
	}
	for _, a := range append(append([]netip.Addr(nil), PublicHosts6...), PrivateHosts6[1:]...) {
		if err := h.AddrAdd(eth, &netlink.Addr{IPNet: prefixNet(a.String() + "/128"), Flags: unix.IFA_F_NODAD}); err != nil {
			return fmt.Errorf("internet address %s: %w", a, err)
		}
	}
	if err := h.LinkSetUp(lo); err != nil {
		return err
	}
	return h.LinkSetUp(eth)
}

func prefixNet(s string) *net.IPNet {
	p := netip.MustParsePrefix(s)
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// serve opens the servers' sockets inside the namespace (from a locked thread
// switched into it; sockets stay in the namespace they were made in) and
// serves them from ordinary goroutines.
func (in *Internet) serve(ns netns.NsHandle) error {
	type socks struct {
		udp    net.PacketConn
		udp6   net.PacketConn
		web    net.Listener
		web6   net.Listener
		dnsUDP net.PacketConn
		dnsTCP net.Listener
		err    error
	}
	ch := make(chan socks, 1)
	go func() {
		goruntime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			ch <- socks{err: err}
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			ch <- socks{err: err}
			goruntime.UnlockOSThread()
			return
		}
		var s socks
		s.web, s.err = net.Listen("tcp4", "0.0.0.0:80")
		if s.err == nil {
			s.web6, s.err = net.Listen("tcp6", "[::]:80")
		}
		if s.err == nil {
			s.udp, s.err = net.ListenPacket("udp4", UDPSink.String())
		}
		if s.err == nil {
			s.udp6, s.err = net.ListenPacket("udp6", UDPSink6.String())
		}
		if s.err == nil {
			s.dnsUDP, s.err = net.ListenPacket("udp4", DNS.String()+":53")
		}
		if s.err == nil {
			s.dnsTCP, s.err = net.Listen("tcp4", DNS.String()+":53")
		}
		if err := netns.Set(orig); err != nil {
			s.err = errors.Join(s.err, err)
			ch <- s
			return // the thread stays locked and is discarded
		}
		goruntime.UnlockOSThread()
		ch <- s
	}()
	s := <-ch
	if s.err != nil {
		return fmt.Errorf("internet servers: %w", s.err)
	}
	web := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		local, _ := r.Context().Value(http.LocalAddrContextKey).(net.Addr)
		host, _, _ := net.SplitHostPort(local.String())
		fmt.Fprintf(w, "hello from %s\n", host)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = web.Serve(s.web) }()
	go func() { _ = web.Serve(s.web6) }()
	in.udpSeen = map[string][]netip.Addr{}
	for _, pc := range []net.PacketConn{s.udp, s.udp6} {
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				src := from.(*net.UDPAddr).AddrPort().Addr().Unmap()
				in.mu.Lock()
				in.udpSeen[string(buf[:n])] = append(in.udpSeen[string(buf[:n])], src)
				in.mu.Unlock()
			}
		}()
		in.closers = append(in.closers, func() { _ = pc.Close() })
	}
	in.closers = append(in.closers, func() { _ = web.Shutdown(context.Background()); _ = web.Close() })

	mux := dns.NewServeMux()
	mux.HandleFunc("test.", func(w dns.ResponseWriter, q *dns.Msg) {
		m := new(dns.Msg)
		m.SetReply(q)
		m.Authoritative = true
		if len(q.Question) == 1 {
			name := dns.CanonicalName(q.Question[0].Name)
			a, ok4 := Names[name]
			a6, ok6 := Names6[name]
			switch {
			case !ok4 && !ok6:
				m.Rcode = dns.RcodeNameError
			case q.Question[0].Qtype == dns.TypeA && ok4:
				m.Answer = append(m.Answer, &dns.A{
					Hdr: dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
					A:   net.IP(a.AsSlice()),
				})
			case q.Question[0].Qtype == dns.TypeAAAA && ok6:
				m.Answer = append(m.Answer, &dns.AAAA{
					Hdr:  dns.RR_Header{Name: q.Question[0].Name, Rrtype: dns.TypeAAAA, Class: dns.ClassINET, Ttl: 60},
					AAAA: net.IP(a6.AsSlice()),
				})
			}
		}
		_ = w.WriteMsg(m)
	})
	udp := &dns.Server{PacketConn: s.dnsUDP, Handler: mux}
	tcp := &dns.Server{Listener: s.dnsTCP, Handler: mux}
	go func() { _ = udp.ActivateAndServe() }()
	go func() { _ = tcp.ActivateAndServe() }()
	in.closers = append(in.closers, func() { _ = udp.Shutdown(); _ = tcp.Shutdown() })
	return nil
}

// RouteBack routes the replies to a range the host reaches without
// masquerading (a Kubernetes node's Pods, say) back through the host: the
// stand-in knows only its own link otherwise. The route goes with the
// namespace.
func (in *Internet) RouteBack(p netip.Prefix) error {
	ns, err := netns.GetFromPath(in.nsPath)
	if err != nil {
		return fmt.Errorf("stand-in internet: %w", err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return err
	}
	defer h.Close()
	if err := h.RouteAdd(&netlink.Route{Dst: prefixNet(p.String()), Gw: net.IP(HostSide.AsSlice())}); err != nil {
		return fmt.Errorf("stand-in internet: route to %s: %w", p, err)
	}
	return nil
}
