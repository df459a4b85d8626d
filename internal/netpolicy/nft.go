package netpolicy

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// firewall is Airlock's nftables table (family inet, one table that belongs to
// Airlock alone; no other table is read or written). Its layout:
//
//	chain prerouting_filter (filter, prerouting, -150)
//	    iifname "alk*" fib saddr . iif oif missing drop     # no spoofed sources, IPv4 and IPv6
//	chain prerouting_nat (nat, prerouting, dstnat)
//	    iifname "alk*" meta nfproto ipv4 udp/tcp dport 53 redirect to :<dns port>
//	chain input (filter, input, 0)
//	    iifname "alk*" ct state established,related accept
//	    iifname "alk*" meta nfproto ipv4 udp/tcp dport <dns port> accept
//	    iifname "alk*" icmpv6 type {nd-neighbor-solicit, nd-neighbor-advert} ip6 hoplimit 255 accept
//	    iifname "alk*" drop                                  # nothing else of the host
//	chain forward (filter, forward, 0)
//	    iifname "alk*" oifname "alk*" drop                   # sandbox to sandbox
//	    oifname "alk*" ct state established,related accept
//	    oifname "alk*" drop                                  # nobody opens into a sandbox
//	    iifname "alk*" ct state established,related accept
//	    iifname "alk*" ip daddr @never drop                  # link-local (cloud metadata), loopback
//	    iifname "alk*" ip6 daddr @never6 drop
//	    iifname "alk*" meta nfproto ipv6 udp/tcp dport 53 drop  # DNS goes to the forwarder over IPv4
//	    iifname "alk*" jump policy                           # per-sandbox policy
//	    iifname "alk*" drop
//	chain policy (regular; also judges intercepted connections, intercept.go)
//	    ip saddr != @sandboxes drop                          # unknown or closed source: fail closed
//	    ip saddr . ip daddr @allow accept
//	    ip saddr . ip daddr @learned accept
//	    ip saddr . ip daddr @deny drop
//	    ip daddr @private drop
//	    ip6 saddr != @sandboxes6 drop
//	    ip6 saddr . ip6 daddr @allow6 accept
//	    ip6 saddr . ip6 daddr @learned6 accept
//	    ip6 saddr . ip6 daddr @deny6 drop
//	    ip6 daddr @private6 drop
//	    accept
//	set sandboxes (ipv4), sandboxes6 (ipv6): the addresses of open sandboxes
//	set allow, deny (ipv4 . ipv4, interval), allow6, deny6 (ipv6 . ipv6,
//	    interval): a sandbox's address with a CIDR its policy allows or denies
//	set learned (ipv4 . ipv4), learned6 (ipv6 . ipv6), per-element timeout:
//	    a sandbox's address with an address its allowed domains resolved to
//	set private (ipv4, interval), private6 (ipv6, interval): the private
//	    ranges (closedPrivate: PrivateRanges and the NAT64/6to4 forms of the
//	    closed IPv4 ones) minus those the operator opened for all sandboxes
//	    (Config.AllowPrivate)
//	set never (ipv4, interval), never6 (ipv6, interval): NeverRanges
//	chain postrouting (nat, postrouting, srcnat)
//	    ip saddr <cidr> oifname != "alk*" masquerade
//	    ip6 saddr <cidr6> oifname != "alk*" masquerade       # with IPv6 on
//
// Every sandbox shares those sets and chains, its elements keyed by its
// address: a sandbox is elements, never a chain or a set of its own. A
// commit that adds a jump to a chain has the kernel validate every chain the
// table can reach, so with a chain per sandbox (as before) each create's
// commit grew with the sandboxes alive: 0.6 ms with 10, 31 ms with 4,000.
// Adding set elements validates nothing. A sandbox with the default policy
// is one element of sandboxes (and of sandboxes6 with IPv6 on).
//
// So a sandbox's allowOut (addresses, CIDRs, and what its domains resolved
// to; see onAnswer for why that never includes a private address) opens a
// destination whatever else says; its denyOut closes one; and a private
// destination neither names is closed. 0.0.0.0/0 in a policy carries ::/0
// with it (compile), so ALL_TRAFFIC denies IPv6 too. Without IPv6 (Config.
// IPv6 off) a sandbox has no IPv6 address beyond link-local and no route;
// what it sends anyway finds no sandboxes6 element and is dropped.
//
// The spoofing check matters because the policy is keyed by source address:
// sandbox root has CAP_NET_RAW and could otherwise borrow another sandbox's
// address. Every rule matches on the interface prefix, so a table left behind
// when Airlock stops affects nothing but sandbox interfaces, and it fails
// closed for sandboxes that outlive the server (their policy stays in force).
type firewall struct {
	mu    sync.Mutex
	conn  *nftables.Conn
	table *nftables.Table
	// open4 and open6 are the sets sandboxes and sandboxes6: open
	// sandboxes' addresses.
	open4, open6 *nftables.Set
	// allow, learned and deny (and their IPv6 twins) hold every open
	// sandbox's policy, keyed by its address (see the type's doc).
	allow, learned, deny, allow6, learned6, deny6 *nftables.Set
	private                                       *nftables.Set
	private6                                      *nftables.Set
	// closed are the private ranges in the private sets, both families.
	closed []ipRange
	prefix string
	cidr   netip.Prefix
	// cidr6 is the IPv6 range of sandboxes (invalid with IPv6 off): a
	// sandbox's IPv6 address is cidr6's prefix with its IPv4 address as the
	// last 32 bits (addr6).
	cidr6   netip.Prefix
	dnsPort uint16
	// egressPort is the egress proxy's port (0: none); see intercept.go.
	egressPort uint16
	// imap is intercept.go's map; intercepting, i6, px4 and px6 its sets.
	imap, intercepting, i6, px4, px6 *nftables.Set
	// sbx is what is installed for each sandbox, by id (fw.mu).
	sbx map[string]*fwSandbox
	// noEgress drops all forwarded sandbox traffic whatever the policy
	// (serve --sandbox-egress=false).
	noEgress bool
	rm       remover
	// lastAdd is when a sandbox's state was last installed (unix ns), by a
	// create or a warm claim: the remover waits for a lull after it
	// (removalQuiet).
	lastAdd atomic.Int64
}

