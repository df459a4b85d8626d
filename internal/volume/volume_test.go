package volume

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/diskquota"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// testEnv is a service over a real btrfs pool (a fresh 512 MiB image) and a
// real SQLite store, both removed when the test ends.
type testEnv struct {
	pool  *diskquota.Pool
	store *store.SQLite
	db    string
	svc   *Service
}

func newTestEnv(t *testing.T, opts Options) *testEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("AIRLOCK_TEST_REQUIRE") != "" {
			t.Fatal("needs root (AIRLOCK_TEST_REQUIRE is set)")
		}
		t.Skip("needs root")
	}
	tmp := t.TempDir()
	pool, err := diskquota.Open(filepath.Join(tmp, "img"), filepath.Join(tmp, "mnt"), 512<<20)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := pool.Close(true); err != nil {
			t.Error(err)
			_ = unix.Unmount(pool.MountPoint(), unix.MNT_DETACH)
		}
	})
	db := filepath.Join(tmp, "airlock.db")
	st, err := store.OpenSQLite(db)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	opts.Pool, opts.Store = pool, st
	opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	svc, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.Recover(context.Background()); err != nil {
		t.Fatal(err)
	}
	return &testEnv{pool: pool, store: st, db: db, svc: svc}
}

type mounts map[string][]string

func (m mounts) SandboxesMounting(id string) []string { return m[id] }

func TestCreateListGetDestroy(t *testing.T) {
	ctx := context.Background()
	e := newTestEnv(t, Options{})
	v, err := e.svc.Create(ctx, "k1", "data", 0)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != DefaultSize || !strings.HasPrefix(v.Token, "vol_") || v.Path != e.pool.VolumeDir(v.ID) {
		t.Fatalf("created %+v", v)
	}
	var st unix.Stat_t
	if err := unix.Stat(v.Path, &st); err != nil || st.Uid != 1000 || st.Gid != 1000 || st.Mode&0o777 != 0o755 {
		t.Fatalf("volume root: uid %d gid %d mode %o (%v)", st.Uid, st.Gid, st.Mode&0o777, err)
	}
	if _, err := e.svc.Create(ctx, "k1", "data", 0); !errors.Is(err, ErrExists) {
		t.Fatalf("duplicate name: %v", err)
	}
	other, err := e.svc.Create(ctx, "k2", "data", 0)
	if err != nil {
		t.Fatalf("same name for another owner: %v", err)
	}
	for _, bad := range []string{"", "a b", "../x", "x/y", ".hidden", "é", strings.Repeat("a", MaxNameLength+1)} {
		if _, err := e.svc.Create(ctx, "k1", bad, 0); !errors.Is(err, ErrInvalid) {
			t.Errorf("name %q: %v", bad, err)
		}
	}
	list, err := e.svc.List(ctx, "k1")
	if err != nil || len(list) != 1 || list[0].ID != v.ID {
		t.Fatalf("List(k1) = %+v, %v", list, err)
	}
	if _, err := e.svc.Get(ctx, "k1", other.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("another owner's volume: %v", err)
	}
	if got, err := e.svc.Get(ctx, "k1", v.ID); err != nil || got.Token != v.Token {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	// Tokens open their own volume only.
	if _, err := e.svc.Open(ctx, v.ID, TokenIs(v.Token)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ id, token string }{{v.ID, other.Token}, {other.ID, v.Token}, {v.ID, ""}, {"nope", v.Token}, {"nope", ""}} {
		if _, err := e.svc.Open(ctx, c.id, TokenIs(c.token)); !errors.Is(err, ErrToken) {
			t.Errorf("Open(%s, %.12s) = %v", c.id, c.token, err)
		}
	}
	if err := e.svc.Destroy(ctx, "k2", v.ID, false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("destroy by another owner: %v", err)
	}
	if err := e.svc.Destroy(ctx, "k1", v.ID, false); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("directory survived destroy: %v", err)
	}
	if err := e.svc.Destroy(ctx, "k1", v.ID, false); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second destroy: %v", err)
	}
	if _, err := e.svc.Open(ctx, v.ID, TokenIs(v.Token)); !errors.Is(err, ErrToken) {
		t.Fatalf("token of a destroyed volume: %v", err)
	}
	if _, err := e.svc.Create(ctx, "k1", "data", 0); err != nil {
		t.Fatalf("name reuse after destroy: %v", err)
	}
}

func TestSizesAndOwnerLimits(t *testing.T) {
	ctx := context.Background()
	e := newTestEnv(t, Options{DefaultSize: 8 << 20, MaxSize: 32 << 20, PerOwner: store.VolumeLimits{MaxCount: 3, MaxBytes: 48 << 20}})
	if _, err := e.svc.Create(ctx, "k", "big", 33<<20); !errors.Is(err, ErrInvalid) {
		t.Fatalf("above max: %v", err)
	}
	if _, err := e.svc.Create(ctx, "k", "tiny", 1000); !errors.Is(err, ErrInvalid) {
		t.Fatalf("below 1 MiB: %v", err)
	}
	if _, err := e.svc.Create(ctx, "k", "a", 32<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Create(ctx, "k", "b", 32<<20); !errors.Is(err, ErrNoSpace) || !strings.Contains(err.Error(), "48 MiB") {
		t.Fatalf("past total bytes: %v", err)
	}
	if _, err := e.svc.Create(ctx, "k", "b", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Create(ctx, "k", "c", 0); err != nil {
		t.Fatal(err)
	}
	if _, err := e.svc.Create(ctx, "k", "d", 1<<20); !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "at most 3 volumes") {
		t.Fatalf("past count: %v", err)
	}
	// Another key has its own allowance.
	if _, err := e.svc.Create(ctx, "k2", "d", 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Pool: e.pool, Store: e.store, DefaultSize: 64 << 20, MaxSize: 32 << 20}); err == nil {
		t.Fatal("a default above the maximum was accepted")
	}
}

