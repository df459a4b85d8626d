package netpolicy

import (
	"fmt"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Interception: the part of Airlock's table that hands a sandbox's TCP
// connections to the egress proxy (internal/egress) on the host, for
// sandboxes with network.rules or an egressProxy. Everyone else's traffic
// never meets it.
//
//	chain intercept_filter (filter, prerouting, mangle+1)
//	    iifname "alk*" tcp dport 53 accept                   # DNS: redirected below
//	    iifname "alk*" ip daddr 169.254.0.0/16 drop
//	    iifname "alk*" ct state new meta l4proto tcp ip saddr @intercepting jump policy
//	chain intercept_nat (nat, prerouting, dstnat+1)
//	    iifname "alk*" ip saddr vmap @intercept
//	set intercepting: the addresses of intercepting sandboxes, whose new TCP
//	    connections the policy chain judges (the one the forward hook uses) on
//	    their real destination, before the redirect hides it
//	map intercept: sandbox address -> jump i_<id>
//	per intercepting sandbox <id>: sets r_<id> (the rule hosts' address
//	    ranges, interval) and q_<id> (addresses the rule hosts' names resolved
//	    to, per-element timeout), and chain i_<id>:
//	    with an egressProxy:  meta l4proto tcp redirect to :<egress port>
//	    otherwise:            ip daddr @r_<id>/@q_<id> tcp dport {80, 443} redirect to :<egress port>
//
// and in the input chain, the egress port is open to sandbox interfaces
// (the proxy refuses a connection that was not redirected). Interception is
// IPv4: an intercepting sandbox's IPv6 TCP is refused with a reset, so
// that clients fall back to IPv4 at once and nothing leaves unproxied; and
// a sandbox with an egressProxy sends nothing beyond the host but through
// it (its TCP is redirected and its DNS goes to the forwarder, so whatever
// is still forwarded, UDP such as QUIC, ICMP, IPv6, is refused):
//
//	chain intercept_forward (filter, forward, filter-1)
//	    iifname "alk*" ip saddr @proxied reject
//	    iifname "alk*" ip6 saddr @proxied6 reject
//	    iifname "alk*" ip6 saddr @intercept6 meta l4proto tcp reject with tcp reset
//	sets proxied, proxied6: the addresses of sandboxes with an egressProxy;
//	    intercept6: the IPv6 addresses of every intercepting sandbox
//
// So with rules only, the connections that may carry a rule host's
// requests reach the proxy, which still passes through (without reading
// them) those whose TLS server name or Host is not a rule host; with an
// egressProxy every TCP connection does. UDP is not intercepted (E2B's
// proxy tunnels TCP only, too).

// interceptPorts are the destination ports whose connections to a rule
// host's addresses go through the egress proxy when the sandbox has rules
// and no egressProxy.
var interceptPorts = []uint16{80, 443}

type interceptSets struct{ nets, learned *nftables.Set }

func (fw *firewall) interceptSets(id string) interceptSets {
	return interceptSets{
		nets:    &nftables.Set{Table: fw.table, Name: "r_" + id, KeyType: nftables.TypeIPAddr, Interval: true},
		learned: &nftables.Set{Table: fw.table, Name: "q_" + id, KeyType: nftables.TypeIPAddr, HasTimeout: true},
	}
}

// installIntercept adds the interception chains and maps to the table
// being installed (same transaction as install).
func (fw *firewall) installIntercept(c *nftables.Conn, t *nftables.Table) error {
	accept := nftables.ChainPolicyAccept
	fw.intercepting = &nftables.Set{Table: t, Name: "intercepting", KeyType: nftables.TypeIPAddr}
	if err := c.AddSet(fw.intercepting, nil); err != nil {
		return fmt.Errorf("nftables: intercepting set: %w", err)
	}
	fw.imap = &nftables.Set{Table: t, Name: "intercept", IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
	if err := c.AddSet(fw.imap, nil); err != nil {
		return fmt.Errorf("nftables: intercept map: %w", err)
	}
	fw.i6 = &nftables.Set{Table: t, Name: "intercept6", KeyType: nftables.TypeIP6Addr}
	if err := c.AddSet(fw.i6, nil); err != nil {
		return fmt.Errorf("nftables: intercept6 set: %w", err)
	}
	fw.px4 = &nftables.Set{Table: t, Name: "proxied", KeyType: nftables.TypeIPAddr}
	fw.px6 = &nftables.Set{Table: t, Name: "proxied6", KeyType: nftables.TypeIP6Addr}
	for _, set := range []*nftables.Set{fw.px4, fw.px6} {
		if err := c.AddSet(set, nil); err != nil {
			return fmt.Errorf("nftables: %s set: %w", set.Name, err)
		}
	}
	fwd := c.AddChain(&nftables.Chain{Name: "intercept_forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityFilter - 1), Policy: &accept})
	unreachable := &expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), ipv4(), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: fw.px4.Name, SetID: fw.px4.ID},
		unreachable,
	})})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), ipv6(), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16},
		&expr.Lookup{SourceRegister: 1, SetName: fw.px6.Name, SetID: fw.px6.ID},
		unreachable,
	})})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), ipv6(), l4proto(unix.IPPROTO_TCP), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 16},
		&expr.Lookup{SourceRegister: 1, SetName: fw.i6.Name, SetID: fw.i6.ID},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	})})
	filt := c.AddChain(&nftables.Chain{Name: "intercept_filter", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityMangle + 1), Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: filt, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), dport(unix.IPPROTO_TCP, 53), verdict(expr.VerdictAccept))})
	c.AddRule(&nftables.Rule{Table: t, Chain: filt, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), ipv4(),
		prefixMatch(16, netip.MustParsePrefix("169.254.0.0/16")), verdict(expr.VerdictDrop))})
	c.AddRule(&nftables.Rule{Table: t, Chain: filt, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), ipv4(), ctNew(), l4proto(unix.IPPROTO_TCP),
		saddrLookup(fw.intercepting, true, false), []expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: policyChain}})})
	nat := c.AddChain(&nftables.Chain{Name: "intercept_nat", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest + 1), Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: cat(fw.ifMatch(expr.MetaKeyIIFNAME, true), ipv4(), []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, DestRegister: 0, IsDestRegSet: true, SetName: fw.imap.Name, SetID: fw.imap.ID},
	})})
	return nil
}

