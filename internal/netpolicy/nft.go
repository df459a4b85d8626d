package netpolicy

import (
	"errors"
	"fmt"
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
//	    iifname "alk*" ip saddr vmap @sandboxes              # per-sandbox policy
//	    iifname "alk*" ip6 saddr vmap @sandboxes6
//	    iifname "alk*" drop                                  # unknown source: fail closed
//	set private (ipv4, interval), private6 (ipv6, interval): the private
//	    ranges (closedPrivate: PrivateRanges and the NAT64/6to4 forms of the
//	    closed IPv4 ones) minus those the operator opened for all sandboxes
//	    (Config.AllowPrivate)
//	set never (ipv4, interval), never6 (ipv6, interval): NeverRanges
//	chain postrouting (nat, postrouting, srcnat)
//	    ip saddr <cidr> oifname != "alk*" masquerade
//	    ip6 saddr <cidr6> oifname != "alk*" masquerade       # with IPv6 on
//	per sandbox <id>: sets a_<id> / a6_<id> (allowed CIDRs, interval),
//	l_<id> / l6_<id> (addresses of allowed domains, learned from A / AAAA
//	answers, per-element timeout), d_<id> / d6_<id> (denied CIDRs, interval),
//	map elements sandboxes[<ipv4>] and, with IPv6 on, sandboxes6[<ipv6>] ->
//	jump s_<id>, and one chain s_<id> for both families:
//	    ip daddr @a_<id> accept; ip daddr @l_<id> accept; ip daddr @d_<id> drop;
//	    ip daddr @private drop;
//	    ip6 daddr @a6_<id> accept; ip6 daddr @l6_<id> accept; ip6 daddr @d6_<id> drop;
//	    ip6 daddr @private6 drop;
//	    accept
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
	mu       sync.Mutex
	conn     *nftables.Conn
	table    *nftables.Table
	vmap     *nftables.Set
	vmap6    *nftables.Set
	private  *nftables.Set
	private6 *nftables.Set
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
	// ipolicy and imap are intercept.go's maps; i6, px4 and px6 its sets.
	ipolicy, imap, i6, px4, px6 *nftables.Set
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
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	fw := &firewall{
		conn:       conn,
		table:      &nftables.Table{Name: table, Family: nftables.TableFamilyINet},
		prefix:     prefix,
		cidr:       cidr,
		cidr6:      cidr6,
		dnsPort:    dnsPort,
		egressPort: egressPort,
		noEgress:   noEgress,
		closed:     closed,
	}
	fw.rm.fw = fw
	return fw, fw.install()
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
	if old, err := c.ListTableOfFamily(fw.table.Name, nftables.TableFamilyINet); err == nil && old != nil {
		c.DelTable(fw.table)
	}
	t := c.AddTable(fw.table)
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
	fw.vmap = &nftables.Set{Table: t, Name: "sandboxes", IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	fw.vmap6 = &nftables.Set{Table: t, Name: "sandboxes6", IsMap: true, KeyType: nftables.TypeIP6Addr, DataType: nftables.TypeVerdict}
	fw.private = &nftables.Set{Table: t, Name: "private", KeyType: nftables.TypeIPAddr, Interval: true}
	fw.private6 = &nftables.Set{Table: t, Name: "private6", KeyType: nftables.TypeIP6Addr, Interval: true}
	never := &nftables.Set{Table: t, Name: "never", KeyType: nftables.TypeIPAddr, Interval: true}
	never6 := &nftables.Set{Table: t, Name: "never6", KeyType: nftables.TypeIP6Addr, Interval: true}
	nv := neverClosed()
	for _, x := range []struct {
		set   *nftables.Set
		elems []nftables.SetElement
	}{
		{fw.vmap, nil}, {fw.vmap6, nil},
		{fw.private, rangeElems(family(fw.closed, true))}, {fw.private6, rangeElems(family(fw.closed, false))},
		{never, rangeElems(family(nv, true))}, {never6, rangeElems(family(nv, false))},
	} {
		if err := c.AddSet(x.set, x.elems); err != nil {
			return fmt.Errorf("nftables: %s set: %w", x.set.Name, err)
		}
	}
	policy := [][]expr.Any{
		sbx(ipv4(), daddrLookup(never, true), verdict(expr.VerdictDrop)),
		sbx(ipv6(), daddrLookup(never6, false), verdict(expr.VerdictDrop)),
		sbx(ipv6(), dport(unix.IPPROTO_UDP, 53), verdict(expr.VerdictDrop)),
		sbx(ipv6(), dport(unix.IPPROTO_TCP, 53), verdict(expr.VerdictDrop)),
		sbx(ipv4(), []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: fw.vmap.Name, SetID: fw.vmap.ID},
		}),
		sbx(ipv6(), []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16},
			&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: fw.vmap6.Name, SetID: fw.vmap6.ID},
		}),
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

// sandboxSets are one sandbox's sets: IPv4 and IPv6 of each kind.
type sandboxSets struct{ allow, learned, deny, allow6, learned6, deny6 *nftables.Set }

