package daemon

// A real `airlock serve` child process for the tests that must kill the
// server (kill -9, a crash point) or take the host's state from under it (a
// reboot): an in-process server (daemontest) cannot be killed without killing
// the test.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

const serveKey = "e2b_servetest00000000000000000000000000000"

// airlockBin is the airlock binary under test: AIRLOCK_BIN (scripts/test.sh
// sets it to bin/airlock).
func airlockBin(t *testing.T) string {
	t.Helper()
	p := os.Getenv("AIRLOCK_BIN")
	if p == "" {
		testenv.Missing(t, "AIRLOCK_BIN is not set: these tests start a real `airlock serve` (make build, then AIRLOCK_BIN=$PWD/bin/airlock)")
	}
	return p
}

// host is one data dir and the servers started on it one after another,
// as a host would run them across restarts and reboots.
type host struct {
	t       *testing.T
	bin     string
	runtime string
	dir     layout.DataDir
	args    []string
	// ids are every sandbox the test made here (reboot kills what is left
	// of them, and only of them).
	ids map[string]bool
	srv *serveProc
	n   int
}

type serveProc struct {
	cmd     *exec.Cmd
	done    chan struct{}
	log     string
	api     string
	sandbox string
}

// newHost makes a data dir for runtime ("linux" or "gvisor") with the
// default server settings but for: the base template only, from the test
// template cache; no warm pool; no egress beyond the host; a small disk pool.
func newHost(t *testing.T, runtime string, extraArgs ...string) *host {
	t.Helper()
	testenv.NeedRoot(t)
	testenv.BaseRootfs(t)
	if runtime == "gvisor" {
		testenv.NeedRunsc(t)
	}
	root := freeDataDir(t)
	h := &host{
		t: t, bin: airlockBin(t), runtime: runtime, dir: layout.DataDir{Root: root}, ids: map[string]bool{},
		args: append([]string{
			"--data-dir", root, "--template-data-dir", testenv.DataDir(), "--templates", "base",
			"--warm-pool", "0", "--runtime", runtime, "--sandbox-egress=false", "--disk-image-size", "2048",
			"--log-level", "debug",
		}, extraArgs...),
	}
	t.Cleanup(h.cleanup)
	return h
}

// freeDataDir makes a data dir whose firewall table name (derived from its
// path, netInstanceOf) no other server on this host uses: the reboot stand-in
// deletes that table, and two servers sharing one would break each other.
func freeDataDir(t *testing.T) string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	for range 20 {
		root, err := os.MkdirTemp("", "airlock-serve-test-")
		if err != nil {
			t.Fatal(err)
		}
		tables, err := c.ListTablesOfFamily(nftables.TableFamilyINet)
		if err != nil {
			t.Fatal(err)
		}
		name := netInstanceOf(root).table
		if !slices.ContainsFunc(tables, func(tb *nftables.Table) bool { return tb.Name == name }) {
			return root
		}
		os.Remove(root)
	}
	t.Fatal("no data dir with a free firewall table name after 20 tries")
	return ""
}

// start starts a server on the data dir, with extra environment
// variables, and waits until it answers. The ports are picked free, then
// closed before the server binds them, so another listener (the server's own
// ephemeral ones among them) may take one in between: a server that exits
// with "address already in use" is started again on other ports.
func (h *host) start(env ...string) *serveProc {
	h.t.Helper()
	for attempt := 1; ; attempt++ {
		s, err := h.startOnce(env)
		if err == nil {
			return s
		}
		if attempt == 3 || !strings.Contains(err.Error(), "address already in use") {
			h.t.Fatal(err)
		}
		h.t.Logf("start %d: %v; again on other ports", attempt, err)
	}
}

