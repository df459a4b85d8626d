package gvisor_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/runtime/runtimetest"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func TestConformance(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedRunsc(t)
	lower := testenv.BaseRootfs(t)
	state := filepath.Join(t.TempDir(), "state")
	runtimetest.Run(t, runtimetest.Harness{
		Lower:       lower,
		GuestKernel: true,
		Envd:        testenv.EnvdBinary(t),
		New: func(t *testing.T) runtime.Runtime {
			r, err := gvisor.New(state, nil)
			if err != nil {
				t.Fatal(err)
			}
			return r
		},
	})
	// Every sandbox is gone, so runsc's shared null-netns pin must be too.
	if _, err := os.Lstat(filepath.Join(state, "null-netns")); !os.IsNotExist(err) {
		t.Errorf("runsc's null-netns pin survived the last sandbox (err=%v)", err)
	}
}

// TestJoinsNetNS gives a sandbox a prepared network namespace (Spec.NetNS) with
// a veth to a second namespace of the test's, and checks that gVisor's netstack
// takes the veth over: the sandbox sees the interface and reaches a listener in
// the peer namespace. No traffic leaves the two namespaces.
func TestJoinsNetNS(t *testing.T) {
	testenv.NeedRoot(t)
	testenv.NeedRunsc(t)
	lower := testenv.BaseRootfs(t)
	for _, tool := range []string{"ip", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("%s not on the host: %v", tool, err)
		}
	}
	tag := strconv.FormatInt(time.Now().UnixNano()%1e8, 36)
	sbNS, peerNS := "gvt-"+tag+"-s", "gvt-"+tag+"-p"
	vethS, vethP := "gvs"+tag, "gvp"+tag
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v: %s", args, err, out)
		}
	}
	t.Cleanup(func() {
		// Deleting the namespaces deletes the veth pair with them.
		_ = exec.Command("ip", "netns", "del", sbNS).Run()
		_ = exec.Command("ip", "netns", "del", peerNS).Run()
	})
	sh("netns", "add", sbNS)
	sh("netns", "add", peerNS)
	sh("link", "add", vethS, "netns", sbNS, "type", "veth", "peer", "name", vethP, "netns", peerNS)
	sh("-n", sbNS, "addr", "add", "10.231.7.1/30", "dev", vethS)
	sh("-n", peerNS, "addr", "add", "10.231.7.2/30", "dev", vethP)
	for _, ns := range [][2]string{{sbNS, vethS}, {peerNS, vethP}} {
		sh("-n", ns[0], "link", "set", "lo", "up")
		sh("-n", ns[0], "link", "set", ns[1], "up")
	}
	// The peer accepts one connection and records what it received.
	base := t.TempDir()
	got := filepath.Join(base, "peer-got")
	peer := exec.Command("ip", "netns", "exec", peerNS, "python3", "-c", `
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("10.231.7.2", 8080)); s.listen(1); s.settimeout(30)
c, _ = s.accept(); data = c.recv(100)
open(sys.argv[1], "wb").write(data)
`, got)
	if err := peer.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = peer.Process.Kill(); _ = peer.Wait() })

	r, err := gvisor.New(filepath.Join(base, "state"), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(base, "out")
	if err := os.MkdirAll(out, 0o777); err != nil {
		t.Fatal(err)
	}
	id := "netns" + tag
	sb, err := r.Create(context.Background(), runtime.Spec{
		ID: id, Hostname: "n", Lower: lower, Dir: filepath.Join(base, "sandbox"),
		Mounts: []runtime.Mount{{Source: out, Target: "/out"}},
		NetNS:  "/var/run/netns/" + sbNS,
		Init: runtime.Process{
			Args: []string{"/bin/sh", "-c", `
cat /proc/net/dev | tail -n +3 | cut -d: -f1 | tr -d ' ' | sort | tr '\n' ' ' > /out/netdevs
for i in 1 2 3 4 5 6 7 8 9 10; do
  python3 -c 'import socket; socket.create_connection(("10.231.7.2", 8080), timeout=2).sendall(b"hello-from-gvisor")' 2> /out/connerr && break
  sleep 0.3
done
touch /out/done
exec sleep 100000`},
			Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
		},
		Resources: runtime.Resources{CPUs: 1, MemoryMB: 256, PidsMax: 256},
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	t.Cleanup(func() { _ = sb.Destroy(context.Background()) })
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(filepath.Join(out, "done")); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sandbox's probe did not finish in 30 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	devs, _ := os.ReadFile(filepath.Join(out, "netdevs"))
	if !strings.Contains(string(devs), vethS) {
		t.Errorf("sandbox interfaces %q lack the veth %s of its namespace", devs, vethS)
	}
	_ = peer.Wait()
	b, err := os.ReadFile(got)
	if string(b) != "hello-from-gvisor" {
		connErr, _ := os.ReadFile(filepath.Join(out, "connerr"))
		t.Fatalf("peer received %q (%v); sandbox side: %s", b, err, connErr)
	}
	if err := sb.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy: %v", err)
	}
}

// TestTasksMax: the task limit a gVisor sandbox enforces inside is the host
// pids limit, lowered to what the memory pays for, never below minTasks; and
// the spec hands it to envd.
func TestTasksMax(t *testing.T) {
	for _, c := range []struct {
		mem, pids, want int64
	}{
		{512, 4096, 128},
		{512, 100, 100},
		{64, 4096, 128},
		{8192, 1024, 1024},
		{0, 4096, 4096},
		{2048, 0, 512},
		{0, 0, 0},
	} {
		if got := gvisor.TasksMax(runtime.Resources{MemoryMB: c.mem, PidsMax: c.pids}); got != c.want {
			t.Errorf("TasksMax(%d MiB, %d pids) = %d, want %d", c.mem, c.pids, got, c.want)
		}
	}
}
