// Package runtimetest is the conformance suite every runtime backend must pass.
// It starts real sandboxes from a real template rootfs; each check is done from
// inside the sandbox by its first process, which reports what it saw into a
// directory bound from the host, so the suite needs nothing from a backend but
// the runtime.Runtime contract.
package runtimetest

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Harness tells the suite how to reach a backend.
type Harness struct {
	// New returns the backend under test.
	New func(t *testing.T) runtime.Runtime
	// Lower is a template root filesystem with /bin/sh, coreutils, procps and
	// python3 (the escape probes are Python, for raw syscalls through ctypes).
	Lower string
	// Caps, if set, is the exact capability set the backend gives a sandbox's
	// root; it must be within MaxCaps either way.
	Caps []string
	// UIDMap, if set, is what /proc/self/uid_map and gid_map must read inside
	// the sandbox (lines joined by " | ", fields by one space), e.g.
	// "0 100000 65536". Empty for a backend whose sandbox kernel is not the
	// host's (gVisor), where the map inside says nothing about host ids.
	UIDMap string
	// GuestKernel says the sandbox's system calls are served by a kernel of
	// the backend's own (gVisor's sentry), not by the host kernel. The host
	// kernel then only sees the guest kernel's calls, which the backend
	// confines itself, so the escape tests check the host-kernel hardening
	// (seccomp status, ENOSYS for clone3) only for backends without one, and
	// accept what the guest kernel contains (see guestContained).
	GuestKernel bool
	// Envd is a static envd binary. The suite then also starts sandboxes
	// with envd as their first process, as the sandbox manager does, and
	// checks what the processes envd starts see (EnvdSysinfo): sysinfo(2) is
	// answered by envd on the linux backend (internal/sysinfo), so a probe
	// run as the first process would not see it. Required: without it that
	// test fails.
	Envd string
	// NoCheckpoint says the backend does not implement runtime.Checkpointer
	// and runtime.Restorer; the checkpoint tests are then skipped instead of
	// failing.
	NoCheckpoint bool
	// Network says the backend's sandboxes work in a network namespace the
	// caller made (Spec.NetNS, as netpolicy makes for the sandbox manager);
	// the checkpoint tests then also pause and fork a sandbox with a TCP
	// server and an established loopback connection in one (NewNetwork
	// makes it, CheckpointInNetwork).
	Network bool
	// Rehome, if set, moves every process of the sandbox into child cgroups
	// of its own cgroup (as a backend that splits envd from user processes
	// does); the limits test then checks the views again.
	Rehome func(t *testing.T, sb runtime.Sandbox)
}

// probe is run as the sandbox's first process. It records facts about its
// environment under /out, signals it is done, then waits to be killed.
const probe = `
set +e
hostname > /out/hostname
echo $$ > /out/pid
ls /proc | grep -c '^[0-9]' > /out/nprocs
cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | sort | tr '\n' ' ' > /out/netdevs
readlink /proc/self/ns/net > /out/netns
readlink /proc/self/ns/mnt > /out/mntns
readlink /proc/self/ns/pid > /out/pidns
readlink /proc/self/ns/uts > /out/utsns
readlink /proc/self/ns/ipc > /out/ipcns
readlink /proc/self/ns/cgroup > /out/cgroupns
cat /proc/self/cgroup > /out/cgroup
echo written > /etc/airlock-probe
cat /etc/airlock-probe > /out/rootwrite 2>&1
test -e "$HOST_PATH/init.log" && echo visible > /out/hostmarker || echo hidden > /out/hostmarker
read line
echo "$line" > /out/stdin
touch /out/done
exec sleep 100000
`

// Run runs the conformance suite against h.
func Run(t *testing.T, h Harness) {
	t.Run("CreateIsolatedAndDestroy", func(t *testing.T) { testCreateIsolatedAndDestroy(t, h) })
	t.Run("LoadListAndDestroyIdempotent", func(t *testing.T) { testLoadList(t, h) })
	t.Run("PauseResume", func(t *testing.T) { testPauseResume(t, h) })
	t.Run("SignalInit", func(t *testing.T) { testSignalInit(t, h) })
	t.Run("StatsAndLimits", func(t *testing.T) { testStats(t, h) })
	t.Run("OwnLimitsVisible", func(t *testing.T) { testOwnLimits(t, h) })
	t.Run("EnvdSysinfo", func(t *testing.T) { testEnvdSysinfo(t, h) })
	t.Run("CreateFailsCleanly", func(t *testing.T) { testCreateFails(t, h) })
	t.Run("UpperKeptAfterDestroy", func(t *testing.T) { testUpperKept(t, h) })
	t.Run("EscapeAttemptsFail", func(t *testing.T) { testEscape(t, h) })
	t.Run("NeighboursInvisible", func(t *testing.T) { testNeighbours(t, h) })
	t.Run("Checkpoint", func(t *testing.T) { testCheckpoint(t, h) })
}

var seq int

