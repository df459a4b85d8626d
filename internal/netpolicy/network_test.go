package netpolicy

import (
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

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestPolicyValidate(t *testing.T) {
	good := []Policy{
		{},
		{DenyOut: []string{AllTraffic}, AllowOut: []string{"1.2.3.4", "10.0.0.0/8", "example.com", "*.example.org", "*"}},
		{DenyOut: []string{"192.0.2.0/24", "198.51.100.7"}},
	}
	for _, p := range good {
		if err := p.Validate(); err != nil {
			t.Errorf("%+v: %v", p, err)
		}
	}
	bad := map[string]Policy{
		`denyOut entry "example.com"`: {DenyOut: []string{"example.com"}},
		`denyOut entry "10.0.0.0/33"`: {DenyOut: []string{"10.0.0.0/33"}},
		`denyOut entry "::/0"`:        {DenyOut: []string{"::/0"}},
		`allowOut entry "bad host!"`:  {AllowOut: []string{"bad host!"}},
		`allowOut entry "a..b"`:       {AllowOut: []string{"a..b"}},
	}
	for want, p := range bad {
		err := p.Validate()
		if !errors.Is(err, ErrInvalidPolicy) || !contains(err.Error(), want) {
			t.Errorf("%+v: error %v, want one naming %s", p, err, want)
		}
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestMergeRanges(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			p, _ := parseNet(s)
			out = append(out, p)
		}
		return out
	}
	r := func(lo, hi string) ipRange {
		return ipRange{addrU32(netip.MustParseAddr(lo)), addrU32(netip.MustParseAddr(hi))}
	}
	cases := []struct {
		in   []netip.Prefix
		want []ipRange
	}{
		{pfx("10.0.0.0/8", "10.1.2.3"), []ipRange{r("10.0.0.0", "10.255.255.255")}},
		{pfx("1.1.1.1", "1.1.1.2", "1.1.1.4"), []ipRange{r("1.1.1.1", "1.1.1.2"), r("1.1.1.4", "1.1.1.4")}},
		{pfx("0.0.0.0/0", "8.8.8.8"), []ipRange{r("0.0.0.0", "255.255.255.255")}},
		{pfx("255.255.255.255", "255.255.255.254"), []ipRange{r("255.255.255.254", "255.255.255.255")}},
	}
	for _, c := range cases {
		if got := mergeRanges(c.in); !slices.Equal(got, c.want) {
			t.Errorf("mergeRanges(%v) = %v, want %v", c.in, got, c.want)
		}
	}
	// The interval encoding has no end element for a range that reaches the top.
	if el := intervalElems(pfx("0.0.0.0/0")); len(el) != 1 || el[0].IntervalEnd {
		t.Errorf("0.0.0.0/0 encodes as %+v", el)
	}
	if el := intervalElems(pfx("10.0.0.0/8")); len(el) != 2 || !el[1].IntervalEnd ||
		netip.AddrFrom4([4]byte(el[1].Key)) != netip.MustParseAddr("11.0.0.0") {
		t.Errorf("10.0.0.0/8 encodes as %+v", el)
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
	got, err := ParseAllowPrivate([]string{"192.168.250.0/24", " 10.1.2.3 ", "", "0.0.0.0/0"})
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("192.168.250.0/24"), netip.MustParsePrefix("10.1.2.3/32"), netip.MustParsePrefix("0.0.0.0/0")}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	for in, msg := range map[string]string{
		"8.8.8.0/24":     "not in a private range",
		"169.254.0.0/16": "link-local",
		"fd00::/8":       "no IPv6 egress",
		"10.0.0.0/33":    "not an IPv4 address or CIDR",
		"intranet":       "not an IPv4 address or CIDR",
	} {
		if _, err := ParseAllowPrivate([]string{in}); err == nil || !contains(err.Error(), msg) {
			t.Errorf("%q: error %v, want one saying %q", in, err, msg)
		}
	}
}

func TestClosedPrivate(t *testing.T) {
	r := func(lo, hi string) ipRange {
		return ipRange{addrU32(netip.MustParseAddr(lo)), addrU32(netip.MustParseAddr(hi))}
	}
	all := []ipRange{
		r("10.0.0.0", "10.255.255.255"), r("100.64.0.0", "100.127.255.255"), r("169.254.0.0", "169.254.255.255"),
		r("172.16.0.0", "172.31.255.255"), r("192.168.0.0", "192.168.255.255"),
	}
	if got := closedPrivate(nil); !slices.Equal(got, all) {
		t.Errorf("closedPrivate(nil) = %v, want %v", got, all)
	}
	open, _ := ParseAllowPrivate([]string{"10.0.0.0/9", "10.200.0.1", "192.168.0.0/16", "172.31.255.255"})
	want := []ipRange{
		r("10.128.0.0", "10.200.0.0"), r("10.200.0.2", "10.255.255.255"), r("100.64.0.0", "100.127.255.255"),
		r("169.254.0.0", "169.254.255.255"), r("172.16.0.0", "172.31.255.254"),
	}
	got := closedPrivate(open)
	if !slices.Equal(got, want) {
		t.Errorf("closedPrivate(%v) = %v, want %v", open, got, want)
	}
	for a, closed := range map[string]bool{
		"10.0.0.1": false, "10.200.0.1": false, "10.200.0.2": true, "172.31.255.255": false, "172.16.0.0": true,
		"192.168.1.1": false, "100.64.0.1": true, "8.8.8.8": false, "169.254.169.254": true,
	} {
		if inRanges(got, netip.MustParseAddr(a)) != closed {
			t.Errorf("%s closed = %v, want %v", a, !closed, closed)
		}
	}
	// The build box opens PrivateRanges, IPv6 entries included.
	if got := closedPrivate(PrivateRanges); len(got) != 0 {
		t.Errorf("PrivateRanges leave %v closed", got)
	}
	if everything, _ := ParseAllowPrivate([]string{"0.0.0.0/0"}); len(closedPrivate(everything)) != 0 {
		t.Errorf("0.0.0.0/0 leaves %v closed", closedPrivate(everything))
	}
}
