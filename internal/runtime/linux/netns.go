package linux

import (
	"context"
	"errors"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/nsfile"
	"github.com/airlock-sandbox/airlock/internal/timing"
)

// Networking. The caller (the sandbox manager, through netpolicy) prepares a
// network namespace, Spec.NetNS, that holds the sandbox's interface (eth0,
// addressed and routed), and keeps it while the sandbox runs or is paused.
// The sandbox does not join that namespace: CRIU saves a task only when every
// namespace it is in belongs to its user namespace (criu/namespaces.c
// check_user_ns), which one the host made does not, and it restores a task
// into a user namespace of its own making, which owns no namespace made
// before. So every start of the sandbox, a restore included, gets a network
// namespace of its own, made inside its user namespace (by libcontainer, or
// by CRIU with --empty-ns net), and a hook of ours, run once the namespaces
// exist and before any process of the sandbox runs, fills it: on a Create
// with Spec.NetLink, the caller makes the interfaces in place; otherwise (a
// restore, a caller without NetLink) the hook moves the caller's interfaces
// from Spec.NetNS with their addresses and routes, which costs an RCU grace
// period per interface. Either way it brings loopback up and opens ports
// below 1024 to every uid of the namespace (what Docker does in every
// container: the namespace holds this sandbox alone).
//
// The server holds the sandbox's namespace open (sandbox.ownNS, from the hook
// or from Load) while it runs, so that a release, which comes after a
// checkpoint has ended every process, can still move the interfaces back into
// Spec.NetNS: a paused sandbox keeps its interface and address for the next
// restore. A checkpoint first binds the namespace at netnsMount, so that it
// also outlives a restart of the server between the dump and the release. It
// is not mounted otherwise: a sandbox's start copies the server's mount
// namespace and walks every mount in it (propagation, then the old root's
// detach), so a mount per live sandbox there made every start slower with
// each sandbox alive. A destroy lets the interfaces go with the namespace.
// The root of the sandbox has no CAP_NET_ADMIN (Capabilities), so it cannot
// reconfigure what the host set up, though the namespace is its user
// namespace's.

// netnsMount is where the sandbox's own network namespace is bind-mounted on
// the host while it lives.
func (s *sandbox) netnsMount() string { return s.rootfs + ".netns" }

// attachNetwork is the hook: pid is the sandbox's first process, in its new
// namespaces.
func (s *sandbox) attachNetwork(ctx context.Context, pid int) error {
	defer timing.Start(ctx, "rt.hook.net")()
	own := procNetNS(pid)
	if err := s.holdNSOf(pid); err != nil {
		return fmt.Errorf("the sandbox's network namespace: %w", err)
	}
	var err error
	if s.netLink != nil {
		stop := timing.Start(ctx, "rt.hook.net.link")
		err = s.netLink(own)
		stop()
	} else {
		stop := timing.Start(ctx, "rt.hook.net.move")
		err = moveLinks(s.parkNetNS, own)
		stop()
	}
	if err != nil {
		return err
	}
	if _, err := inNetNS(own, func() (int, error) {
		// /proc/sys/net is the netns of the thread that opens it.
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_unprivileged_port_start", []byte("0"), 0); err != nil {
			return -1, fmt.Errorf("ip_unprivileged_port_start: %w", err)
		}
		return -1, nil
	}); err != nil {
		return fmt.Errorf("network namespace: %w", err)
	}
	return nil
}

