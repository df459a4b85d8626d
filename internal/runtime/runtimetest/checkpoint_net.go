package runtimetest

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// netServer runs beside the counter in the network tests: a TCP server on
// port 8000 that answers every line with a secret drawn at start (so only the
// same process, with the same memory, answers the same), and a client in the
// same process that keeps one loopback connection open and exchanges a line
// over it every 0.2 s, counting the exchanges in /out/pings. A restored
// connection keeps the count going; a broken one ends it.
const netServer = `
import os, socket, threading, time
secret = os.urandom(8).hex()
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind(("0.0.0.0", 8000))
srv.listen(16)
def serve(c):
    f = c.makefile("rw")
    for line in f:
        f.write(secret + "\n")
        f.flush()
def accept():
    while True:
        c, _ = srv.accept()
        threading.Thread(target=serve, args=(c,), daemon=True).start()
threading.Thread(target=accept, daemon=True).start()
open("/out/secret.tmp", "w").write(secret)
os.rename("/out/secret.tmp", "/out/secret")
cl = socket.create_connection(("127.0.0.1", 8000))
f = cl.makefile("rw")
n = 0
while True:
    f.write("ping\n")
    f.flush()
    if f.readline().strip() != secret:
        break
    n += 1
    open("/out/pings.tmp", "w").write(str(n))
    os.rename("/out/pings.tmp", "/out/pings")
    time.sleep(0.2)
`

// netSpec is a counter spec in a network of its own, with netServer
// started beside the counter; from: a fork's spec, restored from from's
// image.
func netSpec(t *testing.T, h Harness, from *runtime.Spec) (runtime.Spec, string, *Network) {
	t.Helper()
	var spec runtime.Spec
	var out string
	if from == nil {
		spec, out = counterSpec(t, h)
		spec.Init.Args = []string{"/bin/sh", "-c", "python3 -c '" + netServer + "' >/root/server.out 2>&1 &\n" + counter}
		// Made as the sandbox manager makes a new sandbox's: the veth
		// in the sandbox's own namespace (Spec.NetLink).
		n := NewUnlinkedNetwork(t)
		spec.NetNS, spec.NetLink = n.NetNS, n.Link
		return spec, out, n
	}
	// A restore: the veth waits in NetNS.
	spec, out = forkSpec(t, h, *from)
	spec.NetLink = nil
	n := NewNetwork(t)
	spec.NetNS = n.NetNS
	return spec, out, n
}

// readInt reads a number a sandbox wrote into a file of out (0 if none yet).
func readInt(out, name string) int {
	b, err := os.ReadFile(filepath.Join(out, name))
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
}

// waitPings waits until the in-sandbox client has exchanged more than after
// lines over its loopback connection, and returns the count.
func waitPings(t *testing.T, out string, after int) int {
	t.Helper()
	var n int
	testenv.Eventually(t, 60*time.Second, fmt.Sprintf("the loopback connection in %s to pass %d exchanges", out, after), func() bool {
		n = readInt(out, "pings")
		return n > after
	})
	return n
}

// askSecret asks the sandbox's server, over its network, for its secret.
func askSecret(t *testing.T, n *Network) string {
	t.Helper()
	c, err := n.Dial(8000)
	if err != nil {
		t.Fatalf("connect to the sandbox's server: %v", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Write([]byte("hello\n")); err != nil {
		t.Fatalf("ask the sandbox's server: %v", err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		t.Fatalf("the sandbox's server's answer: %v", err)
	}
	return strings.TrimSpace(line)
}

// testCheckpointInNetwork: a sandbox in a network namespace the caller made
// (Harness.Network), with a listening server and an established loopback
// connection, is checkpointed and restored into the same namespace (a pause)
// and, with LeaveRunning, into a new one (a fork): the connection carries on,
// and the server answers with the secret it drew before the checkpoint.
func testCheckpointInNetwork(t *testing.T, h Harness) {
	if !h.Network {
		t.Skip("the harness says the backend takes no network namespace (Harness.Network)")
	}
	r := h.New(t)
	spec, out, net := netSpec(t, h, nil)
	sb := create(t, r, spec)
	if got := net.Links.Load(); got != 1 {
		t.Fatalf("Create called Spec.NetLink %d times, want once", got)
	}
	before := waitCounter(t, out, 2)
	pings := waitPings(t, out, 2)
	secret := askSecret(t, net)
	if want, _ := os.ReadFile(filepath.Join(out, "secret")); secret != string(want) {
		t.Fatalf("the server answered %q, its secret is %q", secret, want)
	}

	// A fork first: the original keeps running.
	fork, forkOut, forkNet := netSpec(t, h, &spec)
	img := filepath.Join(t.TempDir(), "fork-image")
	if err := sb.Pause(); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	atFork := readInt(out, "pings")
	if err := checkpointer(t, sb).Checkpoint(context.Background(), runtime.CheckpointOptions{ImageDir: img, LeaveRunning: true}); err != nil {
		t.Fatalf("Checkpoint LeaveRunning in a network: %v", err)
	}
	copyDir(t, spec.Dir, fork.Dir)
	if err := sb.Resume(); err != nil {
		t.Fatalf("Resume after the checkpoint: %v", err)
	}
	forked := restore(t, r, fork, img)
	waitPings(t, out, pings)
	// The fork's client counts on from its memory of the checkpoint.
	waitPings(t, forkOut, atFork)
	if got := askSecret(t, forkNet); got != secret {
		t.Errorf("the fork's server answers %q, want the original's secret %q", got, secret)
	}
	if err := forked.Destroy(context.Background()); err != nil {
		t.Fatalf("Destroy the fork: %v", err)
	}

	// Then a pause: checkpoint, release, restore into the same namespace.
	img = filepath.Join(t.TempDir(), "image")
	if err := checkpointer(t, sb).Checkpoint(context.Background(), runtime.CheckpointOptions{ImageDir: img}); err != nil {
		t.Fatalf("Checkpoint in a network: %v", err)
	}
	at, _ := readCounter(out)
	atPings := readInt(out, "pings")
	if err := checkpointer(t, sb).Release(context.Background()); err != nil {
		t.Fatalf("Release: %v", err)
	}
	restore(t, r, spec, img)
	if got := net.Links.Load(); got != 1 {
		t.Fatalf("Spec.NetLink called %d times after a restore, want once (the Create's): a restore moves the veth from NetNS", got)
	}
	checkIntact(t, "restored in its network", before, waitCounter(t, out, at.I))
	waitPings(t, out, atPings)
	if got := askSecret(t, net); got != secret {
		t.Errorf("the restored server answers %q, want %q", got, secret)
	}
}