// installing marks an install (a create's addSandbox, a claim's
// openSandbox) from now until the returned func runs: a removal that comes
// meanwhile, or within removalQuiet after, waits (remover.yieldFor).
func (fw *firewall) installing() func() {
	fw.lastAdd.Store(time.Now().UnixNano())
	return func() { fw.lastAdd.Store(time.Now().UnixNano()) }
}

func newFirewall(table, prefix string, cidr, cidr6 netip.Prefix, dnsPort, egressPort uint16, noEgress bool, closed []ipRange) (*firewall, error) {
	fw, err := openFirewall(table, dnsPort, closed)
	if err != nil {
		return nil, err
	}
	fw.prefix, fw.cidr, fw.cidr6, fw.egressPort, fw.noEgress = prefix, cidr, cidr6, egressPort, noEgress
	return fw, fw.install()
}

// openFirewall is a firewall over the table with its netlink connection,
// nothing installed yet.
func openFirewall(table string, dnsPort uint16, closed []ipRange) (*firewall, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	fw := &firewall{
		conn:    conn,
		table:   &nftables.Table{Name: table, Family: nftables.TableFamilyINet},
		dnsPort: dnsPort,
		closed:  closed,
	}
	fw.rm.fw = fw
	return fw, nil
}

// freshTable queues the replacement of the table by an empty one (fw.mu
// held; the caller adds everything and flushes: one transaction).
func (fw *firewall) freshTable(c *nftables.Conn) *nftables.Table {
	if old, err := c.ListTableOfFamily(fw.table.Name, nftables.TableFamilyINet); err == nil && old != nil {
		c.DelTable(fw.table)
	}
	fw.sbx = map[string]*fwSandbox{}
	return c.AddTable(fw.table)
}

// addr6 is the IPv6 address that goes with a sandbox-side or gateway IPv4
// address, or the zero Addr with IPv6 off.
func (fw *firewall) addr6(a netip.Addr) netip.Addr {
	return embed6(fw.cidr6, a)
}

// embed6 puts the IPv4 address a into the last 32 bits of p's prefix.
func embed6(p netip.Prefix, a netip.Addr) netip.Addr {
	if !p.IsValid() || !a.Is4() {
		return netip.Addr{}
	}
	b := p.Addr().As16()
	v := a.As4()
	copy(b[12:], v[:])
	return netip.AddrFrom16(b)
}