// A full volume fails writes with the quota error, and frees room when files
// go.
func TestQuotaExhaustion(t *testing.T) {
	ctx := context.Background()
	e := newTestEnv(t, Options{})
	v, err := e.svc.Create(ctx, "k", "small", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(v.Path, "fill"))
	if err != nil {
		t.Fatal(err)
	}
	buf := bytes.Repeat([]byte{7}, 1<<20)
	var n int
	for n < 64 {
		if _, err = f.Write(buf); err == nil {
			err = f.Sync()
		}
		if err != nil {
			break
		}
		n++
	}
	f.Close()
	if !errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.ENOSPC) {
		t.Fatalf("wrote %d MiB into an 8 MiB volume; last error %v", n, err)
	}
	if n > 10 {
		t.Fatalf("wrote %d MiB into an 8 MiB volume", n)
	}
}

func TestDestroyRefusedWhileMounted(t *testing.T) {
	ctx := context.Background()
	e := newTestEnv(t, Options{})
	v, err := e.svc.Create(ctx, "k", "shared", 0)
	if err != nil {
		t.Fatal(err)
	}
	m := mounts{v.ID: {"sbx2", "sbx1"}}
	e.svc.SetMountChecker(m)
	err = e.svc.Destroy(ctx, "k", v.ID, false)
	var inUse *InUseError
	if !errors.As(err, &inUse) || !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), "sbx1, sbx2") {
		t.Fatalf("destroy of a mounted volume: %v", err)
	}
	if _, err := os.Stat(v.Path); err != nil {
		t.Fatalf("refused destroy removed the directory: %v", err)
	}
	// A lease (a mount on its way) refuses too, until released.
	delete(m, v.ID)
	got, release, err := e.svc.Acquire(ctx, "k", "shared") // by name
	if err != nil || got.ID != v.ID {
		t.Fatalf("Acquire by name = %+v, %v", got, err)
	}
	if err := e.svc.Destroy(ctx, "k", v.ID, false); !errors.Is(err, ErrInUse) {
		t.Fatalf("destroy during a lease: %v", err)
	}
	release()
	release() // twice is harmless
	if got, release, err := e.svc.Acquire(ctx, "k", v.ID); err != nil || got.Path != v.Path {
		t.Fatalf("Acquire by ID = %+v, %v", got, err)
	} else {
		release()
	}
	if _, _, err := e.svc.Acquire(ctx, "other", v.ID); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Acquire of another owner's volume: %v", err)
	}
	// force removes it anyway.
	m[v.ID] = []string{"sbx1"}
	if err := e.svc.Destroy(ctx, "k", v.ID, true); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(v.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("forced destroy left the directory: %v", err)
	}
}

// Recover undoes a create and finishes a destroy that a crash interrupted,
// and removes directories no record names; ready volumes stay whole.
func TestRecoverAfterCrash(t *testing.T) {
	ctx := context.Background()
	e := newTestEnv(t, Options{})
	kept, err := e.svc.Create(ctx, "k", "kept", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(kept.Path, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A create that died after its record and its directory, before ready.
	half := store.Volume{ID: "half-made", Owner: "k", Name: "half", Token: "t", SizeBytes: 1 << 20, State: store.VolumeCreating}
	if err := e.store.InsertVolume(ctx, half, store.VolumeLimits{}); err != nil {
		t.Fatal(err)
	}
	if err := e.pool.CreateVolume(half.ID, 1<<20); err != nil {
		t.Fatal(err)
	}
	// A create that died after its record only.
	if err := e.store.InsertVolume(ctx, store.Volume{ID: "rec-only", Owner: "k", Name: "rec", State: store.VolumeCreating}, store.VolumeLimits{}); err != nil {
		t.Fatal(err)
	}
	// A destroy that died after marking.
	gone, err := e.svc.Create(ctx, "k", "gone", 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.store.SetVolumeState(ctx, gone.ID, store.VolumeDeleting); err != nil {
		t.Fatal(err)
	}
	// A directory nothing names.
	if err := e.pool.CreateVolume("stray", 1<<20); err != nil {
		t.Fatal(err)
	}
	if err := e.svc.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	recs, err := e.store.ListVolumes(ctx, "")
	if err != nil || len(recs) != 1 || recs[0].ID != kept.ID {
		t.Fatalf("records after recover: %+v, %v", recs, err)
	}
	names, err := e.pool.Volumes()
	if err != nil || len(names) != 1 || names[0] != kept.ID {
		t.Fatalf("directories after recover: %v, %v", names, err)
	}
	if b, err := os.ReadFile(filepath.Join(kept.Path, "f")); err != nil || string(b) != "x" {
		t.Fatalf("kept volume's file: %q, %v", b, err)
	}
	// The names of the undone creates are free again.
	if _, err := e.svc.Create(ctx, "k", "half", 0); err != nil {
		t.Fatal(err)
	}
}

// Creates racing for one name: exactly one wins, the rest are told the name
// is taken, and one directory exists.
func TestConcurrentCreatesOfOneName(t *testing.T) {
	ctx := context.Background()
	e := newTestEnv(t, Options{})
	const n = 8
	errs := make(chan error, n)
	for range n {
		go func() {
			_, err := e.svc.Create(ctx, "k", "race", 1<<20)
			errs <- err
		}()
	}
	won := 0
	for range n {
		switch err := <-errs; {
		case err == nil:
			won++
		case !errors.Is(err, ErrExists):
			t.Errorf("a losing create: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d creates of one name succeeded", won)
	}
	if names, _ := e.pool.Volumes(); len(names) != 1 {
		t.Fatalf("volume store holds %v", names)
	}
}
