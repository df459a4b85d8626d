package bench

import (
	"context"
	"fmt"
	"time"
)

// KubeConfig is the Kubernetes backend's bench: the same measurements on
// one box and on two replicas over Kubernetes, in one run.
type KubeConfig struct {
	// Box is a single-box server; Kube replica A's API with replica B's
	// proxy (a sandbox made by one replica, used through the other), and
	// Other replica B's API, for creates through both replicas at once.
	// Box and Kube need SetWarmPool and WarmCount.
	Box, Kube, Other Config
	// BoxName and KubeName label the rows.
	BoxName, KubeName string
	// Creates is each sequential series' length; Burst the creates started
	// at once, half through each replica, for creates per second.
	Creates, Burst int
}

// RunKube measures create + first command, cold (no warm pool) and warm
// (a pooled sandbox or Pod claimed), on one box and on Kubernetes, then
// creates per second through two replicas.
func RunKube(ctx context.Context, cfg KubeConfig) ([]Row, error) {
	var rows []Row
	add := func(r Row) {
		rows = append(rows, r)
		if p := cfg.Box.Progress; p != nil {
			fmt.Fprintf(p, "done: %s (%d samples)\n", r.Name, len(r.Samples))
		}
	}
	for _, side := range []struct {
		name string
		cfg  Config
	}{{cfg.BoxName, cfg.Box}, {cfg.KubeName, cfg.Kube}} {
		c := newClient(side.cfg)
		side.cfg.SetWarmPool(0)
		if err := waitWarm(ctx, side.cfg, func(n int) bool { return n == 0 }); err != nil {
			return rows, fmt.Errorf("%s: emptying the warm pool: %w", side.name, err)
		}
		cold, err := c.sequential(ctx, side.name+", cold (no warm pool)", cfg.Creates, nil)
		if err != nil {
			return rows, err
		}
		add(cold)
		side.cfg.SetWarmPool(2)
		warm, err := c.sequential(ctx, side.name+", warm pool claim", cfg.Creates, func() error {
			return waitWarm(ctx, side.cfg, func(n int) bool { return n >= 1 })
		})
		side.cfg.SetWarmPool(0)
		if err != nil {
			return rows, err
		}
		add(warm)
	}
	burst, err := createsThrough(ctx, cfg.KubeName, cfg.Burst, cfg.Kube, cfg.Other)
	if err != nil {
		return rows, err
	}
	add(burst)
	return rows, nil
}

// waitWarm waits until the warm count satisfies ok (two minutes at most:
// a Pod under gVisor takes a few seconds to become ready).
func waitWarm(ctx context.Context, cfg Config, ok func(int) bool) error {
	deadline := time.Now().Add(2 * time.Minute)
	for !ok(cfg.WarmCount()) {
		if time.Now().After(deadline) {
			return fmt.Errorf("the warm pool holds %d after 2 minutes", cfg.WarmCount())
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return nil
}

// createsThrough starts n creates + first commands at once, alternately
// through each config's API, and notes the creates per second.
func createsThrough(ctx context.Context, name string, n int, cfgs ...Config) (Row, error) {
	r := Row{Name: fmt.Sprintf("%s, %d concurrent creates through %d replicas", name, n, len(cfgs))}
	clients := make([]*client, len(cfgs))
	for i, cfg := range cfgs {
		clients[i] = newClient(cfg)
	}
	start := time.Now()
	var err error
	r.Samples, err = startAtOnce(ctx, n, func(i int) *client { return clients[i%len(clients)] })
	wall := time.Since(start)
	if err != nil {
		return r, fmt.Errorf("%s: %w", name, err)
	}
	r.Note = fmt.Sprintf("%.1f creates/s (all %d in %.2f s)", float64(n)/wall.Seconds(), n, wall.Seconds())
	return r, nil
}