// install replaces the table with a fresh one in one transaction, so there is
// no moment with no rules when a server restarts. Per-sandbox state is added
// back by Adopt.
func (fw *firewall) install() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	c := fw.conn
	t := fw.freshTable(c)
	accept := nftables.ChainPolicyAccept
	sbx := func(parts ...[]expr.Any) []expr.Any {
		return cat(append([][]expr.Any{fw.ifMatch(expr.MetaKeyIIFNAME, true)}, parts...)...)
	}

	pre := c.AddChain(&nftables.Chain{Name: "prerouting_filter", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accept})
	// fib works on both families in an inet table.
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: sbx(
		[]expr.Any{
			&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}},
			&expr.Verdict{Kind: expr.VerdictDrop},
		})})

	nat := c.AddChain(&nftables.Chain{Name: "prerouting_nat", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: sbx(ipv4(), dport(proto, 53),
			[]expr.Any{
				&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(fw.dnsPort)},
				&expr.Redir{RegisterProtoMin: 1},
			})})
	}

	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: sbx(ctEstablished(), verdict(expr.VerdictAccept))})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: sbx(ipv4(), dport(proto, fw.dnsPort), verdict(expr.VerdictAccept))})
	}
	if fw.egressPort != 0 {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: sbx(ipv4(), dport(unix.IPPROTO_TCP, fw.egressPort), verdict(expr.VerdictAccept))})
	}
	// Neighbour discovery: without it the sandbox cannot resolve its IPv6
	// gateway nor answer the host's solicitations. Hop limit 255 means the
	// packet was sent on this link (RFC 4861).
	for _, typ := range []byte{135, 136} { // neighbor solicitation, advertisement
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: sbx(ipv6(), []expr.Any{
			&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_ICMPV6}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{typ}},
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 7, Len: 1},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{255}},
		}, verdict(expr.VerdictAccept))})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: sbx(verdict(expr.VerdictDrop))})

	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	never, never6, err := fw.addPolicy(c, t)
	if err != nil {
		return err
	}
	policy := [][]expr.Any{
		sbx(ipv4(), daddrLookup(never, true), verdict(expr.VerdictDrop)),
		sbx(ipv6(), daddrLookup(never6, false), verdict(expr.VerdictDrop)),
		sbx(ipv6(), dport(unix.IPPROTO_UDP, 53), verdict(expr.VerdictDrop)),
		sbx(ipv6(), dport(unix.IPPROTO_TCP, 53), verdict(expr.VerdictDrop)),
		sbx([]expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: policyChain}}),
	}
	if fw.noEgress {
		policy = [][]expr.Any{sbx(verdict(expr.VerdictDrop))}
	}
	rules := [][]expr.Any{
		cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), fw.ifMatch(expr.MetaKeyOIFNAME, true), verdict(expr.VerdictDrop)),
		cat(fw.ifMatch(expr.MetaKeyOIFNAME, true), ctEstablished(), verdict(expr.VerdictAccept)),
		cat(fw.ifMatch(expr.MetaKeyOIFNAME, true), verdict(expr.VerdictDrop)),
		sbx(ctEstablished(), verdict(expr.VerdictAccept)),
	}
	rules = append(rules, policy...)
	rules = append(rules, sbx(verdict(expr.VerdictDrop)))
	for _, r := range rules {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: r})
	}

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: cat(
		ipv4(), prefixMatch(12, fw.cidr), fw.ifMatch(expr.MetaKeyOIFNAME, false),
		[]expr.Any{&expr.Masq{}})})
	if fw.cidr6.IsValid() {
		c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: cat(
			ipv6(), prefixMatch(8, fw.cidr6), fw.ifMatch(expr.MetaKeyOIFNAME, false),
			[]expr.Any{&expr.Masq{}})})
	}

	if fw.egressPort != 0 {
		if err := fw.installIntercept(c, t); err != nil {
			return err
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: install table %s: %w", fw.table.Name, err)
	}
	return nil
}

