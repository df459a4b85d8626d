package sandbox_test

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/netpolicy/netpolicytest"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// webURL is the stand-in internet's web server at a.
func webURL(a netip.Addr) string { return "http://" + netip.AddrPortFrom(a, 80).String() + "/" }

// probe fetches every address's web server from inside the sandbox at once
// (a dropped packet costs curl its whole timeout, so one after another would
// be slow) and returns the addresses that answered as their server does.
func probe(t *testing.T, m *sandbox.Manager, info sandbox.Info, addrs ...netip.Addr) map[netip.Addr]bool {
	t.Helper()
	var b strings.Builder
	b.WriteString("d=$(mktemp -d)\n")
	for i, a := range addrs {
		fmt.Fprintf(&b, "curl -sS -g --max-time 3 %s > $d/%d 2>&1 &\n", webURL(a), i)
	}
	b.WriteString("wait\nfor f in $d/*; do echo \"${f##*/} $(head -c 200 $f)\"; done\nrm -rf $d\n")
	out, code := run(t, m, info, b.String())
	if code != 0 {
		t.Fatalf("probe in %s: exit %d: %q", info.ID, code, out)
	}
	got := map[netip.Addr]bool{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		i, body, _ := strings.Cut(line, " ")
		n, err := strconv.Atoi(i)
		if err != nil || n >= len(addrs) {
			t.Fatalf("probe output %q", out)
		}
		if strings.Contains(body, "hello from "+addrs[n].String()) {
			got[addrs[n]] = true
		}
	}
	return got
}

// expectReach checks exactly which of the probed addresses the sandbox
// reaches.
func expectReach(t *testing.T, m *sandbox.Manager, info sandbox.Info, what string, probed []netip.Addr, reach ...netip.Addr) {
	t.Helper()
	got := probe(t, m, info, probed...)
	want := map[netip.Addr]bool{}
	for _, a := range reach {
		want[a] = true
	}
	var wrong []string
	for _, a := range probed {
		if got[a] != want[a] {
			wrong = append(wrong, fmt.Sprintf("%s reached=%v want %v", a, got[a], want[a]))
		}
	}
	sort.Strings(wrong)
	if len(wrong) > 0 {
		t.Errorf("%s (sandbox %s): %s", what, info.ID, strings.Join(wrong, "; "))
	}
}