func newSpec(t *testing.T, h Harness) (runtime.Spec, string) {
	t.Helper()
	seq++
	id := fmt.Sprintf("conf%d%d", time.Now().UnixNano()%1e9, seq)
	base := t.TempDir()
	out := filepath.Join(base, "out")
	if err := os.MkdirAll(out, 0o777); err != nil {
		t.Fatal(err)
	}
	return runtime.Spec{
		ID:       id,
		Hostname: "sbx-" + id,
		Lower:    h.Lower,
		Dir:      filepath.Join(base, "sandbox"),
		Mounts:   []runtime.Mount{{Source: out, Target: "/out"}},
		Init: runtime.Process{
			Args:    []string{"/bin/sh", "-c", probe},
			Env:     []string{"PATH=" + envdapi.DefaultPath, "HOST_PATH=" + base},
			Stdin:   []byte("hello-from-host\n"),
			LogPath: filepath.Join(base, "init.log"),
		},
		Resources: runtime.Resources{CPUs: 1, MemoryMB: 256, PidsMax: 256},
	}, out
}

func create(t *testing.T, r runtime.Runtime, spec runtime.Spec) runtime.Sandbox {
	t.Helper()
	sb, err := r.Create(context.Background(), spec)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	return sb
}

func waitFile(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if _, err := os.Stat(path); err == nil {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatalf("%s did not appear within 10s", path)
}

func read(t *testing.T, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, name))
	if err != nil {
		t.Fatalf("read %s: %v", name, err)
	}
	return strings.TrimSpace(string(b))
}

func hostNS(t *testing.T, kind string) string {
	t.Helper()
	s, err := os.Readlink("/proc/self/ns/" + kind)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func testCreateIsolatedAndDestroy(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := newSpec(t, h)
	sb := create(t, r, spec)
	waitFile(t, filepath.Join(out, "done"))

	if got := read(t, out, "hostname"); got != spec.Hostname {
		t.Errorf("hostname = %q, want %q", got, spec.Hostname)
	}
	if got := read(t, out, "pid"); got != "1" {
		t.Errorf("first process has pid %s inside, want 1 (own pid namespace)", got)
	}
	if n, _ := strconv.Atoi(read(t, out, "nprocs")); n > 5 {
		t.Errorf("sandbox sees %d processes; it must see only its own", n)
	}
	if got := read(t, out, "netdevs"); got != "lo" {
		t.Errorf("network devices = %q, want only lo (own network namespace)", got)
	}
	for _, ns := range []string{"net", "mnt", "pid", "uts", "ipc", "cgroup"} {
		if got := read(t, out, ns+"ns"); got == hostNS(t, ns) {
			t.Errorf("%s namespace is the host's (%s)", ns, got)
		}
	}
	if got := read(t, out, "stdin"); got != "hello-from-host" {
		t.Errorf("init stdin = %q, want the bytes from Spec.Init.Stdin", got)
	}
	if got := read(t, out, "rootwrite"); got != "written" {
		t.Errorf("writing /etc inside the sandbox: %q", got)
	}
	if got := read(t, out, "hostmarker"); got != "hidden" {
		t.Errorf("a host file (%s/init.log) is visible inside the sandbox", filepath.Dir(spec.Dir))
	}
	if _, err := os.Stat(filepath.Join(h.Lower, "etc", "airlock-probe")); err == nil {
		t.Fatalf("a write inside the sandbox reached the template")
	}
	if st, err := sb.Status(); err != nil || st != runtime.StatusRunning {
		t.Errorf("Status = %v, %v; want running", st, err)
	}

	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := os.Stat(spec.Dir); !os.IsNotExist(err) {
		t.Errorf("sandbox dir %s still exists after Destroy (err=%v)", spec.Dir, err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), spec.Dir) {
		t.Errorf("a mount under %s survived Destroy", spec.Dir)
	}
	// Backends may keep mount points outside Spec.Dir (the root, for one);
	// none named after the sandbox may survive either.
	if strings.Contains(string(mounts), spec.ID) {
		t.Errorf("a mount naming %s survived Destroy", spec.ID)
	}
	if _, err := r.Load(spec.ID); err == nil {
		t.Errorf("Load after Destroy succeeded; want not found")
	}
}

func testLoadList(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := newSpec(t, h)
	sb := create(t, r, spec)
	waitFile(t, filepath.Join(out, "done"))

	ids, err := r.List()
	if err != nil {
		t.Fatal(err)
	}
	if !contains(ids, spec.ID) {
		t.Fatalf("List = %v, missing %s", ids, spec.ID)
	}
	// A second backend instance stands for the daemon after a restart.
	again, err := h.New(t).Load(spec.ID)
	if err != nil {
		t.Fatalf("Load from a new backend instance: %v", err)
	}
	if st, err := again.Status(); err != nil || st != runtime.StatusRunning {
		t.Fatalf("reloaded Status = %v, %v", st, err)
	}
	if err := again.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy through the reloaded handle: %v", err)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Errorf("second Destroy must be a no-op, got %v", err)
	}
	if _, err := r.Load("nosuchsandbox"); err == nil {
		t.Errorf("Load of an unknown id succeeded")
	}
	ids, _ = r.List()
	if contains(ids, spec.ID) {
		t.Errorf("List still has %s after Destroy", spec.ID)
	}
}