// addPolicy adds the sets of every sandbox's policy and the policy chain
// that judges by them (see firewall's doc) to t, returning the sets of
// NeverRanges for the caller's rules.
func (fw *firewall) addPolicy(c *nftables.Conn, t *nftables.Table) (never, never6 *nftables.Set, err error) {
	fw.open4 = &nftables.Set{Table: t, Name: "sandboxes", KeyType: nftables.TypeIPAddr}
	fw.open6 = &nftables.Set{Table: t, Name: "sandboxes6", KeyType: nftables.TypeIP6Addr}
	pair := func(name string, key nftables.SetDatatype, learned bool) *nftables.Set {
		return &nftables.Set{Table: t, Name: name, KeyType: nftables.MustConcatSetType(key, key),
			Concatenation: true, Interval: !learned, HasTimeout: learned}
	}
	fw.allow, fw.learned, fw.deny = pair("allow", nftables.TypeIPAddr, false), pair("learned", nftables.TypeIPAddr, true), pair("deny", nftables.TypeIPAddr, false)
	fw.allow6, fw.learned6, fw.deny6 = pair("allow6", nftables.TypeIP6Addr, false), pair("learned6", nftables.TypeIP6Addr, true), pair("deny6", nftables.TypeIP6Addr, false)
	fw.private = &nftables.Set{Table: t, Name: "private", KeyType: nftables.TypeIPAddr, Interval: true}
	fw.private6 = &nftables.Set{Table: t, Name: "private6", KeyType: nftables.TypeIP6Addr, Interval: true}
	never = &nftables.Set{Table: t, Name: "never", KeyType: nftables.TypeIPAddr, Interval: true}
	never6 = &nftables.Set{Table: t, Name: "never6", KeyType: nftables.TypeIP6Addr, Interval: true}
	nv := neverClosed()
	for _, x := range []struct {
		set   *nftables.Set
		elems []nftables.SetElement
	}{
		{fw.open4, nil}, {fw.open6, nil},
		{fw.allow, nil}, {fw.learned, nil}, {fw.deny, nil}, {fw.allow6, nil}, {fw.learned6, nil}, {fw.deny6, nil},
		{fw.private, rangeElems(family(fw.closed, true))}, {fw.private6, rangeElems(family(fw.closed, false))},
		{never, rangeElems(family(nv, true))}, {never6, rangeElems(family(nv, false))},
	} {
		if err := c.AddSet(x.set, x.elems); err != nil {
			return nil, nil, fmt.Errorf("nftables: %s set: %w", x.set.Name, err)
		}
	}
	pol := c.AddChain(&nftables.Chain{Name: policyChain, Table: t})
	for _, f := range []struct {
		guard                      []expr.Any
		v4                         bool
		open, allow, learned, deny *nftables.Set
		private                    *nftables.Set
	}{
		{ipv4(), true, fw.open4, fw.allow, fw.learned, fw.deny, fw.private},
		{ipv6(), false, fw.open6, fw.allow6, fw.learned6, fw.deny6, fw.private6},
	} {
		for _, r := range [][]expr.Any{
			cat(f.guard, saddrLookup(f.open, f.v4, true), verdict(expr.VerdictDrop)),
			cat(f.guard, pairLookup(f.allow, f.v4), verdict(expr.VerdictAccept)),
			cat(f.guard, pairLookup(f.learned, f.v4), verdict(expr.VerdictAccept)),
			cat(f.guard, pairLookup(f.deny, f.v4), verdict(expr.VerdictDrop)),
			cat(f.guard, daddrLookup(f.private, f.v4), verdict(expr.VerdictDrop)),
		} {
			c.AddRule(&nftables.Rule{Table: t, Chain: pol, Exprs: r})
		}
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: pol, Exprs: verdict(expr.VerdictAccept)})
	return never, never6, nil
}

// remove deletes the table (tests; a server leaves it, see the type's doc).
func (fw *firewall) remove() error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	fw.conn.DelTable(fw.table)
	if err := fw.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: delete table %s: %w", fw.table.Name, err)
	}
	return nil
}

// policyChain is the regular chain that judges a sandbox's new traffic by
// its policy.
const policyChain = "policy"

// fwSandbox is what the firewall installed for a sandbox: its address and
// its policy's elements. They are kept because the kernel indexes the shared
// sets by whole keys only: an update or a removal deletes exactly these.
type fwSandbox struct {
	addr   netip.Addr
	mapped bool
	policy []setElems // allow and deny, both families
	// learned is when each DNS-learned address's element expires, as
	// installed.
	learned map[netip.Addr]time.Time
}

type setElems struct {
	set   *nftables.Set
	elems []nftables.SetElement
}

// learnedElem is a DNS-learned address and when it stops being allowed.
type learnedElem struct {
	addr    netip.Addr
	expires time.Time
}

// ttl is the element's timeout from now, in whole seconds as the kernel
// takes it; false when under a second is left (not worth installing).
func (e learnedElem) ttl(now time.Time) (time.Duration, bool) {
	ttl := e.expires.Sub(now).Truncate(time.Second)
	return ttl, ttl >= time.Second
}

