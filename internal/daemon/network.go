package daemon

import (
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"os"
	"strings"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
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
	// IPv6 is "auto" (the default: on when the host has an IPv6 default
	// route), "on" or "off": whether sandboxes get IPv6 egress too. It needs
	// Egress.
	IPv6 string
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
func startNetwork(c NetworkConfig, dir layout.DataDir, log *slog.Logger) (*netpolicy.Network, error) {
	if !c.Enabled {
		return nil, nil
	}
	inst := netInstanceOf(dir.Root)
	cidrStr := c.CIDR
	if cidrStr == "" {
		cidrStr = inst.cidr
	}
	cidr, err := netip.ParsePrefix(cidrStr)
	if err != nil {
		return nil, fmt.Errorf("--sandbox-cidr: %w", err)
	}
	allowPrivate, err := netpolicy.ParseAllowPrivate(c.AllowPrivate)
	if err != nil {
		return nil, fmt.Errorf("--allow-private: %w", err)
	}
	ipv6, err := ipv6Enabled(c)
	if err != nil {
		return nil, err
	}
	if c.Egress {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return nil, fmt.Errorf("enable IPv4 forwarding for sandbox egress (or pass --sandbox-egress=false): %w", err)
		}
	}
	if ipv6 {
		// Like ip_forward, never turned off again. Note for hosts that take
		// their IPv6 default route from router advertisements: with
		// forwarding on, the kernel stops accepting them unless the uplink
		// has accept_ra=2; that is the operator's to set (we warn).
		if err := os.WriteFile("/proc/sys/net/ipv6/conf/all/forwarding", []byte("1"), 0o644); err != nil {
			return nil, fmt.Errorf("enable IPv6 forwarding for sandbox IPv6 egress (or pass --sandbox-ipv6=off): %w", err)
		}
		warnAcceptRA(log)
	}
	nw, err := netpolicy.New(netpolicy.Config{
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
		return nil, fmt.Errorf("sandbox network: %w", err)
	}
	var cidr6 any = "off"
	if ipv6 {
		cidr6 = netpolicy.DefaultCIDR6(inst.table)
	}
	log.Info("sandbox network ready", "cidr", cidr, "ipv6", cidr6, "egress", c.Egress, "dns_port", nw.DNSPort(),
		"nft_table", "inet "+inst.table, "veth_prefix", inst.prefix, "allow_private", allowPrivate)
	return nw, nil
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
