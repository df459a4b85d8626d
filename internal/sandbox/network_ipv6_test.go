package sandbox_test

import (
	"context"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/netpolicy/netpolicytest"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestNetworkIPv6 checks IPv6 egress of real sandboxes on both runtimes: a
// sandbox has its IPv6 address and default route, reaches the stand-in
// public IPv6 hosts and no private IPv6 host by default, allowOut opens one
// unique-local host, ALL_TRAFFIC closes IPv6 too, an allowed domain's AAAA
// answer is opened but a rebinding one to a unique-local address is not,
// and IPv6 survives a pause (with memory: CRIU or runsc restore) and a
// restart of the server (Adopt).
func TestNetworkIPv6(t *testing.T) {
	nr := newNetRig(t)
	if _, err := gvisor.Find(); err != nil {
		testenv.Missing(t, "gVisor half: %v", err)
	} else {
		gv, err := gvisor.New(filepath.Join(nr.dataDir, "runtime-gvisor"), nil)
		if err != nil {
			t.Fatal(err)
		}
		nr.gv = gv
		nr.stop()
		nr.start(t)
	}
	web1, web6, web6b := netpolicytest.Web1, netpolicytest.Web6, netpolicytest.Web6b
	p6, p6b, allowed6 := netpolicytest.Private6, netpolicytest.Private6b, netpolicytest.Allowed6
	all := []netip.Addr{web1, web6, web6b, p6, p6b, netpolicytest.SiteLocal6, netpolicytest.NAT64Priv}

	templates := []string{"base"}
	if nr.gv != nil {
		templates = append(templates, "base-gvisor")
	}
	type sandboxes struct{ open, ula, closed, domain sandbox.Info }
	made := map[string]sandboxes{}
	for _, tpl := range templates {
		create := func(req sandbox.CreateRequest) sandbox.Info {
			t.Helper()
			req.Template, req.Timeout, req.Secure = tpl, 5*time.Minute, true
			info, err := nr.m.Create(context.Background(), req)
			if err != nil {
				t.Fatalf("Create %s: %v", tpl, err)
			}
			return info
		}
		s := sandboxes{
			open: create(sandbox.CreateRequest{}),
			ula:  create(sandbox.CreateRequest{Network: &sandbox.NetworkConfig{AllowOut: []string{p6b.String() + "/128"}}}),
			closed: create(sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
				DenyOut: []string{netpolicy.AllTraffic}, AllowOut: []string{web1.String()},
			}}),
			domain: create(sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
				DenyOut: []string{netpolicy.AllTraffic}, AllowOut: []string{"allowed6.test", "private6.test"},
			}}),
		}
		made[tpl] = s
		t.Run(tpl, func(t *testing.T) {
			m := nr.m
			out, code := run(t, m, s.open, "cat /proc/net/if_inet6; ip -6 route 2>/dev/null || cat /proc/net/ipv6_route")
			if code != 0 || !strings.Contains(out, hex6(t, s.open, nr)) {
				t.Errorf("sandbox has no IPv6 address of its own: %q", out)
			}
			expectReach(t, m, s.open, tpl+": default policy", all, web1, web6, web6b)
			expectReach(t, m, s.ula, tpl+": allowOut "+p6b.String()+"/128", all, web1, web6, web6b, p6b)
			expectReach(t, m, s.closed, tpl+": denyOut ALL_TRAFFIC, allowOut "+web1.String(), all, web1)
			out, code = run(t, m, s.domain, "getent ahostsv6 allowed6.test private6.test | awk '{print $1}' | sort -u")
			if code != 0 || !strings.Contains(out, allowed6.String()) || !strings.Contains(out, p6.String()) {
				t.Fatalf("getent ahostsv6: %q (exit %d)", out, code)
			}
			mustReach(t, m, s.domain, "http://allowed6.test/", "hello from "+allowed6.String())
			mustNotReach(t, m, s.domain, "http://private6.test/")
		})
	}

	t.Run("pause and resume keep IPv6", func(t *testing.T) {
		ctx := context.Background()
		for _, tpl := range templates {
			s := made[tpl]
			if err := nr.m.Pause(ctx, s.ula.ID, sandbox.PauseOptions{}); err != nil {
				t.Fatalf("%s: Pause: %v", tpl, err)
			}
			if _, _, err := nr.m.Connect(ctx, s.ula.ID, 5*time.Minute); err != nil {
				t.Fatalf("%s: Connect: %v", tpl, err)
			}
			expectReach(t, nr.m, s.ula, tpl+": after resume", all, web1, web6, web6b, p6b)
		}
	})

	t.Run("a restart keeps IPv6 and its policy", func(t *testing.T) {
		nr.stop()
		nr.start(t)
		for _, tpl := range templates {
			s := made[tpl]
			expectReach(t, nr.m, s.ula, tpl+": after restart", all, web1, web6, web6b, p6b)
			expectReach(t, nr.m, s.closed, tpl+": after restart", all, web1)
		}
	})
}

// hex6 is the sandbox's IPv6 address as /proc/net/if_inet6 writes it.
func hex6(t *testing.T, info sandbox.Info, nr *netRig) string {
	t.Helper()
	a6 := nr.net.Addr6(info.ID)
	if !a6.IsValid() {
		t.Fatalf("sandbox %s has no IPv6 address in the network", info.ID)
	}
	b := a6.As16()
	const digits = "0123456789abcdef"
	var sb strings.Builder
	for _, x := range b {
		sb.WriteByte(digits[x>>4])
		sb.WriteByte(digits[x&15])
	}
	return sb.String()
}
