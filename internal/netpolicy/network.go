// Package netpolicy gives every sandbox its own network: a network namespace
// bind-mounted under Airlock's state directory, a veth pair (host side
// "<prefix><id[:12]>", sandbox side eth0) on a /30 of a private range, Airlock's
// nftables table (isolation from the host and from other sandboxes, masquerade,
// per-sandbox egress policy) and a filtering DNS forwarder that opens the
// addresses of allowed domains as the sandbox resolves them.
//
// The sandbox manager calls Setup before the runtime creates the sandbox (the
// runtime joins Sandbox.NetNS), Teardown after the runtime destroyed it, Adopt
// for sandboxes that survived a server restart, and Update to change a running
// sandbox's policy. Everything is done over netlink and nftables' netlink API;
// no `ip` or `nft` process is run.
package netpolicy

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/netpolicy/dnsfilter"
	"github.com/airlock-sandbox/airlock/internal/nsfile"
	"github.com/airlock-sandbox/airlock/internal/timing"
)

// Config configures a Network.
type Config struct {
	// CIDR is the private IPv4 range sandboxes get their /30s from.
	CIDR netip.Prefix
	// StateDir holds one directory per sandbox: the netns bind mount and the
	// resolv.conf and hosts files bound into the sandbox.
	StateDir string
	// Table is the nftables table (family inet) Airlock owns; default "airlock".
	Table string
	// IfPrefix starts every host-side veth name; default "alk". It must be
	// unique to this Airlock instance: the firewall matches interfaces by it.
	IfPrefix string
	// DNSUpstreams are the "ip:port" servers the forwarder asks; default the
	// host's /etc/resolv.conf nameservers.
	DNSUpstreams []string
	// DNSListen is where the forwarder listens (UDP and TCP); default
	// "0.0.0.0:0" (a free port). Sandboxes' DNS to their gateway's port 53 is
	// redirected there; a query from any other source is REFUSED.
	DNSListen string
	// NoEgress drops every packet a sandbox sends beyond the host, whatever
	// its policy (the host itself stays unreachable as always). Serve sets it
	// when sandbox egress is off, which also leaves ip_forward alone.
	NoEgress bool
	// AllowPrivate are private ranges (see PrivateRanges) every sandbox may
	// reach, as if each sandbox's allowOut named them; a sandbox's denyOut
	// still closes them. Serve sets them from --allow-private (checked by
	// ParseAllowPrivate); the build box opens all of them. Without it, no
	// sandbox reaches a private address its own allowOut does not name.
	AllowPrivate []netip.Prefix
	// EgressPort is the port of Airlock's egress proxy (internal/egress),
	// listening on every address, to which the firewall redirects the TCP
	// connections of sandboxes with network rules or an egress proxy. 0: no
	// egress proxy, and such policies are refused.
	EgressPort uint16
	// IPv6 gives every sandbox an IPv6 address and default route too, with
	// IPv6 egress (NAT66) under the same policy. The caller turns it on only
	// when the host forwards IPv6 (net.ipv6.conf.all.forwarding=1) and has
	// IPv6 beyond itself; off, sandboxes have IPv6 link-local only and the
	// firewall drops every IPv6 packet they forward.
	IPv6 bool
	// CIDR6 is the IPv6 range of sandbox addresses (at most /96): a
	// sandbox's IPv6 address is CIDR6's prefix with its IPv4 address as the
	// last 32 bits, so the /30 of each sandbox is a /126 here, the host side
	// the gateway. Default: the unique-local /64 fdXX:XXXX:XXXX::/64, the
	// 40-bit global id derived from Table, so two servers (each with its
	// own table) never share a range.
	CIDR6  netip.Prefix
	Logger *slog.Logger
}

// Sandbox is one sandbox's network, as the runtime needs it.
type Sandbox struct {
	ID      string
	NetNS   string     // bind-mounted namespace to join
	Addr    netip.Addr // the sandbox's eth0 address
	Gateway netip.Addr // host side: default route and DNS server
	// Addr6 and Gateway6 are the IPv6 counterparts (Config.IPv6; invalid
	// without it). DNS stays on the IPv4 gateway.
	Addr6    netip.Addr
	Gateway6 netip.Addr
	// ResolvConf and Hosts are host files to bind read-only over /etc/resolv.conf
	// and /etc/hosts.
	ResolvConf string
	Hosts      string
}

