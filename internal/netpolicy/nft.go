package netpolicy

import (
	"errors"
	"fmt"
	"net/netip"
	"sync"
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
//	    iifname "alk*" fib saddr . iif oif missing drop     # no spoofed sources
//	chain prerouting_nat (nat, prerouting, dstnat)
//	    iifname "alk*" udp/tcp dport 53 redirect to :<dns port>
//	chain input (filter, input, 0)
//	    iifname "alk*" ct state established,related accept
//	    iifname "alk*" udp/tcp dport <dns port> accept
//	    iifname "alk*" drop                                  # nothing else of the host
//	chain forward (filter, forward, 0)
//	    iifname "alk*" oifname "alk*" drop                   # sandbox to sandbox
//	    oifname "alk*" ct state established,related accept
//	    oifname "alk*" drop                                  # nobody opens into a sandbox
//	    iifname "alk*" ct state established,related accept
//	    iifname "alk*" ip daddr 169.254.0.0/16 drop          # cloud metadata, link-local
//	    iifname "alk*" ip saddr vmap @sandboxes              # per-sandbox policy
//	    iifname "alk*" drop                                  # unknown source: fail closed
//	set private (interval): the private ranges (PrivateRanges, IPv4) minus
//	    those the operator opened for all sandboxes (Config.AllowPrivate)
//	chain postrouting (nat, postrouting, srcnat)
//	    ip saddr <cidr> oifname != "alk*" masquerade
//	per sandbox <id>: sets a_<id> (allowed CIDRs, interval), l_<id> (addresses
//	of allowed domains, learned from DNS answers, per-element timeout),
//	d_<id> (denied CIDRs, interval) and chain s_<id>:
//	    ip daddr @a_<id> accept; ip daddr @l_<id> accept; ip daddr @d_<id> drop;
//	    ip daddr @private drop; accept
//
// So a sandbox's allowOut (addresses, CIDRs, and what its domains resolved
// to; see onAnswer for why that never includes a private address) opens a
// destination whatever else says; its denyOut closes one; and a private
// destination neither names is closed. IPv6 needs no rule of its own: a
// sandbox has no IPv6 address or route, and the forward chain drops every
// non-IPv4 packet from a sandbox interface (the policy rule matches IPv4
// only and the rule after it drops).
//
// The spoofing check matters because the policy is keyed by source address:
// sandbox root has CAP_NET_RAW and could otherwise borrow another sandbox's
// address. Every rule matches on the interface prefix, so a table left behind
// when Airlock stops affects nothing but sandbox interfaces, and it fails
// closed for sandboxes that outlive the server (their policy stays in force).
type firewall struct {
	mu      sync.Mutex
	conn    *nftables.Conn
	table   *nftables.Table
	vmap    *nftables.Set
	private *nftables.Set
	// closed are the private ranges in the private set.
	closed  []ipRange
	prefix  string
	cidr    netip.Prefix
	dnsPort uint16
	// egressPort is the egress proxy's port (0: none); see intercept.go.
	egressPort uint16
	// ipolicy and imap are intercept.go's maps.
	ipolicy, imap *nftables.Set
	// noEgress drops all forwarded sandbox traffic whatever the policy
	// (serve --sandbox-egress=false).
	noEgress bool
}

func newFirewall(table, prefix string, cidr netip.Prefix, dnsPort, egressPort uint16, noEgress bool, closed []ipRange) (*firewall, error) {
	conn, err := nftables.New()
	if err != nil {
		return nil, fmt.Errorf("nftables: %w", err)
	}
	fw := &firewall{
		conn:       conn,
		table:      &nftables.Table{Name: table, Family: nftables.TableFamilyINet},
		prefix:     prefix,
		cidr:       cidr,
		dnsPort:    dnsPort,
		egressPort: egressPort,
		noEgress:   noEgress,
		closed:     closed,
	}
	return fw, fw.install()
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

	pre := c.AddChain(&nftables.Chain{Name: "prerouting_filter", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: pre, Exprs: cat(
		fw.ifMatch(expr.MetaKeyIIFNAME, true),
		[]expr.Any{
			&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}},
			&expr.Verdict{Kind: expr.VerdictDrop},
		})})

	nat := c.AddChain(&nftables.Chain{Name: "prerouting_nat", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest, Policy: &accept})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(
			fw.ifMatch(expr.MetaKeyIIFNAME, true), ipv4(), dport(proto, 53),
			[]expr.Any{
				&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(fw.dnsPort)},
				&expr.Redir{RegisterProtoMin: 1},
			})})
	}

	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), ctEstablished(), verdict(expr.VerdictAccept))})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), dport(proto, fw.dnsPort), verdict(expr.VerdictAccept))})
	}
	if fw.egressPort != 0 {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), dport(unix.IPPROTO_TCP, fw.egressPort), verdict(expr.VerdictAccept))})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), verdict(expr.VerdictDrop))})

	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	fw.vmap = &nftables.Set{Table: t, Name: "sandboxes", IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	if err := c.AddSet(fw.vmap, nil); err != nil {
		return fmt.Errorf("nftables: sandboxes map: %w", err)
	}
	fw.private = &nftables.Set{Table: t, Name: "private", KeyType: nftables.TypeIPAddr, Interval: true}
	if err := c.AddSet(fw.private, rangeElems(fw.closed)); err != nil {
		return fmt.Errorf("nftables: private set: %w", err)
	}
	linkLocal := netip.MustParsePrefix("169.254.0.0/16")
	policyRule := cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), ipv4(), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: fw.vmap.Name, SetID: fw.vmap.ID},
	})
	if fw.noEgress {
		policyRule = cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), verdict(expr.VerdictDrop))
	}
	for _, r := range [][]expr.Any{
		cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), fw.ifMatch(expr.MetaKeyOIFNAME, true), verdict(expr.VerdictDrop)),
		cat(fw.ifMatch(expr.MetaKeyOIFNAME, true), ctEstablished(), verdict(expr.VerdictAccept)),
		cat(fw.ifMatch(expr.MetaKeyOIFNAME, true), verdict(expr.VerdictDrop)),
		cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), ctEstablished(), verdict(expr.VerdictAccept)),
		cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), ipv4(), prefixMatch(16, linkLocal), verdict(expr.VerdictDrop)),
		policyRule,
		cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), verdict(expr.VerdictDrop)),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: r})
	}

	post := c.AddChain(&nftables.Chain{Name: "postrouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: cat(
		ipv4(), prefixMatch(12, fw.cidr), fw.ifMatch(expr.MetaKeyOIFNAME, false),
		[]expr.Any{&expr.Masq{}})})

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

