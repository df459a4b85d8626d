package volumecontent

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/diskquota"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// An upload past a volume's quota answers 507 and leaves nothing behind;
// the volume takes writes again once room is made. Real btrfs pool, real
// volume service.
func TestFullVolume(t *testing.T) {
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
	st, err := store.OpenSQLite(filepath.Join(tmp, "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	svc, err := volume.New(volume.Options{Pool: pool, Store: st})
	if err != nil {
		t.Fatal(err)
	}
	v, err := svc.Create(context.Background(), "k", "small", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	h := New(svc, slog.New(slog.NewTextHandler(io.Discard, nil)))
	big := bytes.Repeat([]byte{1}, 32<<20)
	wantStatus(t, do(t, h, "PUT", "file", v.ID, v.Token, p("path", "/big"), bytes.NewReader(big)), 507, "is full: its quota is 8 MiB")
	es, err := os.ReadDir(v.Path)
	if err != nil || len(es) != 0 {
		t.Fatalf("a failed upload left %v (%v)", es, err)
	}
	// The space of the failed upload is free again.
	unix.Sync()
	wantStatus(t, do(t, h, "PUT", "file", v.ID, v.Token, p("path", "/fits"), bytes.NewReader(big[:4<<20])), 201, "")
	// Another volume's token does not open this one.
	other, err := svc.Create(context.Background(), "k", "other", 0)
	if err != nil {
		t.Fatal(err)
	}
	wantStatus(t, do(t, h, "GET", "file", v.ID, other.Token, p("path", "/fits"), nil), 403, "does not open")
}
