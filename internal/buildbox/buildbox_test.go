package buildbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/buildbox"
	"github.com/airlock-sandbox/airlock/internal/layer"
	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/netpolicy/netpolicytest"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func init() { linux.MaybeInit() }

func TestMain(m *testing.M) { os.Exit(m.Run()) }

// env is a data dir on the base template's filesystem (uppers must share a
// filesystem with <DataDir>/build, and the test lower is a hard-link clone of
// the base template) and a lower that lacks the box's mount points.
type env struct {
	data, lower string
}

func setup(t *testing.T) env {
	t.Helper()
	testenv.NeedRoot(t)
	base := testenv.BaseRootfs(t)
	data, err := os.MkdirTemp(testenv.DataDir(), "buildbox-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if m := mountutil.MountedUnder(data); len(m) > 0 {
			t.Errorf("mounts left under the data dir: %v", m)
			return
		}
		os.RemoveAll(data)
	})
	// The base template has /run/airlock, /etc/hosts and /etc/resolv.conf;
	// a lower without them shows that the box cleans its mount points up.
	diff := filepath.Join(data, "diff")
	for _, p := range []string{"run/airlock", "etc/hosts", "etc/resolv.conf", "usr/local/bin/envd"} {
		if err := os.MkdirAll(filepath.Join(diff, filepath.Dir(p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := unix.Mknod(filepath.Join(diff, p), unix.S_IFCHR, 0); err != nil {
			t.Fatal(err)
		}
	}
	lower := filepath.Join(data, "lower")
	if err := layer.Apply(base, diff, lower); err != nil {
		t.Fatal(err)
	}
	return env{data: data, lower: lower}
}

func (e env) open(t *testing.T, opts buildbox.Options) *buildbox.Box {
	t.Helper()
	opts.DataDir = e.data
	opts.EnvdPath = testenv.EnvdBinary(t)
	b, err := buildbox.Open(context.Background(), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return b
}

func (e env) upper(t *testing.T) string {
	t.Helper()
	d, err := os.MkdirTemp(e.data, "upper-")
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func sh(script string) []string { return []string{"/bin/sh", "-c", script} }

func owner(t *testing.T, p string) (uint32, uint32) {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Uid, st.Gid
}

func TestRun(t *testing.T) {
	e := setup(t)
	b := e.open(t, buildbox.Options{})
	ctx := context.Background()

	t.Run("ExitCodes", func(t *testing.T) {
		for _, c := range []struct {
			script string
			want   int
		}{{"true", 0}, {"exit 3", 3}, {"kill -KILL $$", 137}} {
			code, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: e.upper(t), Args: sh(c.script)}, nil)
			if err != nil || code != c.want {
				t.Errorf("%q: exit %d, %v; want %d", c.script, code, err, c.want)
			}
		}
	})

	t.Run("OutputStreamed", func(t *testing.T) {
		pr, pw := net.Pipe()
		var got bytes.Buffer
		first := make(chan string, 1)
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 4096)
			for {
				n, err := pr.Read(buf)
				if n > 0 && got.Len() == 0 {
					first <- string(buf[:n])
				}
				got.Write(buf[:n])
				if err != nil {
					return
				}
			}
		}()
		done := make(chan struct{})
		go func() {
			// The step waits for a file this test makes once it saw the first
			// line: output must arrive while the step runs, not at its end.
			code, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: e.upper(t), Args: sh(
				`echo first; i=0; while [ ! -e /tmp/go ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; echo second >&2`)}, pw)
			if err != nil || code != 0 {
				t.Errorf("exit %d, %v", code, err)
			}
			pw.Close()
			close(done)
		}()
		select {
		case s := <-first:
			if !strings.HasPrefix(s, "first") {
				t.Errorf("first output %q", s)
			}
		case <-time.After(30 * time.Second):
			t.Fatal("no output while the step runs")
		}
		// The step's /tmp is its own; reach it through the box's step dir.
		dirs, _ := filepath.Glob(filepath.Join(e.data, "build", "steps", "*"))
		if len(dirs) != 1 {
			t.Fatalf("step dirs: %v", dirs)
		}
		if err := touchInStep(t, e.data); err != nil {
			t.Fatal(err)
		}
		<-done
		wg.Wait()
		if got.String() != "first\nsecond\n" {
			t.Errorf("output %q, want stdout and stderr both", got.String())
		}
	})

	// A step is the user's code like any command: it sees the box's memory
	// limit through sysinfo (envd step answers it) and, as root, holds no
	// CAP_SYS_PTRACE (envd keeps it to answer sysinfo).
	t.Run("SysinfoAndNoPtrace", func(t *testing.T) {
		var out bytes.Buffer
		code, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: e.upper(t), Args: sh(
			`python3 -c 'import os; print(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") >> 20)'; awk '/^CapPrm:/{print $2}' /proc/self/status`)}, &out)
		if err != nil || code != 0 {
			t.Fatalf("exit %d, %v: %s", code, err, out.String())
		}
		f := strings.Fields(out.String())
		if len(f) != 2 {
			t.Fatalf("output %q", out.String())
		}
		if f[0] != strconv.Itoa(buildbox.DefaultMemoryMB) {
			t.Errorf("SC_PHYS_PAGES in a step says %s MiB; the box has %d", f[0], buildbox.DefaultMemoryMB)
		}
		if prm, err := strconv.ParseUint(f[1], 16, 64); err != nil || prm&(1<<19) != 0 {
			t.Errorf("a step run as root has CapPrm %s: CAP_SYS_PTRACE must be dropped", f[1])
		}
	})

	t.Run("EnvCwdUser", func(t *testing.T) {
		up := e.upper(t)
		var out bytes.Buffer
		code, err := b.Run(ctx, buildbox.Step{
			Lower: e.lower, Upper: up, Env: []string{"FOO=bar baz"}, Cwd: "/home/user", User: "user",
			Args: sh(`echo "$FOO|$HOME|$USER|$(pwd)|$(id -u):$(id -g)|$(id -G)" > /tmp/facts; touch /home/user/mine`),
		}, &out)
		if err != nil || code != 0 {
			t.Fatalf("exit %d, %v: %s", code, err, out.String())
		}
		facts, err := os.ReadFile(filepath.Join(up, "tmp", "facts"))
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.TrimSpace(string(facts)); !strings.HasPrefix(got, "bar baz|/home/user|user|/home/user|1000:1000|1000") {
			t.Errorf("facts %q", got)
		}
		if u, g := owner(t, filepath.Join(up, "home", "user", "mine")); u != 1000 || g != 1000 {
			t.Errorf("a file made by USER user is owned by %d:%d in upper, want 1000:1000", u, g)
		}
		if u, g := owner(t, filepath.Join(up, "tmp", "facts")); u != 1000 || g != 1000 {
			t.Errorf("/tmp/facts owned by %d:%d", u, g)
		}

		up = e.upper(t)
		if code, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: up, Args: sh(`touch /rootfile && mkdir -p /opt/x && rm /etc/issue`)}, nil); err != nil || code != 0 {
			t.Fatalf("exit %d, %v", code, err)
		}
		for _, p := range []string{"rootfile", "opt/x", "opt", "."} {
			if u, g := owner(t, filepath.Join(up, p)); u != 0 || g != 0 {
				t.Errorf("%s made by root owned by %d:%d in upper, want 0:0", p, u, g)
			}
		}
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(up, "etc", "issue"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
			t.Errorf("rm /etc/issue is not a whiteout in upper: %v %+v", err, st)
		}
		if _, err := os.Stat(filepath.Join(e.lower, "etc", "issue")); err != nil {
			t.Errorf("the step's rm reached the lower: %v", err)
		}
		if _, err := os.Stat(filepath.Join(e.lower, "rootfile")); err == nil {
			t.Errorf("the step's write reached the lower")
		}

		if _, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: e.upper(t), User: "nosuchuser", Args: sh("true")}, nil); err == nil {
			t.Errorf("a step as an unknown user ran")
		}
		if _, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: e.upper(t), Cwd: "/no/such", Args: sh("true")}, nil); err == nil {
			t.Errorf("a step in a missing cwd ran")
		}
		if _, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: up, Args: sh("true")}, nil); err == nil {
			t.Errorf("a step with a non-empty upper ran")
		}
	})

	t.Run("MountPointsNotInUpper", func(t *testing.T) {
		up := e.upper(t)
		if code, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: up, Args: sh(`test -s /etc/resolv.conf && test -x /usr/local/bin/envd && test -x /usr/local/bin/mcp-gateway && test -d /run/airlock`)}, nil); err != nil || code != 0 {
			t.Fatalf("mount points missing inside: exit %d, %v", code, err)
		}
		for _, p := range []string{"run/airlock", "etc/hosts", "etc/resolv.conf", "usr/local/bin/envd", "usr/local/bin/mcp-gateway", "run/airlock-build"} {
			if _, err := os.Lstat(filepath.Join(up, p)); err == nil {
				t.Errorf("mount point artefact %s left in upper", p)
			}
		}
		var left []string
		_ = filepath.Walk(up, func(p string, fi os.FileInfo, err error) error {
			if err == nil && !fi.IsDir() {
				left = append(left, p)
			}
			return nil
		})
		if len(left) > 0 {
			t.Errorf("a step that wrote nothing left files in upper: %v", left)
		}
	})

	t.Run("HostTrustBundle", func(t *testing.T) {
		// The default box (Options.TrustBundle "") hands the host's trust
		// store to Node in steps, as a user other than root too.
		host := ""
		for _, p := range buildbox.HostTrustBundles {
			if _, err := os.Stat(p); err == nil {
				host = p
				break
			}
		}
		if host == "" {
			t.Skip("this host has no trust store at a known path")
		}
		want, err := os.ReadFile(host)
		if err != nil {
			t.Fatal(err)
		}
		up := e.upper(t)
		if code, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: up, User: "user",
			Args: sh(`cat "$NODE_EXTRA_CA_CERTS" > /tmp/ca && echo "$NODE_EXTRA_CA_CERTS" > /tmp/name`)}, nil); err != nil || code != 0 {
			t.Fatalf("exit %d, %v", code, err)
		}
		if got, _ := os.ReadFile(filepath.Join(up, "tmp", "ca")); !bytes.Equal(got, want) {
			t.Errorf("the step's NODE_EXTRA_CA_CERTS holds %d bytes, want the host's %s (%d bytes)", len(got), host, len(want))
		}
		if _, err := os.Lstat(filepath.Join(up, "run", "airlock-build")); err == nil {
			t.Errorf("the trust bundle's mount point was left in the layer")
		}
		// A step that names its own bundle keeps it.
		up = e.upper(t)
		if code, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: up, Env: []string{"NODE_EXTRA_CA_CERTS=/mine.pem"},
			Args: sh(`echo "$NODE_EXTRA_CA_CERTS" > /tmp/name`)}, nil); err != nil || code != 0 {
			t.Fatalf("exit %d, %v", code, err)
		}
		if got, _ := os.ReadFile(filepath.Join(up, "tmp", "name")); strings.TrimSpace(string(got)) != "/mine.pem" {
			t.Errorf("a step's own NODE_EXTRA_CA_CERTS became %q", got)
		}
	})

	t.Run("BackgroundProcessDies", func(t *testing.T) {
		if code, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: e.upper(t), Args: sh(`sleep 7654321 </dev/null >/dev/null 2>&1 & echo started`)}, nil); err != nil || code != 0 {
			t.Fatalf("exit %d, %v", code, err)
		}
		if pids := procsWith("7654321"); len(pids) > 0 {
			t.Errorf("a background process of the step outlived it: %v", pids)
		}
	})
}

