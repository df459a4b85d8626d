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
	for _, lang := range []struct{ name, code string }{{"python", "1+1"}, {"javascript", "1+1"}, {"bash", "echo 2"}, {"r", "1+1"}, {"java", "1+1"}} {
		r := Row{Name: fmt.Sprintf("runCode('%s') %s, warm context, %d", lang.code, lang.name, n)}
		// Warm-up: a language the template does not prewarm (r, java) starts its kernel here.
		if _, err := c.execute(ctx, sb, lang.code, lang.name); err != nil {
			return nil, fmt.Errorf("%s warm-up: %w", lang.name, err)
		}
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

	// First cell of a new context: the kernel's start (POST /contexts, as the SDK's
	// createCodeContext) plus its first runCode, in the running sandbox.
	for _, lang := range []string{"python", "r", "java"} {
		k := max(1, min(cfg.Creates, 10))
		r := Row{Name: fmt.Sprintf("createCodeContext(%s) + first runCode('1+1'), %d", lang, k)}
		for i := 0; i < k; i++ {
			start := time.Now()
			id, err := sb.CreateContext(ctx, lang, "")
			if err != nil {
				return nil, fmt.Errorf("%s context: %w", lang, err)
			}
			out, err := c.executeIn(ctx, sb, "1+1", id)
			d := time.Since(start)
			if derr := sb.DeleteContext(ctx, id); err == nil && derr != nil {
				err = derr
			}
			if err != nil {
				return nil, fmt.Errorf("%s first cell: %w", lang, err)
			}
			if !strings.Contains(out, "2") {
				return nil, fmt.Errorf("%s first cell: unexpected output %q", lang, out)
			}
			r.Samples = append(r.Samples, d)
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
	return c.executeReq(ctx, sb, e2bwire.ExecuteRequest{Code: code, Language: &language})
}

// executeIn is execute in a context made with CreateContext.
func (c *client) executeIn(ctx context.Context, sb *e2bclient.Sandbox, code, contextID string) (string, error) {
	return c.executeReq(ctx, sb, e2bwire.ExecuteRequest{Code: code, ContextID: &contextID})
}

func (c *client) executeReq(ctx context.Context, sb *e2bclient.Sandbox, req e2bwire.ExecuteRequest) (string, error) {
	var out strings.Builder
	err := sb.Execute(ctx, req, func(ev e2bclient.Event) error {
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
