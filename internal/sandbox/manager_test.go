package sandbox_test

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/airlock-sandbox/airlock/api/gen/process"
	"github.com/airlock-sandbox/airlock/api/gen/process/processconnect"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func init() { linux.MaybeInit() }

func TestMain(m *testing.M) { os.Exit(m.Run()) }

// rig is a real manager: libcontainer runtime, SQLite store, the built base
// template and the real envd binary, all under one temp data dir.
type rig struct {
	dataDir string
	db      *store.SQLite
	rt      *linux.Runtime
	tpl     sandbox.Template
	envd    string
}

func newRig(t *testing.T) *rig {
	t.Helper()
	testenv.NeedRoot(t)
	rootfs := testenv.BaseRootfs(t)
	dataDir := t.TempDir()
	db, err := store.OpenSQLite(filepath.Join(dataDir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	rt, err := linux.New(filepath.Join(dataDir, "runtime"), nil)
	if err != nil {
		t.Fatal(err)
	}
	return &rig{
		dataDir: dataDir, db: db, rt: rt, envd: testenv.EnvdBinary(t),
		tpl: sandbox.Template{
			ID: "base", Alias: "base", Rootfs: rootfs, CPUCount: 2, MemoryMB: 512,
			DiskSizeMB: 1024, DefaultUser: "user",
		},
	}
}

func (r *rig) Resolve(_ context.Context, name string) (sandbox.Template, error) {
	if name != "base" {
		return sandbox.Template{}, sandbox.ErrTemplateNotFound
	}
	return r.tpl, nil
}

// manager is a started manager over the rig.
func (r *rig) manager(t *testing.T, metricsEvery time.Duration) *sandbox.Manager {
	t.Helper()
	return r.newManager(t, metricsEvery, false)
}

func (r *rig) newManager(t *testing.T, metricsEvery time.Duration, readopt bool) *sandbox.Manager {
	t.Helper()
	m := sandbox.New(sandbox.Options{
		Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd,
		MaxTimeout: time.Hour, MetricsInterval: metricsEvery,
	})
	t.Cleanup(func() {
		m.KillAll(context.Background())
		m.Close()
	})
	if readopt {
		if err := m.Recover(context.Background()); err != nil {
			t.Fatalf("Recover: %v", err)
		}
	}
	m.Start()
	return m
}

// recovered is a started manager that first re-adopted what an earlier one
// left, as a server restart does.
func (r *rig) recovered(t *testing.T) *sandbox.Manager {
	t.Helper()
	return r.newManager(t, 0, true)
}

// run executes a command in the sandbox the way commands.run does.
func run(t *testing.T, m *sandbox.Manager, info sandbox.Info, cmd string) (string, int32) {
	t.Helper()
	tr, err := m.EnvdTransport(info.ID)
	if err != nil {
		t.Fatalf("EnvdTransport: %v", err)
	}
	return testenv.RunCommand(t, tr, info.AccessToken, cmd)
}

func create(t *testing.T, m *sandbox.Manager, timeout time.Duration) sandbox.Info {
	t.Helper()
	info, err := m.Create(context.Background(), sandbox.CreateRequest{
		Template: "base", Timeout: timeout, Secure: true,
		Metadata: map[string]string{"k": "v"}, EnvVars: map[string]string{"FOO": "bar"},
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	return info
}

func TestCreateRunKill(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, 0)
	info := create(t, m, time.Minute)
	if info.State != sandbox.StateRunning || len(info.ID) != 20 || info.AccessToken == "" {
		t.Fatalf("create returned %+v", info)
	}
	out, code := run(t, m, info, `echo "$FOO $(whoami) $HOME $E2B_SANDBOX_ID"`)
	if want := "bar user /home/user " + info.ID + "\n"; out != want || code != 0 {
		t.Fatalf("command output %q (exit %d), want %q", out, code, want)
	}
	if _, code := run(t, m, info, "exit 3"); code != 3 {
		t.Fatalf("exit code %d, want 3", code)
	}
	if err := m.Kill(context.Background(), info.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Get(context.Background(), info.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("Get after Kill: %v", err)
	}
	if err := m.Kill(context.Background(), info.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("second Kill: %v", err)
	}
	if _, err := os.Stat(filepath.Join(r.dataDir, "sandboxes", info.ID)); !os.IsNotExist(err) {
		t.Fatalf("sandbox dir survived kill: %v", err)
	}
	if _, err := r.db.Get(context.Background(), info.ID); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("record survived kill: %v", err)
	}
}

func TestCreateRejectsBadInput(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, 0)
	ctx := context.Background()
	if _, err := m.Create(ctx, sandbox.CreateRequest{Template: "nope", Timeout: time.Minute}); !errors.Is(err, sandbox.ErrTemplateNotFound) {
		t.Errorf("unknown template: %v", err)
	}
	if _, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: -time.Second}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("negative timeout: %v", err)
	}
	if _, err := m.Create(ctx, sandbox.CreateRequest{Template: "base", Timeout: 2 * time.Hour}); !errors.Is(err, sandbox.ErrInvalid) {
		t.Errorf("timeout above the maximum: %v", err)
	}
}