// touchInStep creates /tmp/go in the running step's root, through
// /proc/<pid>/root of one of its processes.
func touchInStep(t *testing.T, data string) error {
	steps, _ := os.ReadDir(filepath.Join(data, "build", "steps"))
	if len(steps) != 1 {
		return fmt.Errorf("steps: %v", steps)
	}
	// Through the step's own root: the runtime takes the overlay off the
	// host's mount namespace once the step runs.
	procs := procsWith("while [ ! -e /tmp/go ]")
	if len(procs) == 0 {
		return fmt.Errorf("no process of step %s", steps[0].Name())
	}
	pid, _, _ := strings.Cut(procs[0], ":")
	return os.WriteFile(filepath.Join("/proc", pid, "root", "tmp", "go"), nil, 0o644)
}

func procsWith(marker string) []string {
	var out []string
	ents, _ := os.ReadDir("/proc")
	for _, d := range ents {
		b, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err == nil && strings.Contains(string(b), marker) {
			out = append(out, d.Name()+":"+strings.ReplaceAll(string(b), "\x00", " "))
		}
	}
	return out
}

// TestEgress: a step reaches a stand-in internet by address and by name
// (through the box's DNS forwarder), and never the host.
func TestEgress(t *testing.T) {
	e := setup(t)
	in := netpolicytest.Start(t)
	b := e.open(t, buildbox.Options{Egress: true, DNSUpstreams: []string{in.DNSUpstream()}})
	// A host service on every address: the step must not reach it.
	l, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Write([]byte("host secret\n"))
			c.Close()
		}
	}()
	port := l.Addr().(*net.TCPAddr).Port
	up := e.upper(t)
	script := fmt.Sprintf(`
curl -sS -m 10 http://%s/ > /tmp/web 2>&1
curl -sS -m 10 http://allowed.test/ > /tmp/byname 2>&1
curl -sS -m 10 http://%s/ > /tmp/private 2>&1
gw=$(awk '/^nameserver/{print $2; exit}' /etc/resolv.conf)
curl -sS -m 3 http://$gw:%d/ > /tmp/host 2>&1; echo "exit $?" >> /tmp/host
true`, netpolicytest.Web1, netpolicytest.Private10, port)
	var out bytes.Buffer
	if code, err := b.Run(context.Background(), buildbox.Step{Lower: e.lower, Upper: up, Args: sh(script)}, &out); err != nil || code != 0 {
		t.Fatalf("exit %d, %v: %s", code, err, out.String())
	}
	read := func(name string) string {
		b, _ := os.ReadFile(filepath.Join(up, "tmp", name))
		return strings.TrimSpace(string(b))
	}
	if got := read("web"); got != "hello from "+netpolicytest.Web1.String() {
		t.Errorf("egress by address: %q", got)
	}
	if got := read("byname"); got != "hello from "+netpolicytest.Allowed.String() {
		t.Errorf("egress by name: %q", got)
	}
	// Unlike a sandbox, a build step reaches private addresses (a
	// company's mirror or proxy).
	if got := read("private"); got != "hello from "+netpolicytest.Private10.String() {
		t.Errorf("egress to a private address: %q", got)
	}
	if got := read("host"); strings.Contains(got, "host secret") || strings.HasSuffix(got, "exit 0") {
		t.Errorf("the step reached the host: %q", got)
	}

	// A step of an API key's build (Step.Network as the template builder
	// sets it): the private ranges are closed but the one allowed.
	up2 := e.upper(t)
	script2 := fmt.Sprintf(`
curl -sS -m 10 http://%s/ > /tmp/web 2>&1
curl -sS -m 3 http://%s/ > /tmp/private 2>&1; echo "exit $?" >> /tmp/private
curl -sS -m 10 http://%s/ > /tmp/opened 2>&1
true`, netpolicytest.Web1, netpolicytest.Private10, netpolicytest.Private172)
	out.Reset()
	step := buildbox.Step{Lower: e.lower, Upper: up2, Args: sh(script2), Network: netpolicy.Policy{
		DenyOut:  []string{"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"},
		AllowOut: []string{netpolicytest.Private172.String() + "/32"},
	}}
	if code, err := b.Run(context.Background(), step, &out); err != nil || code != 0 {
		t.Fatalf("exit %d, %v: %s", code, err, out.String())
	}
	up = up2
	if got := read("web"); got != "hello from "+netpolicytest.Web1.String() {
		t.Errorf("untrusted step, egress by address: %q", got)
	}
	if got := read("private"); strings.Contains(got, "hello from") || strings.HasSuffix(got, "exit 0") {
		t.Errorf("an untrusted step reached a private address: %q", got)
	}
	if got := read("opened"); got != "hello from "+netpolicytest.Private172.String() {
		t.Errorf("untrusted step, the opened private range: %q", got)
	}
}