func testPauseResume(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := newSpec(t, h)
	sb := create(t, r, spec)
	waitFile(t, filepath.Join(out, "done"))
	if err := sb.Pause(); err == runtime.ErrNotSupported {
		t.Skip("backend does not pause")
	} else if err != nil {
		t.Fatalf("Pause: %v", err)
	}
	if st, _ := sb.Status(); st != runtime.StatusPaused {
		t.Errorf("Status after Pause = %v", st)
	}
	if err := sb.Resume(); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	if st, _ := sb.Status(); st != runtime.StatusRunning {
		t.Errorf("Status after Resume = %v", st)
	}
	// A paused sandbox must also be destroyable.
	if err := sb.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy while paused: %v", err)
	}
}

func testStats(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := newSpec(t, h)
	sb := create(t, r, spec)
	waitFile(t, filepath.Join(out, "done"))
	st, err := sb.Stats()
	if err != nil {
		t.Fatalf("Stats: %v", err)
	}
	if st.MemoryLimit != spec.Resources.MemoryMB<<20 {
		t.Errorf("memory limit = %d, want %d", st.MemoryLimit, spec.Resources.MemoryMB<<20)
	}
	if st.MemoryUsed <= 0 || st.Pids < 1 || st.CPUUsage <= 0 {
		t.Errorf("implausible usage: %+v", st)
	}
	if st.WritableBytes <= 0 {
		t.Errorf("writable layer usage = %d; the probe wrote /etc/airlock-probe", st.WritableBytes)
	}
	cg := read(t, out, "cgroup")
	if !strings.Contains(cg, ":/\n") && !strings.HasSuffix(cg, ":/") {
		t.Errorf("sandbox sees a host cgroup path (want its own cgroup namespace rooted at /):\n%s", cg)
	}
}

func testCreateFails(t *testing.T, h Harness) {
	r := h.New(t)
	spec, _ := newSpec(t, h)
	spec.Init.Args = []string{"/no/such/binary"}
	sb, err := r.Create(context.Background(), spec)
	if err == nil {
		_ = sb.Destroy(context.Background())
		t.Fatalf("Create with a missing init binary succeeded")
	}
	if _, statErr := os.Stat(spec.Dir); !os.IsNotExist(statErr) {
		t.Errorf("failed Create left %s behind", spec.Dir)
	}
	if ids, _ := r.List(); contains(ids, spec.ID) {
		t.Errorf("failed Create left state for %s", spec.ID)
	}
}

// testUpperKept: with Spec.Upper set, the sandbox's writes land there (not in
// the template, not under Dir), and Destroy, also through a backend instance
// that only loaded the sandbox (a restart), removes Dir but leaves Upper.
func testUpperKept(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := newSpec(t, h)
	spec.Upper = filepath.Join(filepath.Dir(spec.Dir), "kept-upper")
	if err := os.Mkdir(spec.Upper, 0o755); err != nil {
		t.Fatal(err)
	}
	sb := create(t, r, spec)
	waitFile(t, filepath.Join(out, "done"))
	if b, err := os.ReadFile(filepath.Join(spec.Upper, "etc", "airlock-probe")); err != nil || strings.TrimSpace(string(b)) != "written" {
		t.Fatalf("the probe's write to /etc is not in Upper: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(spec.Dir, "upper", "etc", "airlock-probe")); err == nil {
		t.Errorf("the write also landed in <Dir>/upper")
	}
	st, err := sb.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.WritableBytes <= 0 {
		t.Errorf("WritableBytes = %d; Stats must measure Upper", st.WritableBytes)
	}
	again, err := h.New(t).Load(spec.ID)
	if err != nil {
		t.Fatalf("Load from a new backend instance: %v", err)
	}
	if err := again.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
	if _, err := os.Stat(spec.Dir); !os.IsNotExist(err) {
		t.Errorf("sandbox dir %s still exists after Destroy (err=%v)", spec.Dir, err)
	}
	if b, err := os.ReadFile(filepath.Join(spec.Upper, "etc", "airlock-probe")); err != nil || strings.TrimSpace(string(b)) != "written" {
		t.Errorf("Upper lost the sandbox's write after Destroy: %q, %v", b, err)
	}
	mounts, _ := os.ReadFile("/proc/self/mountinfo")
	if strings.Contains(string(mounts), spec.Upper) {
		t.Errorf("a mount referring to Upper survived Destroy")
	}

	// Upper inside Dir would be removed by Destroy: refused.
	bad, _ := newSpec(t, h)
	bad.Upper = filepath.Join(bad.Dir, "upper2")
	if sb, err := r.Create(context.Background(), bad); err == nil {
		_ = sb.Destroy(context.Background())
		t.Errorf("Create accepted an Upper inside Dir")
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}
