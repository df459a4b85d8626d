package bench

import (
	"context"
	"fmt"
	"time"
)

// KeysConfig configures RunKeys.
type KeysConfig struct {
	Config
	// AddKeys fills the server's store with keys and teams and returns one
	// of the keys made; Added says how many keys and teams that is.
	AddKeys func(ctx context.Context) (key string, err error)
	Added   string
	// Creates and Commands are the creates, and the commands in one
	// sandbox, of each series.
	Creates, Commands int
}

// RunKeys times creates and command round trips with one key in the store,
// then with the store full of keys and teams: through one of the keys made
// and, interleaved with it one create at a time, through the first key
// again (what drift alone does to the same key in the same run).
func RunKeys(ctx context.Context, cfg KeysConfig) ([]Row, error) {
	first := newClient(cfg.Config)
	series := func(c *client, label string) ([]Row, error) {
		return c.keysSeries(ctx, label, cfg.Creates, cfg.Commands)
	}
	rows, err := series(first, "1 key in the store")
	if err != nil {
		return nil, err
	}
	key, err := cfg.AddKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("add keys: %w", err)
	}
	madeCfg := cfg.Config
	madeCfg.APIKey = key
	made := newClient(madeCfg)
	// One create and a few commands at a time, by each key in turn, so
	// that drift touches both series alike.
	var withMade, withFirst []Row
	for i := 0; i < cfg.Creates; i++ {
		cmds := cfg.Commands / cfg.Creates
		m, err := made.keysSeries(ctx, cfg.Added+", a key made", 1, cmds)
		if err != nil {
			return nil, err
		}
		f, err := first.keysSeries(ctx, cfg.Added+", the first key", 1, cmds)
		if err != nil {
			return nil, err
		}
		withMade, withFirst = merge(withMade, m), merge(withFirst, f)
	}
	return append(rows, append(withMade, withFirst...)...), nil
}

// merge appends b's samples to a's rows of the same position.
func merge(a, b []Row) []Row {
	if a == nil {
		return b
	}
	for i := range a {
		a[i].Samples = append(a[i].Samples, b[i].Samples...)
	}
	return a
}

// keysSeries is n creates (each sandbox killed after) and m commands in
// one sandbox, with this client's key.
func (c *client) keysSeries(ctx context.Context, label string, n, m int) ([]Row, error) {
	creates := Row{Name: "create, " + label}
	for range n {
		start := time.Now()
		sb, err := c.create(ctx)
		if err != nil {
			return nil, err
		}
		creates.Samples = append(creates.Samples, time.Since(start))
		c.kill(context.WithoutCancel(ctx), sb)
	}
	cmds := Row{Name: "commands.run, " + label}
	sb, err := c.create(ctx)
	if err != nil {
		return nil, err
	}
	defer c.kill(context.WithoutCancel(ctx), sb)
	for range m {
		start := time.Now()
		if code, err := c.run(ctx, sb, "true"); err != nil || code != 0 {
			return nil, fmt.Errorf("commands.run: exit %d, %v", code, err)
		}
		cmds.Samples = append(cmds.Samples, time.Since(start))
	}
	if c.cfg.Progress != nil && n > 1 {
		fmt.Fprintf(c.cfg.Progress, "%s: %d creates, %d commands\n", label, n, m)
	}
	return []Row{creates, cmds}, nil
}