// policyElems are a sandbox's allow and deny elements under a policy: its
// address (or, for IPv6, the one that goes with it; none with IPv6 off)
// with each merged range.
func (fw *firewall) policyElems(addr netip.Addr, c compiled) []setElems {
	var out []setElems
	for _, f := range []struct {
		src         netip.Addr
		v4          bool
		allow, deny *nftables.Set
	}{
		{addr, true, fw.allow, fw.deny},
		{fw.addr6(addr), false, fw.allow6, fw.deny6},
	} {
		if !f.src.IsValid() {
			continue
		}
		for _, x := range []struct {
			set  *nftables.Set
			nets []netip.Prefix
		}{{f.allow, c.allowNets}, {f.deny, c.denyNets}} {
			if el := pairRangeElems(f.src, mergeRanges(prefixesOf(x.nets, f.v4))); len(el) > 0 {
				out = append(out, setElems{x.set, el})
			}
		}
	}
	return out
}

// learnedSet is the set and source address a learned address goes with, or
// nil for an IPv6 address with IPv6 off.
func (fw *firewall) learnedSet(addr, dst netip.Addr) (*nftables.Set, netip.Addr) {
	if dst.Is4() {
		return fw.learned, addr
	}
	if a6 := fw.addr6(addr); a6.IsValid() {
		return fw.learned6, a6
	}
	return nil, netip.Addr{}
}

// addLearned queues the learned elements of the sandbox at addr (fw.mu
// held; the caller flushes) and records each in into, for the caller to
// keep once the transaction committed.
func (fw *firewall) addLearned(addr netip.Addr, into map[netip.Addr]time.Time, l []learnedElem) error {
	now := time.Now()
	for _, e := range l {
		set, src := fw.learnedSet(addr, e.addr)
		ttl, ok := e.ttl(now)
		if set == nil || !ok {
			continue
		}
		if err := fw.conn.SetAddElements(set, []nftables.SetElement{{Key: pairKey(src, e.addr), Timeout: ttl}}); err != nil {
			return fmt.Errorf("nftables: %s: %w", set.Name, err)
		}
		into[e.addr] = e.expires
	}
	return nil
}

// liveLearned are st's learned elements that have not expired yet, as
// deletions. The kernel may still expire one before they commit (its timeout
// was rounded down); deleting it then fails with ENOENT.
func (fw *firewall) liveLearned(st *fwSandbox) []setElems {
	var out []setElems
	now := time.Now()
	for a, exp := range st.learned {
		set, src := fw.learnedSet(st.addr, a)
		if set == nil || !exp.After(now) {
			continue
		}
		out = append(out, setElems{set, []nftables.SetElement{{Key: pairKey(src, a)}}})
	}
	return out
}

// mapElems are the elements that open a sandbox: its address in sandboxes
// and, with IPv6 on, the one that goes with it in sandboxes6.
func (fw *firewall) mapElems(addr netip.Addr) []setElems {
	out := []setElems{{fw.open4, []nftables.SetElement{{Key: addr.AsSlice()}}}}
	if a6 := fw.addr6(addr); a6.IsValid() {
		out = append(out, setElems{fw.open6, []nftables.SetElement{{Key: a6.AsSlice()}}})
	}
	return out
}

// queueAdd queues additions on conn.
func queueAdd(conn *nftables.Conn, xs []setElems) error {
	for _, x := range xs {
		if err := conn.SetAddElements(x.set, x.elems); err != nil {
			return fmt.Errorf("nftables: %s: %w", x.set.Name, err)
		}
	}
	return nil
}

// queueDelete queues deletions on conn.
func queueDelete(conn *nftables.Conn, xs []setElems) error {
	for _, x := range xs {
		if err := conn.SetDeleteElements(x.set, x.elems); err != nil {
			return fmt.Errorf("nftables: %s: %w", x.set.Name, err)
		}
	}
	return nil
}

// addSandbox installs a sandbox's policy, learned addresses and, if mapped,
// its addresses in sandboxes/sandboxes6, in one transaction. Unmapped, its
// traffic is dropped whatever its elements.
func (fw *firewall) addSandbox(id string, addr netip.Addr, c compiled, learned []learnedElem, mapped bool) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	defer fw.installing()()
	st := &fwSandbox{addr: addr, learned: map[netip.Addr]time.Time{}}
	if err := fw.install1(st, c, learned, mapped); err != nil {
		return fmt.Errorf("nftables: add sandbox %s: %w", id, err)
	}
	fw.sbx[id] = st
	return nil
}