// Timings of the last Setup and Teardown, for the bench.
type Timings struct {
	Setup, Teardown time.Duration
}

// Network manages sandbox networks for one Airlock server.
type Network struct {
	cfg  Config
	log  *slog.Logger
	fw   *firewall
	dns  *dnsfilter.Server
	port uint16

	mu    sync.Mutex
	slots map[int]string // slot index -> sandbox id ("" while reserved by the kernel state)
	sbx   map[string]*state
	byIP  map[netip.Addr]*state
	last  Timings
	// foreign are the slots whose addresses some interface this Network
	// did not make holds (kernelSlots), as read at foreignAt: a dump of
	// every host address, whose cost grows with the sandboxes alive, so it
	// is read again only after foreignTTL. A link of ours whose delete
	// failed keeps its slot in slots instead (teardown).
	foreign   map[int]bool
	foreignAt time.Time
}

// foreignTTL is how long a read of the host's addresses in the range is
// trusted. Foreign addresses there come from misconfiguration (another
// server on the same range), not from this server's own creates.
const foreignTTL = 10 * time.Second

// state is what the Network keeps per sandbox.
type state struct {
	Sandbox
	slot    int
	hostIf  string
	policy  Policy
	c       compiled
	learned map[netip.Addr]learned
	// ruleLearned are addresses rule hosts resolved to: the firewall sends
	// the sandbox's HTTP(S) connections to them to the egress proxy.
	ruleLearned map[netip.Addr]learned
	// intercepting: the firewall holds interception state for it.
	intercepting bool
	// closed: prepared with PrepareClosed and not yet Updated; its sets are
	// empty and no map element sends its traffic to its chain.
	closed bool
}

type learned struct {
	name    string
	expires time.Time
}

const slotSize = 4 // a /30: network, gateway, sandbox, broadcast

// minLearnTTL keeps a DNS-learned address open at least this long: answers
// with a TTL of 0 or a few seconds would otherwise close before the client
// that asked has connected.
const minLearnTTL = 30 * time.Second

// learnSlack keeps a DNS-learned address this long beyond the answer's TTL,
// so that the next answers for the name, as long as the element still
// outlives their TTL, need no kernel update: restarting an element's timeout
// deletes and re-adds it in one nftables transaction, which took 10-15 ms
// here (against well under 1 ms for the lookup itself), and a client that
// looks the name up before every connection would pay that each time. With
// the slack, a name's address is refreshed at most once per learnSlack.
const learnSlack = 15 * time.Second

// New installs the nftables table (replacing one a previous run left), starts
// the DNS forwarder and reads which addresses live sandboxes already hold.
func New(cfg Config) (*Network, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Table == "" {
		cfg.Table = "airlock"
	}
	if cfg.IfPrefix == "" {
		cfg.IfPrefix = "alk"
	}
	if len(cfg.IfPrefix) > 3 {
		return nil, fmt.Errorf("netpolicy: interface prefix %q is longer than 3 characters", cfg.IfPrefix)
	}
	if !cfg.CIDR.IsValid() || !cfg.CIDR.Addr().Is4() || cfg.CIDR.Bits() > 30 {
		return nil, fmt.Errorf("netpolicy: sandbox CIDR %s must be an IPv4 range of /30 or larger", cfg.CIDR)
	}
	cfg.CIDR = cfg.CIDR.Masked()
	if cfg.IPv6 {
		if !cfg.CIDR6.IsValid() {
			cfg.CIDR6 = DefaultCIDR6(cfg.Table)
		}
		if !cfg.CIDR6.Addr().Is6() || cfg.CIDR6.Addr().Is4In6() || cfg.CIDR6.Bits() > 96 {
			return nil, fmt.Errorf("netpolicy: sandbox IPv6 range %s must be an IPv6 range of /96 or larger", cfg.CIDR6)
		}
		cfg.CIDR6 = cfg.CIDR6.Masked()
	} else {
		cfg.CIDR6 = netip.Prefix{}
	}
	var err error
	if cfg.DNSListen, cfg.DNSUpstreams, err = dnsDefaults(cfg.DNSListen, cfg.DNSUpstreams); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("netpolicy: state dir: %w", err)
	}
	n := &Network{
		cfg:   cfg,
		log:   cfg.Logger,
		slots: map[int]string{},
		sbx:   map[string]*state{},
		byIP:  map[netip.Addr]*state{},
	}
	if err := n.serveDNS(func(port uint16) (*firewall, error) {
		return newFirewall(cfg.Table, cfg.IfPrefix, cfg.CIDR, cfg.CIDR6, port, cfg.EgressPort, cfg.NoEgress, closedPrivate(cfg.AllowPrivate))
	}); err != nil {
		return nil, err
	}
	n.scanSlots()
	return n, nil
}