func TestTimeoutKills(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, 0)
	info := create(t, m, time.Minute)
	if err := m.SetTimeout(context.Background(), info.ID, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		_, err := m.Get(context.Background(), info.ID)
		_, statErr := os.Stat(filepath.Join(r.dataDir, "sandboxes", info.ID))
		if errors.Is(err, sandbox.ErrNotFound) && os.IsNotExist(statErr) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("sandbox (or its dir) still there 10 s after its end time")
}

func TestPauseConnect(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, 0)
	ctx := context.Background()
	info := create(t, m, time.Minute)
	run(t, m, info, "echo before > /tmp/state")
	if err := m.Pause(ctx, info.ID, sandbox.PauseOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Pause(ctx, info.ID, sandbox.PauseOptions{}); !errors.Is(err, sandbox.ErrConflict) {
		t.Fatalf("second Pause: %v", err)
	}
	if _, err := m.EnvdTransport(info.ID); err == nil {
		t.Fatalf("a paused sandbox still takes traffic")
	}
	got, resumed, err := m.Connect(ctx, info.ID, 2*time.Minute)
	if err != nil || !resumed || got.State != sandbox.StateRunning {
		t.Fatalf("Connect = %+v, %v, %v", got, resumed, err)
	}
	if out, _ := run(t, m, info, "cat /tmp/state"); out != "before\n" {
		t.Fatalf("state after resume: %q", out)
	}
	_, resumed, err = m.Connect(ctx, info.ID, time.Minute)
	if err != nil || resumed {
		t.Fatalf("Connect to a running sandbox: resumed=%v err=%v", resumed, err)
	}
}

func TestMetricsSampled(t *testing.T) {
	r := newRig(t)
	m := r.manager(t, 100*time.Millisecond)
	info := create(t, m, time.Minute)
	run(t, m, info, "head -c 3000000 /dev/urandom > /home/user/blob")
	time.Sleep(400 * time.Millisecond)
	ms, err := m.Metrics(context.Background(), info.ID, time.Time{}, time.Time{})
	if err != nil || len(ms) < 2 {
		t.Fatalf("Metrics = %d samples, %v", len(ms), err)
	}
	last := ms[len(ms)-1]
	if last.CPUCount != 2 || last.MemTotal != 512<<20 || last.MemUsed <= 0 || last.DiskTotal != 1024<<20 || last.DiskUsed < 3000000 {
		t.Fatalf("implausible sample: %+v", last)
	}
}

