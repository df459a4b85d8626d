package teamstats

import (
	"context"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

func TestSampler(t *testing.T) {
	var now []sandbox.Info
	s := New(func(context.Context) ([]sandbox.Info, error) { return now, nil }, 5*time.Second)
	t0 := time.Date(2026, 11, 28, 9, 0, 0, 0, time.UTC)
	ctx := context.Background()
	now = []sandbox.Info{{ID: "a", Owner: "blue", State: sandbox.StateRunning}}
	s.Sample(ctx, t0) // the first sample counts no starts: it knows no before
	now = append(now, sandbox.Info{ID: "b", Owner: "blue", State: sandbox.StateRunning},
		sandbox.Info{ID: "c", Owner: "blue", State: sandbox.StatePaused},
		sandbox.Info{ID: "d", Owner: "red", State: sandbox.StateRunning})
	s.Sample(ctx, t0.Add(5*time.Second))
	now = now[1:] // a ends
	s.Sample(ctx, t0.Add(10*time.Second))

	got := s.Query("blue", t0, t0.Add(time.Minute))
	want := []Point{{t0, 1, 0}, {t0.Add(5 * time.Second), 2, 0.4}, {t0.Add(10 * time.Second), 1, 0}}
	if len(got) != len(want) {
		t.Fatalf("blue = %v", got)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("blue[%d] = %+v, want %+v", i, got[i], want[i])
		}
	}
	if red := s.Query("red", t0.Add(time.Second), t0.Add(time.Minute)); len(red) != 2 || red[0].StartRate != 0.2 {
		t.Errorf("red = %v", red)
	}
	s.Sample(ctx, t0.Add(Keep+6*time.Second))
	if old := s.Query("blue", t0, t0.Add(5*time.Second)); len(old) != 0 {
		t.Errorf("samples older than an hour kept: %v", old)
	}
}