type sandboxSets struct{ allow, learned, deny *nftables.Set }

func (fw *firewall) sets(id string) sandboxSets {
	return sandboxSets{
		allow:   &nftables.Set{Table: fw.table, Name: "a_" + id, KeyType: nftables.TypeIPAddr, Interval: true},
		learned: &nftables.Set{Table: fw.table, Name: "l_" + id, KeyType: nftables.TypeIPAddr, HasTimeout: true},
		deny:    &nftables.Set{Table: fw.table, Name: "d_" + id, KeyType: nftables.TypeIPAddr, Interval: true},
	}
}

// learnedElem is a DNS-learned address and when it stops being allowed.
type learnedElem struct {
	addr    netip.Addr
	expires time.Time
}

// addSandbox installs a sandbox's sets, chain and map entry in one transaction.
func (fw *firewall) addSandbox(id string, addr netip.Addr, c compiled, learned []learnedElem) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	s := fw.sets(id)
	cn := fw.conn
	if err := cn.AddSet(s.allow, intervalElems(c.allowNets)); err != nil {
		return fmt.Errorf("nftables: %s: %w", s.allow.Name, err)
	}
	if err := cn.AddSet(s.learned, learnedElems(learned)); err != nil {
		return fmt.Errorf("nftables: %s: %w", s.learned.Name, err)
	}
	if err := cn.AddSet(s.deny, intervalElems(c.denyNets)); err != nil {
		return fmt.Errorf("nftables: %s: %w", s.deny.Name, err)
	}
	ch := cn.AddChain(&nftables.Chain{Name: "s_" + id, Table: fw.table})
	for _, r := range []struct {
		set *nftables.Set
		v   expr.VerdictKind
	}{{s.allow, expr.VerdictAccept}, {s.learned, expr.VerdictAccept}, {s.deny, expr.VerdictDrop}, {fw.private, expr.VerdictDrop}} {
		cn.AddRule(&nftables.Rule{Table: fw.table, Chain: ch, Exprs: cat(ipv4(), []expr.Any{
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
			&expr.Lookup{SourceRegister: 1, SetName: r.set.Name, SetID: r.set.ID},
		}, verdict(r.v))})
	}
	cn.AddRule(&nftables.Rule{Table: fw.table, Chain: ch, Exprs: verdict(expr.VerdictAccept)})
	if err := cn.SetAddElements(fw.vmap, []nftables.SetElement{{
		Key: addr.AsSlice(), VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name},
	}}); err != nil {
		return fmt.Errorf("nftables: map %s: %w", addr, err)
	}
	if err := cn.Flush(); err != nil {
		return fmt.Errorf("nftables: add sandbox %s: %w", id, err)
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
	for _, x := range []struct {
		set   *nftables.Set
		elems []nftables.SetElement
	}{{s.allow, intervalElems(c.allowNets)}, {s.learned, learnedElems(learned)}, {s.deny, intervalElems(c.denyNets)}} {
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

// learn adds DNS-learned addresses to a sandbox's learned set. An address
// already there is deleted and re-added in the same transaction so that its
// timeout restarts from the new answer's TTL.
func (fw *firewall) learn(id string, add []learnedElem, present []netip.Addr) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	s := fw.sets(id).learned
	if len(present) > 0 {
		del := make([]nftables.SetElement, len(present))
		for i, a := range present {
			del[i] = nftables.SetElement{Key: a.AsSlice()}
		}
		if err := fw.conn.SetDeleteElements(s, del); err != nil {
			return fmt.Errorf("nftables: %s: %w", s.Name, err)
		}
	}
	if err := fw.conn.SetAddElements(s, learnedElems(add)); err != nil {
		return fmt.Errorf("nftables: %s: %w", s.Name, err)
	}
	if err := fw.conn.Flush(); err != nil {
		return fmt.Errorf("nftables: learn for %s: %w", id, err)
	}
	return nil
}

// removeSandbox deletes the map entry, chain and sets. It tries everything in
// one transaction and, if that fails (something already gone), each piece on
// its own, so that a half-installed sandbox is cleaned too.
func (fw *firewall) removeSandbox(id string, addr netip.Addr) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	s := fw.sets(id)
	ch := &nftables.Chain{Name: "s_" + id, Table: fw.table}
	steps := []func(){
		func() {
			_ = fw.conn.SetDeleteElements(fw.vmap, []nftables.SetElement{{Key: addr.AsSlice()}})
		},
		func() { fw.conn.FlushChain(ch); fw.conn.DelChain(ch) },
		func() { fw.conn.DelSet(s.allow) },
		func() { fw.conn.DelSet(s.learned) },
		func() { fw.conn.DelSet(s.deny) },
	}
	for _, st := range steps {
		st()
	}
	err := fw.conn.Flush()
	if err == nil {
		return nil
	}
	var errs []error
	for _, st := range steps {
		st()
		if e := fw.conn.Flush(); e != nil && !errors.Is(e, unix.ENOENT) {
			errs = append(errs, e)
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("nftables: remove sandbox %s: %w", id, errors.Join(errs...))
	}
	return nil
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

// prefixMatch matches the IPv4 address at offset (12 source, 16 destination)
// against a prefix.
func prefixMatch(offset uint32, p netip.Prefix) []expr.Any {
	mask := make([]byte, 4)
	m := ^uint32(0) << (32 - p.Bits())
	if p.Bits() == 0 {
		m = 0
	}
	binaryutilPut(mask, m)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: mask, Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

func binaryutilPut(b []byte, v uint32) {
	b[0], b[1], b[2], b[3] = byte(v>>24), byte(v>>16), byte(v>>8), byte(v)
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

// intervalElems encodes prefixes for an interval set: each merged range is a
// start element and an end element one past its last address.
func intervalElems(pfxs []netip.Prefix) []nftables.SetElement {
	return rangeElems(mergeRanges(pfxs))
}

// rangeElems encodes sorted, non-overlapping ranges for an interval set.
func rangeElems(rs []ipRange) []nftables.SetElement {
	var out []nftables.SetElement
	for _, r := range rs {
		out = append(out, nftables.SetElement{Key: u32Addr(r.lo).AsSlice()})
		if r.hi != ^uint32(0) {
			out = append(out, nftables.SetElement{Key: u32Addr(r.hi + 1).AsSlice(), IntervalEnd: true})
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
