package netpolicy

import (
	"fmt"
	"maps"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// A Kubernetes node's sandbox Pods (NewPods) are not on veths of ours: the
// CNI plugin gives each an interface and an address, and a gVisor Pod's
// netstack writes its frames to that interface itself, so rules inside the
// Pod's namespace would see nothing. Their traffic crosses the node's own
// forward path, where this table judges it by source address. Its layout
// (the policy chain and its sets are the box's, see firewall):
//
//	chain prerouting_nat (nat, prerouting, dstnat - 10: before kube-proxy's
//	                     DNAT of the cluster DNS Service, which would win
//	                     the connection's one NAT binding)
//	    ip saddr @sandboxes udp/tcp dport 53 redirect to :<dns port>
//	chain input (filter, input, 0)
//	    ip saddr @sandboxes ct state established,related accept
//	    ip saddr @sandboxes udp/tcp dport <dns port> accept
//	    ip saddr @sandboxes drop                         # nothing else of the node
//	chain forward (filter, forward, 0)
//	    ip saddr @sandboxes ct state established,related accept
//	    ip saddr @sandboxes ip daddr @never drop
//	    ip saddr @sandboxes jump policy
//
// Only the egress of sandbox Pods is judged: what may open a connection to
// a Pod is the cluster's NetworkPolicy (deploy/kubernetes admits only the
// replicas), and masquerading is the CNI plugin's. IPv4 only: the node
// agent refuses a Pod with an IPv6 address (a dual-stack cluster), whose
// IPv6 traffic this table would not judge. The source address is
// the Pod's own: a gVisor sandbox has no raw sockets (runsc runs without
// --net-raw), so it cannot send with another Pod's address.
//
// A Pod is judged from the moment its address is in sandboxes: the node
// agent adds it when it first sees the Pod's address, and the replica that
// created the Pod runs nothing in it before the agent said so. The table is
// replaced at start with the Pods already known in the same transaction,
// and left in place when the agent stops, so the Pods of a node whose agent
// restarts stay judged by their last policy throughout.
func newPodFirewall(table string, dnsPort uint16, closed []ipRange, initial []podElems) (*firewall, error) {
	fw, err := openFirewall(table, dnsPort, closed)
	if err != nil {
		return nil, err
	}
	return fw, fw.installPods(initial)
}

// podElems is a Pod installed with the table (newPodFirewall).
type podElems struct {
	id   string
	addr netip.Addr
	c    compiled
}

func (fw *firewall) installPods(initial []podElems) error {
	fw.mu.Lock()
	defer fw.mu.Unlock()
	c := fw.conn
	t := fw.freshTable(c)
	never, _, err := fw.addPolicy(c, t)
	if err != nil {
		return err
	}
	pod := func(parts ...[]expr.Any) []expr.Any {
		return cat(append([][]expr.Any{ipv4(), saddrLookup(fw.open4, true, false)}, parts...)...)
	}
	accept := nftables.ChainPolicyAccept
	natPrio := nftables.ChainPriorityRef(*nftables.ChainPriorityNATDest - 10)
	nat := c.AddChain(&nftables.Chain{Name: "prerouting_nat", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: natPrio, Policy: &accept})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: t, Chain: nat, Exprs: pod(dport(proto, 53), []expr.Any{
			&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(fw.dnsPort)},
			&expr.Redir{RegisterProtoMin: 1},
		})})
	}
	in := c.AddChain(&nftables.Chain{Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: pod(ctEstablished(), verdict(expr.VerdictAccept))})
	for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
		c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: pod(dport(proto, fw.dnsPort), verdict(expr.VerdictAccept))})
	}
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: pod(verdict(expr.VerdictDrop))})
	fwd := c.AddChain(&nftables.Chain{Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	for _, r := range [][]expr.Any{
		pod(ctEstablished(), verdict(expr.VerdictAccept)),
		pod(daddrLookup(never, true), verdict(expr.VerdictDrop)),
		pod([]expr.Any{&expr.Verdict{Kind: expr.VerdictJump, Chain: policyChain}}),
	} {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: r})
	}
	installed := map[string]*fwSandbox{}
	for _, p := range initial {
		pol := fw.policyElems(p.addr, p.c)
		if err := queueAdd(c, append(pol, fw.mapElems(p.addr)...)); err != nil {
			return err
		}
		installed[p.id] = &fwSandbox{addr: p.addr, mapped: true, policy: pol, learned: map[netip.Addr]time.Time{}}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("nftables: install table %s: %w", fw.table.Name, err)
	}
	maps.Copy(fw.sbx, installed)
	return nil
}
