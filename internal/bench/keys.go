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
// Phase one's series holds twice the samples of each of phase two's.
func RunKeys(ctx context.Context, cfg KeysConfig) ([]Row, error) {
	first := newClient(cfg.Config)
	// Both phases run the same shape of work, one create and a few
	// commands at a time by each of two clients in turn, so that what
	// differs between them is the store alone; within a phase, drift
	// touches both clients alike.
	alternate := func(a, b *client, labelA, labelB string) (rowsA, rowsB []Row, err error) {
		cmds := max(1, cfg.Commands/cfg.Creates)
		for range cfg.Creates {
			ra, err := a.keysSeries(ctx, labelA, 1, cmds)
			if err != nil {
				return nil, nil, err
			}
			rb, err := b.keysSeries(ctx, labelB, 1, cmds)
			if err != nil {
				return nil, nil, err
			}
			rowsA, rowsB = merge(rowsA, ra), merge(rowsB, rb)
		}
		return rowsA, rowsB, nil
	}
	one, again, err := alternate(first, first, "1 key in the store", "1 key in the store")
	if err != nil {
		return nil, err
	}
	rows := merge(one, again)
	key, err := cfg.AddKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("add keys: %w", err)
	}
	madeCfg := cfg.Config
	madeCfg.APIKey = key
	withMade, withFirst, err := alternate(newClient(madeCfg), first, cfg.Added+", a key made", cfg.Added+", the first key")
	if err != nil {
		return nil, err
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
