package sandbox_test

import (
	"context"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/nftables"
	"github.com/vishvananda/netlink"

	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/netpolicy/netpolicytest"
	"github.com/airlock-sandbox/airlock/internal/proxy"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// testIfPrefix names this test's sandbox veths; it differs from a server's
// "alk" so the test's firewall never touches a real server's sandboxes.
const testIfPrefix = "alt"

// netRig is a manager whose sandboxes have real networks, next to a stand-in
// internet.
type netRig struct {
	*rig
	m     *sandbox.Manager
	net   *netpolicy.Network
	inet  *netpolicytest.Internet
	table string
	cidr  netip.Prefix
	// allowPrivate is the network's Config.AllowPrivate (serve
	// --allow-private) at the next start.
	allowPrivate []netip.Prefix
	// egress is the rig's egress proxy; egressRoots verify the servers it
	// intercepts (tests add the stand-in's CA); secrets stand in for the
	// secret store (name -> value) behind its rules.
	egress      *egress.Proxy
	egressCA    *egress.CA
	egressRoots *x509.CertPool
	secrets     *fakeSecrets
	// gv, when set, serves the "base-gvisor" template (twoRuntimes).
	gv runtime.Runtime
	// stop closes the manager and network as a server stop does (sandboxes
	// keep running).
	stop func()
}

func newNetRig(t *testing.T) *netRig {
	t.Helper()
	r := newRig(t)
	inet := netpolicytest.Start(t)
	enableForwarding(t)
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	table := "airlock_test_" + hex.EncodeToString(b)
	// A /24 of its own per run keeps parallel test binaries apart.
	cidr := netip.MustParsePrefix(fmt.Sprintf("10.%d.%d.0/24", 200+int(b[0])%50, b[1]))
	nr := &netRig{rig: r, inet: inet, table: table, cidr: cidr, egressRoots: x509.NewCertPool(), secrets: &fakeSecrets{m: map[string]string{}}}
	nr.start(t)
	return nr
}

// start opens the network and a manager over it, and recovers what a stopped
// one left, as a server start does.
func (nr *netRig) start(t *testing.T) {
	t.Helper()
	ln, err := egress.Listen("0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	n, err := netpolicy.New(netpolicy.Config{
		EgressPort:   uint16(ln.Addr().(*net.TCPAddr).Port),
		CIDR:         nr.cidr,
		StateDir:     filepath.Join(nr.dataDir, "network"),
		Table:        nr.table,
		IfPrefix:     testIfPrefix,
		DNSUpstreams: []string{nr.inet.DNSUpstream()},
		AllowPrivate: nr.allowPrivate,
		// Every network test runs with IPv6 on (the stand-in internet has
		// IPv6 hosts; enableForwarding turns IPv6 forwarding on too).
		IPv6: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		n.Close()
		_ = n.RemoveTable()
	})
	ca, err := egress.LoadOrCreateCA(filepath.Join(nr.dataDir, "egress"))
	if err != nil {
		t.Fatal(err)
	}
	px := egress.New(egress.Config{Directory: n, CA: ca, Fill: nr.secrets.fill, Roots: nr.egressRoots})
	go func() { _ = px.Serve(ln) }()
	t.Cleanup(func() { px.Close() })
	nr.egress, nr.egressCA = px, ca
	opts := sandbox.Options{
		Runtime: nr.rt, Store: nr.db, Templates: nr, DataDir: nr.dataDir, EnvdPath: nr.envd,
		MaxTimeout: time.Hour, Network: n, EgressTrust: ca, Secrets: nr.secrets,
	}
	if nr.gv != nil {
		opts.Runtimes, opts.Templates = []runtime.Runtime{nr.gv}, twoRuntimes{nr.tpl}
	}
	m := sandbox.New(opts)
	stopped := false
	t.Cleanup(func() {
		if !stopped {
			m.KillAll(context.Background())
			m.Close()
		}
	})
	nr.m, nr.net = m, n
	nr.stop = func() { stopped = true; m.Close(); n.Close(); px.Close() }
	if err := m.Recover(context.Background()); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	m.Start()
}

