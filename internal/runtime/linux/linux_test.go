package linux_test

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/nsfile"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/runtime/runtimetest"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func init() { linux.MaybeInit() }

func TestMain(m *testing.M) { os.Exit(m.Run()) }

func TestConformance(t *testing.T) {
	testenv.NeedRoot(t)
	lower := testenv.BaseRootfs(t)
	state := filepath.Join(t.TempDir(), "state")
	runtimetest.Run(t, runtimetest.Harness{
		Lower:   lower,
		Caps:    linux.Capabilities,
		UIDMap:  "0 100000 65536",
		Rehome:  rehome,
		Envd:    testenv.EnvdBinary(t),
		Network: true,
		New: func(t *testing.T) runtime.Runtime {
			r, err := linux.New(state, nil)
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
	})
}

// newRuntime is a linux backend with its state under base.
func newRuntime(tb testing.TB, base string) *linux.Runtime {
	tb.Helper()
	r, err := linux.New(filepath.Join(base, "state"), nil)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

// BenchmarkCreateDestroy measures the backend alone: Create (the first process
// has started) then Destroy, with the default isolation layers.
func BenchmarkCreateDestroy(b *testing.B) {
	testenv.NeedRoot(b)
	lower := testenv.BaseRootfs(b)
	base := b.TempDir()
	r := newRuntime(b, base)
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("bench%d", i)
		sb, err := r.Create(context.Background(), runtime.Spec{
			ID: id, Hostname: id, Lower: lower, Dir: filepath.Join(base, id),
			Init: runtime.Process{Args: []string{"/bin/sleep", "1000"}},
		})
		if err != nil {
			b.Fatal(err)
		}
		if err := sb.Destroy(context.Background()); err != nil {
			b.Fatal(err)
		}
	}
}

// newNetNS makes a network namespace pinned at a file, with a veth pair
// in it, the way the sandbox manager prepares one (Spec.NetNS).
func newNetNS(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "netns")
	if err := os.WriteFile(path, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("unshare", "--net="+path, "true").CombinedOutput(); err != nil {
		t.Fatalf("unshare --net: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = unix.Unmount(path, unix.MNT_DETACH) })
	if out, err := exec.Command("nsenter", "--net="+path, "ip", "link", "add", "airlockva", "type", "veth", "peer", "name", "airlockvb").CombinedOutput(); err != nil {
		t.Fatalf("add veth pair: %v: %s", err, out)
	}
	for _, args := range [][]string{
		{"addr", "add", "10.201.0.1/30", "dev", "airlockva"},
		{"link", "set", "airlockva", "up"},
		{"link", "set", "airlockvb", "up"},
		{"route", "add", "default", "via", "10.201.0.2", "dev", "airlockva"},
	} {
		if out, err := exec.Command("nsenter", append([]string{"--net=" + path, "ip"}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	return path
}

// netnsProbe reports, from inside, which netns it is in, which interfaces its
// /sys shows, whether /sys is read-only and whether root can bind port 80.
const netnsProbe = `
import os, socket
out = {}
out["netns"] = os.readlink("/proc/self/ns/net")
out["sysnet"] = " ".join(sorted(os.listdir("/sys/class/net")))
out["route"] = " ".join(l.split()[0] + ":" + l.split()[1] + ":" + l.split()[2] for l in open("/proc/net/route").readlines()[1:])
out["sysro"] = "ro" if os.statvfs("/sys").f_flag & os.ST_RDONLY else "rw"
try:
    s = socket.socket()
    s.bind(("127.0.0.1", 80))
    out["bind80"] = "ok"
except OSError as e:
    out["bind80"] = str(e)
for k, v in out.items():
    open("/out/" + k, "w").write(v)
open("/out/done", "w").close()
import time
time.sleep(100000)
`

// TestJoinPreparedNetNS: a sandbox given Spec.NetNS runs in a network
// namespace of its own (CRIU could not save it in the host's; netns.go) into
// which the prepared namespace's interfaces moved with their addresses; it
// sees them (not the host's) in a read-only /sys, its root can serve on port
// 80; the server holds that namespace without a mount; Release (from a
// handle loaded as after a restart) gives the interfaces back, addressed, to
// the prepared namespace, and Destroy drops them with the sandbox's.
func TestJoinPreparedNetNS(t *testing.T) {
	testenv.NeedRoot(t)
	lower := testenv.BaseRootfs(t)
	base := t.TempDir()
	r := newRuntime(t, base)
	netns := newNetNS(t)
	var st unix.Stat_t
	if err := unix.Stat(netns, &st); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(base, "out")
	if err := os.Mkdir(out, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := runtime.Spec{
		ID: fmt.Sprintf("netns%d", time.Now().UnixNano()%1e9), Hostname: "netns", Lower: lower,
		Dir:    filepath.Join(base, "sandbox"),
		Mounts: []runtime.Mount{{Source: out, Target: "/out"}},
		Init:   runtime.Process{Args: []string{"/usr/bin/python3", "-c", netnsProbe}, LogPath: filepath.Join(base, "init.log")},
		NetNS:  netns,
	}
	sb, err := r.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(out, "done")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(spec.Init.LogPath)
			t.Fatalf("probe did not finish; log: %s", log)
		}
		time.Sleep(10 * time.Millisecond)
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(out, name))
		return string(b)
	}
	if got, prepared := read("netns"), fmt.Sprintf("net:[%d]", st.Ino); got == prepared || !strings.HasPrefix(got, "net:[") {
		t.Errorf("sandbox netns = %s, want one of its own (the prepared one is %s)", got, prepared)
	}
	links := func() string {
		out, err := exec.Command("nsenter", "--net="+netns, "ip", "-4", "-o", "addr", "show").CombinedOutput()
		if err != nil {
			t.Fatalf("addresses in the prepared netns: %v: %s", err, out)
		}
		return string(out)
	}
	if got := links(); strings.Contains(got, "airlockva") {
		t.Errorf("the veth is still in the prepared netns while the sandbox runs: %s", got)
	}
	if got := read("sysnet"); got != "airlockva airlockvb lo" {
		t.Errorf("/sys/class/net inside = %q, want the prepared netns's interfaces", got)
	}
	// 0200C90A is 10.201.0.2 and 0000C90A 10.201.0.0, as /proc/net/route writes them.
	if got := read("route"); !strings.Contains(got, "airlockva:00000000:0200C90A") || !strings.Contains(got, "airlockva:0000C90A:00000000") {
		t.Errorf("routes inside = %q, want the default route via 10.201.0.2 and 10.201.0.0/30 on airlockva", got)
	}
	if got := read("sysro"); got != "ro" {
		t.Errorf("/sys inside is %s", got)
	}
	if got := read("bind80"); got != "ok" {
		t.Errorf("root inside cannot bind port 80: %s", got)
	}
	// The server holds the sandbox's namespace open, not mounted: a mount
	// per sandbox in the server's namespace is walked by every start.
	for _, m := range mountutil.MountedUnder(base) {
		if strings.HasSuffix(m, ".netns") {
			t.Errorf("the sandbox's network namespace is mounted at %s while it runs", m)
		}
	}
	// A release (what a pause does after its checkpoint) gives the
	// interfaces back, addressed, for the restore; here through a handle
	// loaded as after a restart of the server.
	r2, err := linux.New(filepath.Join(base, "state"), nil)
	if err != nil {
		t.Fatal(err)
	}
	loaded, err := r2.Load(spec.ID)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if err := loaded.(runtime.Checkpointer).Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if got := links(); !strings.Contains(got, "airlockva") || !strings.Contains(got, "10.201.0.1/30") {
		t.Errorf("after Release the prepared netns has %q, want airlockva back with 10.201.0.1/30", got)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if m := mountutil.MountedUnder(spec.Dir); len(m) > 0 {
		t.Errorf("mounts left after Destroy: %v", m)
	}

	// A Destroy drops them with the sandbox's namespace instead (its caller
	// tears the network down next); the prepared namespace stays.
	spec.ID += "b"
	if err := os.Remove(filepath.Join(out, "done")); err != nil {
		t.Fatal(err)
	}
	sb, err = r.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create again: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, "the second probe", func() bool {
		_, err := os.Stat(filepath.Join(out, "done"))
		return err == nil
	})
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	testenv.Eventually(t, 10*time.Second, "the veth gone with the destroyed sandbox's namespace", func() bool {
		return !strings.Contains(links(), "airlockva")
	})
}

// TestIDMappedTemplateShared: sandboxes of one template share one idmapped view
// of it, which the last Destroy releases; a ref left by a crashed Create is
// pruned by the next backend start.
func TestIDMappedTemplateShared(t *testing.T) {
	testenv.NeedRoot(t)
	lower := testenv.BaseRootfs(t)
	base := t.TempDir()
	state := filepath.Join(base, "state")
	r, err := linux.New(state, nil)
	if err != nil {
		t.Fatal(err)
	}
	views := func() int { return len(mountutil.MountedUnder(filepath.Join(state, ".idmap"))) }
	var sbs []runtime.Sandbox
	for i := range 2 {
		id := fmt.Sprintf("idm%d%d", time.Now().UnixNano()%1e9, i)
		sb, err := r.Create(context.Background(), runtime.Spec{
			ID: id, Hostname: id, Lower: lower, Dir: filepath.Join(base, id),
			Init: runtime.Process{Args: []string{"/bin/sleep", "1000"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
		sbs = append(sbs, sb)
	}
	if n := views(); n != 1 {
		t.Fatalf("%d idmapped views for one template, want 1", n)
	}
	if err := sbs[0].Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := views(); n != 1 {
		t.Fatalf("the view went away while a sandbox still uses the template (%d)", n)
	}
	if err := sbs[1].Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := views(); n != 0 {
		t.Fatalf("%d idmapped views left after the last sandbox", n)
	}

	// A crashed Create: a view and a ref, but no container state.
	sb, err := r.Create(context.Background(), runtime.Spec{
		ID: "idmcrash", Hostname: "c", Lower: lower, Dir: filepath.Join(base, "crash"),
		Init: runtime.Process{Args: []string{"/bin/sleep", "1000"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	refs, _ := filepath.Glob(filepath.Join(state, ".idmap", "*.refs", "idmcrash"))
	if len(refs) != 1 {
		t.Fatalf("refs of the sandbox: %v", refs)
	}
	ref := refs[0]
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	view := strings.TrimSuffix(filepath.Dir(ref), ".refs")
	if err := os.MkdirAll(view, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount(lower, view, "", unix.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Unmount(view, unix.MNT_DETACH) })
	if err := os.MkdirAll(filepath.Dir(ref), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ref, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-2 * time.Minute)
	if err := os.Chtimes(ref, old, old); err != nil {
		t.Fatal(err)
	}
	if _, err := linux.New(state, nil); err != nil {
		t.Fatal(err)
	}
	if n := views(); n != 0 {
		t.Errorf("a view held only by a crashed Create's ref survived the next start (%d)", n)
	}
}

// TestDevicesCgroup: the devices cgroup allows the basic character devices
// and nothing else, and never mknod (specconv on its own allows mknod of any
// device and /dev/net/tun).
func TestDevicesCgroup(t *testing.T) {
	testenv.NeedRoot(t)
	list := "/sys/fs/cgroup/devices"
	if _, err := os.Stat(list); err != nil {
		t.Skip("no cgroup v1 devices controller on this host")
	}
	lower := testenv.BaseRootfs(t)
	base := t.TempDir()
	r := newRuntime(t, base)
	id := fmt.Sprintf("dev%d", time.Now().UnixNano()%1e9)
	sb, err := r.Create(context.Background(), runtime.Spec{
		ID: id, Hostname: id, Lower: lower, Dir: filepath.Join(base, id),
		Init: runtime.Process{Args: []string{"/bin/sleep", "1000"}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	b, err := os.ReadFile(filepath.Join(list, linux.CgroupParent, id, "devices.list"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{
		"c 1:3 rw": true, "c 1:5 rw": true, "c 1:7 rw": true, "c 1:8 rw": true, "c 1:9 rw": true,
		"c 5:0 rw": true, "c 5:2 rw": true, "c 136:* rw": true,
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	for _, l := range lines {
		if !want[l] {
			t.Errorf("devices cgroup allows %q", l)
		}
		delete(want, l)
	}
	for l := range want {
		t.Errorf("devices cgroup lacks %q", l)
	}
}

// rehome moves every process of a sandbox into a child cgroup "leaf" of its
// cgroup in each controller, with no limits of its own (a cpuset child gets
// its parent's CPUs and memory nodes, as it must before it can hold a
// process), as a runtime does that splits envd from the user's processes.
func rehome(t *testing.T, sb runtime.Sandbox) {
	t.Helper()
	for _, ctrl := range []string{"memory", "cpu", "cpuacct", "cpuset", "pids"} {
		parent := filepath.Join("/sys/fs/cgroup", ctrl, linux.CgroupParent, sb.ID())
		if _, err := os.Stat(parent); err != nil {
			t.Fatalf("cgroup %s: %v", parent, err)
		}
		leaf := filepath.Join(parent, "leaf")
		if err := os.Mkdir(leaf, 0o755); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = os.Remove(leaf) })
		if ctrl == "cpuset" {
			for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
				b, err := os.ReadFile(filepath.Join(parent, f))
				if err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(leaf, f), b, 0); err != nil {
					t.Fatalf("%s/%s: %v", leaf, f, err)
				}
			}
		}
		procs, err := os.ReadFile(filepath.Join(parent, "cgroup.procs"))
		if err != nil {
			t.Fatal(err)
		}
		for _, pid := range strings.Fields(string(procs)) {
			// ESRCH: a short-lived process exited since the listing.
			if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte(pid), 0); err != nil && !errors.Is(err, unix.ESRCH) {
				t.Fatalf("move %s to %s: %v", pid, leaf, err)
			}
		}
	}
}

// diskProbe writes 2 MiB with O_DIRECT, then 2 MiB through the page cache
// followed by fsync, and records how long each took (ns).
const diskProbe = `s=$(date +%s%N)
dd if=/dev/zero of=/direct bs=64k count=32 oflag=direct 2>/dev/null
m=$(date +%s%N)
dd if=/dev/zero of=/synced bs=64k count=32 conv=fsync 2>/dev/null
e=$(date +%s%N)
echo $((m-s)) $((e-m)) > /times.tmp && mv /times.tmp /times
exec sleep 1000`

// TestDiskThrottle: a sandbox started after SetDiskThrottle has the rates in
// its blkio cgroup, and its direct and fsync'd writes to that device are
// held to them; one started after the throttle is turned off has none.
func TestDiskThrottle(t *testing.T) {
	testenv.NeedRoot(t)
	if _, err := os.Stat("/sys/fs/cgroup/blkio"); err != nil {
		t.Skip("no cgroup v1 blkio controller on this host")
	}
	lower := testenv.BaseRootfs(t)
	base := t.TempDir()
	// The sandboxes' writable layers are under base: throttle its device.
	var st unix.Stat_t
	if err := unix.Stat(base, &st); err != nil {
		t.Fatal(err)
	}
	major, minor := unix.Major(st.Dev), unix.Minor(st.Dev)
	if _, err := os.Stat(fmt.Sprintf("/sys/dev/block/%d:%d", major, minor)); err != nil {
		t.Skipf("%s is not on a block device (%d:%d)", base, major, minor)
	}
	r := newRuntime(t, base)
	const rate = 1 << 20
	run := func(name string) (direct, synced time.Duration, cgroup string) {
		t.Helper()
		id := fmt.Sprintf("%s%d", name, time.Now().UnixNano()%1e9)
		sb, err := r.Create(context.Background(), runtime.Spec{
			ID: id, Hostname: id, Lower: lower, Dir: filepath.Join(base, id),
			Init: runtime.Process{Args: []string{"/bin/bash", "-c", diskProbe}},
		})
		if err != nil {
			t.Fatal(err)
		}
		defer sb.Destroy(context.Background())
		b, err := os.ReadFile(filepath.Join("/sys/fs/cgroup/blkio", linux.CgroupParent, id, "blkio.throttle.write_bps_device"))
		if err != nil {
			t.Fatal(err)
		}
		times := filepath.Join(base, id, "upper", "times")
		deadline := time.Now().Add(30 * time.Second)
		for {
			out, err := os.ReadFile(times)
			if err == nil {
				var d, s int64
				if _, err := fmt.Sscan(string(out), &d, &s); err != nil {
					t.Fatalf("%s: %q: %v", times, out, err)
				}
				return time.Duration(d), time.Duration(s), strings.TrimSpace(string(b))
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the probe did not finish in 30 s", name)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}

	r.SetDiskThrottle(linux.DiskThrottle{Major: major, Minor: minor, WriteBps: rate, WriteIOPS: 1000})
	direct, synced, cg := run("dthr")
	if want := fmt.Sprintf("%d:%d %d", major, minor, rate); cg != want {
		t.Errorf("blkio.throttle.write_bps_device = %q, want %q", cg, want)
	}
	t.Logf("throttled to 1 MiB/s: 2 MiB direct in %s, 2 MiB + fsync in %s", direct, synced)
	// 2 MiB at 1 MiB/s: about 2 s each (the first slice goes at once).
	if direct < 1500*time.Millisecond || synced < 1500*time.Millisecond {
		t.Errorf("2 MiB written in %s (direct) and %s (fsync) through a 1 MiB/s throttle", direct, synced)
	}

	r.SetDiskThrottle(linux.DiskThrottle{})
	direct, synced, cg = run("dfree")
	if cg != "" {
		t.Errorf("throttle off: blkio.throttle.write_bps_device = %q", cg)
	}
	t.Logf("unthrottled: 2 MiB direct in %s, 2 MiB + fsync in %s", direct, synced)
	if direct > time.Second || synced > time.Second {
		t.Errorf("unthrottled, 2 MiB took %s (direct) and %s (fsync): the control is too slow to tell", direct, synced)
	}
}

// TestReleaseMakesTheCallersNetNS: a sandbox whose veth was made in its own
// namespace (Spec.NetLink) with no namespace at Spec.NetNS yet (netpolicy
// leaves it to its first user) has its interfaces kept there by a release,
// which makes it: the next start of a paused sandbox finds them.
func TestReleaseMakesTheCallersNetNS(t *testing.T) {
	testenv.NeedRoot(t)
	lower := testenv.BaseRootfs(t)
	base := t.TempDir()
	r := newRuntime(t, base)
	n := runtimetest.NewUnlinkedNetwork(t)
	park := filepath.Join(base, "park")
	t.Cleanup(func() { _ = nsfile.Remove(park) })
	spec := runtime.Spec{
		ID: fmt.Sprintf("park%d", time.Now().UnixNano()%1e9), Hostname: "park", Lower: lower,
		Dir:     filepath.Join(base, "sandbox"),
		Init:    runtime.Process{Args: []string{"/bin/sleep", "1000"}, LogPath: filepath.Join(base, "init.log")},
		NetNS:   park,
		NetLink: n.Link,
	}
	sb, err := r.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	if _, err := os.Stat(park); !os.IsNotExist(err) {
		t.Fatalf("the caller's namespace exists before any release (%v)", err)
	}
	if err := sb.(runtime.Checkpointer).Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	out, err := exec.Command("nsenter", "--net="+park, "ip", "-4", "-o", "addr", "show", "eth0").CombinedOutput()
	if err != nil || !strings.Contains(string(out), "10.200.0.2/30") {
		t.Fatalf("after Release the namespace at Spec.NetNS has %q (%v), want eth0 with 10.200.0.2/30", out, err)
	}
}

// TestRootDetached: a running sandbox's overlay root is not left in the
// server's mount namespace, which every sandbox start copies and walks (one
// mount per live sandbox made starts grow with the number alive), yet the
// host still sees that root through RootPath, and a checkpoint and restore
// work on it.
func TestRootDetached(t *testing.T) {
	testenv.NeedRoot(t)
	lower := testenv.BaseRootfs(t)
	base := t.TempDir()
	r := newRuntime(t, base)
	id := fmt.Sprintf("root%d", time.Now().UnixNano()%1e9)
	spec := runtime.Spec{
		ID: id, Hostname: id, Lower: lower, Dir: filepath.Join(base, id),
		Init: runtime.Process{Args: []string{"/bin/sh", "-c", "echo inside > /marker; exec sleep 1000"}},
	}
	sb, err := r.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	mountedHere := func() []string {
		var out []string
		b, err := os.ReadFile("/proc/self/mountinfo")
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 4 && strings.HasSuffix(f[4], "-"+id) {
				out = append(out, f[4])
			}
		}
		return out
	}
	if m := mountedHere(); len(m) > 0 {
		t.Errorf("the running sandbox's root is still mounted in the server's namespace: %v", m)
	}
	rv, ok := sb.(runtime.RootViewer)
	if !ok {
		t.Fatal("the linux sandbox is no RootViewer")
	}
	readMarker := func(what string) {
		t.Helper()
		testenv.Eventually(t, 10*time.Second, "the sandbox's /marker through RootPath "+what, func() bool {
			b, err := os.ReadFile(filepath.Join(rv.RootPath(), "marker"))
			return err == nil && string(b) == "inside\n"
		})
	}
	readMarker("after create")

	cp, ok := sb.(runtime.Checkpointer)
	if !ok {
		t.Fatal("the linux sandbox is no Checkpointer")
	}
	image := filepath.Join(base, "image")
	if err := cp.Checkpoint(context.Background(), runtime.CheckpointOptions{ImageDir: image}); err != nil {
		t.Fatalf("checkpoint of a sandbox whose root was detached: %v", err)
	}
	if err := cp.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	restored, err := r.Restore(context.Background(), spec, image)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	defer restored.Destroy(context.Background())
	if m := mountedHere(); len(m) > 0 {
		t.Errorf("the restored sandbox's root is still mounted in the server's namespace: %v", m)
	}
	rv = restored.(runtime.RootViewer)
	readMarker("after restore")
	if err := restored.Destroy(context.Background()); err != nil {
		t.Fatal(err)
	}
	if m := mountedHere(); len(m) > 0 {
		t.Errorf("left mounted after destroy: %v", m)
	}
}