// openSandbox gives an unmapped sandbox (no policy installed) its policy and
// maps it, in one transaction that only adds.
func (fw *firewall) openSandbox(id string, addr netip.Addr, c compiled, learned []learnedElem) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	defer fw.installing()()
	st := fw.sbx[id]
	if st == nil || st.mapped || len(st.policy) > 0 || len(st.learned) > 0 {
		return fmt.Errorf("nftables: open sandbox %s: not installed closed", id)
	}
	if err := fw.install1(st, c, learned, true); err != nil {
		return fmt.Errorf("nftables: open sandbox %s: %w", id, err)
	}
	return nil
}

// install1 adds st's policy, learned addresses and, if mapped, its map
// elements in one transaction (fw.mu held); st records them once committed.
func (fw *firewall) install1(st *fwSandbox, c compiled, learned []learnedElem, mapped bool) error {
	pol := fw.policyElems(st.addr, c)
	if err := queueAdd(fw.conn, pol); err != nil {
		return err
	}
	next := map[netip.Addr]time.Time{}
	if err := fw.addLearned(st.addr, next, learned); err != nil {
		return err
	}
	if mapped {
		if err := queueAdd(fw.conn, fw.mapElems(st.addr)); err != nil {
			return err
		}
	}
	if err := fw.conn.Flush(); err != nil {
		return err
	}
	st.policy, st.learned, st.mapped = pol, next, mapped
	return nil
}

// updateSandbox replaces a sandbox's policy and learned addresses in one
// transaction: no packet sees half of the old policy and half of the new.
func (fw *firewall) updateSandbox(id string, c compiled, learned []learnedElem) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	st := fw.sbx[id]
	if st == nil {
		return fmt.Errorf("nftables: update sandbox %s: not installed", id)
	}
	pol := fw.policyElems(st.addr, c)
	gone := fw.liveLearned(st)
	next := map[netip.Addr]time.Time{}
	replace := func(learnedGone []setElems) error {
		if err := queueDelete(fw.conn, st.policy); err != nil {
			return err
		}
		if err := queueDelete(fw.conn, learnedGone); err != nil {
			return err
		}
		if err := queueAdd(fw.conn, pol); err != nil {
			return err
		}
		if err := fw.addLearned(st.addr, next, learned); err != nil {
			return err
		}
		return fw.conn.Flush()
	}
	err := replace(gone)
	if err != nil && len(gone) > 0 {
		// A learned element expired in the kernel first: delete those that
		// are left one at a time, then replace the policy.
		for _, g := range gone {
			_ = queueDelete(fw.conn, []setElems{g})
			_ = fw.conn.Flush()
		}
		err = replace(nil)
	}
	if err != nil {
		return fmt.Errorf("nftables: update sandbox %s: %w", id, err)
	}
	st.policy, st.learned = pol, next
	return nil
}

// learn adds DNS-learned addresses to a sandbox's learned elements. An
// address already there is deleted and re-added in the same transaction so
// that its timeout restarts from the new answer's TTL. A sandbox whose
// removal began learns nothing: what it learned would outlive it.
func (fw *firewall) learn(id string, add []learnedElem, present []netip.Addr) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	st := fw.sbx[id]
	if st == nil {
		return nil
	}
	for _, a := range present {
		if set, src := fw.learnedSet(st.addr, a); set != nil {
			if err := fw.conn.SetDeleteElements(set, []nftables.SetElement{{Key: pairKey(src, a)}}); err != nil {
				return fmt.Errorf("nftables: %s: %w", set.Name, err)
			}
		}
	}
	added := map[netip.Addr]time.Time{}
	if err := fw.addLearned(st.addr, added, add); err != nil {
		return err
	}
	if err := fw.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: learn for %s: %w", id, err)
	}
	maps.Copy(st.learned, added)
	return nil
}

// removeSandbox deletes a sandbox's elements (map, policy, learned)
// through the remover: never under fw.mu, and in one transaction with the
// removals that arrive meanwhile.
func (fw *firewall) removeSandbox(id string, addr netip.Addr) error {
	fw.mu.Lock()
	elems := fw.mapElems(addr)
	if st := fw.sbx[id]; st != nil {
		delete(fw.sbx, id)
		elems = append(append(elems, st.policy...), fw.liveLearned(st)...)
	}
	fw.mu.Unlock()
	return fw.rm.remove(id, elems)
}

