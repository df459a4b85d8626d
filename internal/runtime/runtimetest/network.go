package runtimetest

import (
	"fmt"
	"net"
	"net/netip"
	"path/filepath"
	goruntime "runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/nsfile"
)

// Network is a sandbox network as netpolicy makes one, in miniature and
// apart from the host: NetNS holds eth0 (10.200.0.2/30, default route via
// 10.200.0.1) whose peer is in a second namespace of the test's own, standing
// for the host, from which Dial reaches the sandbox. Nothing of it is in the
// host's network namespace, so tests may run it beside a server.
type Network struct {
	NetNS string
	outer string
	// Links counts the calls of Link.
	Links atomic.Int32
}

var (
	netGateway = netip.MustParseAddr("10.200.0.1")
	netSandbox = netip.MustParseAddr("10.200.0.2")
)

// NewNetwork makes a Network and removes it at the test's end.
func NewNetwork(t *testing.T) *Network {
	t.Helper()
	n := NewUnlinkedNetwork(t)
	if err := n.linkInto(n.NetNS); err != nil {
		t.Fatalf("test network: %v", err)
	}
	return n
}

// NewUnlinkedNetwork makes a Network whose NetNS is empty: Link, a
// Spec.NetLink, makes eth0 in the namespace a backend gives it.
func NewUnlinkedNetwork(t *testing.T) *Network {
	t.Helper()
	dir := t.TempDir()
	n := &Network{NetNS: filepath.Join(dir, "netns"), outer: filepath.Join(dir, "outer")}
	for _, p := range []string{n.NetNS, n.outer} {
		h, err := nsfile.Make(p)
		if err != nil {
			t.Fatal(err)
		}
		h.Close()
		t.Cleanup(func() { _ = nsfile.Remove(p) })
	}
	return n
}

// Link is a Spec.NetLink: it makes the veth with eth0 in the namespace at
// path.
func (n *Network) Link(path string) error {
	n.Links.Add(1)
	return n.linkInto(path)
}

func (n *Network) linkInto(path string) error {
	outer, err := netns.GetFromPath(n.outer)
	if err != nil {
		return err
	}
	defer outer.Close()
	inner, err := netns.GetFromPath(path)
	if err != nil {
		return err
	}
	defer inner.Close()
	oh, err := netlink.NewHandleAt(outer)
	if err != nil {
		return err
	}
	defer oh.Close()
	ih, err := netlink.NewHandleAt(inner)
	if err != nil {
		return err
	}
	defer ih.Close()
	if err := oh.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "host0"}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(inner))}); err != nil {
		return fmt.Errorf("veth: %w", err)
	}
	for _, side := range []struct {
		h    *netlink.Handle
		name string
		addr netip.Addr
	}{{oh, "host0", netGateway}, {ih, "eth0", netSandbox}} {
		l, err := side.h.LinkByName(side.name)
		if err != nil {
			return err
		}
		ipn := &net.IPNet{IP: side.addr.AsSlice(), Mask: net.CIDRMask(30, 32)}
		if err := side.h.AddrAdd(l, &netlink.Addr{IPNet: ipn}); err != nil {
			return fmt.Errorf("address %s: %w", side.addr, err)
		}
		if err := side.h.LinkSetUp(l); err != nil {
			return err
		}
		lo, err := side.h.LinkByName("lo")
		if err != nil {
			return err
		}
		if err := side.h.LinkSetUp(lo); err != nil {
			return err
		}
		if side.name == "eth0" {
			if err := side.h.RouteAdd(&netlink.Route{LinkIndex: l.Attrs().Index, Gw: netGateway.AsSlice()}); err != nil {
				return fmt.Errorf("default route: %w", err)
			}
		}
	}
	return nil
}

// Dial connects to port on the sandbox's eth0 from the namespace standing for
// the host.
func (n *Network) Dial(port int) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The thread stays locked, so it dies with the goroutine instead of
		// going back to the pool inside another namespace.
		goruntime.LockOSThread()
		h, err := netns.GetFromPath(n.outer)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer h.Close()
		if err := unix.Setns(int(h), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("join %s: %w", n.outer, err)}
			return
		}
		c, err := net.DialTimeout("tcp", net.JoinHostPort(netSandbox.String(), fmt.Sprint(port)), 5*time.Second)
		ch <- result{c, err}
	}()
	r := <-ch
	return r.c, r.err
}
