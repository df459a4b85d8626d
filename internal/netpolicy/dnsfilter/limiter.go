package dnsfilter

import (
	"net/netip"
	"sync"
	"time"
)

// limiter bounds each source's query rate (token bucket) and in-flight
// queries, so one sandbox cannot starve the others or turn the forwarder
// into an amplifier against the upstreams.
type limiter struct {
	rate     float64 // tokens per second
	burst    float64
	inflight int

	mu      sync.Mutex
	sources map[netip.Addr]*bucket
	swept   time.Time
}

type bucket struct {
	tokens   float64
	last     time.Time
	inflight int
}

func newLimiter(rate float64, inflight int) *limiter {
	return &limiter{rate: rate, burst: 2 * rate, inflight: inflight, sources: make(map[netip.Addr]*bucket)}
}

// acquire takes a token and an in-flight slot for src at time now; done
// returns the slot.
func (l *limiter) acquire(src netip.Addr, now time.Time) (done func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.sweep(now)
	b := l.sources[src]
	if b == nil {
		if len(l.sources) >= maxSources {
			return nil, false
		}
		b = &bucket{tokens: l.burst, last: now}
		l.sources[src] = b
	}
	if el := now.Sub(b.last).Seconds(); el > 0 {
		b.tokens = min(l.burst, b.tokens+el*l.rate)
		b.last = now
	}
	if b.tokens < 1 || b.inflight >= l.inflight {
		return nil, false
	}
	b.tokens--
	b.inflight++
	return func() {
		l.mu.Lock()
		b.inflight--
		l.mu.Unlock()
	}, true
}

// sweep forgets idle sources whose bucket has refilled, at most once a
// minute, so the map holds only recently active sandboxes.
func (l *limiter) sweep(now time.Time) {
	if now.Sub(l.swept) < time.Minute {
		return
	}
	l.swept = now
	for src, b := range l.sources {
		refilled := b.tokens+now.Sub(b.last).Seconds()*l.rate >= l.burst
		if b.inflight == 0 && refilled {
			delete(l.sources, src)
		}
	}
}