// remover deletes sandboxes' nftables state. A transaction that deletes
// commits only after an RCU grace period (5-20 ms measured): held under
// fw.mu it made the next create's Prepare wait for the last kill's teardown,
// and a thousand kills waited out a thousand grace periods one after
// another. So removals go through their own netlink connection, and those
// that arrive while one commits are committed together after it.
//
// Off fw.mu, a removal still held up a create that came while it committed
// (the kernel commits one nftables transaction at a time): in sandboxes
// created and killed one after another, a create's nftables commit took 6.6
// ms instead of 0.5. So removals also yield to creates and warm claims: they
// wait for a lull of removalQuiet after the last install (installing), but
// never past removalMaxWait, and then go as one batch. A killed sandbox's
// address is free again only once its removal committed (Network.teardown),
// a little later than it was.
type remover struct {
	fw      *firewall
	mu      sync.Mutex
	pending []*removal
	running bool // a goroutine commits pending batches
}

type removal struct {
	id    string
	elems []setElems
	since time.Time
	done  chan error
}

// maxRemovalBatch bounds the sandboxes one transaction removes (a message
// per set each sandbox has elements in), well within a netlink socket's
// buffer.
const maxRemovalBatch = 128

// removalQuiet is the lull after an install that removals wait for;
// removalMaxWait bounds how long a removal waits for one.
const (
	removalQuiet   = 250 * time.Millisecond
	removalMaxWait = time.Second
)

func (rm *remover) remove(id string, elems []setElems) error {
	r := &removal{id: id, elems: elems, since: time.Now(), done: make(chan error, 1)}
	rm.mu.Lock()
	rm.pending = append(rm.pending, r)
	if !rm.running {
		rm.running = true
		go rm.run()
	}
	rm.mu.Unlock()
	return <-r.done
}

// run commits the pending removals, a batch at a time, until none is left,
// each batch once installs pause (or its oldest removal waited long enough).
func (rm *remover) run() {
	for {
		rm.mu.Lock()
		if len(rm.pending) == 0 {
			rm.running = false
			rm.mu.Unlock()
			return
		}
		if wait := rm.yieldFor(rm.pending[0].since, time.Now()); wait > 0 {
			rm.mu.Unlock()
			time.Sleep(wait)
			continue
		}
		n := min(len(rm.pending), maxRemovalBatch)
		batch := rm.pending[:n:n]
		rm.pending = rm.pending[n:]
		rm.mu.Unlock()
		rm.commit(batch)
	}
}

// yieldFor is how much longer removals wait at now, the oldest pending one
// having arrived at oldest: until removalQuiet after the last install, at
// most until removalMaxWait after oldest; 0 means commit now.
func (rm *remover) yieldFor(oldest, now time.Time) time.Duration {
	lull := time.Unix(0, rm.fw.lastAdd.Load()).Add(removalQuiet).Sub(now)
	limit := oldest.Add(removalMaxWait).Sub(now)
	return max(min(lull, limit), 0)
}

// commit removes batch in one transaction or, if that fails (something of
// one already gone: a learned element expired, a half-installed sandbox),
// each element in a transaction of its own, so that the rest still goes;
// each removal gets its own outcome.
func (rm *remover) commit(batch []*removal) {
	conn, err := nftables.New()
	if err != nil {
		for _, r := range batch {
			r.done <- fmt.Errorf("nftables: remove sandbox %s: %w", r.id, err)
		}
		return
	}
	for _, r := range batch {
		err = errors.Join(err, queueDelete(conn, r.elems))
	}
	if err == nil && conn.Flush() == nil {
		for _, r := range batch {
			r.done <- nil
		}
		return
	}
	for _, r := range batch {
		var errs []error
		for _, x := range r.elems {
			for _, el := range x.elems {
				err := conn.SetDeleteElements(x.set, []nftables.SetElement{el})
				if err == nil {
					err = conn.Flush()
				}
				if err != nil && !errors.Is(err, unix.ENOENT) {
					errs = append(errs, err)
				}
			}
		}
		if len(errs) > 0 {
			r.done <- fmt.Errorf("nftables: remove sandbox %s: %w", r.id, errors.Join(errs...))
		} else {
			r.done <- nil
		}
	}
}