// TestNetworkSurvivesRestart stops the manager and the network (sandboxes keep
// running, the table stays), starts new ones, and checks that Recover puts
// the sandbox's policy back and sweeps a network nobody owns.
func TestNetworkSurvivesRestart(t *testing.T) {
	nr := newNetRig(t)
	info := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
		DenyOut: []string{netpolicy.AllTraffic}, AllowOut: []string{netpolicytest.Web1.String()},
	}})
	web1 := "http://" + netpolicytest.Web1.String() + "/"
	web2 := "http://" + netpolicytest.Web2.String() + "/"
	mustReach(t, nr.m, info, web1, "hello from 198.51.100.10")
	// A network with no sandbox behind it, as a crash between Setup and the
	// record would leave.
	const orphan = "orphanorphanorphan00"
	if _, err := nr.net.Setup(context.Background(), orphan, netpolicy.Policy{}); err != nil {
		t.Fatal(err)
	}

	nr.stop()
	nr.start(t)
	got, err := nr.m.Get(context.Background(), info.ID)
	if err != nil {
		t.Fatalf("sandbox not re-adopted: %v", err)
	}
	if got.Addr != info.Addr || len(got.Network.AllowOut) != 1 {
		t.Errorf("re-adopted as %+v (addr %s), want addr %s and its rules", got.Network, got.Addr, info.Addr)
	}
	mustReach(t, nr.m, got, web1, "hello from 198.51.100.10")
	mustNotReach(t, nr.m, got, web2)
	if _, err := netlink.LinkByName(nr.net.HostIf(orphan)); err == nil {
		t.Error("orphaned network survived Recover")
	}
	// A new sandbox does not get the adopted one's address.
	other := nr.create(t, sandbox.CreateRequest{})
	if other.Addr == got.Addr {
		t.Fatalf("address %s handed out twice", other.Addr)
	}
	nr.m.KillAll(context.Background())
	nr.assertClean(t, []string{info.ID, other.ID, orphan})
}

// enableForwarding turns on IPv4 and IPv6 forwarding (sandbox egress is
// routed) and restores the previous values at cleanup.
func enableForwarding(t *testing.T) {
	for _, p := range []string{"/proc/sys/net/ipv4/ip_forward", "/proc/sys/net/ipv6/conf/all/forwarding"} {
		old, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte("1"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.WriteFile(p, old, 0o644) })
	}
}

