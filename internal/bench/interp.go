package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// InterpConfig says how much of the code interpreter to measure.
type InterpConfig struct {
	Config
	// RoundTrips is the number of runCode('1+1') in one warm context.
	RoundTrips int
	// Creates is the number of create + first runCode measured cold and warm.
	Creates int
}

// Interp measures the code interpreter over the wire calls @e2b/code-interpreter
// makes: POST /execute on port 49999 through the sandbox proxy, reading the NDJSON
// stream to end_of_execution. Baselines in the same run: the proxy's floor (envd
// /health) and what a cell costs without a kernel (python3 -c through
// commands.run).
func Interp(ctx context.Context, cfg InterpConfig) ([]Row, error) {
	c := newClient(cfg.Config)
	var rows []Row
	add := func(r Row) {
		rows = append(rows, r)
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "measured %s (%d samples)\n", r.Name, len(r.Samples))
		}
	}
	sb, err := c.create(ctx)
	if err != nil {
		return nil, err
	}
	defer c.kill(context.WithoutCancel(ctx), sb)
	// Warm-up: the default context exists (prewarmed) and has run once.
	if _, err := c.execute(ctx, sb, "1+1", "python"); err != nil {
		return nil, fmt.Errorf("warm-up: %w", err)
	}

	n := cfg.RoundTrips
	health := Row{Name: fmt.Sprintf("baseline: envd /health through the proxy, %d", n)}
	for i := 0; i < n; i++ {
		start := time.Now()
		if err := sb.Health(ctx); err != nil {
			return nil, err
		}
		health.Samples = append(health.Samples, time.Since(start))
	}
	add(health)
	shell := Row{Name: fmt.Sprintf("baseline: commands.run('python3 -c \"print(1+1)\"'), %d", min(n, 50))}
	for i := 0; i < min(n, 50); i++ {
		start := time.Now()
		if _, err := c.run(ctx, sb, `python3 -c "print(1+1)"`); err != nil {
			return nil, err
		}
		shell.Samples = append(shell.Samples, time.Since(start))
	}
	add(shell)
	for _, lang := range []struct{ name, code string }{{"python", "1+1"}, {"javascript", "1+1"}, {"bash", "echo 2"}} {
		r := Row{Name: fmt.Sprintf("runCode('%s') %s, warm context, %d", lang.code, lang.name, n)}
		for i := 0; i < n; i++ {
			start := time.Now()
			out, err := c.execute(ctx, sb, lang.code, lang.name)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", lang.name, err)
			}
			if !strings.Contains(out, "2") {
				return nil, fmt.Errorf("%s: unexpected output %q", lang.name, out)
			}
			r.Samples = append(r.Samples, time.Since(start))
		}
		add(r)
	}

	tti := func(name string, ready func() error) (Row, error) {
		r := Row{Name: fmt.Sprintf("%s, %d sequential", name, cfg.Creates)}
		for i := 0; i < cfg.Creates; i++ {
			if ready != nil {
				if err := ready(); err != nil {
					return r, err
				}
			}
			start := time.Now()
			sb, err := c.create(ctx)
			if err != nil {
				return r, err
			}
			_, err = c.execute(ctx, sb, "1+1", "python")
			d := time.Since(start)
			c.kill(context.WithoutCancel(ctx), sb)
			if err != nil {
				return r, err
			}
			r.Samples = append(r.Samples, d)
		}
		return r, nil
	}
	if cfg.SetWarmPool != nil {
		cfg.SetWarmPool(0)
	}
	r, err := tti("create "+cfg.Template+" + first runCode('1+1'), cold", nil)
	if err != nil {
		return nil, err
	}
	add(r)
	if cfg.SetWarmPool != nil && cfg.WarmCount != nil {
		cfg.SetWarmPool(2)
		fill := func() error {
			deadline := time.Now().Add(2 * time.Minute)
			for cfg.WarmCount() < 1 {
				if time.Now().After(deadline) {
					return errors.New("warm pool did not fill within 2 minutes")
				}
				time.Sleep(5 * time.Millisecond)
			}
			// A pooled sandbox counts once envd answers; give its kernels
			// the time they take to start, as a pool that has been idle has.
			time.Sleep(1500 * time.Millisecond)
			return nil
		}
		r, err := tti("create "+cfg.Template+" + first runCode('1+1'), warm pool", fill)
		cfg.SetWarmPool(0)
		if err != nil {
			return nil, err
		}
		add(r)
	}
	return rows, nil
}

// execute runs code through POST /execute and returns the text of its results
// and stdout; an error event is returned as an error.
func (c *client) execute(ctx context.Context, sb *e2bclient.Sandbox, code, language string) (string, error) {
	var out strings.Builder
	err := sb.Execute(ctx, e2bwire.ExecuteRequest{Code: code, Language: &language}, func(ev e2bclient.Event) error {
		switch ev.Type {
		case "result", "stdout":
			out.WriteString(ev.Text)
		case "error":
			return fmt.Errorf("execute: %s: %s", ev.Name, ev.Value)
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return out.String(), nil
}
