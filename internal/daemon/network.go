package daemon

import (
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/secret"
)

// NetworkConfig is how sandboxes are networked (serve's --sandbox-* flags).
type NetworkConfig struct {
	// Enabled gives every sandbox its own netns, veth, egress policy and DNS;
	// off, sandboxes have loopback only.
	Enabled bool
	// CIDR is the private IPv4 range sandboxes get a /30 each from; empty
	// means the data dir's own (netInstanceOf).
	CIDR string
	// Egress lets sandboxes reach beyond the host (it turns IPv4 forwarding
	// on); off, no sandbox has egress.
	Egress bool
	// DNSUpstreams are the servers the sandboxes' DNS forwarder asks (empty:
	// the host's resolv.conf); DNSListen is where the forwarder listens.
	DNSUpstreams []string
	DNSListen    string
	// AllowPrivate are private ranges (CIDR or IP) every sandbox may reach;
	// they are closed by default.
	AllowPrivate []string
	// EgressListen is where the egress proxy listens (default a free port
	// on every address; only sandbox interfaces may reach it). It serves
	// network.rules and egressProxy.
	EgressListen string
	// EgressUpstreamCA is a PEM file of extra roots for verifying the real
	// servers of hosts the egress intercepts (the host's roots always).
	EgressUpstreamCA string
	// IPv6 is "auto" (the default: on when the host has an IPv6 default
	// route), "on" or "off": whether sandboxes get IPv6 egress too. It needs
	// Egress.
	IPv6 string
}

// egressParts is the egress proxy and its CA, started with the network.
type egressParts struct {
	proxy *egress.Proxy
	ca    *egress.CA
}

// ipv6Enabled decides serve --sandbox-ipv6. Without egress there is nothing
// for IPv6 to reach.
func ipv6Enabled(c NetworkConfig) (bool, error) {
	switch c.IPv6 {
	case "", "auto":
		return c.Egress && netpolicy.HostHasIPv6(), nil
	case "on":
		return c.Egress, nil
	case "off":
		return false, nil
	}
	return false, fmt.Errorf("--sandbox-ipv6 %q: want auto, on or off", c.IPv6)
}

// startNetwork sets up sandbox networking unless it is disabled. Egress needs
// IPv4 forwarding, a host-wide setting: it is turned on only with egress and
// never turned off (other software may rely on it by then).
func startNetwork(c NetworkConfig, dir layout.DataDir, fill egress.FillFunc, log *slog.Logger) (*netpolicy.Network, *egressParts, error) {
	if !c.Enabled {
		return nil, nil, nil
	}
	nw, ln, err := openNetwork(c, dir, log)
	if err != nil {
		return nil, nil, err
	}
	roots, err := upstreamRoots(c.EgressUpstreamCA)
	if err != nil {
		ln.Close()
		nw.Close()
		return nil, nil, err
	}
	ca, err := egress.LoadOrCreateCA(dir.Egress())
	if err != nil {
		ln.Close()
		nw.Close()
		return nil, nil, err
	}
	px := egress.New(egress.Config{Directory: nw, CA: ca, Fill: fill, Roots: roots, Logger: log})
	go func() {
		if err := px.Serve(ln); err != nil {
			log.Error("egress proxy stopped", "err", err)
		}
	}()
	return nw, &egressParts{proxy: px, ca: ca}, nil
}

// upstreamRoots are the host's roots plus the operator's extra file.
func upstreamRoots(file string) (*x509.CertPool, error) {
	if file == "" {
		return nil, nil
	}
	pool, err := x509.SystemCertPool()
	if err != nil || pool == nil {
		pool = x509.NewCertPool()
	}
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("--egress-upstream-ca: %w", err)
	}
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("--egress-upstream-ca %s: no PEM certificate in it", file)
	}
	return pool, nil
}