func (fw *firewall) sets(id string) sandboxSets {
	set := func(name string, key nftables.SetDatatype, learned bool) *nftables.Set {
		return &nftables.Set{Table: fw.table, Name: name, KeyType: key, Interval: !learned, HasTimeout: learned}
	}
	return sandboxSets{
		allow:    set("a_"+id, nftables.TypeIPAddr, false),
		learned:  set("l_"+id, nftables.TypeIPAddr, true),
		deny:     set("d_"+id, nftables.TypeIPAddr, false),
		allow6:   set("a6_"+id, nftables.TypeIP6Addr, false),
		learned6: set("l6_"+id, nftables.TypeIP6Addr, true),
		deny6:    set("d6_"+id, nftables.TypeIP6Addr, false),
	}
}

// contents are the elements of each of a sandbox's sets under a policy.
func (s sandboxSets) contents(c compiled, learned []learnedElem) []setElems {
	var l4, l6 []learnedElem
	for _, e := range learned {
		if e.addr.Is4() {
			l4 = append(l4, e)
		} else {
			l6 = append(l6, e)
		}
	}
	return []setElems{
		{s.allow, intervalElems(prefixesOf(c.allowNets, true))},
		{s.learned, learnedElems(l4)},
		{s.deny, intervalElems(prefixesOf(c.denyNets, true))},
		{s.allow6, intervalElems(prefixesOf(c.allowNets, false))},
		{s.learned6, learnedElems(l6)},
		{s.deny6, intervalElems(prefixesOf(c.denyNets, false))},
	}
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

// addSandbox installs a sandbox's sets, chain and, if mapped, map elements
// (its IPv4 address, and with IPv6 on the IPv6 address that goes with it)
// in one transaction. Unmapped, its traffic finds no chain: dropped.
func (fw *firewall) addSandbox(id string, addr netip.Addr, c compiled, learned []learnedElem, mapped bool) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	defer fw.installing()()
	s := fw.sets(id)
	cn := fw.conn
	for _, x := range s.contents(c, learned) {
		if err := cn.AddSet(x.set, x.elems); err != nil {
			return fmt.Errorf("nftables: %s: %w", x.set.Name, err)
		}
	}
	ch := cn.AddChain(&nftables.Chain{Name: "s_" + id, Table: fw.table})
	for _, r := range []struct {
		set *nftables.Set
		v   expr.VerdictKind
	}{
		{s.allow, expr.VerdictAccept}, {s.learned, expr.VerdictAccept}, {s.deny, expr.VerdictDrop}, {fw.private, expr.VerdictDrop},
		{s.allow6, expr.VerdictAccept}, {s.learned6, expr.VerdictAccept}, {s.deny6, expr.VerdictDrop}, {fw.private6, expr.VerdictDrop},
	} {
		v4 := r.set.KeyType == nftables.TypeIPAddr
		guard := ipv4()
		if !v4 {
			guard = ipv6()
		}
		cn.AddRule(&nftables.Rule{Table: fw.table, Chain: ch, Exprs: cat(guard, daddrLookup(r.set, v4), verdict(r.v))})
	}
	cn.AddRule(&nftables.Rule{Table: fw.table, Chain: ch, Exprs: verdict(expr.VerdictAccept)})
	if mapped {
		if err := fw.mapSandbox(id, addr); err != nil {
			return err
		}
	}
	if err := cn.Flush(); err != nil {
		return fmt.Errorf("nftables: add sandbox %s: %w", id, err)
	}
	return nil
}

// mapSandbox queues the map elements that send a sandbox's traffic to its
// chain (fw.mu held; the caller flushes).
func (fw *firewall) mapSandbox(id string, addr netip.Addr) error {
	jump := &expr.Verdict{Kind: expr.VerdictJump, Chain: "s_" + id}
	if err := fw.conn.SetAddElements(fw.vmap, []nftables.SetElement{{Key: addr.AsSlice(), VerdictData: jump}}); err != nil {
		return fmt.Errorf("nftables: map %s: %w", addr, err)
	}
	if a6 := fw.addr6(addr); a6.IsValid() {
		if err := fw.conn.SetAddElements(fw.vmap6, []nftables.SetElement{{Key: a6.AsSlice(), VerdictData: jump}}); err != nil {
			return fmt.Errorf("nftables: map %s: %w", a6, err)
		}
	}
	return nil
}

// openSandbox gives an unmapped sandbox (its sets empty) its policy and maps
// it, in one transaction that only adds.
func (fw *firewall) openSandbox(id string, addr netip.Addr, c compiled, learned []learnedElem) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	defer fw.installing()()
	cn := fw.conn
	for _, x := range fw.sets(id).contents(c, learned) {
		if len(x.elems) > 0 {
			if err := cn.SetAddElements(x.set, x.elems); err != nil {
				return fmt.Errorf("nftables: %s: %w", x.set.Name, err)
			}
		}
	}
	if err := fw.mapSandbox(id, addr); err != nil {
		return err
	}
	if err := cn.Flush(); err != nil {
		return fmt.Errorf("nftables: open sandbox %s: %w", id, err)
	}
	return nil
}

