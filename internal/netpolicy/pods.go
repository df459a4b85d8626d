package netpolicy

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
)

// PodConfig configures a Network over the sandbox Pods of one Kubernetes
// node (NewPods): the node agent's.
type PodConfig struct {
	// Table is the nftables table (family inet) the agent owns; default
	// "airlock_pods".
	Table string
	// DNSUpstreams are the "ip:port" servers the forwarder asks; default
	// the node's /etc/resolv.conf nameservers.
	DNSUpstreams []string
	// DNSListen is where the forwarder listens (UDP and TCP); default
	// "0.0.0.0:0". Sandbox Pods' DNS, to whatever server, is redirected
	// there; a query from any other source is REFUSED.
	DNSListen string
	// AllowPrivate are private ranges every sandbox Pod may reach (see
	// Config.AllowPrivate).
	AllowPrivate []netip.Prefix
	Logger       *slog.Logger
}

// Pod is a sandbox Pod of the node and the policy it runs under.
type Pod struct {
	ID     string
	Addr   netip.Addr
	Policy Policy
}

// ErrPodPolicy is a policy a Pod cannot have: network rules and an egress
// proxy need the box's egress proxy, which no node runs.
var ErrPodPolicy = errors.New("netpolicy: not for Pods")

// NewPods installs the node's table with the Pods already running on it (in
// one transaction, so a restarted agent leaves no moment in which they are
// not judged) and starts the DNS forwarder. Open, Update and Close a Pod
// as the agent sees it come, change and go; Policy reads one back.
func NewPods(cfg PodConfig, pods []Pod) (*Network, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Table == "" {
		cfg.Table = "airlock_pods"
	}
	var err error
	if cfg.DNSListen, cfg.DNSUpstreams, err = dnsDefaults(cfg.DNSListen, cfg.DNSUpstreams); err != nil {
		return nil, err
	}
	n := &Network{
		cfg:  Config{Table: cfg.Table, DNSUpstreams: cfg.DNSUpstreams, DNSListen: cfg.DNSListen, AllowPrivate: cfg.AllowPrivate, Logger: cfg.Logger},
		log:  cfg.Logger,
		sbx:  map[string]*state{},
		byIP: map[netip.Addr]*state{},
	}
	var initial []podElems
	var states []*state
	for _, p := range pods {
		st, err := podState(p)
		if err != nil {
			return nil, fmt.Errorf("netpolicy: pod %s: %w", p.ID, err)
		}
		initial = append(initial, podElems{id: p.ID, addr: p.Addr, c: st.c})
		states = append(states, st)
	}
	for _, st := range states {
		n.sbx[st.ID], n.byIP[st.Addr] = st, st
	}
	if err := n.serveDNS(func(port uint16) (*firewall, error) {
		return newPodFirewall(cfg.Table, port, closedPrivate(cfg.AllowPrivate), initial)
	}); err != nil {
		return nil, err
	}
	return n, nil
}

// podState is what the Network keeps of a Pod, its policy compiled.
func podState(p Pod) (*state, error) {
	if !p.Addr.Is4() {
		return nil, fmt.Errorf("%w: address %s is not IPv4 (the node agent judges IPv4 only)", ErrPodPolicy, p.Addr)
	}
	c, err := p.Policy.compile()
	if err != nil {
		return nil, err
	}
	if c.egress.intercepts() {
		return nil, fmt.Errorf("%w: network rules and an egress proxy need Airlock's egress proxy, which runs on one box only", ErrPodPolicy)
	}
	st := &state{policy: p.Policy, c: c, slot: -1, learned: map[netip.Addr]learned{}, ruleLearned: map[netip.Addr]learned{}}
	st.ID, st.Addr = p.ID, p.Addr
	return st, nil
}

// CheckPod says why a Pod cannot be opened as it is, if it cannot
// (ErrPodPolicy, ErrInvalidPolicy).
func CheckPod(p Pod) error {
	_, err := podState(p)
	return err
}

// Open starts judging a Pod's traffic by its policy (NewPods).
func (n *Network) Open(p Pod) error {
	st, err := podState(p)
	if err != nil {
		return err
	}
	n.mu.Lock()
	_, dup := n.sbx[p.ID]
	other, taken := n.byIP[p.Addr]
	n.mu.Unlock()
	switch {
	case dup:
		return fmt.Errorf("netpolicy: pod %s is open already", p.ID)
	case taken:
		return fmt.Errorf("netpolicy: pod %s has the address %s of pod %s, still open", p.ID, p.Addr, other.ID)
	}
	if err := n.fw.addSandbox(p.ID, p.Addr, st.c, nil, true); err != nil {
		return err
	}
	n.mu.Lock()
	n.sbx[p.ID], n.byIP[p.Addr] = st, st
	n.mu.Unlock()
	return nil
}

// UpdatePod replaces an open Pod's policy atomically (as Update does for a
// sandbox of the box), refusing what a Pod cannot have.
func (n *Network) UpdatePod(id string, p Policy) error {
	n.mu.Lock()
	st, ok := n.sbx[id]
	n.mu.Unlock()
	if !ok {
		return fmt.Errorf("netpolicy: no network for pod %s", id)
	}
	if _, err := podState(Pod{ID: id, Addr: st.Addr, Policy: p}); err != nil {
		return err
	}
	return n.Update(id, p)
}

// ClosePod stops judging a Pod that is gone: its elements leave the table
// and its address is free for the next Pod to get it.
func (n *Network) ClosePod(id string) error {
	n.mu.Lock()
	st, ok := n.sbx[id]
	if ok {
		delete(n.sbx, id)
		delete(n.byIP, st.Addr)
	}
	n.mu.Unlock()
	if !ok {
		return nil
	}
	return n.fw.removeSandbox(id, st.Addr)
}

// Pods lists the Pods open now, by ID.
func (n *Network) Pods() map[string]netip.Addr {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]netip.Addr, len(n.sbx))
	for id, st := range n.sbx {
		out[id] = st.Addr
	}
	return out
}
