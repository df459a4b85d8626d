package bench

import (
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/airlock-sandbox/airlock/internal/timing"
)

// Phases is where the time of a series of creates went: each create's
// request as the client timed it, the server's own spans of it (its
// Server-Timing header: the manager's steps, and the runtime's as "rt.*"),
// what the request cost outside the handler (HTTP, JSON, auth, loopback),
// and the first command.
type Phases struct {
	creates int
	order   []string
	samples map[string][]time.Duration
}

// Phase names the client adds around the server's spans.
const (
	phaseRequest  = "create request (client)"
	phaseOutside  = "  outside the handler: HTTP, JSON, auth"
	phaseHandler  = "  in the handler (server total)"
	phaseFirstCmd = "first commands.run (client)"
)

func (p *Phases) add(name string, d time.Duration) {
	if p.samples == nil {
		p.samples = map[string][]time.Duration{}
	}
	if _, ok := p.samples[name]; !ok {
		p.order = append(p.order, name)
	}
	p.samples[name] = append(p.samples[name], d)
}

// addCreate records one create: request is the create's round trip at the
// client, spans the server's, firstCmd the first commands.run after it.
func (p *Phases) addCreate(request time.Duration, spans []timing.Span, firstCmd time.Duration) {
	p.creates++
	p.add(phaseRequest, request)
	var total time.Duration
	for _, s := range spans {
		if s.Name == "total" {
			total = s.D
		}
	}
	if total > 0 {
		p.add(phaseOutside, request-total)
		p.add(phaseHandler, total)
	}
	for _, s := range spans {
		if s.Name == "total" {
			continue
		}
		indent := "    "
		if strings.HasPrefix(s.Name, "rt.") {
			indent = "      "
		}
		p.add(indent+s.Name, s.D)
	}
	p.add(phaseFirstCmd, firstCmd)
}

// PrintBreakdown writes where the time of r's creates went: per phase its
// p50, its mean over every create (a phase some creates skip counts 0 for
// them) and that mean's share of the mean time to interactive. Indented
// phases are parts of the one above them.
func PrintBreakdown(w io.Writer, r Row) {
	p := r.Phases
	if p.creates == 0 || len(r.Samples) == 0 {
		return
	}
	var tti time.Duration
	for _, d := range r.Samples {
		tti += d
	}
	tti /= time.Duration(len(r.Samples))
	fmt.Fprintf(w, "\nWhere the time of %q goes (mean TTI %s ms):\n\n", r.Name, ms(tti))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "phase\tn\tp50 ms\tmean ms\tshare\t")
	for _, name := range p.order {
		s := append([]time.Duration(nil), p.samples[name]...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		var sum time.Duration
		for _, d := range s {
			sum += d
		}
		mean := sum / time.Duration(p.creates)
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.0f%%\t\n", name, len(s), ms(Percentile(s, 50)), ms(mean), 100*float64(mean)/float64(tti))
	}
	tw.Flush()
}