// dnsDefaults fills in the forwarder's listen address ("0.0.0.0:0") and
// upstreams (the host's /etc/resolv.conf) where they are not set.
func dnsDefaults(listen string, upstreams []string) (string, []string, error) {
	if listen == "" {
		listen = "0.0.0.0:0"
	}
	if len(upstreams) == 0 {
		ups, err := HostNameservers("/etc/resolv.conf")
		if err != nil {
			return "", nil, err
		}
		upstreams = ups
	}
	return listen, upstreams, nil
}

// serveDNS opens the forwarder's sockets, installs the firewall that
// redirects sandboxes' DNS to their port (install), and serves.
func (n *Network) serveDNS(install func(port uint16) (*firewall, error)) error {
	pc, l, err := listenDNS(n.cfg.DNSListen)
	if err != nil {
		return err
	}
	n.port = uint16(pc.LocalAddr().(*net.UDPAddr).Port)
	if n.fw, err = install(n.port); err != nil {
		pc.Close()
		l.Close()
		return err
	}
	n.dns = dnsfilter.New(dnsfilter.Config{Upstreams: n.cfg.DNSUpstreams, Lookup: n.dnsRules, OnAnswer: n.onAnswer})
	go func() {
		if err := n.dns.Serve(pc, l); err != nil {
			n.log.Debug("dns forwarder stopped", "err", err)
		}
	}()
	return nil
}

// DefaultCIDR6 is the unique-local /64 a server with the given nftables
// table gives its sandboxes (RFC 4193: fd, then a 40-bit global id, here a
// hash of the table name, which is unique per data dir; subnet 0).
func DefaultCIDR6(table string) netip.Prefix {
	h := sha256.Sum256([]byte("airlock sandbox ipv6/" + table))
	var b [16]byte
	b[0] = 0xfd
	copy(b[1:6], h[:5])
	return netip.PrefixFrom(netip.AddrFrom16(b), 64)
}

// HostHasIPv6 reports whether the host has an IPv6 default route, that is
// IPv6 beyond its own links (serve --sandbox-ipv6=auto).
func HostHasIPv6() bool {
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V6, &netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE)
	if err != nil {
		return false
	}
	for _, r := range routes {
		if r.Dst == nil || r.Dst.IP.IsUnspecified() && isZeroMask(r.Dst.Mask) {
			return true
		}
	}
	return false
}

func isZeroMask(m net.IPMask) bool {
	ones, _ := m.Size()
	return ones == 0
}

// listenDNS binds UDP and TCP on the same port: the firewall redirects both
// protocols to one port number.
func listenDNS(addr string) (net.PacketConn, net.Listener, error) {
	var lastErr error
	for range 10 {
		pc, err := net.ListenPacket("udp4", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("netpolicy: dns listen %s: %w", addr, err)
		}
		l, err := net.Listen("tcp4", pc.LocalAddr().String())
		if err == nil {
			return pc, l, nil
		}
		pc.Close()
		lastErr = err
		if !strings.HasSuffix(addr, ":0") {
			break
		}
	}
	return nil, nil, fmt.Errorf("netpolicy: dns listen tcp: %w", lastErr)
}

// HostNameservers reads the nameserver lines of a resolv.conf as "ip:53".
func HostNameservers(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("netpolicy: dns upstreams: %w", err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if a, err := netip.ParseAddr(f[1]); err == nil {
				out = append(out, netip.AddrPortFrom(a.WithZone(""), 53).String())
			}
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("netpolicy: no nameserver in %s; set the DNS upstreams explicitly", path)
	}
	return out, nil
}

