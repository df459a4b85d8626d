package bench

import (
	"context"
	"fmt"
	"sort"
	"time"
)

// CompareTemplates measures cold create (the REST call alone) and time to
// interactive (create + first commands.run) for each template, interleaved so
// that load drifting on a shared machine hits every template alike. The first
// template is the baseline the others' notes compare against: a template's size
// must not show in its create time, since sandboxes mount it and never copy it.
func CompareTemplates(ctx context.Context, cfg Config, templates []string, labels map[string]string, n int) ([]Row, error) {
	create := make([]Row, len(templates))
	tti := make([]Row, len(templates))
	clients := make([]*client, len(templates))
	for i, t := range templates {
		c := cfg
		c.Template = t
		clients[i] = newClient(c)
		create[i].Name = fmt.Sprintf("create %s (%s)", t, labels[t])
		tti[i].Name = fmt.Sprintf("TTI %s: create + first commands.run", t)
		// Warm-up: the first create of a template pays for page-cache misses.
		if _, err := clients[i].createAndRun(ctx, nil); err != nil {
			return nil, fmt.Errorf("warm-up %s: %w", t, err)
		}
	}
	for round := 0; round < n; round++ {
		for i, c := range clients {
			start := time.Now()
			sb, err := c.create(ctx)
			if err != nil {
				return nil, err
			}
			created := time.Since(start)
			code, err := c.run(ctx, sb, "true")
			total := time.Since(start)
			c.kill(context.WithoutCancel(ctx), sb)
			if err != nil {
				return nil, err
			}
			if code != 0 {
				return nil, fmt.Errorf("%s: true exited %d", templates[i], code)
			}
			create[i].Samples = append(create[i].Samples, created)
			tti[i].Samples = append(tti[i].Samples, total)
		}
		if cfg.Progress != nil && (round+1)%10 == 0 {
			fmt.Fprintf(cfg.Progress, "template comparison: %d/%d rounds\n", round+1, n)
		}
	}
	for i := 1; i < len(templates); i++ {
		create[i].Note = ratioNote(create[i].Samples, create[0].Samples, templates[0])
		tti[i].Note = ratioNote(tti[i].Samples, tti[0].Samples, templates[0])
	}
	var rows []Row
	rows = append(rows, create...)
	return append(rows, tti...), nil
}

// ratioNote says how a series' p50 compares with the baseline's.
func ratioNote(s, base []time.Duration, baseName string) string {
	p := func(x []time.Duration) time.Duration {
		x = append([]time.Duration(nil), x...)
		sort.Slice(x, func(i, j int) bool { return x[i] < x[j] })
		return Percentile(x, 50)
	}
	b := p(base)
	if b <= 0 {
		return ""
	}
	return fmt.Sprintf("p50 %.2fx %s", float64(p(s))/float64(b), baseName)
}
