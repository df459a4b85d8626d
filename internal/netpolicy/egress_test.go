package netpolicy_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/netpolicy/netpolicytest"
)

// Egress tests without a runtime: the "sandbox" is a Network's namespace,
// and the test's own sockets, opened inside it, play the sandbox's code.
// Every packet goes to the stand-in internet (netpolicytest), the host
// itself or another test namespace; nothing leaves the machine.

// egressRig is a Network with IPv6 next to a stand-in internet.
type egressRig struct {
	n    *netpolicy.Network
	inet *netpolicytest.Internet
}

func newEgressRig(t *testing.T) *egressRig {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	inet := netpolicytest.Start(t)
	setSysctl(t, "/proc/sys/net/ipv4/ip_forward", "1")
	setSysctl(t, "/proc/sys/net/ipv6/conf/all/forwarding", "1")
	return &egressRig{n: newEgressNetwork(t, inet, "ale", nil), inet: inet}
}

// newEgressNetwork is a Network with IPv6 over the stand-in internet, with
// its own interface prefix, table and range.
func newEgressNetwork(t *testing.T, inet *netpolicytest.Internet, prefix string, allowPrivate []netip.Prefix) *netpolicy.Network {
	t.Helper()
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	n, err := netpolicy.New(netpolicy.Config{
		// Its own /24 and table per run: other test binaries may run at once.
		CIDR:         netip.MustParsePrefix(fmt.Sprintf("10.198.%d.0/24", b[0])),
		StateDir:     filepath.Join(t.TempDir(), "network"),
		Table:        "airlock_egress_" + hex.EncodeToString(b),
		IfPrefix:     prefix,
		DNSUpstreams: []string{inet.DNSUpstream()},
		IPv6:         true,
		AllowPrivate: allowPrivate,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		if err := n.RemoveTable(); err != nil {
			t.Error(err)
		}
	})
	return n
}

// setSysctl sets a sysctl for the test and puts the old value back after.
func setSysctl(t *testing.T, path, v string) {
	t.Helper()
	old, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(v), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.WriteFile(path, old, 0o644) })
}

func (r *egressRig) setup(t *testing.T, id string, p netpolicy.Policy) *netpolicy.Sandbox {
	t.Helper()
	sb, err := r.n.Setup(context.Background(), id, p)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.n.Teardown(id) })
	if !sb.Addr6.IsValid() || !sb.Gateway6.IsValid() {
		t.Fatalf("sandbox %s has no IPv6 address (%s, gateway %s)", id, sb.Addr6, sb.Gateway6)
	}
	return sb
}

// inNS runs fn on a thread inside the namespace at path; sockets fn opens
// stay in that namespace.
func inNS[T any](path string, fn func() (T, error)) (T, error) {
	type res struct {
		v   T
		err error
	}
	ch := make(chan res, 1)
	go func() {
		goruntime.LockOSThread()
		var zero T
		orig, err := netns.Get()
		if err != nil {
			ch <- res{zero, err}
			return
		}
		defer orig.Close()
		ns, err := netns.GetFromPath(path)
		if err != nil {
			ch <- res{zero, err}
			return
		}
		defer ns.Close()
		if err := netns.Set(ns); err != nil {
			ch <- res{zero, err}
			return
		}
		v, err := fn()
		if serr := netns.Set(orig); serr != nil {
			ch <- res{v, serr} // the thread stays locked and dies
			return
		}
		goruntime.UnlockOSThread()
		ch <- res{v, err}
	}()
	r := <-ch
	return r.v, r.err
}

// get fetches http://addr/ from inside a sandbox's namespace.
func get(sb *netpolicy.Sandbox, addr netip.Addr) (string, error) {
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
			return inNS(sb.NetNS, func() (net.Conn, error) {
				d := net.Dialer{Timeout: 2 * time.Second}
				return d.DialContext(ctx, network, a)
			})
		},
		DisableKeepAlives: true,
	}}
	resp, err := c.Get("http://" + netip.AddrPortFrom(addr, 80).String() + "/")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