func (h *host) startOnce(env []string) (*serveProc, error) {
	h.t.Helper()
	if h.srv != nil {
		h.t.Fatal("a server is running already")
	}
	ports := freePorts(h.t, 2)
	h.n++
	s := &serveProc{
		done:    make(chan struct{}),
		log:     filepath.Join(h.dir.Root, fmt.Sprintf("serve-%d.log", h.n)),
		api:     "http://" + ports[0],
		sandbox: "http://" + ports[1],
	}
	logf, err := os.Create(s.log)
	if err != nil {
		h.t.Fatal(err)
	}
	defer logf.Close()
	args := append([]string{"serve", "--api-addr", ports[0], "--sandbox-addr", ports[1], "--metrics-addr", "127.0.0.1:0"}, h.args...)
	s.cmd = exec.Command(h.bin, args...)
	s.cmd.Stdout, s.cmd.Stderr = logf, logf
	s.cmd.Env = append(os.Environ(), "AIRLOCK_API_KEY="+serveKey, "AIRLOCK_ENVD="+testenv.EnvdBinary(h.t))
	s.cmd.Env = append(s.cmd.Env, env...)
	if err := s.cmd.Start(); err != nil {
		h.t.Fatalf("start airlock serve: %v", err)
	}
	go func() { _ = s.cmd.Wait(); close(s.done) }()
	h.srv = s
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get(s.api + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		select {
		case <-s.done:
			h.srv = nil
			return nil, fmt.Errorf("airlock serve exited before answering (%v):\n%s", s.cmd.ProcessState, tail(s.log, 60))
		default:
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("airlock serve did not answer /health in 2 minutes:\n%s", tail(s.log, 60))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// metric is the value of one series (its name and labels exactly as
// exposed) on the running server's metrics page, or -1 when it has none.
// The page's address is what serve printed once it was serving.
func (h *host) metric(series string) float64 {
	h.t.Helper()
	var url string
	deadline := time.Now().Add(10 * time.Second)
	for url == "" {
		b, _ := os.ReadFile(h.srv.log)
		if m := regexp.MustCompile(`Prometheus metrics: (\S+)`).FindSubmatch(b); m != nil {
			url = string(m[1])
		} else if time.Now().After(deadline) {
			h.t.Fatalf("serve printed no metrics address:\n%s", tail(h.srv.log, 30))
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	resp, err := http.Get(url)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindSubmatch(page)
	if m == nil {
		return -1
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}

// client and backend talk to the running server.
func (h *host) client() *e2bclient.Client {
	return e2bclient.New(e2bclient.Config{APIURL: h.srv.api, SandboxURL: h.srv.sandbox, APIKey: serveKey})
}

func (h *host) backend() mcp.Backend {
	return mcp.NewHTTPBackend(e2bclient.Config{APIURL: h.srv.api, SandboxURL: h.srv.sandbox, APIKey: serveKey})
}

// kill9 kills the server with SIGKILL, by its pid, and waits for it.
func (h *host) kill9() {
	h.t.Helper()
	s := h.srv
	_ = s.cmd.Process.Signal(syscall.SIGKILL)
	<-s.done
	h.srv = nil
	h.checkLog(s)
}

// stop stops the server as an operator would (SIGTERM) and waits for it.
func (h *host) stop() {
	h.t.Helper()
	s := h.srv
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(60 * time.Second):
		_ = s.cmd.Process.Signal(syscall.SIGKILL)
		<-s.done
		h.t.Errorf("airlock serve did not stop within 60 s of SIGTERM")
	}
	h.srv = nil
	h.checkLog(s)
}

// died waits for a server that is expected to kill itself (a crash point).
func (h *host) died(within time.Duration) {
	h.t.Helper()
	s := h.srv
	select {
	case <-s.done:
	case <-time.After(within):
		h.t.Fatalf("airlock serve is still running %s after the operation that should have crashed it:\n%s", within, tail(s.log, 40))
	}
	h.srv = nil
	if ws, ok := s.cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		h.t.Fatalf("airlock serve ended with %v, not by its crash point's SIGKILL:\n%s", s.cmd.ProcessState, tail(s.log, 40))
	}
	h.checkLog(s)
}

// checkLog fails the test on a panic in a server's log.
func (h *host) checkLog(s *serveProc) {
	h.t.Helper()
	b, _ := os.ReadFile(s.log)
	if strings.Contains(strings.ToLower(string(b)), "panic") {
		h.t.Errorf("server log %s shows a panic:\n%s", s.log, tail(s.log, 80))
	}
}

// reboot stands in for a reboot of the host with the server stopped: every
// process, mount, cgroup, network namespace, veth and firewall table of
// this data dir's sandboxes goes; the data dir's files (records, writable
// layers, checkpoint images, the disk image) stay, as a disk does. With
// clearState the runtimes' and network's state dirs go too (as when they
// live on a tmpfs); without, their files stay, stale (mount points without
// their mounts, runtime state naming dead processes).
func (h *host) reboot(clearState bool) {
	h.t.Helper()
	if h.srv != nil {
		h.t.Fatal("reboot with a server running")
	}
	for id := range h.sandboxIDs() {
		if err := killCgroups(id); err != nil {
			h.t.Fatalf("reboot: %v", err)
		}
	}
	// Anything else that names the data dir (runsc's sentry and gofer carry
	// --root=<data>/runtime/gvisor) should have been in a sandbox's cgroup.
	for _, pid := range h.strayProcesses() {
		h.t.Errorf("reboot: process %d names the data dir but was in no sandbox cgroup: %s", pid, cmdline(pid))
		_ = unix.Kill(pid, unix.SIGKILL)
	}
	if err := h.unmountAll(); err != nil {
		h.t.Fatalf("reboot: %v", err)
	}
	inst := netInstanceOf(h.dir.Root)
	for id := range h.sandboxIDs() {
		name := inst.prefix + id[:min(12, len(id))]
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	}
	if c, err := nftables.New(); err == nil {
		c.DelTable(&nftables.Table{Family: nftables.TableFamilyINet, Name: inst.table})
		_ = c.Flush() // absent already: fine
	}
	if !clearState {
		return
	}
	for _, d := range []string{h.dir.Runtime("linux"), h.dir.Runtime("gvisor"), h.dir.Network()} {
		if err := os.RemoveAll(d); err != nil {
			h.t.Fatalf("reboot: %v", err)
		}
	}
}

// sandboxIDs are the sandboxes of this data dir: the test's, and any whose
// directory is on its disk.
func (h *host) sandboxIDs() map[string]bool {
	ids := map[string]bool{}
	for id := range h.ids {
		ids[id] = true
	}
	entries, _ := os.ReadDir(h.dir.Sandboxes())
	for _, de := range entries {
		if de.IsDir() && !strings.HasPrefix(de.Name(), ".") {
			ids[de.Name()] = true
		}
	}
	return ids
}

// strayProcesses are the host's processes whose command line names the
// data dir, but for this test process.
func (h *host) strayProcesses() []int {
	procs, _ := filepath.Glob("/proc/[0-9]*")
	var out []int
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil || pid == os.Getpid() {
			continue
		}
		if strings.Contains(cmdline(pid), h.dir.Root+"/") {
			out = append(out, pid)
		}
	}
	return out
}

func cmdline(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return strings.ReplaceAll(string(b), "\x00", " ")
}

// killCgroups kills every process in sandbox id's cgroups (under Airlock's
// parent, /airlock/<id>) and removes the cgroups, as a reboot would.
func killCgroups(id string) error {
	ctrls, _ := filepath.Glob("/sys/fs/cgroup/*")
	var dirs []string
	for _, c := range ctrls {
		root := filepath.Join(c, "airlock", id)
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
	}
	// Frozen tasks die only once thawed.
	for _, d := range dirs {
		if strings.HasPrefix(d, "/sys/fs/cgroup/freezer/") {
			_ = os.WriteFile(filepath.Join(d, "freezer.state"), []byte("THAWED"), 0)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		left := 0
		for _, d := range dirs {
			for _, pid := range cgroupPids(d) {
				left++
				_ = unix.Kill(pid, unix.SIGKILL)
			}
		}
		if left == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("sandbox %s: %d processes still in its cgroups 10 s after SIGKILL", id, left)
		}
		time.Sleep(20 * time.Millisecond)
	}
	sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
	// Removal has its own bound: on a loaded machine the kills above can
	// take most of theirs.
	deadline = time.Now().Add(20 * time.Second)
	for _, d := range dirs {
		// EBUSY while the killed tasks are still being torn down, or while
		// a leaf made after the walk above (envd makes one per process)
		// is still there: kill and remove those too, then go again.
		for {
			err := unix.Rmdir(d)
			if err == nil || errors.Is(err, unix.ENOENT) {
				break
			}
			if !errors.Is(err, unix.EBUSY) || time.Now().After(deadline) {
				return fmt.Errorf("remove cgroup %s: %w (tasks %v, children %v)", d, err, cgroupPids(d), childDirs(d))
			}
			for _, c := range childDirs(d) {
				for _, pid := range cgroupPids(c) {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
				_ = unix.Rmdir(c)
			}
			for _, pid := range cgroupPids(d) {
				_ = unix.Kill(pid, unix.SIGKILL)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

// childDirs are the cgroups under dir, deepest first.
func childDirs(dir string) []string {
	var out []string
	_ = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() && p != dir {
			out = append(out, p)
		}
		return nil
	})
	sort.Slice(out, func(i, j int) bool { return len(out[i]) > len(out[j]) })
	return out
}

func cgroupPids(dir string) []int {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return nil
	}
	var out []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil {
			out = append(out, pid)
		}
	}
	return out
}

// unmountAll unmounts every mount under the data dir and every overlay of
// its sandboxes in /run/airlock-rootfs, deepest first.
func (h *host) unmountAll() error {
	ids := h.sandboxIDs()
	for round := 0; ; round++ {
		var points []string
		for _, p := range mountutil.MountedUnder(h.dir.Root) {
			if p != h.dir.Root {
				points = append(points, p)
			}
		}
		for _, p := range mountutil.MountedUnder("/run/airlock-rootfs") {
			base, _ := strings.CutPrefix(p, "/run/airlock-rootfs/")
			// <key>-<id> (the overlay) and <key>-<id>.netns (the network
			// namespace's pin); the latter leaked until the suffix was cut.
			base = strings.TrimSuffix(base, ".netns")
			if i := strings.LastIndex(base, "-"); i >= 0 && ids[base[i+1:]] {
				points = append(points, p)
			}
		}
		if len(points) == 0 {
			break
		}
		if round == 20 {
			return fmt.Errorf("still mounted after 20 rounds of unmounting: %v", points)
		}
		sort.Slice(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
		for _, p := range points {
			_ = unix.Unmount(p, unix.MNT_DETACH)
		}
	}
	// The overlays' mount points.
	for id := range ids {
		ms, _ := filepath.Glob("/run/airlock-rootfs/*-" + id)
		pins, _ := filepath.Glob("/run/airlock-rootfs/*-" + id + ".netns")
		ms = append(ms, pins...)
		for _, m := range ms {
			_ = os.Remove(m)
		}
	}
	return nil
}

// cleanup kills what the test left: the server, every sandbox of the data
// dir (through a server when one can start, else as a reboot does), then
// the disk pool's mount and the data dir.
func (h *host) cleanup() {
	if h.srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		c := h.client()
		if list, err := c.List(ctx, e2bclient.ListQuery{}); err == nil {
			for _, sb := range list {
				_ = c.Kill(ctx, sb.SandboxID)
			}
		}
		cancel()
		h.stop()
	}
	h.reboot(true)
	if h.t.Failed() {
		h.t.Logf("data dir kept for inspection: %s", h.dir.Root)
		return
	}
	if err := os.RemoveAll(h.dir.Root); err != nil {
		h.t.Errorf("remove the data dir: %v", err)
	}
}

func freePorts(t *testing.T, n int) []string {
	t.Helper()
	var out []string
	var lns []net.Listener
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		out = append(out, ln.Addr().String())
	}
	for _, ln := range lns {
		ln.Close()
	}
	return out
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