func (nr *netRig) create(t *testing.T, req sandbox.CreateRequest) sandbox.Info {
	t.Helper()
	req.Template, req.Timeout, req.Secure = "base", 5*time.Minute, true
	info, err := nr.m.Create(context.Background(), req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if !info.Addr.IsValid() {
		t.Fatalf("sandbox %s has no address", info.ID)
	}
	return info
}

// curl fetches url from inside the sandbox; ok reports success.
func curl(t *testing.T, m *sandbox.Manager, info sandbox.Info, url string) (string, bool) {
	t.Helper()
	out, code := run(t, m, info, "curl -sS --max-time 3 "+url)
	return out, code == 0
}

func mustReach(t *testing.T, m *sandbox.Manager, info sandbox.Info, url, want string) {
	t.Helper()
	out, ok := curl(t, m, info, url)
	if !ok || !strings.Contains(out, want) {
		t.Errorf("sandbox %s: %s: got %q (ok=%v), want %q", info.ID, url, out, ok, want)
	}
}

func mustNotReach(t *testing.T, m *sandbox.Manager, info sandbox.Info, url string) {
	t.Helper()
	if out, ok := curl(t, m, info, url); ok {
		t.Errorf("sandbox %s reached %s: %q", info.ID, url, out)
	}
}

func deny(b bool) *bool { return &b }

func TestNetworkEgressPolicy(t *testing.T) {
	nr := newNetRig(t)
	m := nr.m
	web1 := "http://" + netpolicytest.Web1.String() + "/"
	web2 := "http://" + netpolicytest.Web2.String() + "/"

	open := nr.create(t, sandbox.CreateRequest{})
	t.Run("default policy reaches the internet", func(t *testing.T) {
		mustReach(t, m, open, web1, "hello from 198.51.100.10")
		mustReach(t, m, open, "http://allowed.test/", "hello from 203.0.113.10")
		// The sandbox sees the forwarder as its gateway and its own hosts file.
		out, _ := run(t, m, open, "cat /etc/resolv.conf /etc/hosts")
		if gw := open.Addr.Prev(); !strings.Contains(out, "nameserver "+gw.String()) || !strings.Contains(out, open.Addr.String()) {
			t.Errorf("resolv.conf: %q", out)
		}
	})
	t.Run("link-local metadata is denied", func(t *testing.T) {
		mustNotReach(t, m, open, "http://"+netpolicytest.Metadata.String()+"/")
	})

	closed := nr.create(t, sandbox.CreateRequest{AllowInternetAccess: deny(false)})
	t.Run("allowInternetAccess=false denies egress", func(t *testing.T) {
		mustNotReach(t, m, closed, web1)
	})

	onlyIP := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
		DenyOut: []string{netpolicy.AllTraffic}, AllowOut: []string{netpolicytest.Web1.String()},
	}})
	t.Run("allowOut IP wins over denyOut ALL", func(t *testing.T) {
		mustReach(t, m, onlyIP, web1, "hello from 198.51.100.10")
		mustNotReach(t, m, onlyIP, web2)
	})

	domain := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{
		DenyOut: []string{netpolicy.AllTraffic}, AllowOut: []string{"allowed.test", "*.allowed.test"},
	}})
	t.Run("allowOut domain", func(t *testing.T) {
		mustReach(t, m, domain, "http://allowed.test/", "hello from 203.0.113.10")
		// A second answer for an address already open refreshes its timeout
		// (delete + add in one transaction) and must not fail the query.
		if out, code := run(t, m, domain, "getent hosts allowed.test && getent hosts allowed.test"); code != 0 || !strings.Contains(out, netpolicytest.Allowed.String()) {
			t.Errorf("allowed.test again: %q (exit %d)", out, code)
		}
		mustReach(t, m, domain, "http://www.allowed.test/", "hello from 203.0.113.10")
		if out, code := run(t, m, domain, "getent hosts blocked.test"); code == 0 {
			t.Errorf("blocked.test resolved: %q", out)
		}
		mustNotReach(t, m, domain, "http://"+netpolicytest.Blocked.String()+"/")
		mustNotReach(t, m, domain, web1)
		// DNS to another server is redirected to the forwarder too: no way
		// around the domain rules on port 53.
		if out, code := run(t, m, domain, "getent hosts blocked.test"); code == 0 {
			t.Errorf("blocked.test resolved: %q", out)
		}
	})

	t.Run("policy update while running", func(t *testing.T) {
		ctx := context.Background()
		if err := m.UpdateNetwork(ctx, closed.ID, sandbox.NetworkUpdate{AllowInternetAccess: deny(true)}); err != nil {
			t.Fatal(err)
		}
		mustReach(t, m, closed, web1, "hello from 198.51.100.10")
		if err := m.UpdateNetwork(ctx, closed.ID, sandbox.NetworkUpdate{DenyOut: []string{netpolicytest.Web1.String()}}); err != nil {
			t.Fatal(err)
		}
		mustNotReach(t, m, closed, web1)
		mustReach(t, m, closed, web2, "hello from 198.51.100.20")
		if err := m.UpdateNetwork(ctx, closed.ID, sandbox.NetworkUpdate{DenyOut: []string{"not-a-cidr"}}); err == nil {
			t.Error("update with a bad CIDR succeeded")
		}
		info, _ := m.Get(ctx, closed.ID)
		if len(info.Network.DenyOut) != 1 || info.Network.DenyOut[0] != netpolicytest.Web1.String() {
			t.Errorf("network after update = %+v", info.Network)
		}
	})

	t.Run("host is unreachable", func(t *testing.T) {
		l, err := net.Listen("tcp4", "0.0.0.0:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			_, _ = io.WriteString(w, "host service\n")
		}), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(l) }()
		defer srv.Close()
		port := l.Addr().(*net.TCPAddr).Port
		gw := open.Addr.Prev() // the /30's first host address is the gateway
		for _, a := range append(hostAddrs(t, nr.cidr), gw) {
			mustNotReach(t, m, open, fmt.Sprintf("http://%s:%d/", a, port))
		}
		// The listener itself works: the host reaches it.
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
		if err != nil {
			t.Fatalf("host listener: %v", err)
		}
		resp.Body.Close()
	})

	t.Run("sandboxes cannot reach each other; the host and proxy reach user ports", func(t *testing.T) {
		startHTTPServer(t, m, open, 8000)
		url := fmt.Sprintf("http://%s:8000/", open.Addr)
		resp, err := http.Get(url)
		if err != nil {
			t.Fatalf("host -> sandbox: %v", err)
		}
		resp.Body.Close()
		mustNotReach(t, m, onlyIP, url)
		mustNotReach(t, m, closed, url)

		srv := testenv.NewHTTPServer(t, proxy.New(m, nil))
		defer srv.Close()
		get := func(host string, hdr map[string]string) (int, string) {
			req, _ := http.NewRequest("GET", srv.URL+"/", nil)
			req.Host = host
			for k, v := range hdr {
				req.Header.Set(k, v)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("proxy: %v", err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		if code, body := get("8000-"+open.ID+".airlock.test", nil); code != 200 || !strings.Contains(body, "Directory listing") {
			t.Errorf("user port by host: %d %q", code, body)
		}
		if code, body := get("proxy", map[string]string{"E2b-Sandbox-Id": open.ID, "E2b-Sandbox-Port": "8000"}); code != 200 {
			t.Errorf("user port by header: %d %q", code, body)
		}
		if code, body := get("8001-"+open.ID+".airlock.test", nil); code != 502 || !strings.Contains(body, "port is not open") {
			t.Errorf("closed port: %d %q", code, body)
		}

		private := nr.create(t, sandbox.CreateRequest{Network: &sandbox.NetworkConfig{AllowPublicTraffic: deny(false)}})
		if private.TrafficAccessToken == "" {
			t.Fatal("allowPublicTraffic=false gave no traffic access token")
		}
		startHTTPServer(t, m, private, 8000)
		host := "8000-" + private.ID + ".airlock.test"
		if code, _ := get(host, nil); code != 403 {
			t.Errorf("private port without token: %d, want 403", code)
		}
		if code, _ := get(host, map[string]string{"E2B-Traffic-Access-Token": "wrong"}); code != 403 {
			t.Errorf("private port with a wrong token: %d, want 403", code)
		}
		if code, body := get(host, map[string]string{"E2B-Traffic-Access-Token": private.TrafficAccessToken}); code != 200 {
			t.Errorf("private port with token: %d %q", code, body)
		}
	})

	t.Run("a sandbox cannot borrow another sandbox's address", func(t *testing.T) {
		// From a sandbox whose egress is all denied, send UDP to the internet
		// with the open sandbox's address as source (sandbox root has
		// CAP_NET_RAW). Were it not dropped, it would pass under the open
		// sandbox's policy. The same datagram from the open sandbox itself
		// shows the path works.
		send := func(from sandbox.Info, src netip.Addr, payload string) (string, int32) {
			return runAsRoot(t, m, from, fmt.Sprintf(spoofScript, src, netpolicytest.UDPSink.Addr(), netpolicytest.UDPSink.Port(), payload))
		}
		if out, code := send(open, open.Addr, "honest"); code == 3 {
			t.Skipf("no raw sockets in the sandbox, so no spoofing: %q", out)
		} else if code != 0 {
			t.Fatalf("raw send from the open sandbox: %q (exit %d)", out, code)
		}
		if out, code := send(onlyIP, open.Addr, "spoofed"); code != 0 {
			t.Fatalf("raw send: %q (exit %d)", out, code)
		}
		deadline := time.Now().Add(3 * time.Second)
		for len(nr.inet.UDPFrom("honest")) == 0 && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if len(nr.inet.UDPFrom("honest")) == 0 {
			t.Fatal("the honest datagram did not arrive: the check below would prove nothing")
		}
		time.Sleep(500 * time.Millisecond)
		if got := nr.inet.UDPFrom("spoofed"); len(got) != 0 {
			t.Errorf("spoofed datagram arrived (from %v)", got)
		}
	})

	t.Run("kill removes the network", func(t *testing.T) {
		ids := []string{open.ID, closed.ID, onlyIP.ID, domain.ID}
		nr.m.KillAll(context.Background())
		nr.assertClean(t, ids)
	})
}

// startHTTPServer runs python3's http.server on port in the sandbox and waits
// until it answers from inside.
func startHTTPServer(t *testing.T, m *sandbox.Manager, info sandbox.Info, port int) {
	t.Helper()
	run(t, m, info, fmt.Sprintf("cd /tmp && setsid nohup python3 -m http.server %d >/dev/null 2>&1 < /dev/null &", port))
	for i := 0; i < 100; i++ {
		if _, code := run(t, m, info, fmt.Sprintf("curl -s -o /dev/null http://127.0.0.1:%d/", port)); code == 0 {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("http.server on %d did not start in %s", port, info.ID)
}

// hostAddrs returns the host's own IPv4 addresses outside sandbox ranges.
func hostAddrs(t *testing.T, sandboxes netip.Prefix) []netip.Addr {
	ifs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, a := range ifs {
		p, err := netip.ParsePrefix(a.String())
		if err != nil || !p.Addr().Is4() || p.Addr().IsLoopback() {
			continue
		}
		if sandboxes.Contains(p.Addr()) {
			continue // sandbox gateways: one is checked on its own
		}
		out = append(out, p.Addr())
	}
	return out
}

// assertClean checks that nothing of the given sandboxes' networks is left:
// veths, netns mounts and state, nftables chains and map entries.
func (nr *netRig) assertClean(t *testing.T, ids []string) {
	t.Helper()
	for _, id := range ids {
		if _, err := netlink.LinkByName(nr.net.HostIf(id)); err == nil {
			t.Errorf("veth of %s survived", id)
		}
		if _, err := os.Stat(filepath.Join(nr.dataDir, "network", id)); !os.IsNotExist(err) {
			t.Errorf("network state of %s survived: %v", id, err)
		}
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), filepath.Join(nr.dataDir, "network")) {
		t.Errorf("a netns mount survived under %s", nr.dataDir)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyINet)
	if err != nil {
		t.Fatal(err)
	}
	for _, ch := range chains {
		if ch.Table.Name == nr.table && strings.HasPrefix(ch.Name, "i_") {
			t.Errorf("chain %s survived", ch.Name)
		}
	}
	sets, err := c.GetSets(&nftables.Table{Name: nr.table, Family: nftables.TableFamilyINet})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range sets {
		switch s.Name {
		case "private", "private6", "never", "never6":
			continue // table-wide: the closed ranges
		case "sandboxes", "sandboxes6", "allow", "allow6", "deny", "deny6", "learned", "learned6", "intercept", "intercepting", "intercept6", "proxied", "proxied6":
			if el, _ := c.GetSetElements(s); len(el) != 0 {
				t.Errorf("%s still has %d elements", s.Name, len(el))
			}
		default:
			t.Errorf("set %s survived", s.Name)
		}
	}
}

// TestNetworkWarmPoolClaimAppliesPolicy checks that a pooled sandbox, which
// starts with all egress denied, gets the client's policy when claimed.
func TestNetworkWarmPoolClaimAppliesPolicy(t *testing.T) {
	nr := newNetRig(t)
	web1 := "http://" + netpolicytest.Web1.String() + "/"
	// claim creates a sandbox from a ready pooled one: the pooled sandbox's
	// network exists before the create and carries the created id.
	claim := func(req sandbox.CreateRequest) sandbox.Info {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for nr.m.WarmCount(nr.tpl.ID) < 1 {
			if time.Now().After(deadline) {
				t.Fatal("warm pool did not fill")
			}
			time.Sleep(20 * time.Millisecond)
		}
		before, _ := os.ReadDir(filepath.Join(nr.dataDir, "network"))
		info := nr.create(t, req)
		for _, d := range before {
			if d.Name() == info.ID {
				return info
			}
		}
		t.Fatalf("sandbox %s was not claimed from the pool", info.ID)
		return info
	}
	nr.m.SetWarmPool(nr.tpl, 1)
	closed := claim(sandbox.CreateRequest{AllowInternetAccess: deny(false)})
	open := claim(sandbox.CreateRequest{})
	nr.m.SetWarmPool(nr.tpl, 0)
	mustNotReach(t, nr.m, closed, web1)
	mustReach(t, nr.m, open, web1, "hello from 198.51.100.10")
	if closed.StartedAt.After(open.StartedAt) || closed.Addr == open.Addr {
		t.Errorf("claims: %s at %s, %s at %s", closed.ID, closed.Addr, open.ID, open.Addr)
	}
}

// spoofScript sends one UDP datagram with a chosen source address through a
// raw socket: args source, destination, port, payload. Exit 3: no raw socket.
const spoofScript = `python3 - <<'EOF'
import socket, struct, sys
src, dst, port, payload = "%s", "%s", %d, b"%s"
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
except PermissionError as e:
    print(e); sys.exit(3)
udp = struct.pack("!HHHH", 40000, port, 8 + len(payload), 0) + payload
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, socket.IPPROTO_UDP, 0,
                 socket.inet_aton(src), socket.inet_aton(dst))
s.sendto(ip + udp, (dst, 0))
EOF`

// runAsRoot runs a command as the sandbox's root (raw sockets need it).
func runAsRoot(t *testing.T, m *sandbox.Manager, info sandbox.Info, cmd string) (string, int32) {
	t.Helper()
	tr, err := m.EnvdTransport(info.ID)
	if err != nil {
		t.Fatal(err)
	}
	c := processconnect.NewProcessClient(&http.Client{Transport: tr}, "http://envd", connect.WithProtoJSON())
	req := connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-c", cmd}},
	})
	req.Header().Set("X-Access-Token", info.AccessToken)
	req.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte("root:")))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stream, err := c.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			out.Write(d.GetStdout())
			out.Write(d.GetStderr())
		}
		if end := ev.GetEnd(); end != nil {
			return out.String(), end.GetExitCode()
		}
	}
	t.Fatalf("stream ended without end event: %v", stream.Err())
	return "", 0
}
