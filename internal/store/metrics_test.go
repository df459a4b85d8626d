package store

import (
	"context"
	"testing"
	"time"
)

// TestMetrics: samples come back by sandbox, within the window asked,
// oldest first, every field as written; pruning by age and deleting the
// sandbox's record take them.
func TestMetrics(t *testing.T) { forEachDB(t, testMetrics) }

func testMetrics(t *testing.T, open func() *DB) {
	s := open()
	ctx := context.Background()
	t0 := time.Unix(1800000000, 123)
	var ms []Metric
	for i := range 4 {
		ms = append(ms, Metric{SandboxID: "a", Time: t0.Add(time.Duration(3-i) * 5 * time.Second), CPUCount: 2, CPUUsedPct: 12.5 + float64(i),
			MemUsed: 1 << 20, MemTotal: 512 << 20, MemCache: 3, DiskUsed: 4 << 20, DiskTotal: 1 << 30})
	}
	ms = append(ms, Metric{SandboxID: "b", Time: t0, CPUCount: 1})
	if err := s.AddMetrics(ctx, ms); err != nil {
		t.Fatal(err)
	}
	got, err := s.Metrics(ctx, "a", time.Time{}, time.Time{})
	if err != nil || len(got) != 4 {
		t.Fatalf("metrics of a: %+v %v", got, err)
	}
	if !got[0].Time.Equal(t0) || got[0].CPUUsedPct != 15.5 || got[0].MemTotal != 512<<20 || got[0].DiskTotal != 1<<30 || got[0].MemCache != 3 {
		t.Fatalf("the oldest sample: %+v", got[0])
	}
	if got[3].CPUUsedPct != 12.5 {
		t.Fatalf("not oldest first: %+v", got)
	}
	if w, _ := s.Metrics(ctx, "a", t0.Add(5*time.Second), t0.Add(10*time.Second)); len(w) != 2 {
		t.Fatalf("a window of two samples: %+v", w)
	}
	if err := s.PruneMetrics(ctx, t0.Add(6*time.Second)); err != nil {
		t.Fatal(err)
	}
	if left, _ := s.Metrics(ctx, "a", time.Time{}, time.Time{}); len(left) != 2 {
		t.Fatalf("after pruning: %+v", left)
	}
	if left, _ := s.Metrics(ctx, "b", time.Time{}, time.Time{}); len(left) != 0 {
		t.Fatalf("b's old sample outlived the prune: %+v", left)
	}
	if err := s.Put(ctx, Sandbox{ID: "a", Metadata: map[string]string{}, EnvVars: map[string]string{}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if left, err := s.Metrics(ctx, "a", time.Time{}, time.Time{}); err != nil || len(left) != 0 {
		t.Fatalf("samples outlived their sandbox: %+v %v", left, err)
	}
}