// setIntercept installs, replaces or removes (e without interception) a
// sandbox's interception in one transaction. learned are the rule hosts'
// resolved addresses to keep.
func (fw *firewall) setIntercept(id string, addr netip.Addr, e egressCompiled, learned []learnedElem) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if fw.egressPort == 0 || fw.imap == nil {
		if e.intercepts() {
			return fmt.Errorf("netpolicy: sandbox %s has network rules or an egress proxy, but this server runs no egress proxy", id)
		}
		return nil
	}
	cn := fw.conn
	s := fw.interceptSets(id)
	ch := &nftables.Chain{Name: "i_" + id, Table: fw.table}
	key := []nftables.SetElement{{Key: addr.AsSlice()}}
	// Drop whatever was there (a no-op error for a sandbox never
	// intercepted is ignored by flushing the pieces separately first).
	fw.clearIntercept(id, addr)
	if !e.intercepts() {
		return nil
	}
	if err := cn.AddSet(s.nets, intervalElems(e.ruleNets())); err != nil {
		return fmt.Errorf("nftables: %s: %w", s.nets.Name, err)
	}
	if err := cn.AddSet(s.learned, learnedElems(learned)); err != nil {
		return fmt.Errorf("nftables: %s: %w", s.learned.Name, err)
	}
	cn.AddChain(ch)
	redirect := []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(fw.egressPort)},
		&expr.Redir{RegisterProtoMin: 1},
	}
	if e.proxy != nil {
		cn.AddRule(&nftables.Rule{Table: fw.table, Chain: ch, Exprs: cat(l4proto(unix.IPPROTO_TCP), redirect)})
	} else {
		for _, set := range []*nftables.Set{s.nets, s.learned} {
			for _, port := range interceptPorts {
				cn.AddRule(&nftables.Rule{Table: fw.table, Chain: ch, Exprs: cat(ipv4(), []expr.Any{
					&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
					&expr.Lookup{SourceRegister: 1, SetName: set.Name, SetID: set.ID},
				}, dport(unix.IPPROTO_TCP, port), redirect)})
			}
		}
	}
	if err := cn.SetAddElements(fw.intercepting, key); err != nil {
		return fmt.Errorf("nftables: intercepting %s: %w", addr, err)
	}
	if err := cn.SetAddElements(fw.imap, []nftables.SetElement{{
		Key: key[0].Key, VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: ch.Name},
	}}); err != nil {
		return fmt.Errorf("nftables: intercept %s: %w", addr, err)
	}
	a6 := fw.addr6(addr)
	if a6.IsValid() {
		if err := cn.SetAddElements(fw.i6, []nftables.SetElement{{Key: a6.AsSlice()}}); err != nil {
			return fmt.Errorf("nftables: intercept6 %s: %w", a6, err)
		}
	}
	if e.proxy != nil {
		if err := cn.SetAddElements(fw.px4, []nftables.SetElement{{Key: addr.AsSlice()}}); err != nil {
			return fmt.Errorf("nftables: proxied %s: %w", addr, err)
		}
		if a6.IsValid() {
			if err := cn.SetAddElements(fw.px6, []nftables.SetElement{{Key: a6.AsSlice()}}); err != nil {
				return fmt.Errorf("nftables: proxied6 %s: %w", a6, err)
			}
		}
	}
	if err := cn.Flush(); err != nil {
		return fmt.Errorf("nftables: intercept for sandbox %s: %w", id, err)
	}
	return nil
}