// TestNetworkPrivateRangesClosed checks that the default policy reaches the
// (stand-in) public internet but no private address beyond the host; that
// allowOut naming one private host opens exactly that host, at create and by
// an update; that a domain in allowOut does not open the private address it
// resolves to; and, after a restart with AllowPrivate (serve
// --allow-private), that the opened range is reachable by every sandbox,
// adopted ones too, while denyOut still closes it.
func TestNetworkPrivateRangesClosed(t *testing.T) {
	nr := newNetRig(t)
	m := nr.m
	web1, web2 := netpolicytest.Web1, netpolicytest.Web2
	p192, p10, p172, p100 := netpolicytest.Private192, netpolicytest.Private10, netpolicytest.Private172, netpolicytest.Private100
	all := []netip.Addr{web1, web2, p192, p10, p172, p100, netpolicytest.Private6}
	if nr.cidr.Contains(p10) {
		t.Fatalf("test host %s is inside the sandbox range %s: the check would prove nothing", p10, nr.cidr)
	}

	// The private hosts are up: the host itself (not a sandbox) reaches
	// every one of them, so a sandbox failing to is the firewall's doing.
	client := &http.Client{Timeout: 3 * time.Second}
	for _, a := range append([]netip.Addr{netpolicytest.Private6}, netpolicytest.PrivateHosts...) {
		resp, err := client.Get(webURL(a))
		if err != nil {
			t.Fatalf("the host cannot reach test host %s: %v", a, err)
		}
		resp.Body.Close()
	}

	open := nr.create(t, sandbox.CreateRequest{})
	t.Run("default policy: public yes, private no", func(t *testing.T) {
		expectReach(t, m, open, "default policy", all, web1, web2)
	})

	one := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{AllowOut: []string{p192.String()}}})
	t.Run("allowOut naming one private host opens exactly that one", func(t *testing.T) {
		expectReach(t, m, one, "allowOut "+p192.String(), all, web1, web2, p192)
	})

	onlyTen := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
		DenyOut: []string{netpolicy.AllTraffic}, AllowOut: []string{p10.String() + "/32"},
	}})
	t.Run("allowOut CIDR over denyOut ALL", func(t *testing.T) {
		expectReach(t, m, onlyTen, "denyOut ALL, allowOut "+p10.String()+"/32", all, p10)
	})

	closed := nr.create(t, sandbox.CreateRequest{AllowInternetAccess: deny(false)})
	t.Run("allowInternetAccess=false reaches nothing", func(t *testing.T) {
		expectReach(t, m, closed, "allowInternetAccess=false", all)
	})

	domain := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
		DenyOut: []string{netpolicy.AllTraffic}, AllowOut: []string{"allowed.test", "private.test"},
	}})
	t.Run("a domain in allowOut does not open a private address", func(t *testing.T) {
		// private.test resolves (the answer is not hidden) ...
		out, code := run(t, m, domain, "getent hosts private.test allowed.test")
		if code != 0 || !strings.Contains(out, p192.String()) || !strings.Contains(out, netpolicytest.Allowed.String()) {
			t.Fatalf("getent: %q (exit %d)", out, code)
		}
		// ... but only the public domain's address is opened.
		mustReach(t, m, domain, "http://allowed.test/", "hello from "+netpolicytest.Allowed.String())
		mustNotReach(t, m, domain, "http://private.test/")
	})

	t.Run("PUT network opens and closes a private host", func(t *testing.T) {
		ctx := context.Background()
		if err := m.UpdateNetwork(ctx, open.ID, sandbox.NetworkUpdate{AllowOut: []string{p172.String(), p100.String()}}); err != nil {
			t.Fatal(err)
		}
		expectReach(t, m, open, "after update to allowOut "+p172.String()+", "+p100.String(), all, web1, web2, p172, p100)
		if err := m.UpdateNetwork(ctx, open.ID, sandbox.NetworkUpdate{}); err != nil {
			t.Fatal(err)
		}
		expectReach(t, m, open, "after update to no rules", all, web1, web2)
	})

	// The operator opens 192.168.250.0/24 for every sandbox: a restart with
	// the option adopts the running sandboxes under the new firewall.
	wide := netip.PrefixFrom(p192, 24).Masked()
	denied := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{DenyOut: []string{p192.String()}}})
	over := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
		AllowOut: []string{wide.String()}, DenyOut: []string{p192.String()},
	}})
	nr.stop()
	nr.allowPrivate = []netip.Prefix{wide}
	nr.start(t)
	m = nr.m
	t.Run("AllowPrivate opens a range for every sandbox", func(t *testing.T) {
		expectReach(t, m, open, "default policy with "+wide.String()+" opened", all, web1, web2, p192)
		fresh := nr.create(t, sandbox.CreateRequest{})
		expectReach(t, m, fresh, "new sandbox with "+wide.String()+" opened", all, web1, web2, p192)
		// What was closed by the sandbox's own rules stays closed.
		expectReach(t, m, onlyTen, "denyOut ALL, allowOut "+p10.String()+"/32", all, p10)
		expectReach(t, m, closed, "allowInternetAccess=false", all)
		// A domain's answer in an opened range is opened like a public one.
		mustReach(t, m, domain, "http://private.test/", "hello from "+p192.String())
	})
	t.Run("denyOut still wins over AllowPrivate; allowOut over denyOut", func(t *testing.T) {
		expectReach(t, m, denied, "denyOut "+p192.String()+" with "+wide.String()+" opened", all, web1, web2)
		expectReach(t, m, over, "allowOut "+wide.String()+" over denyOut "+p192.String(), all, web1, web2, p192)
	})
}