// TestRestartReadopts stands for `airlock serve` restarting: a second manager on
// the same store and runtime state takes over live sandboxes, reports dead and
// expired ones killed, and destroys runtime sandboxes that have no record.
func TestRestartReadopts(t *testing.T) {
	r := newRig(t)
	ctx := context.Background()
	first := sandbox.New(sandbox.Options{Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour})
	alive := create(t, first, time.Minute)
	expired := create(t, first, time.Minute)
	orphan := create(t, first, time.Minute)
	run(t, first, alive, "echo kept > /tmp/mark")
	first.Close() // the server stops; sandboxes keep running

	rec, _ := r.db.Get(ctx, expired.ID)
	rec.EndAt = time.Now().Add(-time.Second)
	if err := r.db.Put(ctx, rec); err != nil {
		t.Fatal(err)
	}
	if err := r.db.Delete(ctx, orphan.ID); err != nil {
		t.Fatal(err)
	}

	second := r.recovered(t)
	if out, _ := run(t, second, alive, "cat /tmp/mark"); out != "kept\n" {
		t.Fatalf("re-adopted sandbox lost state: %q", out)
	}
	if _, err := second.Get(ctx, expired.ID); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("expired sandbox was re-adopted: %v", err)
	}
	for _, id := range []string{expired.ID, orphan.ID} {
		if _, err := r.rt.Load(id); err == nil {
			t.Errorf("sandbox %s still exists in the runtime after Recover", id)
		}
		if _, err := os.Stat(filepath.Join(r.dataDir, "sandboxes", id)); !os.IsNotExist(err) {
			t.Errorf("sandbox dir of %s survived Recover", id)
		}
	}
}

// TestWarmPoolClaim checks that a sandbox taken from the warm pool gets the
// identity of its create request (env vars, token, id in its environment),
// that pooled sandboxes are invisible, and that Close destroys the pool.
func TestWarmPoolClaim(t *testing.T) {
	r := newRig(t)
	m := sandbox.New(sandbox.Options{Runtime: r.rt, Store: r.db, Templates: r, DataDir: r.dataDir, EnvdPath: r.envd, MaxTimeout: time.Hour})
	m.Start()
	closed := false
	t.Cleanup(func() {
		if !closed {
			m.KillAll(context.Background())
			m.Close()
		}
	})
	m.SetWarmPool(r.tpl, 2)
	deadline := time.Now().Add(20 * time.Second)
	for m.WarmCount("base") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("warm pool did not fill: %d ready", m.WarmCount("base"))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if list, _ := m.List(context.Background(), sandbox.ListFilter{}); len(list) != 0 {
		t.Fatalf("pooled sandboxes are listed: %v", list)
	}
	info := create(t, m, time.Minute)
	// The claimed sandbox outlives Close by design; destroy it even if the
	// test stops before the re-adopting manager below takes it over.
	t.Cleanup(func() {
		if sb, err := r.rt.Load(info.ID); err == nil {
			_ = sb.Destroy(context.Background())
		}
	})
	if m.WarmCount("base") > 1 {
		t.Fatalf("create did not take a pooled sandbox")
	}
	out, code := run(t, m, info, `echo "$FOO $E2B_SANDBOX_ID"`)
	if want := "bar " + info.ID + "\n"; out != want || code != 0 {
		t.Fatalf("claimed sandbox: output %q, want %q", out, want)
	}
	wrong := info
	wrong.AccessToken = "not-the-token"
	tr, _ := m.EnvdTransport(info.ID)
	c := processconnect.NewProcessClient(&http.Client{Transport: tr}, "http://envd", connect.WithProtoJSON())
	req := connect.NewRequest(&process.ListRequest{})
	req.Header().Set("X-Access-Token", wrong.AccessToken)
	if _, err := c.List(context.Background(), req); connect.CodeOf(err) != connect.CodeUnauthenticated {
		t.Fatalf("claimed sandbox accepted a wrong token: %v", err)
	}

	// Close destroys the pool but leaves the claimed sandbox for re-adoption.
	m.Close()
	closed = true
	if left := count(t, r.dataDir, nil).dirs; left != 1 {
		t.Fatalf("after Close %d sandbox dirs remain, want only the claimed one", left)
	}
	if _, err := r.rt.Load(info.ID); err != nil {
		t.Fatalf("claimed sandbox did not survive Close: %v", err)
	}
	r.recovered(t)
}