// updateSandbox replaces a sandbox's sets in one transaction: no packet sees
// half of the old policy and half of the new.
func (fw *firewall) updateSandbox(id string, c compiled, learned []learnedElem) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	s := fw.sets(id)
	cn := fw.conn
	for _, x := range s.contents(c, learned) {
		cn.FlushSet(x.set)
		if len(x.elems) > 0 {
			if err := cn.SetAddElements(x.set, x.elems); err != nil {
				return fmt.Errorf("nftables: %s: %w", x.set.Name, err)
			}
		}
	}
	if err := cn.Flush(); err != nil {
		return fmt.Errorf("nftables: update sandbox %s: %w", id, err)
	}
	return nil
}

// learn adds DNS-learned addresses to a sandbox's learned sets (IPv4 and
// IPv6). An address already there is deleted and re-added in the same
// transaction so that its timeout restarts from the new answer's TTL.
func (fw *firewall) learn(id string, add []learnedElem, present []netip.Addr) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	s := fw.sets(id)
	setOf := func(a netip.Addr) *nftables.Set {
		if a.Is4() {
			return s.learned
		}
		return s.learned6
	}
	for _, a := range present {
		if err := fw.conn.SetDeleteElements(setOf(a), []nftables.SetElement{{Key: a.AsSlice()}}); err != nil {
			return fmt.Errorf("nftables: %s: %w", setOf(a).Name, err)
		}
	}
	for _, e := range add {
		if el := learnedElems([]learnedElem{e}); len(el) > 0 {
			if err := fw.conn.SetAddElements(setOf(e.addr), el); err != nil {
				return fmt.Errorf("nftables: %s: %w", setOf(e.addr).Name, err)
			}
		}
	}
	if err := fw.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: learn for %s: %w", id, err)
	}
	return nil
}

// removeSandbox deletes the map entry, chain and sets of a sandbox, through
// the remover: never under fw.mu, and in one transaction with the removals
// that arrive meanwhile.
func (fw *firewall) removeSandbox(id string, addr netip.Addr) error {
	return fw.rm.remove(id, addr)
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
	addr  netip.Addr
	since time.Time
	done  chan error
}

// maxRemovalBatch bounds the sandboxes one transaction removes (nine
// messages each), well within a netlink socket's buffer.
const maxRemovalBatch = 128

// removalQuiet is the lull after an install that removals wait for;
// removalMaxWait bounds how long a removal waits for one.
const (
	removalQuiet   = 250 * time.Millisecond
	removalMaxWait = time.Second
)

func (rm *remover) remove(id string, addr netip.Addr) error {
	r := &removal{id: id, addr: addr, since: time.Now(), done: make(chan error, 1)}
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
// one already gone), each sandbox piece by piece, so that a half-installed
// one is cleaned too; each removal gets its own outcome.
func (rm *remover) commit(batch []*removal) {
	conn, err := nftables.New()
	if err != nil {
		for _, r := range batch {
			r.done <- fmt.Errorf("nftables: remove sandbox %s: %w", r.id, err)
		}
		return
	}
	steps := make([][]func(), len(batch))
	for i, r := range batch {
		steps[i] = rm.fw.removalSteps(conn, r.id, r.addr)
		for _, st := range steps[i] {
			st()
		}
	}
	if conn.Flush() == nil {
		for _, r := range batch {
			r.done <- nil
		}
		return
	}
	for i, r := range batch {
		var errs []error
		for _, st := range steps[i] {
			st()
			if e := conn.Flush(); e != nil && !errors.Is(e, unix.ENOENT) {
				errs = append(errs, e)
			}
		}
		if len(errs) > 0 {
			r.done <- fmt.Errorf("nftables: remove sandbox %s: %w", r.id, errors.Join(errs...))
		} else {
			r.done <- nil
		}
	}
}

// removalSteps queue, each, one piece of a sandbox's removal on conn: its
// map entries, its chain, its sets.
func (fw *firewall) removalSteps(conn *nftables.Conn, id string, addr netip.Addr) []func() {
	s := fw.sets(id)
	ch := &nftables.Chain{Name: "s_" + id, Table: fw.table}
	steps := []func(){
		func() {
			_ = conn.SetDeleteElements(fw.vmap, []nftables.SetElement{{Key: addr.AsSlice()}})
		},
	}
	if a6 := fw.addr6(addr); a6.IsValid() {
		steps = append(steps, func() {
			_ = conn.SetDeleteElements(fw.vmap6, []nftables.SetElement{{Key: a6.AsSlice()}})
		})
	}
	steps = append(steps, func() { conn.FlushChain(ch); conn.DelChain(ch) })
	for _, set := range []*nftables.Set{s.allow, s.learned, s.deny, s.allow6, s.learned6, s.deny6} {
		steps = append(steps, func() { conn.DelSet(set) })
	}
	return steps
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
		ttl := e.expires.Sub(now).Truncate(time.Second)
		if ttl < time.Second {
			continue
		}
		out = append(out, nftables.SetElement{Key: e.addr.AsSlice(), Timeout: ttl})
	}
	return out
}
