package sandbox

import (
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/layout"
)

// pausedDiskBytes counts both places a pause leaves a sandbox on disk: its
// checkpoint image and its directory (without a disk pool, walked).
func TestPausedDiskBytes(t *testing.T) {
	data := t.TempDir()
	m := &Manager{opts: Options{DataDir: data}}
	dirs := layout.DataDir{Root: data}
	e := &entry{id: "sb1", dir: dirs.Sandbox("sb1")}
	write := func(path string, n int) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
			t.Fatal(err)
		}
		b := make([]byte, n)
		if _, err := rand.Read(b); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(e.dir, "upper", "home", "user", "f"), 2<<20)
	const slack = 256 << 10
	if got := m.pausedDiskBytes(e); got < 2<<20 || got > 2<<20+slack {
		t.Errorf("paused without an image: %d bytes, want 2 MiB (+%d at most)", got, slack)
	}
	write(filepath.Join(dirs.PausedMemory("sb1"), "pages-1.img"), 3<<20)
	if got := m.pausedDiskBytes(e); got < 5<<20 || got > 5<<20+slack {
		t.Errorf("paused with an image: %d bytes, want 5 MiB (+%d at most)", got, slack)
	}
}

// The paused disk quota refuses a pause once the team's paused sandboxes
// hold its limit, with ErrStorageLimit (an ErrLimit too) naming the quota,
// its limit and the use; running sandboxes, other teams' and the killed do
// not count.
func TestPausedDiskQuota(t *testing.T) {
	quota := Quota{Team: "tight", PausedDiskMB: 10}
	m := &Manager{sandboxes: map[string]*entry{}, opts: Options{Quota: func(string) Quota { return quota }}}
	add := func(id, owner string, st State, bytes int64) {
		e := &entry{id: id}
		e.info = Info{ID: id, Owner: owner, State: st, PausedDiskBytes: bytes}
		m.sandboxes[id] = e
	}
	add("p1", "t", StatePaused, 6<<20)
	add("r1", "t", StateRunning, 0)
	add("k1", "t", StateKilled, 50<<20)
	add("o1", "other", StatePaused, 50<<20)
	if err := m.checkPausedQuota("t"); err != nil {
		t.Fatalf("6 of 10 MiB held: %v", err)
	}
	// The pause that crosses the limit went through; the next is refused.
	add("p2", "t", StatePaused, 4<<20+1)
	err := m.checkPausedQuota("t")
	if !errors.Is(err, ErrStorageLimit) || !errors.Is(err, ErrLimit) {
		t.Fatalf("past the limit: %v, want ErrStorageLimit and ErrLimit", err)
	}
	for _, want := range []string{"paused sandboxes' disk", "team tight", "hold 11 MiB", "its limit is 10 MiB"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%q does not say %q", err, want)
		}
	}
	quota.PausedDiskMB = 0
	if err := m.checkPausedQuota("t"); err != nil {
		t.Errorf("without a disk quota: %v", err)
	}
	// The count quota is checked first, and stays a 429's ErrLimit.
	quota = Quota{Paused: 2, PausedDiskMB: 1}
	if err := m.checkPausedQuota("t"); !errors.Is(err, ErrLimit) || errors.Is(err, ErrStorageLimit) {
		t.Errorf("two paused of two: %v, want ErrLimit only", err)
	}
}
