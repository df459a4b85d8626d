// Package teamstats keeps, for each team, its concurrent sandboxes and its
// sandbox start rate over the last hour: what GET /teams/{teamID}/metrics
// answers (E2B's TeamMetric). A Sampler reads the manager's list every
// interval; a sandbox counts as started in the interval its ID first
// appears in, so nothing on the create path pays for it.
package teamstats

import (
	"context"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Point is one sample of one team.
type Point struct {
	At         time.Time
	Concurrent int     // running sandboxes (paused ones excluded)
	StartRate  float64 // sandboxes started per second since the sample before
}

// Keep is how long samples are kept.
const Keep = time.Hour

// Sampler samples every team's sandboxes.
type Sampler struct {
	list     func(ctx context.Context) ([]sandbox.Info, error)
	interval time.Duration

	mu     sync.Mutex
	series map[string][]Point // by team, oldest first
	seen   map[string]bool    // sandbox IDs of the last sample
	first  bool
}

// New returns a sampler over list, sampling every interval.
func New(list func(ctx context.Context) ([]sandbox.Info, error), interval time.Duration) *Sampler {
	return &Sampler{list: list, interval: interval, series: map[string][]Point{}, seen: map[string]bool{}, first: true}
}

// Run samples until ctx ends.
func (s *Sampler) Run(ctx context.Context) {
	t := time.NewTicker(s.interval)
	defer t.Stop()
	s.Sample(ctx, time.Now())
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			s.Sample(ctx, now)
		}
	}
}

// Sample takes one sample at now.
func (s *Sampler) Sample(ctx context.Context, now time.Time) {
	infos, err := s.list(ctx)
	if err != nil {
		return
	}
	running := map[string]int{}
	started := map[string]int{}
	seen := make(map[string]bool, len(infos))
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, in := range infos {
		if in.Owner == "" {
			continue
		}
		seen[in.ID] = true
		if in.State == sandbox.StateRunning || in.State == sandbox.StateCreating {
			running[in.Owner]++
		}
		if !s.first && !s.seen[in.ID] {
			started[in.Owner]++
		}
		if _, ok := s.series[in.Owner]; !ok {
			s.series[in.Owner] = nil
		}
	}
	for team, pts := range s.series {
		pts = append(pts, Point{At: now, Concurrent: running[team], StartRate: float64(started[team]) / s.interval.Seconds()})
		i := 0
		for i < len(pts) && now.Sub(pts[i].At) > Keep {
			i++
		}
		s.series[team] = pts[i:]
	}
	s.seen, s.first = seen, false
}

// Query returns team's samples from start to end (inclusive), oldest first.
func (s *Sampler) Query(team string, start, end time.Time) []Point {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Point
	for _, p := range s.series[team] {
		if !p.At.Before(start) && !p.At.After(end) {
			out = append(out, p)
		}
	}
	return out
}