// scanSlots marks the /30s that host-side links in the kernel already use
// (sandboxes that outlived a previous server), so that allocation survives a
// restart without a file that could disagree with the kernel.
func (n *Network) scanSlots() {
	links, err := netlink.LinkList()
	if err != nil {
		n.log.Warn("netpolicy: list links", "err", err)
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, l := range links {
		if gw, ok := linkGateway(l, n.cfg.CIDR); ok {
			n.slots[n.slotOf(gw)] = ""
		}
	}
}

// kernelSlots returns the slots whose addresses are on some host interface.
func (n *Network) kernelSlots() map[int]bool {
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil {
		return nil
	}
	out := map[int]bool{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP.To4()); ok && n.cfg.CIDR.Contains(ip) {
			out[n.slotOf(ip)] = true
		}
	}
	return out
}

func (n *Network) slotOf(a netip.Addr) int {
	return int((addrU32(a) - addrU32(n.cfg.CIDR.Addr())) / slotSize)
}

func (n *Network) slotAddrs(slot int) (gw, sbx netip.Addr) {
	base := addrU32(n.cfg.CIDR.Addr()) + uint32(slot*slotSize)
	return u32Addr(base + 1), u32Addr(base + 2)
}

// DNSPort is the port the forwarder listens on.
func (n *Network) DNSPort() uint16 { return n.port }

// HostIf returns the host-side interface name of a sandbox.
func (n *Network) HostIf(id string) string {
	if len(id) > 12 {
		id = id[:12]
	}
	return n.cfg.IfPrefix + id
}

func (n *Network) dir(id string) string { return filepath.Join(n.cfg.StateDir, id) }

// Setup creates a sandbox's network with its initial policy.
func (n *Network) Setup(ctx context.Context, id string, p Policy) (*Sandbox, error) {
	sb, err := n.Prepare(ctx, id, p)
	if err != nil {
		return nil, err
	}
	if err := n.Link(id, sb.NetNS); err != nil {
		_ = n.Teardown(id)
		return nil, err
	}
	return sb, nil
}

// Prepare is Setup without the link: the namespace at Sandbox.NetNS is
// empty until Link puts the sandbox's veth in it or in another namespace
// (the sandbox's own, made by its runtime: a veth made in place is cheap,
// one moved between namespaces waits out an RCU grace period). Teardown
// undoes it either way.
func (n *Network) Prepare(ctx context.Context, id string, p Policy) (*Sandbox, error) {
	return n.prepare(ctx, id, p, false)
}

// PrepareClosed is Prepare for a sandbox that must reach nothing until it is
// given a policy (a warm pool's, until its claim): its forwarded traffic
// finds no policy of its own and is dropped (the firewall fails closed), and
// DNS answers it as under a policy that denies all traffic. Its first Update
// then only adds to the firewall; a change that removes anything (Update
// from a policy with elements) waits for an RCU grace period in the kernel,
// 8-45 ms measured, on a claim's path.
func (n *Network) PrepareClosed(ctx context.Context, id string) (*Sandbox, error) {
	return n.prepare(ctx, id, Policy{DenyOut: []string{AllTraffic}}, true)
}