// detachNetwork drops the sandbox's namespace, having moved its interfaces
// back to the caller's if keepLinks (else they go with it: a veth's host end
// with its peer); a sandbox without one has nothing to do.
func (s *sandbox) detachNetwork(keepLinks bool) error {
	own := s.netnsMount()
	mounted, _ := mountutil.IsMountPoint(own)
	src := ""
	switch {
	case mounted:
		src = own
	case s.ownNS != nil:
		src = s.heldNSPath()
	}
	var errs []error
	if s.parkNetNS != "" && keepLinks && src != "" {
		// The caller's namespace is made by its first user: for a sandbox
		// whose veth was made in its own (Spec.NetLink), this.
		err := nsfile.Ensure(s.parkNetNS)
		if err == nil {
			err = moveLinks(src, s.parkNetNS)
		}
		if err != nil {
			errs = append(errs, err)
		}
	}
	s.holdNS(nil)
	if mounted {
		if err := unix.Unmount(own, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) {
			errs = append(errs, fmt.Errorf("unmount %s: %w", own, err))
		}
	}
	if err := os.Remove(own); err != nil && !errors.Is(err, os.ErrNotExist) {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// holdNS replaces the sandbox's held network namespace (nil: none).
func (s *sandbox) holdNS(ns *os.File) {
	if s.ownNS != nil {
		s.ownNS.Close()
	}
	s.ownNS = ns
}

// holdNSOf holds the network namespace process pid is in.
func (s *sandbox) holdNSOf(pid int) error {
	ns, err := os.Open(procNetNS(pid))
	if err != nil {
		return err
	}
	s.holdNS(ns)
	return nil
}

// heldNSPath names the held namespace (s.ownNS, not nil) for what opens a
// namespace by path.
func (s *sandbox) heldNSPath() string {
	return "/proc/self/fd/" + strconv.Itoa(int(s.ownNS.Fd()))
}

// procNetNS names the network namespace of process pid.
func procNetNS(pid int) string { return "/proc/" + strconv.Itoa(pid) + "/ns/net" }

// bindOwnNS binds the sandbox's network namespace at netnsMount (before a
// checkpoint ends its processes; see the package comment on networking). A
// sandbox without a network of the caller's has none to keep.
func (s *sandbox) bindOwnNS() error {
	if s.parkNetNS == "" {
		return nil
	}
	own := s.netnsMount()
	if mounted, _ := mountutil.IsMountPoint(own); mounted {
		return nil
	}
	src := ""
	if s.ownNS != nil {
		src = s.heldNSPath()
	} else if pid, ok := s.initPid(); ok {
		src = procNetNS(pid)
	} else {
		return fmt.Errorf("linux runtime: %s: no running init to hold its network namespace", s.id)
	}
	f, err := os.OpenFile(own, os.O_CREATE|os.O_RDONLY, 0o444)
	if err != nil {
		return fmt.Errorf("linux runtime: network namespace mount point: %w", err)
	}
	f.Close()
	if err := unix.Mount(src, own, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("linux runtime: bind the sandbox's network namespace: %w", err)
	}
	return nil
}

// initPid is the pid of the sandbox's running (or frozen) init.
func (s *sandbox) initPid() (int, bool) {
	if s.c == nil {
		return 0, false
	}
	if st, err := s.c.Status(); err != nil || (st != libcontainer.Running && st != libcontainer.Paused) {
		return 0, false
	}
	state, err := s.c.State()
	if err != nil {
		return 0, false
	}
	return state.InitProcessPid, true
}

// moveLinks moves every interface but loopback from the namespace mounted at
// from into the one at to, with its IPv4 and IPv6 addresses and routes (a
// move drops them; IPv6 link-local ones the kernel makes anew), up, and brings loopback up in to. An interface with no namespace to
// go to (the sandbox's died without the mount) is gone with it; that is
// not an error here, netpolicy's teardown copes with a missing veth.
func moveLinks(from, to string) error {
	src, err := netns.GetFromPath(from)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", from, err)
	}
	defer src.Close()
	dst, err := netns.GetFromPath(to)
	if err != nil {
		return fmt.Errorf("network namespace %s: %w", to, err)
	}
	defer dst.Close()
	sh, err := netlink.NewHandleAt(src)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", from, err)
	}
	defer sh.Close()
	dh, err := netlink.NewHandleAt(dst)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", to, err)
	}
	defer dh.Close()
	links, err := sh.LinkList()
	if err != nil {
		return fmt.Errorf("interfaces in %s: %w", from, err)
	}
	for _, l := range links {
		name := l.Attrs().Name
		if name == "lo" {
			continue
		}
		var addrs []netlink.Addr
		var routes []netlink.Route
		for _, fam := range []int{netlink.FAMILY_V4, netlink.FAMILY_V6} {
			as, err := sh.AddrList(l, fam)
			if err != nil {
				return fmt.Errorf("addresses of %s: %w", name, err)
			}
			for _, a := range as {
				// The kernel makes the IPv6 link-local address anew.
				if !a.IP.IsLinkLocalUnicast() {
					addrs = append(addrs, a)
				}
			}
			rs, err := sh.RouteList(l, fam)
			if err != nil {
				return fmt.Errorf("routes of %s: %w", name, err)
			}
			routes = append(routes, rs...)
		}
		if err := sh.LinkSetNsFd(l, int(dst)); err != nil {
			return fmt.Errorf("move %s: %w", name, err)
		}
		moved, err := dh.LinkByName(name)
		if err != nil {
			return fmt.Errorf("%s after the move: %w", name, err)
		}
		for _, a := range addrs {
			a := a
			a.Label = ""
			// Keep IFA_F_NODAD (netpolicy sets it on IPv6 addresses): an
			// address that went through duplicate address detection again
			// would be unusable for a second after every start.
			a.Flags &= unix.IFA_F_NODAD
			if err := dh.AddrReplace(moved, &a); err != nil {
				return fmt.Errorf("address %s on %s: %w", a.IPNet, name, err)
			}
		}
		if err := dh.LinkSetUp(moved); err != nil {
			return fmt.Errorf("up %s: %w", name, err)
		}
		for _, r := range routes {
			if r.Protocol == unix.RTPROT_KERNEL {
				continue // the address's own prefix route, back with it
			}
			r := r
			r.LinkIndex = moved.Attrs().Index
			// Flags the kernel sets on a route whose interface had no
			// carrier when it was listed (its veth peer moving first, as
			// in a namespace holding both ends); adding one with them
			// is EINVAL.
			r.Flags &^= unix.RTNH_F_LINKDOWN | unix.RTNH_F_DEAD
			if err := dh.RouteReplace(&r); err != nil {
				return fmt.Errorf("route %s on %s: %w", r, name, err)
			}
		}
	}
	lo, err := dh.LinkByName("lo")
	if err == nil {
		err = dh.LinkSetUp(lo)
	}
	if err != nil {
		return fmt.Errorf("loopback in %s: %w", to, err)
	}
	return nil
}

