// Package timing records where the time of one operation goes: named spans,
// carried in its context, that any layer the context reaches (the API handler,
// the manager, a runtime) adds to without knowing who reads them.
//
// The lifecycle: the one who wants the breakdown (the create handler) makes a
// Recorder and puts it in the context with With; each layer wraps a step in
// Start(ctx, name)…stop(); the owner reads Spans when the operation is over and
// reports them (as a Server-Timing header). Without a Recorder in the context
// Start costs one context lookup and records nothing, so layers call it
// unconditionally.
package timing

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"
)

// Span is one named step and how long it took. Steps of one name are summed:
// a retry loop reports its total.
type Span struct {
	Name string
	D    time.Duration
}

// Recorder collects the spans of one operation; safe for concurrent use (a
// step may run on another goroutine of the same operation).
type Recorder struct {
	mu    sync.Mutex
	spans []Span
}

type key struct{}

// With returns ctx carrying r.
func With(ctx context.Context, r *Recorder) context.Context {
	return context.WithValue(ctx, key{}, r)
}

// From returns the Recorder in ctx, or nil.
func From(ctx context.Context) *Recorder {
	r, _ := ctx.Value(key{}).(*Recorder)
	return r
}

// Start begins the step name of the operation ctx belongs to; the returned
// func ends it. With no Recorder in ctx both are no-ops.
func Start(ctx context.Context, name string) (stop func()) {
	r := From(ctx)
	if r == nil {
		return func() {}
	}
	begin := time.Now()
	return func() { r.Add(name, time.Since(begin)) }
}

// Add records d under name (summed with earlier spans of that name, which
// keep their first position).
func (r *Recorder) Add(name string, d time.Duration) {
	if r == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := range r.spans {
		if r.spans[i].Name == name {
			r.spans[i].D += d
			return
		}
	}
	r.spans = append(r.spans, Span{Name: name, D: d})
}

// Spans returns the steps recorded so far, in the order each name first
// ended.
func (r *Recorder) Spans() []Span {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Span(nil), r.spans...)
}

// ServerTiming renders spans as an HTTP Server-Timing header value
// (`name;dur=1.234, …`, milliseconds, as browsers' devtools show it). Names
// are tokens: anything else in one becomes '_'.
func ServerTiming(spans []Span) string {
	var b strings.Builder
	for i, s := range spans {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(token(s.Name))
		fmt.Fprintf(&b, ";dur=%.3f", float64(s.D)/float64(time.Millisecond))
	}
	return b.String()
}

// ParseServerTiming reads a Server-Timing header value back into spans; the
// entries without a dur are skipped, as are malformed ones.
func ParseServerTiming(v string) []Span {
	var out []Span
	for _, entry := range strings.Split(v, ",") {
		parts := strings.Split(strings.TrimSpace(entry), ";")
		if parts[0] == "" {
			continue
		}
		for _, p := range parts[1:] {
			k, val, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok || k != "dur" {
				continue
			}
			var ms float64
			if _, err := fmt.Sscanf(val, "%g", &ms); err != nil {
				continue
			}
			out = append(out, Span{Name: parts[0], D: time.Duration(ms * float64(time.Millisecond))})
		}
	}
	return out
}

// token keeps the characters RFC 9110 allows in a token.
func token(s string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		case strings.ContainsRune("!#$%&'*+-.^_`|~", r):
			return r
		}
		return '_'
	}, s)
}
