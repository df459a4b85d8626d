package bench_test

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// The test binary is also the sandboxes' init (libcontainer re-executes it).
func init() { linux.MaybeInit() }

// TestPersistIdle runs `airlock bench persist`'s code once on real sandboxes
// with the idle rows alone (the memory-holding and capture rows take
// minutes), so that it cannot rot: every row measured, every pause's mode
// one the bench knows and consistent with what the sandbox still holds.
func TestPersistIdle(t *testing.T) {
	d := daemontest.Start(t, nil)
	res, err := bench.Persist(context.Background(), bench.PersistConfig{
		Manager: d.Manager, DataDir: d.Layout.Root,
		SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0], Keys: d.Keys,
		Base: "base", BaseRootfs: testenv.BaseRootfs(t),
		Iterations: 2,
	})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	bench.PrintPersist(&out, res)
	t.Logf("\n%s", out.String())

	rows := map[string]bench.Row{}
	for _, r := range res.Rows {
		rows[r.Name] = r
	}
	modes := []string{bench.ModeDisk, bench.ModeFrozen, bench.ModeFS}
	for _, name := range []string{"pause, idle base", "resume, idle base", "pause, memory=false, idle base", "resume, memory=false, idle base"} {
		r, ok := rows[name]
		if !ok {
			t.Fatalf("no row %q in %v", name, res.Rows)
		}
		if len(r.Samples) != 2 {
			t.Errorf("%s: %d samples, want 2", name, len(r.Samples))
		}
		if !containsAny(r.Note, modes) {
			t.Errorf("%s: note %q names no pause mode", name, r.Note)
		}
	}
	// memory=false keeps only the filesystem, whatever the runtime can save.
	if n := rows["pause, memory=false, idle base"].Note; !strings.Contains(n, bench.ModeFS+" 2/2") {
		t.Errorf("memory=false pauses: %q, want %s 2/2", n, bench.ModeFS)
	}
	ck, rs := rows["baseline: runc checkpoint, idle base"], rows["baseline: runc restore, idle base"]
	_, runcErr := exec.LookPath("runc")
	_, criuErr := exec.LookPath("criu")
	if runcErr == nil && criuErr == nil && (len(ck.Samples) != 2 || len(rs.Samples) != 2) {
		t.Errorf("runc baseline: %d checkpoints, %d restores, want 2 each: %s", len(ck.Samples), len(rs.Samples), ck.Note)
	}

	if len(res.Mem) != 3 {
		t.Fatalf("memory rows: %+v, want the noise baseline, idle and memory=false idle", res.Mem)
	}
	for _, m := range res.Mem[1:] {
		if m.N != 2 || m.Used <= 0 {
			t.Errorf("%s: n %d, used %d bytes: want 2 pauses of a sandbox using memory", m.Name, m.N, m.Used)
		}
		// A sandbox frozen in place keeps its memory in its cgroup; one
		// whose processes left the host keeps none there.
		frozen := strings.Contains(m.Modes, bench.ModeFrozen+" 2/2")
		if frozen != (m.Resident > 0) {
			t.Errorf("%s: %s, yet %d bytes resident once paused", m.Name, m.Modes, m.Resident)
		}
	}
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}