// clearIntercept removes a sandbox's interception, each piece in a
// transaction of its own so that missing pieces do not stop the rest.
// Callers hold fw.mu.
func (fw *firewall) clearIntercept(id string, addr netip.Addr) {
	if fw.imap == nil {
		return
	}
	cn := fw.conn
	s := fw.interceptSets(id)
	ch := &nftables.Chain{Name: "i_" + id, Table: fw.table}
	for _, st := range []func(){
		func() {
			if a6 := fw.addr6(addr); a6.IsValid() {
				_ = cn.SetDeleteElements(fw.i6, []nftables.SetElement{{Key: a6.AsSlice()}})
			}
		},
		func() { _ = cn.SetDeleteElements(fw.px4, []nftables.SetElement{{Key: addr.AsSlice()}}) },
		func() {
			if a6 := fw.addr6(addr); a6.IsValid() {
				_ = cn.SetDeleteElements(fw.px6, []nftables.SetElement{{Key: a6.AsSlice()}})
			}
		},
		func() { _ = cn.SetDeleteElements(fw.imap, []nftables.SetElement{{Key: addr.AsSlice()}}) },
		func() { _ = cn.SetDeleteElements(fw.intercepting, []nftables.SetElement{{Key: addr.AsSlice()}}) },
		func() { cn.FlushChain(ch); cn.DelChain(ch) },
		func() { cn.DelSet(s.nets) },
		func() { cn.DelSet(s.learned) },
	} {
		st()
		_ = cn.Flush()
	}
}

// learnIntercept adds addresses a rule host resolved to; as learn, an
// address already present is deleted and re-added to restart its timeout.
func (fw *firewall) learnIntercept(id string, add []learnedElem, present []netip.Addr) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	s := fw.interceptSets(id).learned
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
		return fmt.Errorf("nftables: learn rule hosts for %s: %w", id, err)
	}
	return nil
}

func ctNew() []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(expr.CtStateBitNEW),
			Xor:  binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

func l4proto(proto byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
	}
}