func openNetwork(c NetworkConfig, dir layout.DataDir, log *slog.Logger) (*netpolicy.Network, net.Listener, error) {
	inst := netInstanceOf(dir.Root)
	cidrStr := c.CIDR
	if cidrStr == "" {
		cidrStr = inst.cidr
	}
	cidr, err := netip.ParsePrefix(cidrStr)
	if err != nil {
		return nil, nil, fmt.Errorf("--sandbox-cidr: %w", err)
	}
	allowPrivate, err := netpolicy.ParseAllowPrivate(c.AllowPrivate)
	if err != nil {
		return nil, nil, fmt.Errorf("--allow-private: %w", err)
	}
	ipv6, err := ipv6Enabled(c)
	if err != nil {
		return nil, nil, err
	}
	if c.Egress {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return nil, nil, fmt.Errorf("enable IPv4 forwarding for sandbox egress (or pass --sandbox-egress=false): %w", err)
		}
	}
	if ipv6 {
		// Like ip_forward, never turned off again. Note for hosts that take
		// their IPv6 default route from router advertisements: with
		// forwarding on, the kernel stops accepting them unless the uplink
		// has accept_ra=2; that is the operator's to set (we warn).
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
			return nil, nil, fmt.Errorf("enable IPv6 forwarding for sandbox IPv6 egress (or pass --sandbox-ipv6=off): %w", err)
		}
		warnAcceptRA(log)
	}
	ln, err := egress.Listen(cmp.Or(c.EgressListen, "0.0.0.0:0"))
	if err != nil {
		return nil, nil, err
	}
	nw, err := netpolicy.New(netpolicy.Config{
		EgressPort:   uint16(ln.Addr().(*net.TCPAddr).Port),
		CIDR:         cidr,
		StateDir:     dir.Network(),
		Table:        inst.table,
		IfPrefix:     inst.prefix,
		DNSUpstreams: c.DNSUpstreams,
		DNSListen:    c.DNSListen,
		NoEgress:     !c.Egress,
		AllowPrivate: allowPrivate,
		IPv6:         ipv6,
		Logger:       log,
	})
	if err != nil {
		ln.Close()
		return nil, nil, fmt.Errorf("sandbox network: %w", err)
	}
	var cidr6 any = "off"
	if ipv6 {
		cidr6 = netpolicy.DefaultCIDR6(inst.table)
	}
	log.Info("sandbox network ready", "cidr", cidr, "ipv6", cidr6, "egress", c.Egress, "dns_port", nw.DNSPort(),
		"egress_proxy", ln.Addr().String(),
		"nft_table", "inet "+inst.table, "veth_prefix", inst.prefix, "allow_private", allowPrivate)
	return nw, ln, nil
}

// warnAcceptRA warns about interfaces that hold an IPv6 default route learned
// from router advertisements (proto ra) while accept_ra is below 2: with
// forwarding on, the kernel stops accepting advertisements there and the
// route expires.
func warnAcceptRA(log *slog.Logger) {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V6)
	if err != nil {
		return
	}
	for _, r := range routes {
		if r.Protocol != unix.RTPROT_RA {
			continue
		}
		l, err := netlink.LinkByIndex(r.LinkIndex)
		if err != nil {
			continue
		}
		name := l.Attrs().Name
		b, err := os.ReadFile("/proc/sys/net/ipv6/conf/" + name + "/accept_ra")
		if err == nil && strings.TrimSpace(string(b)) != "2" {
			log.Warn("IPv6 forwarding is on for sandbox egress: this interface's routes come from router advertisements, which the kernel now ignores unless accept_ra=2",
				"interface", name, "fix", "sysctl net.ipv6.conf."+name+".accept_ra=2")
		}
	}
}

// netInstance names what one server owns in the host's shared network state.
type netInstance struct{ table, prefix, cidr string }

// netInstanceOf gives the server of the default data dir the plain names
// (table "airlock", veths "alk…", 10.77.0.0/16) and any other data dir (a
// test or a second server on the same host) its own, derived from the path:
// two servers must never share a table, an interface prefix or a range, or
// one's start would replace the other's firewall.
func netInstanceOf(dataDir string) netInstance {
	if dataDir == layout.DefaultRoot {
		return netInstance{table: "airlock", prefix: "alk", cidr: "10.77.0.0/16"}
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(dataDir))
	v := h.Sum32()
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	tag := string([]byte{digits[v%36], digits[(v/36)%36]})
	if tag == "lk" || tag == "lt" { // the default server's and the Go tests' prefixes
		tag = "x" + tag[1:]
	}
	return netInstance{
		table:  "airlock_" + tag,
		prefix: "a" + tag,
		cidr:   fmt.Sprintf("10.%d.0.0/16", 100+(v>>16)%100),
	}
}

// egressTrust is the manager's EgressTrust: nil (not a nil *egress.CA)
// without a network.
func (d *Daemon) egressTrust() sandbox.TrustStore {
	if d.EgressCA == nil {
		return nil
	}
	return d.EgressCA
}

// fillSecrets fills the secret markers of a rule's header value for the
// egress proxy, with the owner's current values. A value that would break
// the header (a line break or NUL in the secret) is refused rather than
// sent: it could smuggle headers or a second request.
func (d *Daemon) fillSecrets(ctx context.Context, owner, value string) (string, error) {
	if len(secret.Placeholders(value)) == 0 {
		return value, nil
	}
	if d.Secrets == nil {
		return "", errors.New("this server has no secret store")
	}
	out, err := secret.Fill(ctx, d.Secrets, owner, value)
	if err != nil {
		return "", err
	}
	if strings.ContainsAny(out, "\r\n\x00") {
		return "", errors.New("a secret's value holds a line break or NUL, which a header cannot carry")
	}
	return out, nil
}

// secretChecker is the manager's Secrets over the secret store.
type secretChecker struct{ r secret.Resolver }

func (c secretChecker) Missing(ctx context.Context, owner string, values []string) (string, error) {
	for _, v := range values {
		for _, name := range secret.Placeholders(v) {
			ok, err := c.r.Exists(ctx, owner, name)
			if err != nil {
				return "", err
			}
			if !ok {
				return name, nil
			}
		}
	}
	return "", nil
}

func (d *Daemon) managerSecrets() sandbox.SecretChecker {
	if d.Secrets == nil {
		return nil
	}
	return secretChecker{d.Secrets}
}
