package kube

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// MetricsStore keeps the sandboxes' samples where every replica reads
// them (store.DB).
type MetricsStore interface {
	AddMetrics(ctx context.Context, ms []store.Metric) error
	Metrics(ctx context.Context, sandboxID string, start, end time.Time) ([]store.Metric, error)
	PruneMetrics(ctx context.Context, before time.Time) error
}

// Sampling: how often the reconciling replica samples every sandbox (as
// one box does), how many at once, and how long samples are kept.
const (
	SampleEvery     = 5 * time.Second
	sampleParallel  = 16
	metricsKeptFor  = 24 * time.Hour
	sampleReadLimit = 64 << 10
)

// envdMetrics is what envd's GET /metrics answers (internal/envd).
type envdMetrics struct {
	CPUCount   int     `json:"cpu_count"`
	CPUUsedPct float64 `json:"cpu_used_pct"`
	MemTotal   int64   `json:"mem_total"`
	MemUsed    int64   `json:"mem_used"`
	MemCache   int64   `json:"mem_cache"`
}

// Sample asks every running sandbox's envd for its use and writes one
// sample each. envd measures CPU between two of its answers, so one
// sampler at a time (the reconciler) keeps the periods even. Disk used is
// not measured: under gVisor a Pod's writable layer lives in its memory,
// and counts there.
func (b *Backend) Sample(ctx context.Context) error {
	if b.Samples == nil {
		return nil
	}
	recs, err := b.Records.List(ctx)
	if err != nil {
		return fmt.Errorf("listing records: %w", err)
	}
	var (
		mu  sync.Mutex
		out []store.Metric
		wg  sync.WaitGroup
	)
	sem := make(chan struct{}, sampleParallel)
	for _, r := range recs {
		if r.State != string(sandbox.StateRunning) {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			m, err := b.sampleOne(ctx, r)
			if err != nil {
				b.log().Debug("sampling a sandbox", "sandbox", r.ID, "err", err)
				return
			}
			mu.Lock()
			out = append(out, m)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return errors.Join(b.Samples.AddMetrics(ctx, out), b.Samples.PruneMetrics(ctx, b.now().Add(-metricsKeptFor)))
}

func (b *Backend) sampleOne(ctx context.Context, r store.Sandbox) (store.Metric, error) {
	rt, err := b.route(r.ID)
	if err != nil {
		return store.Metric{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://envd/metrics", nil)
	if rt.token != "" {
		req.Header.Set("X-Access-Token", rt.token)
	}
	res, err := rt.envd.RoundTrip(req)
	if err != nil {
		return store.Metric{}, err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return store.Metric{}, fmt.Errorf("envd /metrics: %s", res.Status)
	}
	var em envdMetrics
	if err := json.NewDecoder(http.MaxBytesReader(nil, res.Body, sampleReadLimit)).Decode(&em); err != nil {
		return store.Metric{}, fmt.Errorf("envd /metrics: %w", err)
	}
	memTotal := em.MemTotal
	if limit := int64(r.MemoryMB) << 20; memTotal <= 0 || memTotal > limit {
		memTotal = limit
	}
	return store.Metric{
		SandboxID: r.ID, Time: b.now(), CPUCount: r.CPUCount, CPUUsedPct: min(max(em.CPUUsedPct, 0), 100),
		MemUsed: em.MemUsed, MemTotal: memTotal, MemCache: em.MemCache, DiskTotal: int64(r.DiskSizeMB) << 20,
	}, nil
}

// Metrics returns a sandbox's samples from start to end.
func (b *Backend) Metrics(ctx context.Context, id string, start, end time.Time) ([]sandbox.Metric, error) {
	if _, err := b.record(ctx, id); err != nil {
		return nil, err
	}
	if b.Samples == nil {
		return nil, errNotSupported("metrics")
	}
	ms, err := b.Samples.Metrics(ctx, id, start, end)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.Metric, 0, len(ms))
	for _, m := range ms {
		out = append(out, sandbox.Metric{Time: m.Time, CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct, MemUsed: m.MemUsed,
			MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal})
	}
	return out, nil
}