// TestCancel: cancelling mid-step kills it and leaves nothing: no mounts,
// cgroups, netns, veths, processes.
func TestCancel(t *testing.T) {
	e := setup(t)
	b := e.open(t, buildbox.Options{Egress: true})
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := net.Pipe()
	started := make(chan struct{})
	go func() {
		buf := make([]byte, 1024)
		once := false
		for {
			n, err := pr.Read(buf)
			if n > 0 && !once {
				once = true
				close(started)
			}
			if err != nil {
				return
			}
		}
	}()
	var id string
	go func() {
		<-started
		steps, _ := os.ReadDir(filepath.Join(e.data, "build", "steps"))
		if len(steps) == 1 {
			id = steps[0].Name()
		}
		cancel()
	}()
	code, err := b.Run(ctx, buildbox.Step{Lower: e.lower, Upper: e.upper(t), Args: sh(`sleep 8765432 & echo started; sleep 8765431`)}, pw)
	pw.Close()
	if err == nil || !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after cancel = %d, %v; want context.Canceled", code, err)
	}
	if id == "" {
		t.Fatal("did not see the step's id")
	}
	if pids := procsWith("876543"); len(pids) > 0 {
		t.Errorf("processes of the cancelled step left: %v", pids)
	}
	if m := mountutil.MountedUnder(e.data); len(m) > 0 {
		t.Errorf("mounts left: %v", m)
	}
	if roots, _ := filepath.Glob("/run/airlock-rootfs/*-" + id); len(roots) > 0 {
		t.Errorf("root mount point left: %v", roots)
	}
	mi, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mi), id) {
		t.Errorf("a mount naming %s left", id)
	}
	for _, c := range []string{"memory", "pids", "cpu", "freezer", "devices"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/cgroup", c, linux.CgroupParent, id)); err == nil {
			t.Errorf("cgroup %s/%s left", c, id)
		}
	}
	links, _ := netlink.LinkList()
	pfx := buildbox.InstanceOf(e.data).IfPrefix
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, pfx) {
			t.Errorf("veth %s left", l.Attrs().Name)
		}
	}
	if ents, _ := os.ReadDir(filepath.Join(e.data, "build", "network")); len(ents) > 0 {
		t.Errorf("network state left: %v", ents)
	}
	if ents, _ := os.ReadDir(filepath.Join(e.data, "build", "steps")); len(ents) > 0 {
		t.Errorf("step dirs left: %v", ents)
	}
}