// expectReach fetches every address at once from the sandbox and checks
// that exactly reach answered as their servers do.
func expectReach(t *testing.T, what string, sb *netpolicy.Sandbox, probed []netip.Addr, reach ...netip.Addr) {
	t.Helper()
	got := make([]bool, len(probed))
	var wg sync.WaitGroup
	for i, a := range probed {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body, err := get(sb, a)
			got[i] = err == nil && strings.Contains(body, "hello from "+a.String())
		}()
	}
	wg.Wait()
	want := map[netip.Addr]bool{}
	for _, a := range reach {
		want[a] = true
	}
	var wrong []string
	for i, a := range probed {
		if got[i] != want[a] {
			wrong = append(wrong, fmt.Sprintf("%s reached=%v want %v", a, got[i], want[a]))
		}
	}
	sort.Strings(wrong)
	if len(wrong) > 0 {
		t.Errorf("%s: %s", what, strings.Join(wrong, "; "))
	}
}

// resolve asks the sandbox's DNS (its gateway, port 53) for name's AAAA
// records from inside its namespace.
func resolve(t *testing.T, sb *netpolicy.Sandbox, name string) []netip.Addr {
	t.Helper()
	conn, err := inNS(sb.NetNS, func() (net.Conn, error) {
		return net.Dial("udp4", netip.AddrPortFrom(sb.Gateway, 53).String())
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(name), dns.TypeAAAA)
	c := &dns.Client{Timeout: 3 * time.Second}
	resp, _, err := c.ExchangeWithConn(q, &dns.Conn{Conn: conn})
	if err != nil {
		t.Fatalf("AAAA %s: %v", name, err)
	}
	var out []netip.Addr
	for _, rr := range resp.Answer {
		if a, ok := rr.(*dns.AAAA); ok {
			ip, _ := netip.AddrFromSlice(a.AAAA)
			out = append(out, ip)
		}
	}
	return out
}

// TestIPv6Egress checks IPv6 egress under the policy engine: the public
// stand-in is reachable by default, every private class is not, allowOut
// opens one host of a class by CIDR, denyOut closes a public one, ALL_TRAFFIC
// closes IPv6 too, domains learn AAAA answers but never a rebinding to a
// unique-local address, and an update opens and closes.
func TestIPv6Egress(t *testing.T) {
	r := newEgressRig(t)
	web1 := netpolicytest.Web1
	web6, web6b, allowed6, blocked6 := netpolicytest.Web6, netpolicytest.Web6b, netpolicytest.Allowed6, netpolicytest.Blocked6
	p6, p6b, site, nat64, sixto4 := netpolicytest.Private6, netpolicytest.Private6b, netpolicytest.SiteLocal6, netpolicytest.NAT64Priv, netpolicytest.SixToFour
	all := append([]netip.Addr{web1, netpolicytest.Private10, netpolicytest.Reserved4}, netpolicytest.PublicHosts6...)
	all = append(all, netpolicytest.PrivateHosts6...)

	// The test hosts are up: the host itself reaches every one.
	hc := &http.Client{Timeout: 2 * time.Second}
	for _, a := range all {
		resp, err := hc.Get("http://" + netip.AddrPortFrom(a, 80).String() + "/")
		if err != nil {
			t.Fatalf("the host cannot reach test host %s: %v", a, err)
		}
		resp.Body.Close()
	}

	def := r.setup(t, "v6default0000000000", netpolicy.Policy{})
	t.Run("namespace has an IPv6 address and default route", func(t *testing.T) {
		checkIPv6(t, def)
	})
	t.Run("the host side has the gateway's IPv6 address alone, no link-local one", func(t *testing.T) {
		l, err := netlink.LinkByName(r.n.HostIf(def.ID))
		if err != nil {
			t.Fatal(err)
		}
		addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
		if err != nil {
			t.Fatal(err)
		}
		if len(addrs) != 1 || addrs[0].IP.String() != def.Gateway6.String() {
			t.Errorf("host side IPv6 addresses %v, want %s alone", addrs, def.Gateway6)
		}
	})
	t.Run("default policy: public IPv6 yes, private classes no", func(t *testing.T) {
		expectReach(t, "default policy", def, all, web1, web6, web6b, allowed6, blocked6)
	})

	opened := r.setup(t, "v6allowcidr00000000", netpolicy.Policy{AllowOut: []string{
		p6b.String() + "/128", "fec0::/10", nat64.String(), "2002:c0a8:fa02::/48", "240.0.0.0/4",
	}})
	t.Run("allowOut CIDRs open one host of each class", func(t *testing.T) {
		expectReach(t, "allowOut private CIDRs", opened, all,
			web1, web6, web6b, allowed6, blocked6, p6b, site, nat64, sixto4, netpolicytest.Reserved4)
	})

	denied := r.setup(t, "v6denycidr000000000", netpolicy.Policy{DenyOut: []string{web6.String() + "/128", "2001:db8:a1c0::b"}})
	t.Run("denyOut of IPv6 CIDRs closes public hosts", func(t *testing.T) {
		expectReach(t, "denyOut "+web6.String(), denied, all, web1, web6b, allowed6)
	})

	closed := r.setup(t, "v6denyall0000000000", netpolicy.Policy{DenyOut: []string{netpolicy.AllTraffic}})
	t.Run("denyOut 0.0.0.0/0 closes IPv6 too", func(t *testing.T) {
		expectReach(t, "denyOut ALL_TRAFFIC", closed, all)
	})
	only6 := r.setup(t, "v6denyonly600000000", netpolicy.Policy{DenyOut: []string{"::/0"}})
	t.Run("denyOut ::/0 closes IPv6 only", func(t *testing.T) {
		expectReach(t, "denyOut ::/0", only6, all, web1)
	})

	domains := r.setup(t, "v6domains0000000000", netpolicy.Policy{
		DenyOut: []string{netpolicy.AllTraffic}, AllowOut: []string{"allowed6.test", "private6.test"},
	})
	t.Run("a domain in allowOut learns AAAA answers, never a unique-local one", func(t *testing.T) {
		expectReach(t, "before resolving", domains, all)
		if got := resolve(t, domains, "allowed6.test"); len(got) != 1 || got[0] != allowed6 {
			t.Fatalf("allowed6.test AAAA = %v, want %s", got, allowed6)
		}
		// The rebinding answer is given, but its address stays closed.
		if got := resolve(t, domains, "private6.test"); len(got) != 1 || got[0] != p6 {
			t.Fatalf("private6.test AAAA = %v, want %s", got, p6)
		}
		if got := resolve(t, domains, "blocked6.test"); len(got) != 0 {
			t.Errorf("blocked6.test resolved under ALL_TRAFFIC denied: %v", got)
		}
		expectReach(t, "after resolving", domains, all, allowed6)
	})

	t.Run("update opens and closes a unique-local host", func(t *testing.T) {
		if err := r.n.Update(def.ID, netpolicy.Policy{AllowOut: []string{p6.String()}}); err != nil {
			t.Fatal(err)
		}
		expectReach(t, "after update", def, all, web1, web6, web6b, allowed6, blocked6, p6)
		if err := r.n.Update(def.ID, netpolicy.Policy{}); err != nil {
			t.Fatal(err)
		}
		expectReach(t, "after update back", def, all, web1, web6, web6b, allowed6, blocked6)
	})

	t.Run("--allow-private opens a unique-local range and, with 10/8, its NAT64 form", func(t *testing.T) {
		open, err := netpolicy.ParseAllowPrivate([]string{"fdaa:a1c0:251::/64", "10.251.0.0/16"})
		if err != nil {
			t.Fatal(err)
		}
		n2 := newEgressNetwork(t, r.inet, "alf", open)
		sb, err := n2.Setup(context.Background(), "v6allowpriv00000000", netpolicy.Policy{})
		if err != nil {
			t.Fatal(err)
		}
		defer n2.Teardown(sb.ID)
		expectReach(t, "--allow-private "+strings.Join([]string{"fdaa:a1c0:251::/64", "10.251.0.0/16"}, ","), sb, all,
			web1, web6, web6b, allowed6, blocked6, p6b, nat64, netpolicytest.Private10)
		sb2, err := n2.Setup(context.Background(), "v6allowprivdeny0000", netpolicy.Policy{DenyOut: []string{p6b.String()}})
		if err != nil {
			t.Fatal(err)
		}
		defer n2.Teardown(sb2.ID)
		expectReach(t, "--allow-private, denyOut "+p6b.String(), sb2, all,
			web1, web6, web6b, allowed6, blocked6, nat64, netpolicytest.Private10)
	})
}

func checkIPv6(t *testing.T, sb *netpolicy.Sandbox) {
	t.Helper()
	ns, err := netns.GetFromPath(sb.NetNS)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	eth, err := h.LinkByName("eth0")
	if err != nil {
		t.Fatal(err)
	}
	addrs, _ := h.AddrList(eth, netlink.FAMILY_V6)
	var found bool
	for _, a := range addrs {
		found = found || a.IP.Equal(net.IP(sb.Addr6.AsSlice()))
	}
	if !found {
		t.Errorf("eth0 IPv6 addresses %v lack %s", addrs, sb.Addr6)
	}
	routes, _ := h.RouteList(eth, netlink.FAMILY_V6)
	var gw bool
	for _, rt := range routes {
		def := rt.Dst == nil || rt.Dst.String() == "::/0"
		gw = gw || def && rt.Gw.Equal(net.IP(sb.Gateway6.AsSlice()))
	}
	if !gw {
		t.Errorf("no IPv6 default route via %s: %v", sb.Gateway6, routes)
	}
}

// TestIPv6Isolation checks that a sandbox reaches neither the host (its
// gateway, its link-local address, its global addresses) nor another
// sandbox over IPv6, and that a spoofed IPv6 source is dropped.
func TestIPv6Isolation(t *testing.T) {
	r := newEgressRig(t)
	a := r.setup(t, "v6isoa0000000000000", netpolicy.Policy{DenyOut: []string{netpolicy.AllTraffic}})
	b := r.setup(t, "v6isob0000000000000", netpolicy.Policy{})

	// A server of the host's on every IPv6 address.
	l, err := net.Listen("tcp6", "[::]:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go acceptLoop(l)
	port := uint16(l.Addr().(*net.TCPAddr).Port)

	hostAddrs := []netip.AddrPort{netip.AddrPortFrom(b.Gateway6, port)}
	// The host side's link-local address, with the sandbox's eth0 as zone.
	hostLink, err := netlink.LinkByName(r.n.HostIf(b.ID))
	if err != nil {
		t.Fatal(err)
	}
	waitLinkLocal(t, hostLink)
	lls, _ := netlink.AddrList(hostLink, netlink.FAMILY_V6)
	for _, ad := range lls {
		if ip, ok := netip.AddrFromSlice(ad.IP); ok && ip.IsLinkLocalUnicast() {
			hostAddrs = append(hostAddrs, netip.AddrPortFrom(ip.WithZone("eth0"), port))
		}
	}
	// The host's global addresses (the machine's own network included:
	// packets to them are delivered locally, never sent).
	globals, _ := netlink.AddrList(nil, netlink.FAMILY_V6)
	for _, ad := range globals {
		if ip, ok := netip.AddrFromSlice(ad.IP); ok && ip.IsGlobalUnicast() && !strings.HasPrefix(ip.String(), "fdaa:a1c0:") {
			hostAddrs = append(hostAddrs, netip.AddrPortFrom(ip, port))
		}
	}
	t.Logf("host addresses probed: %v", hostAddrs)
	// The host reaches its own server (the test would prove nothing
	// otherwise) ...
	if c, err := net.DialTimeout("tcp6", netip.AddrPortFrom(b.Gateway6, port).String(), time.Second); err != nil {
		t.Fatalf("host to its own server: %v", err)
	} else {
		c.Close()
	}
	// ... and no sandbox does, whatever its policy.
	for _, sb := range []*netpolicy.Sandbox{a, b} {
		for _, ap := range hostAddrs {
			if dialFrom(sb, ap, time.Second) == nil {
				t.Errorf("sandbox %s reached the host at %s", sb.ID, ap)
			}
		}
	}

	// Sandbox to sandbox: b listens, the host reaches it, a does not.
	bl, err := inNS(b.NetNS, func() (net.Listener, error) { return net.Listen("tcp6", "[::]:8080") })
	if err != nil {
		t.Fatal(err)
	}
	defer bl.Close()
	go acceptLoop(bl)
	bAddr := netip.AddrPortFrom(b.Addr6, 8080)
	if c, err := net.DialTimeout("tcp6", bAddr.String(), time.Second); err != nil {
		t.Fatalf("host to sandbox %s: %v", bAddr, err)
	} else {
		c.Close()
	}
	c := r.setup(t, "v6isoc0000000000000", netpolicy.Policy{})
	for _, sb := range []*netpolicy.Sandbox{a, c} {
		if dialFrom(sb, bAddr, time.Second) == nil {
			t.Errorf("sandbox %s reached sandbox %s at %s", sb.ID, b.ID, bAddr)
		}
	}

	// Spoofing: a (everything denied) sends from b's address (free bind:
	// the address is not a's); the datagram must not arrive, while b's own
	// does.
	send := func(from *netpolicy.Sandbox, src netip.Addr, payload string) {
		t.Helper()
		_, err := inNS(from.NetNS, func() (struct{}, error) {
			lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
				var serr error
				if err := rc.Control(func(fd uintptr) {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_IPV6, unix.IPV6_FREEBIND, 1)
				}); err != nil {
					return err
				}
				return serr
			}}
			pc, err := lc.ListenPacket(context.Background(), "udp6", netip.AddrPortFrom(src, 0).String())
			if err != nil {
				return struct{}{}, err
			}
			defer pc.Close()
			_, err = pc.WriteTo([]byte(payload), net.UDPAddrFromAddrPort(netpolicytest.UDPSink6))
			return struct{}{}, err
		})
		if err != nil {
			t.Fatalf("send from %s as %s: %v", from.ID, src, err)
		}
	}
	tag := fmt.Sprintf("%d", time.Now().UnixNano())
	send(a, b.Addr6, "spoofed-"+tag)
	send(a, a.Addr6, "own-a-"+tag)
	send(b, b.Addr6, "own-b-"+tag)
	deadline := time.Now().Add(3 * time.Second)
	for len(r.inet.UDPFrom("own-b-"+tag)) == 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if len(r.inet.UDPFrom("own-b-"+tag)) == 0 {
		t.Fatal("b's own datagram did not arrive: the check proves nothing")
	}
	time.Sleep(300 * time.Millisecond)
	if got := r.inet.UDPFrom("spoofed-" + tag); len(got) > 0 {
		t.Errorf("a datagram with a spoofed IPv6 source arrived (from %v)", got)
	}
	if got := r.inet.UDPFrom("own-a-" + tag); len(got) > 0 {
		t.Errorf("a sandbox with ALL_TRAFFIC denied sent IPv6 (from %v)", got)
	}
}

func acceptLoop(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		c.Close()
	}
}

// dialFrom connects to ap from inside sb's namespace.
func dialFrom(sb *netpolicy.Sandbox, ap netip.AddrPort, timeout time.Duration) error {
	c, err := inNS(sb.NetNS, func() (net.Conn, error) {
		return net.DialTimeout("tcp6", ap.String(), timeout)
	})
	if err == nil {
		c.Close()
	}
	return err
}

// waitLinkLocal waits until the link has its IPv6 link-local address (the
// kernel adds it when the link comes up, after duplicate address detection).
func waitLinkLocal(t *testing.T, l netlink.Link) {
	t.Helper()
	for range 50 {
		addrs, _ := netlink.AddrList(l, netlink.FAMILY_V6)
		for _, a := range addrs {
			if a.IP.IsLinkLocalUnicast() && a.Flags&unix.IFA_F_TENTATIVE == 0 {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("%s has no usable link-local address yet", l.Attrs().Name)
}
