package netpolicy

import (
	"github.com/airlock-sandbox/airlock/internal/nsfile"

	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestPolicyValidate(t *testing.T) {
	good := []Policy{
		{},
		{DenyOut: []string{AllTraffic}, AllowOut: []string{"1.2.3.4", "10.0.0.0/8", "example.com", "*.example.org", "*"}},
		{DenyOut: []string{"192.0.2.0/24", "198.51.100.7"}},
		{DenyOut: []string{"::/0", "2001:db8::/32"}, AllowOut: []string{"fdaa:a1c0:250::2", "2001:db8:1::/48"}},
	}
	for _, p := range good {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	bad := map[string]Policy{
		`denyOut entry "example.com"`:  {DenyOut: []string{"example.com"}},
		`denyOut entry "10.0.0.0/33"`:  {DenyOut: []string{"10.0.0.0/33"}},
		`denyOut entry "::/129"`:       {DenyOut: []string{"::/129"}},
		`denyOut entry "fe80::1%eth0"`: {DenyOut: []string{"fe80::1%eth0"}},
		`allowOut entry "bad host!"`:   {AllowOut: []string{"bad host!"}},
		`allowOut entry "a..b"`:        {AllowOut: []string{"a..b"}},
	}
	for want, p := range bad {
		err := p.Validate()
		if !errors.Is(err, ErrInvalidPolicy) || !contains(err.Error(), want) {
			t.Errorf("%+v: error %v, want one naming %s", p, err, want)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func rng(lo, hi string) ipRange {
	return ipRange{netip.MustParseAddr(lo), netip.MustParseAddr(hi)}
}

func TestMergeRanges(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			p, ok := parseNet(s)
			if !ok {
				t.Fatalf("parseNet(%q)", s)
			}
			out = append(out, p)
		}
		return out
	}
	r := rng
	cases := []struct {
		in   []netip.Prefix
		want []ipRange
	}{
		{pfx("10.0.0.0/8", "10.1.2.3"), []ipRange{r("10.0.0.0", "10.255.255.255")}},
		{pfx("1.1.1.1", "1.1.1.2", "1.1.1.4"), []ipRange{r("1.1.1.1", "1.1.1.2"), r("1.1.1.4", "1.1.1.4")}},
		{pfx("0.0.0.0/0", "8.8.8.8"), []ipRange{r("0.0.0.0", "255.255.255.255")}},
		{pfx("255.255.255.255", "255.255.255.254"), []ipRange{r("255.255.255.254", "255.255.255.255")}},
		// Families never merge, IPv4 sorts first.
		{pfx("fc00::/7", "255.255.255.255", "::/128", "::1"), []ipRange{
			r("255.255.255.255", "255.255.255.255"), r("::", "::1"), r("fc00::", "fdff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}},
		{pfx("::/0", "2001:db8::1"), []ipRange{r("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff")}},
	}
	for _, c := range cases {
		if got := mergeRanges(c.in); !slices.Equal(got, c.want) {
			t.Errorf("mergeRanges(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	// The interval encoding has no end element for a range that reaches the top.
	for _, top := range []string{"0.0.0.0/0", "::/0", "ff00::/8"} {
		if el := intervalElems(pfx(top)); len(el) != 1 || el[0].IntervalEnd {
			t.Errorf("%s encodes as %+v", top, el)
		}
	}
	if el := intervalElems(pfx("10.0.0.0/8")); len(el) != 2 || !el[1].IntervalEnd ||
		netip.AddrFrom4([4]byte(el[1].Key)) != netip.MustParseAddr("11.0.0.0") {
		t.Errorf("10.0.0.0/8 encodes as %+v", el)
	}
	if el := intervalElems(pfx("fc00::/7")); len(el) != 2 || !el[1].IntervalEnd ||
		netip.AddrFrom16([16]byte(el[1].Key)) != netip.MustParseAddr("fe00::") {
		t.Errorf("fc00::/7 encodes as %+v", el)
	}
}

func TestMatchDomain(t *testing.T) {
	pats := []string{"example.com", "*.example.org"}
	for name, want := range map[string]bool{
		"example.com": true, "EXAMPLE.com.": true, "www.example.com": false,
		"example.org": false, "a.example.org": true, "a.b.example.org": true, "badexample.org": false,
	} {
		if got := matchDomain(pats, name); got != want {
			t.Errorf("matchDomain(%q) = %v, want %v", name, got, want)
		}
	}
	if !matchDomain([]string{"*"}, "anything.test") {
		t.Error(`"*" must match every name`)
	}
}

// testNetwork is a Network with its own table, interface prefix and range,
// removed at cleanup. The prefix differs from the sandbox package tests'
// ("alt") because both packages' tests may run at once.
func testNetwork(t *testing.T) *Network {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	n, err := New(Config{
		CIDR:         netip.MustParsePrefix(fmt.Sprintf("10.199.%d.0/24", os.Getpid()%250)),
		StateDir:     filepath.Join(t.TempDir(), "network"),
		Table:        fmt.Sprintf("airlock_unit_%d", os.Getpid()),
		IfPrefix:     "alu",
		DNSUpstreams: []string{"127.0.0.1:9"},
		DNSListen:    "127.0.0.1:0",
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

// TestSetupTeardown checks the namespace's interfaces, addresses and route,
// that teardown leaves nothing, and reports the timings.
func TestSetupTeardown(t *testing.T) {
	n := testNetwork(t)
	const rounds = 20
	var setup, teardown []time.Duration
	for i := range rounds {
		id := fmt.Sprintf("unit%016d", i)
		t0 := time.Now()
		sb, err := n.Setup(context.Background(), id, Policy{DenyOut: []string{"192.0.2.0/24"}})
		if err != nil {
			t.Fatal(err)
		}
		setup = append(setup, time.Since(t0))
		if i == 0 {
			checkNamespace(t, sb)
			checkHostIPv6(t, n.HostIf(id), false)
		}
		t0 = time.Now()
		if err := n.Teardown(id); err != nil {
			t.Fatal(err)
		}
		teardown = append(teardown, time.Since(t0))
		if _, err := netlink.LinkByName(n.HostIf(id)); err == nil {
			t.Fatalf("veth of %s survived teardown", id)
		}
		if _, err := os.Stat(sb.NetNS); !os.IsNotExist(err) {
			t.Fatalf("netns mount of %s survived teardown: %v", id, err)
		}
	}
	t.Logf("netns+veth+nft setup: median %v, teardown: median %v (%d rounds)", median(setup), median(teardown), rounds)
}

// Prepare makes neither the namespace at NetNS nor the veth; Link makes the
// veth with its sandbox end in another namespace (the sandbox's own, made by its runtime);
// Teardown removes the host end, and a second Link of the same sandbox fails
// without harm.
func TestPrepareThenLink(t *testing.T) {
	n := testNetwork(t)
	id := "unitprepare00000001"
	sb, err := n.Prepare(context.Background(), id, Policy{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Teardown(id) })
	// Made by its first user (Link into it, or a runtime at a pause): a
	// mount per sandbox in the server's mount namespace slows every start.
	if _, err := os.Stat(sb.NetNS); !os.IsNotExist(err) {
		t.Errorf("Prepare made the namespace at NetNS (%v); its first user is to make it", err)
	}
	if _, err := netlink.LinkByName(n.HostIf(id)); err == nil {
		t.Error("Prepare made the host end; Link is to make it")
	}

	own := filepath.Join(t.TempDir(), "own")
	h, err := nsfile.Make(own)
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	t.Cleanup(func() { _ = nsfile.Remove(own) })
	if err := n.Link(id, own); err != nil {
		t.Fatalf("Link: %v", err)
	}
	checkNamespace(t, &Sandbox{NetNS: own, Addr: sb.Addr, Gateway: sb.Gateway, ResolvConf: sb.ResolvConf})
	if err := n.Link(id, own); err == nil {
		t.Error("a second Link of the same sandbox succeeded")
	}
	if err := n.Link("unitnosuch000000001", own); err == nil {
		t.Error("Link of a sandbox never prepared succeeded")
	}
	if err := n.Teardown(id); err != nil {
		t.Fatal(err)
	}
	if _, err := netlink.LinkByName(n.HostIf(id)); err == nil {
		t.Fatalf("veth of %s survived teardown", id)
	}
}

// An address of the range that an interface this Network did not make holds
// (another server misconfigured onto the same range) is never handed out,
// though the host's addresses are read only once per foreignTTL.
func TestSetupSkipsForeignAddresses(t *testing.T) {
	n := testNetwork(t)
	gw, _ := n.slotAddrs(0)
	name := fmt.Sprintf("alf%d", os.Getpid()%100000)
	// A veth pair, as the test kernel may lack the dummy driver.
	dummy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}
	if err := netlink.LinkAdd(dummy); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netlink.LinkDel(dummy) })
	if err := netlink.AddrAdd(dummy, &netlink.Addr{IPNet: ipNet(gw, 30)}); err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		id := fmt.Sprintf("f%dforeign%011d", i, i)
		sb, err := n.Setup(context.Background(), id, Policy{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Teardown(id) })
		if sb.Gateway == gw {
			t.Fatalf("setup %d got gateway %s, which %s holds", i, gw, name)
		}
	}
}

// checkHostIPv6 checks that a sandbox's host-side interface has IPv6
// disabled (ipv6 false) or no address but the gateway's: no link-local
// address, whose routes the kernel walks at every interface change.
func checkHostIPv6(t *testing.T, hostIf string, ipv6 bool) {
	t.Helper()
	l, err := netlink.LinkByName(hostIf)
	if err != nil {
		t.Fatal(err)
	}
	addrs, err := netlink.AddrList(l, netlink.FAMILY_V6)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if a.IP.IsLinkLocalUnicast() || !ipv6 {
			t.Errorf("host side %s has IPv6 address %s", hostIf, a.IP)
		}
	}
	if ipv6 && len(addrs) != 1 {
		t.Errorf("host side %s has IPv6 addresses %v, want the gateway's alone", hostIf, addrs)
	}
	if !ipv6 {
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + hostIf + "/disable_ipv6")
		if err != nil || strings.TrimSpace(string(b)) != "1" {
			t.Errorf("IPv6 is not disabled on host side %s: %q, %v", hostIf, b, err)
		}
	}
}

func checkNamespace(t *testing.T, sb *Sandbox) {
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
		t.Fatalf("no eth0 in the sandbox netns: %v", err)
	}
	addrs, _ := h.AddrList(eth, netlink.FAMILY_V4)
	if len(addrs) != 1 || addrs[0].IP.String() != sb.Addr.String() {
		t.Errorf("eth0 addresses %v, want %s", addrs, sb.Addr)
	}
	routes, _ := h.RouteList(eth, netlink.FAMILY_V4)
	var gw bool
	for _, r := range routes {
		gw = gw || (r.Dst == nil || r.Dst.String() == "0.0.0.0/0") && r.Gw.String() == sb.Gateway.String()
	}
	if !gw {
		t.Errorf("no default route via %s: %v", sb.Gateway, routes)
	}
	lo, _ := h.LinkByName("lo")
	if lo == nil || lo.Attrs().Flags&1 == 0 {
		t.Error("lo is not up")
	}
	if b, _ := os.ReadFile(sb.ResolvConf); !contains(string(b), "nameserver "+sb.Gateway.String()) {
		t.Errorf("resolv.conf: %q", b)
	}
}

func median(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[len(s)/2]
}

func TestParseAllowPrivate(t *testing.T) {
	got, err := ParseAllowPrivate([]string{"192.168.250.0/24", " 10.1.2.3 ", "", "0.0.0.0/0", "fd12::/16", "fdaa:a1c0:250::2"})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("192.168.250.0/24"), netip.MustParsePrefix("10.1.2.3/32"),
		netip.MustParsePrefix("0.0.0.0/0"), netip.MustParsePrefix("fd12::/16"), netip.MustParsePrefix("fdaa:a1c0:250::2/128")}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for in, msg := range map[string]string{
		"8.8.8.0/24":     "not in a private range",
		"2001:db8::/32":  "not in a private range",
		"169.254.0.0/16": "link-local",
		"127.0.0.1":      "loopback",
		"fe80::/64":      "link-local",
		"::1":            "loopback",
		"10.0.0.0/33":    "not an IP address or CIDR",
		"fe80::1%eth0":   "not an IP address or CIDR",
		"intranet":       "not an IP address or CIDR",
	} {
		if _, err := ParseAllowPrivate([]string{in}); err == nil || !contains(err.Error(), msg) {
			t.Errorf("%q: error %v, want one saying %q", in, err, msg)
		}
	}
}

// TestClosedPrivate checks which destinations the private sets close, by
// default and with ranges opened, for every class of PrivateRanges.
func TestClosedPrivate(t *testing.T) {
	closed := closedPrivate(nil)
	for a, want := range map[string]bool{
		// IPv4 classes
		"10.1.2.3": true, "172.16.0.1": true, "172.31.255.255": true, "172.32.0.1": false, "192.168.1.1": true,
		"100.64.0.1": true, "100.128.0.1": false, "169.254.169.254": true, "127.0.0.1": true, "0.0.0.1": true,
		"224.0.0.251": true, "239.255.255.250": true, "240.0.0.1": true, "255.255.255.255": true,
		"8.8.8.8": false, "198.51.100.10": false, "203.0.113.80": false, "1.0.0.0": false,
		// IPv6 classes
		"fd00::1": true, "fc00::1": true, "fdaa:a1c0:250::2": true, "fe80::1": true, "febf::1": true, "fec0::1": true,
		"::1": true, "::": true, "ff02::1": true, "ff0e::1": true, "::ffff:10.0.0.1": true, "::ffff:8.8.8.8": true,
		"64:ff9b:1::1": true,
		"2001:db8::10": false, "2001:4860:4860::8888": false, "::2": false, "fe00::1": false,
		// IPv4 embedded in NAT64 and 6to4 forms
		"64:ff9b::10.0.0.1": true, "64:ff9b::192.168.1.1": true, "64:ff9b::8.8.8.8": false,
		"2002:c0a8:101::1": true, "2002:0a00:1:ffff::1": true, "2002:0808:0808::1": false,
	} {
		if got := inRanges(closed, netip.MustParseAddr(a)); got != want {
			t.Errorf("%s closed = %v, want %v", a, got, want)
		}
	}
	open, err := ParseAllowPrivate([]string{"10.0.0.0/9", "10.200.0.1", "192.168.0.0/16", "172.31.255.255", "fdaa:a1c0:250::/64"})
	if err != nil {
		t.Fatal(err)
	}
	got := family(closedPrivate(open), true)
	want := []ipRange{
		rng("0.0.0.0", "0.255.255.255"),
		rng("10.128.0.0", "10.200.0.0"), rng("10.200.0.2", "10.255.255.255"), rng("100.64.0.0", "100.127.255.255"),
		rng("127.0.0.0", "127.255.255.255"), rng("169.254.0.0", "169.254.255.255"), rng("172.16.0.0", "172.31.255.254"),
		rng("224.0.0.0", "255.255.255.255"),
	}
	if !slices.Equal(got, want) {
		t.Errorf("closedPrivate(%v) = %v, want %v", open, got, want)
	}
	all := closedPrivate(open)
	for a, closed := range map[string]bool{
		"10.0.0.1": false, "10.200.0.1": false, "10.200.0.2": true, "192.168.1.1": false,
		"fdaa:a1c0:250::2": false, "fdaa:a1c0:251::2": true,
		// Opening an IPv4 range opens its NAT64 form with it.
		"64:ff9b::192.168.1.1": false, "64:ff9b::10.200.0.2": true,
	} {
		if inRanges(all, netip.MustParseAddr(a)) != closed {
			t.Errorf("with %v: %s closed = %v, want %v", open, a, !closed, closed)
		}
	}
	// The build box opens PrivateRanges: nothing stays in the private sets
	// (NeverRanges stay closed by a rule of their own).
	if got := closedPrivate(PrivateRanges); len(got) != 0 {
		t.Errorf("PrivateRanges leave %v closed", got)
	}
	if everything, _ := ParseAllowPrivate([]string{"0.0.0.0/0", "::/0"}); len(closedPrivate(everything)) != 0 {
		t.Errorf("0.0.0.0/0 and ::/0 leave %v closed", closedPrivate(everything))
	}
	for _, a := range []string{"169.254.169.254", "127.0.0.1", "fe80::1", "::1", "64:ff9b::169.254.169.254", "64:ff9b::127.0.0.1"} {
		if !inRanges(neverClosed(), netip.MustParseAddr(a)) {
			t.Errorf("%s is not in NeverRanges", a)
		}
	}
}

func TestPolicyAllTraffic(t *testing.T) {
	c, err := Policy{DenyOut: []string{AllTraffic}}.compile()
	if err != nil {
		t.Fatal(err)
	}
	if !c.deniesAll() || !slices.Contains(c.denyNets, netip.MustParsePrefix("::/0")) {
		t.Errorf("0.0.0.0/0 compiles to %v: IPv6 not denied", c.denyNets)
	}
	c, _ = Policy{DenyOut: []string{"::/0"}}.compile()
	if c.deniesAll() || len(c.denyNets) != 1 {
		t.Errorf("::/0 alone compiles to %v (denies all: %v); want IPv6 only", c.denyNets, c.deniesAll())
	}
	c, _ = Policy{AllowOut: []string{AllTraffic}}.compile()
	if !slices.Contains(c.allowNets, netip.MustParsePrefix("::/0")) {
		t.Errorf("allowOut 0.0.0.0/0 compiles to %v: IPv6 not allowed", c.allowNets)
	}
}

// A sandbox prepared closed has no map element (its forwarded traffic falls
// to the fail-closed drop) and empty sets while DNS sees a deny-all policy;
// its first Update maps it with the policy's elements, and later Updates
// replace them as for any sandbox.
func TestPrepareClosedThenOpen(t *testing.T) {
	n := testNetwork(t)
	id := "unitclosed000000001"
	sb, err := n.PrepareClosed(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Teardown(id) })
	mapped := func() bool {
		t.Helper()
		return sourceElems(t, n.fw, n.fw.open4, sb.Addr) > 0
	}
	elems := func(name string) int {
		t.Helper()
		return sourceElems(t, n.fw, n.fw.deny, sb.Addr)
	}
	if mapped() {
		t.Fatal("a closed sandbox's address is in the policy map")
	}
	if got := elems("deny"); got != 0 {
		t.Errorf("a closed sandbox's deny set has %d elements, want none (its first Update only adds)", got)
	}
	if p, _ := n.Policy(id); len(p.DenyOut) != 1 || p.DenyOut[0] != AllTraffic {
		t.Errorf("a closed sandbox's policy (what DNS answers by) is %+v, want all traffic denied", p)
	}
	if err := n.Update(id, Policy{DenyOut: []string{"192.0.2.0/24"}}); err != nil {
		t.Fatalf("first Update: %v", err)
	}
	if !mapped() {
		t.Fatal("the first Update did not map the sandbox")
	}
	if got := elems("deny"); got == 0 {
		t.Error("the first Update left the deny set empty")
	}
	if err := n.Update(id, Policy{}); err != nil {
		t.Fatalf("second Update: %v", err)
	}
	if got := elems("deny"); got != 0 || !mapped() {
		t.Errorf("after an Update to no policy: deny set %d elements, mapped %v", got, mapped())
	}
}

// TestTeardownsTogether: teardowns that arrive together are committed
// together and each leaves nothing of its sandbox in the table, even when one
// of them is half gone already (its map entry deleted behind the server's back),
// which sends the batch down the piece-by-piece path.
func TestTeardownsTogether(t *testing.T) {
	n := testNetwork(t)
	const count = 12
	ids := make([]string, count)
	addrs := map[netip.Addr]bool{}
	for i := range ids {
		ids[i] = fmt.Sprintf("unitbatch%010d", i)
		sb, err := n.Prepare(context.Background(), ids[i], Policy{DenyOut: []string{"192.0.2.0/24"}})
		if err != nil {
			t.Fatal(err)
		}
		addrs[sb.Addr] = true
	}
	var halfAddr netip.Addr
	for a := range addrs {
		halfAddr = a
		break
	}
	if err := n.fw.conn.SetDeleteElements(n.fw.open4, []nftables.SetElement{{Key: halfAddr.AsSlice()}}); err != nil {
		t.Fatal(err)
	}
	if err := n.fw.conn.Flush(); err != nil {
		t.Fatal(err)
	}
	errs := make(chan error, count)
	for _, id := range ids {
		go func() { errs <- n.Teardown(id) }()
	}
	for range ids {
		if err := <-errs; err != nil {
			t.Errorf("Teardown: %v", err)
		}
	}
	for a := range addrs {
		for _, set := range []*nftables.Set{n.fw.open4, n.fw.deny} {
			if got := sourceElems(t, n.fw, set, a); got != 0 {
				t.Errorf("%s still has %d elements of %s", set.Name, got, a)
			}
		}
	}
	if len(n.fw.sbx) != 0 {
		t.Errorf("the firewall still holds %d sandboxes", len(n.fw.sbx))
	}
}

// sourceElems counts the elements of set (an address set or a set of
// address pairs) whose key starts with addr.
func sourceElems(t *testing.T, fw *firewall, set *nftables.Set, addr netip.Addr) int {
	t.Helper()
	els, err := fw.conn.GetSetElements(set)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, e := range els {
		if bytes.HasPrefix(e.Key, addr.AsSlice()) {
			n++
		}
	}
	return n
}