// TestOneBoxPerDataDir: a second Open waits for the first box's Close, and
// gives up when its context ends.
func TestOneBoxPerDataDir(t *testing.T) {
	testenv.NeedRoot(t)
	data := t.TempDir()
	envdPath := testenv.EnvdBinary(t)
	first, err := buildbox.Open(context.Background(), buildbox.Options{DataDir: data, EnvdPath: envdPath})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if b, err := buildbox.Open(ctx, buildbox.Options{DataDir: data, EnvdPath: envdPath}); err == nil {
		b.Close()
		t.Fatal("a second box opened on the same data dir")
	} else if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Open: %v", err)
	}
	opened := make(chan error, 1)
	go func() {
		b, err := buildbox.Open(context.Background(), buildbox.Options{DataDir: data, EnvdPath: envdPath})
		if err == nil {
			err = b.Close()
		}
		opened <- err
	}()
	time.Sleep(200 * time.Millisecond)
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-opened:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting Open did not get the box after Close")
	}
}

func TestInstanceOf(t *testing.T) {
	seen := map[string]bool{}
	for _, d := range []string{"/var/lib/airlock", "/var/lib/airlock-test", "/tmp/x", "/srv/a/b"} {
		in := buildbox.InstanceOf(d)
		if !strings.HasPrefix(in.Table, "airlock_b") || len(in.IfPrefix) != 3 || in.IfPrefix[0] != 'b' {
			t.Errorf("%s: %+v", d, in)
		}
		a := in.CIDR.Addr().As4()
		if in.CIDR.Bits() != 24 || a[0] != 10 || a[1] < 200 || a[1] > 249 {
			t.Errorf("%s: range %s outside 10.200-249.x.0/24", d, in.CIDR)
		}
		seen[in.Table] = true
	}
}

func TestTrustBundleMissing(t *testing.T) {
	_, err := buildbox.Open(context.Background(), buildbox.Options{DataDir: t.TempDir(), EnvdPath: testenv.EnvdBinary(t), TrustBundle: "/no/such/ca.pem"})
	if err == nil || !strings.Contains(err.Error(), "/no/such/ca.pem") {
		t.Fatalf("Open with a missing trust bundle: %v", err)
	}
}
