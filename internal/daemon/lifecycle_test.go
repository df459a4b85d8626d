package daemon_test

import (
	"context"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// The runtime re-executes the test binary as each sandbox's first process.
func init() { linux.MaybeInit() }

// TestStartCloseLifecycle walks a data dir through the server's lifecycle: a
// Start that fails half-way (its API address taken) undoes what it did, so the
// next Start on the data dir works; a server closed without KillOnClose
// leaves its sandbox running, and the next server re-adopts it; a server
// closed with KillOnClose leaves no sandbox behind.
func TestStartCloseLifecycle(t *testing.T) {
	dataDir := t.TempDir()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	failed := daemon.New(daemon.Config{
		APIAddr: taken.Addr().String(), SandboxAddr: "127.0.0.1:0",
		DataDir: dataDir, TemplateDataDir: testenv.DataDir(), EnvdPath: testenv.EnvdBinary(t),
		MaxTimeout: time.Hour, Templates: []string{"base"}, APIKeys: []string{"k"},
	})
	if err := failed.Start(context.Background()); err == nil || !strings.Contains(err.Error(), "listen on "+taken.Addr().String()) {
		t.Fatalf("Start with its API address taken: %v", err)
	}
	select {
	case <-failed.Built():
	default:
		t.Fatal("Built blocks after a failed Start")
	}
	if err := failed.Close(); err != nil {
		t.Fatalf("Close after a failed Start: %v", err)
	}

	ctx := context.Background()
	first := daemontest.Start(t, func(c *daemon.Config) { c.DataDir = dataDir; c.KillOnClose = false })
	info, err := first.Manager.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: 10 * time.Minute})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if err := first.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	rt, err := linux.New(first.Layout.Runtime("linux"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // if the test stops before the next server kills it
		if sb, err := rt.Load(info.ID); err == nil {
			_ = sb.Destroy(context.Background())
		}
	})
	if ids, err := rt.List(); err != nil || !slices.Contains(ids, info.ID) {
		t.Fatalf("after a Close without KillOnClose the sandbox is gone: %v %v", ids, err)
	}

	second := daemontest.Start(t, func(c *daemon.Config) { c.DataDir = dataDir })
	got, err := second.Manager.Get(ctx, info.ID)
	if err != nil || got.State != sandbox.StateRunning {
		t.Fatalf("the next server did not re-adopt the sandbox: %+v %v", got, err)
	}
	out, code := testenv.RunCommand(t, mustTransport(t, second.Manager, info.ID), info.AccessToken, "echo adopted")
	if code != 0 || out != "adopted\n" {
		t.Fatalf("command in the re-adopted sandbox: %q exit %d", out, code)
	}
	if err := second.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if ids, err := rt.List(); err != nil || len(ids) != 0 {
		t.Fatalf("after a Close with KillOnClose sandboxes are left: %v %v", ids, err)
	}
}

func mustTransport(t *testing.T, m *sandbox.Manager, id string) http.RoundTripper {
	t.Helper()
	tr, err := m.EnvdTransport(id)
	if err != nil {
		t.Fatal(err)
	}
	return tr
}