// networkHook makes cfg's sandbox attach the caller's network on every
// start: libcontainer runs CreateRuntime hooks once the init's namespaces
// exist, and a CRIU restore runs them at its setup-namespaces step.
// Function hooks are not saved with the container's state, so a sandbox
// loaded after a restart of ours has none, and needs none.
func networkHook(ctx context.Context, cfg *configs.Config, s *sandbox) {
	if cfg.Hooks == nil {
		cfg.Hooks = configs.Hooks{}
	}
	cfg.Hooks[configs.CreateRuntime] = append(cfg.Hooks[configs.CreateRuntime],
		configs.NewFunctionHook(func(st *specs.State) error {
			if err := s.attachNetwork(ctx, st.Pid); err != nil {
				return fmt.Errorf("linux runtime: network of %s: %w", s.id, err)
			}
			return nil
		}))
}

// inNetNS runs fn on an OS thread that has joined netns, then returns the
// thread to the host's netns. A thread that cannot go back is left locked, so
// the Go runtime ends it instead of reusing it.
func inNetNS(netns string, fn func() (int, error)) (int, error) {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		host, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- result{-1, err}
			return
		}
		defer host.Close()
		target, err := os.Open(netns)
		if err != nil {
			ch <- result{-1, err}
			return
		}
		defer target.Close()
		if err := unix.Setns(int(target.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{-1, fmt.Errorf("join: %w", err)}
			return
		}
		fd, err := fn()
		if serr := unix.Setns(int(host.Fd()), unix.CLONE_NEWNET); serr != nil {
			// Stay locked: the thread dies with this goroutine.
			if fd >= 0 {
				unix.Close(fd)
			}
			ch <- result{-1, fmt.Errorf("return to the host netns: %w", serr)}
			return
		}
		goruntime.UnlockOSThread()
		ch <- result{fd, err}
	}()
	r := <-ch
	return r.fd, r.err
}