// ifMatch matches the interface name's prefix (iifname "alk*"); eq=false is
// the negation.
func (fw *firewall) ifMatch(key expr.MetaKey, eq bool) []expr.Any {
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: 1},
		&expr.Cmp{Op: op, Register: 1, Data: []byte(fw.prefix)},
	}
}

// ipv4 guards payload matches on IPv4 headers: in an inet table an IPv6
// packet would otherwise be read at IPv4 offsets.
func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// ipv6 is ipv4's counterpart for IPv6 headers.
func ipv6() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.NFPROTO_IPV6}},
	}
}

// daddrLookup matches the destination address (IPv4 header if v4, else
// IPv6) against a set; guard it with ipv4() or ipv6().
func daddrLookup(set *nftables.Set, v4 bool) []expr.Any {
	off, n := uint32(16), uint32(4)
	if !v4 {
		off, n = 24, 16
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// saddrLookup matches the source address (IPv4 header if v4, else IPv6)
// against a set, or with invert its absence; guard it with ipv4() or ipv6().
func saddrLookup(set *nftables.Set, v4, invert bool) []expr.Any {
	off, n := uint32(12), uint32(4)
	if !v4 {
		off, n = 8, 16
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: off, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID, Invert: invert},
	}
}

// pairLookup matches source . destination address against a set of
// address pairs (pairKey); guard it with ipv4() or ipv6(). A concatenation
// is looked up from consecutive registers: the IPv4 destination goes to the
// 32-bit register after the source's (NFT_REG32_01 is 9), the IPv6 one to
// the 128-bit register after (NFT_REG_2).
func pairLookup(set *nftables.Set, v4 bool) []expr.Any {
	src, dst, n, next := uint32(12), uint32(16), uint32(4), uint32(9)
	if !v4 {
		src, dst, n, next = 8, 24, 16, 2
	}
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: src, Len: n},
		&expr.Payload{DestRegister: next, Base: expr.PayloadBaseNetworkHeader, Offset: dst, Len: n},
		&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
	}
}

// pairKey is the key of src . dst in a set of address pairs (both of one
// family; IPv4 fields fill a 32-bit register each, as the lookup reads them).
func pairKey(src, dst netip.Addr) []byte {
	return append(src.AsSlice(), dst.AsSlice()...)
}

// pairRangeElems are src paired with each of ranges, for an interval set of
// address pairs: the first and the last (inclusive) key of each.
func pairRangeElems(src netip.Addr, ranges []ipRange) []nftables.SetElement {
	out := make([]nftables.SetElement, 0, len(ranges))
	for _, r := range ranges {
		out = append(out, nftables.SetElement{Key: pairKey(src, r.lo), KeyEnd: pairKey(src, r.hi)})
	}
	return out
}

// prefixMatch matches the address at offset of the network header (IPv4: 12
// source, 16 destination; IPv6: 8 source, 24 destination) against a prefix
// of the same family.
func prefixMatch(offset uint32, p netip.Prefix) []expr.Any {
	n := uint32(p.Addr().BitLen() / 8)
	mask := net.CIDRMask(p.Bits(), p.Addr().BitLen())
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: n},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: n, Mask: mask, Xor: make([]byte, n)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

func dport(proto byte, port uint16) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(port)},
	}
}

func ctEstablished() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func verdict(k expr.VerdictKind) []expr.Any { return []expr.Any{&expr.Verdict{Kind: k}} }

func cat(parts ...[]expr.Any) []expr.Any {
	var out []expr.Any
	for _, p := range parts {
		out = append(out, p...)
	}
	return out
}

// intervalElems encodes prefixes (of one family) for an interval set: each
// merged range is a start element and an end element one past its last
// address.
func intervalElems(pfxs []netip.Prefix) []nftables.SetElement {
	return rangeElems(mergeRanges(pfxs))
}

// rangeElems encodes sorted, non-overlapping ranges of one family for an
// interval set.
func rangeElems(rs []ipRange) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: r.lo.AsSlice()})
		if end := r.hi.Next(); end.IsValid() {
			out = append(out, nftables.SetElement{Key: end.AsSlice(), IntervalEnd: true})
		}
	}
	return out
}

func learnedElems(l []learnedElem) []nftables.SetElement {
	var out []nftables.SetElement
	now := time.Now()
	for _, e := range l {
		if ttl, ok := e.ttl(now); ok {
			out = append(out, nftables.SetElement{Key: e.addr.AsSlice(), Timeout: ttl})
		}
	}
	return out
}