func (n *Network) prepare(ctx context.Context, id string, p Policy, closed bool) (*Sandbox, error) {
	c, err := p.compile()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	st := &state{policy: p, c: c, hostIf: n.HostIf(id), learned: map[netip.Addr]learned{}, ruleLearned: map[netip.Addr]learned{}, closed: closed}
	st.ID = id
	// Addresses the kernel already has in the range (another server
	// misconfigured onto the same range, or links this one does not know)
	// are skipped: a duplicate gateway would misroute both sandboxes.
	n.mu.Lock()
	stale := time.Since(n.foreignAt) > foreignTTL
	n.mu.Unlock()
	var fresh map[int]bool
	if stale {
		stop := timing.Start(ctx, "net.scan")
		fresh = n.kernelSlots() // a netlink dump: not under n.mu
		stop()
	}
	n.mu.Lock()
	if stale {
		// Ours are in slots already; only the others' need remembering.
		for slot := range fresh {
			if _, ours := n.slots[slot]; ours {
				delete(fresh, slot)
			}
		}
		n.foreign, n.foreignAt = fresh, time.Now()
	}
	taken := n.foreign
	st.slot = -1
	for i := 0; i < (1<<(32-n.cfg.CIDR.Bits()))/slotSize; i++ {
		if _, used := n.slots[i]; !used && !taken[i] {
			st.slot = i
			n.slots[i] = id
			break
		}
	}
	n.mu.Unlock()
	if st.slot < 0 {
		return nil, fmt.Errorf("netpolicy: no free address in %s", n.cfg.CIDR)
	}
	st.Gateway, st.Addr = n.slotAddrs(st.slot)
	st.Gateway6, st.Addr6 = n.fw.addr6(st.Gateway), n.fw.addr6(st.Addr)
	dir := n.dir(id)
	st.NetNS = filepath.Join(dir, "netns")
	st.ResolvConf = filepath.Join(dir, "resolv.conf")
	st.Hosts = filepath.Join(dir, "hosts")
	fail := func(err error) (*Sandbox, error) {
		_ = n.teardown(st)
		return nil, fmt.Errorf("netpolicy: sandbox %s: %w", id, err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fail(err)
	}
	if err := n.writeFiles(st); err != nil {
		return fail(err)
	}
	// The namespace at NetNS is made by its first user (Link into it, or a
	// runtime keeping the interfaces there at a pause): a mount per live
	// sandbox in the server's mount namespace is copied and walked by every
	// sandbox start, and one whose veth lives in its own namespace needs
	// this one only once it is paused.
	stop := timing.Start(ctx, "net.nft")
	if closed {
		err = n.fw.addSandbox(id, st.Addr, compiled{}, nil, false)
	} else {
		err = n.fw.addSandbox(id, st.Addr, c, nil, true)
	}
	stop()
	if err != nil {
		return fail(err)
	}
	if err := n.applyIntercept(st, nil); err != nil {
		return fail(err)
	}
	n.mu.Lock()
	n.sbx[id] = st
	n.byIP[st.Addr] = st
	n.last.Setup = time.Since(start)
	n.mu.Unlock()
	out := st.Sandbox
	return &out, nil
}

// Link makes a prepared sandbox's veth: the host end addressed and up, its
// peer (eth0) made inside the network namespace at netnsPath, addressed,
// routed to the host end and up, with loopback up there too. Call it once per
// Prepare.
func (n *Network) Link(id, netnsPath string) error {
	n.mu.Lock()
	st := n.sbx[id]
	n.mu.Unlock()
	if st == nil {
		return fmt.Errorf("netpolicy: link of %s: no network prepared for it", id)
	}
	if netnsPath == st.NetNS {
		if err := nsfile.Ensure(netnsPath); err != nil {
			return fmt.Errorf("netpolicy: link of %s: %w", id, err)
		}
	}
	ns, err := netns.GetFromPath(netnsPath)
	if err != nil {
		return fmt.Errorf("netpolicy: link of %s: %w", id, err)
	}
	defer ns.Close()
	err = setupLink(ns, link{hostIf: st.hostIf, gateway: st.Gateway, addr: st.Addr, bits: 30,
		gateway6: st.Gateway6, addr6: st.Addr6})
	if err != nil {
		return fmt.Errorf("netpolicy: link of %s: %w", id, err)
	}
	return nil
}

// writeFiles writes the resolv.conf (the gateway is the DNS server) and hosts
// files the sandbox sees read-only.
func (n *Network) writeFiles(st *state) error {
	resolv := fmt.Sprintf("# Airlock: DNS goes through the sandbox's gateway\nnameserver %s\noptions edns0\n", st.Gateway)
	if err := os.WriteFile(st.ResolvConf, []byte(resolv), 0o644); err != nil {
		return err
	}
	hosts := fmt.Sprintf("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n%s\tairlock\n", st.Addr)
	if st.Addr6.IsValid() {
		hosts += fmt.Sprintf("%s\tairlock\n", st.Addr6)
	}
	return os.WriteFile(st.Hosts, []byte(hosts), 0o644)
}

// Adopt takes back a sandbox that survived a server restart: its netns and
// veth are still there; the firewall state (rebuilt empty by New) is
// reinstalled with the policy the caller persisted.
func (n *Network) Adopt(id string, p Policy) (*Sandbox, error) {
	c, err := p.compile()
	if err != nil {
		return nil, err
	}
	st := &state{policy: p, c: c, hostIf: n.HostIf(id), learned: map[netip.Addr]learned{}, ruleLearned: map[netip.Addr]learned{}}
	st.ID = id
	dir := n.dir(id)
	st.NetNS = filepath.Join(dir, "netns")
	st.ResolvConf = filepath.Join(dir, "resolv.conf")
	st.Hosts = filepath.Join(dir, "hosts")
	l, err := netlink.LinkByName(st.hostIf)
	if err != nil {
		return nil, fmt.Errorf("netpolicy: adopt %s: %w", id, err)
	}
	gw, ok := linkGateway(l, n.cfg.CIDR)
	if !ok {
		return nil, fmt.Errorf("netpolicy: adopt %s: %s has no address in %s", id, st.hostIf, n.cfg.CIDR)
	}
	st.slot = n.slotOf(gw)
	st.Gateway, st.Addr = n.slotAddrs(st.slot)
	// The IPv6 addresses follow from the IPv4 ones. A sandbox set up while
	// IPv6 was off has none in its namespace: its IPv6 traffic (link-local
	// only) still finds no rule that accepts it.
	st.Gateway6, st.Addr6 = n.fw.addr6(st.Gateway), n.fw.addr6(st.Addr)
	if err := n.fw.addSandbox(id, st.Addr, c, nil, true); err != nil {
		return nil, err
	}
	if err := n.applyIntercept(st, nil); err != nil {
		_ = n.fw.removeSandbox(id, st.Addr)
		return nil, err
	}
	n.mu.Lock()
	n.slots[st.slot] = id
	n.sbx[id] = st
	n.byIP[st.Addr] = st
	n.mu.Unlock()
	out := st.Sandbox
	return &out, nil
}

// Update replaces a running sandbox's policy atomically. Addresses learned
// from DNS stay open only while their domain is still allowed.
func (n *Network) Update(id string, p Policy) error {
	c, err := p.compile()
	if err != nil {
		return err
	}
	n.mu.Lock()
	st, ok := n.sbx[id]
	if !ok {
		n.mu.Unlock()
		return fmt.Errorf("netpolicy: no network for sandbox %s", id)
	}
	var keep []learnedElem
	now := time.Now()
	for a, l := range st.learned {
		if l.expires.After(now) && matchDomain(c.allowDomains, l.name) {
			keep = append(keep, learnedElem{a, l.expires})
		} else {
			delete(st.learned, a)
		}
	}
	var keepRule []learnedElem
	for a, l := range st.ruleLearned {
		if l.expires.After(now) && matchDomain(c.egress.ruleDomains(), l.name) {
			keepRule = append(keepRule, learnedElem{a, l.expires})
		} else {
			delete(st.ruleLearned, a)
		}
	}
	st.policy, st.c = p, c
	wasClosed := st.closed
	st.closed = false
	n.mu.Unlock()
	if wasClosed {
		err = n.fw.openSandbox(id, st.Addr, c, keep)
	} else {
		err = n.fw.updateSandbox(id, c, keep)
	}
	if err != nil {
		if wasClosed {
			n.mu.Lock()
			st.closed = true // nothing was committed: still closed
			n.mu.Unlock()
		}
		return err
	}
	return n.applyIntercept(st, keepRule)
}

// applyIntercept brings the firewall's interception for a sandbox in line
// with its compiled policy (nothing to do for a sandbox that neither had
// nor needs it, which is most of them).
func (n *Network) applyIntercept(st *state, learned []learnedElem) error {
	need := st.c.egress.intercepts()
	if !need && !st.intercepting {
		return nil
	}
	if err := n.fw.setIntercept(st.ID, st.Addr, st.c.egress, learned); err != nil {
		return err
	}
	n.mu.Lock()
	st.intercepting = need
	n.mu.Unlock()
	return nil
}

// Policy returns a sandbox's current policy.
func (n *Network) Policy(id string) (Policy, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.sbx[id]
	if !ok {
		return Policy{}, false
	}
	return st.policy, true
}

// Addr returns the sandbox's address, which the host (the proxy) dials for user
// ports.
func (n *Network) Addr(id string) (netip.Addr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.sbx[id]
	if !ok {
		return netip.Addr{}, false
	}
	return st.Addr, true
}

// Addr6 returns the sandbox's IPv6 address (invalid without IPv6).
func (n *Network) Addr6(id string) netip.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	if st, ok := n.sbx[id]; ok {
		return st.Addr6
	}
	return netip.Addr{}
}

// Teardown removes a sandbox's firewall state, veth, netns and files. Call it
// after the runtime destroyed the sandbox. It takes tens of milliseconds (the
// veth delete waits for an RCU grace period), so callers run it off the
// request path.
func (n *Network) Teardown(id string) error {
	n.mu.Lock()
	st, ok := n.sbx[id]
	n.mu.Unlock()
	if !ok {
		// Unknown (e.g. a leftover after a crash): clean what the kernel and
		// the state directory still hold under this id.
		st = &state{hostIf: n.HostIf(id), slot: -1}
		st.ID = id
		st.NetNS = filepath.Join(n.dir(id), "netns")
	}
	start := time.Now()
	err := n.teardown(st)
	n.mu.Lock()
	n.last.Teardown = time.Since(start)
	n.mu.Unlock()
	return err
}

func (n *Network) teardown(st *state) error {
	var errs []error
	if st.Addr.IsValid() {
		if st.intercepting {
			n.fw.mu.Lock()
			n.fw.clearIntercept(st.ID, st.Addr) // it jumps to s_<id>: first
			n.fw.mu.Unlock()
		}
		if err := n.fw.removeSandbox(st.ID, st.Addr); err != nil {
			errs = append(errs, err)
		}
	}
	linkErr := deleteLink(st.hostIf)
	if linkErr != nil {
		errs = append(errs, linkErr)
	}
	if st.NetNS != "" {
		if err := nsfile.Remove(st.NetNS); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(n.dir(st.ID)); err != nil {
		errs = append(errs, err)
	}
	n.mu.Lock()
	if cur, ok := n.sbx[st.ID]; ok && cur == st {
		delete(n.sbx, st.ID)
		delete(n.byIP, st.Addr)
	}
	if st.slot >= 0 && n.slots[st.slot] == st.ID {
		if linkErr == nil {
			delete(n.slots, st.slot)
		} else {
			// The veth may still hold the slot's addresses: reserved as
			// kernel state until a restart's scan finds it gone.
			n.slots[st.slot] = ""
		}
	}
	n.mu.Unlock()
	return errors.Join(errs...)
}

// Sweep tears down every network in the state directory whose sandbox is not
// in keep (leftovers of sandboxes that died while no server ran). Only this
// instance's state directory is looked at, never other interfaces.
func (n *Network) Sweep(keep map[string]bool) {
	dirs, _ := os.ReadDir(n.cfg.StateDir)
	for _, d := range dirs {
		if !d.IsDir() || keep[d.Name()] {
			continue
		}
		n.mu.Lock()
		_, live := n.sbx[d.Name()]
		n.mu.Unlock()
		if live {
			continue
		}
		n.log.Info("netpolicy: removing leftover sandbox network", "id", d.Name())
		if err := n.Teardown(d.Name()); err != nil {
			n.log.Warn("netpolicy: leftover network", "id", d.Name(), "err", err)
		}
	}
	n.scanSlots()
}

// LastTimings reports the duration of the most recent Setup and Teardown.
func (n *Network) LastTimings() Timings {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.last
}

// Close stops the DNS forwarder. The nftables table stays: sandboxes that keep
// running after the server stops keep their isolation and policy.
func (n *Network) Close() error {
	return n.dns.Close()
}

// RemoveTable deletes Airlock's nftables table; for tests and for a server
// that killed all its sandboxes.
func (n *Network) RemoveTable() error { return n.fw.remove() }

// dnsRules is the forwarder's view of a sandbox's policy, by source address.
// With ALL_TRAFFIC denied only allowOut domains resolve; otherwise every name
// resolves and only allowOut domains' answers open the firewall (see
// dnsfilter.Rules).
func (n *Network) dnsRules(src netip.Addr) (dnsfilter.Rules, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	st, ok := n.byIP[src.Unmap()]
	if !ok {
		return dnsfilter.Rules{}, false
	}
	r := dnsfilter.Rules{Allow: append([]string(nil), st.c.allowDomains...), DenyAll: st.c.deniesAll()}
	if st.intercepting && st.c.egress.proxy == nil {
		r.Watch = st.c.egress.ruleDomains()
	}
	return r, true
}

// onAnswer opens the answered addresses of an allowed domain for the sandbox
// before the forwarder releases the answer, so the connection that follows the
// lookup is not dropped.
func (n *Network) onAnswer(_ context.Context, src netip.Addr, name string, addrs []netip.Addr, ttl time.Duration) error {
	ttl = max(ttl, minLearnTTL)
	if err := n.learnRuleHost(src, name, addrs, ttl); err != nil {
		return err
	}
	n.mu.Lock()
	st, ok := n.byIP[src.Unmap()]
	if !ok || !matchDomain(st.c.allowDomains, name) {
		n.mu.Unlock()
		return nil
	}
	now := time.Now()
	covered, expires := now.Add(ttl), now.Add(ttl+learnSlack)
	if len(st.learned) > 4096 {
		// Forget what the kernel has already expired, so a sandbox resolving
		// many names does not grow this map without bound.
		for a, l := range st.learned {
			if !l.expires.After(now) {
				delete(st.learned, a)
			}
		}
	}
	var add []learnedElem
	var present []netip.Addr
	for _, a := range addrs {
		// An IPv4-mapped AAAA answer is an IPv4 destination: a dual-stack
		// socket connecting to it sends IPv4.
		a = a.Unmap().WithZone("")
		if a.Is6() && !n.cfg.IPv6 {
			continue // no IPv6 egress to open
		}
		if inRanges(n.fw.closed, a) || inRanges(neverClosed(), a) {
			// A domain never opens a closed private address, as E2B's
			// firewall refuses them too: whoever controls a name's DNS (or
			// rebinds it) could otherwise point an allowed domain at the
			// company network. The sandbox still gets the answer; its
			// connection is dropped unless allowOut names the address.
			n.log.Debug("netpolicy: allowed domain resolved to a private address; not opened",
				"sandbox", st.ID, "name", name, "addr", a)
			continue
		}
		if old, ok := st.learned[a]; ok && !old.expires.Before(covered) {
			continue
		} else if ok && old.expires.After(now) {
			// Re-adding an element does not restart its timeout; delete and
			// add it in one transaction instead.
			present = append(present, a)
		}
		st.learned[a] = learned{name: strings.TrimSuffix(strings.ToLower(name), "."), expires: expires}
		add = append(add, learnedElem{a, expires})
	}
	id := st.ID
	n.mu.Unlock()
	if len(add) == 0 {
		return nil
	}
	err := n.fw.learn(id, add, present)
	if err != nil && len(present) > 0 {
		// An element expired in the kernel between our check and the delete.
		err = n.fw.learn(id, add, nil)
	}
	return err
}

// learnRuleHost sends the sandbox's HTTP(S) connections to the addresses a
// rule host resolved to through the egress proxy, before the answer is
// released. Whether the sandbox may reach them at all is the policy's
// business (the interception judges the real destination first).
func (n *Network) learnRuleHost(src netip.Addr, name string, addrs []netip.Addr, ttl time.Duration) error {
	n.mu.Lock()
	st, ok := n.byIP[src.Unmap()]
	if !ok || !st.intercepting || st.c.egress.proxy != nil || !matchDomain(st.c.egress.ruleDomains(), name) {
		// With an egress proxy every connection is intercepted already.
		n.mu.Unlock()
		return nil
	}
	now := time.Now()
	covered, expires := now.Add(ttl), now.Add(ttl+learnSlack)
	var add []learnedElem
	var present []netip.Addr
	for _, a := range addrs {
		a = a.Unmap()
		if !a.Is4() {
			continue
		}
		if old, ok := st.ruleLearned[a]; ok && !old.expires.Before(covered) {
			continue
		} else if ok && old.expires.After(now) {
			present = append(present, a)
		}
		st.ruleLearned[a] = learned{name: strings.TrimSuffix(strings.ToLower(name), "."), expires: expires}
		add = append(add, learnedElem{a, expires})
	}
	id := st.ID
	n.mu.Unlock()
	if len(add) == 0 {
		return nil
	}
	err := n.fw.learnIntercept(id, add, present)
	if err != nil && len(present) > 0 {
		err = n.fw.learnIntercept(id, add, nil)
	}
	return err
}
