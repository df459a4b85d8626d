package dnsfilter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// upstreams forwards to the configured resolvers in order. A resolver that
// fails at the transport level (timeout, refused connection) is moved behind
// the healthy ones for upstreamDownFor, so a dead primary costs one timeout
// every few seconds instead of one per query.
type upstreams struct {
	addrs   []string
	timeout time.Duration

	mu        sync.Mutex
	downUntil map[string]time.Time
}

func newUpstreams(addrs []string, timeout time.Duration) *upstreams {
	return &upstreams{addrs: addrs, timeout: timeout, downUntil: make(map[string]time.Time)}
}

// order returns the upstreams to try: healthy ones in configured order,
// then the ones marked down (better a slow answer than none).
func (u *upstreams) order(now time.Time) []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]string, 0, len(u.addrs))
	var down []string
	for _, a := range u.addrs {
		if now.Before(u.downUntil[a]) {
			down = append(down, a)
		} else {
			out = append(out, a)
		}
	}
	return append(out, down...)
}

func (u *upstreams) mark(addr string, ok bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if ok {
		delete(u.downUntil, addr)
	} else {
		u.downUntil[addr] = time.Now().Add(upstreamDownFor)
	}
}

// exchange sends m to the first upstream that answers usefully. SERVFAIL
// and REFUSED move on to the next one (another resolver may do better) but
// do not mark the first down: they are often about the name, not the server.
func (u *upstreams) exchange(ctx context.Context, m *dns.Msg) (*dns.Msg, error) {
	var errs []error
	var last *dns.Msg
	for _, addr := range u.order(time.Now()) {
		if ctx.Err() != nil {
			errs = append(errs, ctx.Err())
			break
		}
		resp, err := u.exchangeOne(ctx, addr, m)
		if err != nil {
			u.mark(addr, false)
			errs = append(errs, err)
			continue
		}
		u.mark(addr, true)
		if resp.Rcode == dns.RcodeServerFailure || resp.Rcode == dns.RcodeRefused {
			last = resp
			errs = append(errs, fmt.Errorf("upstream %s: %s", addr, dns.RcodeToString[resp.Rcode]))
			continue
		}
		return resp, nil
	}
	if last != nil {
		// Every upstream that answered said SERVFAIL/REFUSED: relay that.
		return last, nil
	}
	if len(errs) == 0 {
		return nil, errors.New("no upstreams")
	}
	return nil, errors.Join(errs...)
}

// exchangeOne asks one upstream over UDP, then over TCP if the answer was
// truncated.
func (u *upstreams) exchangeOne(ctx context.Context, addr string, m *dns.Msg) (*dns.Msg, error) {
	resp, err := u.exchangeNet(ctx, "udp", addr, m)
	if err == nil && resp.Truncated {
		resp, err = u.exchangeNet(ctx, "tcp", addr, m)
	}
	if err != nil {
		return nil, fmt.Errorf("upstream %s: %w", addr, err)
	}
	return resp, nil
}

func (u *upstreams) exchangeNet(ctx context.Context, netw, addr string, m *dns.Msg) (*dns.Msg, error) {
	c := &dns.Client{Net: netw, Timeout: u.timeout, UDPSize: upstreamUDPSize}
	conn, err := c.DialContext(ctx, addr)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", netw, err)
	}
	defer conn.Close()
	// miekg/dns honours a context's deadline but not its cancellation;
	// closing the socket makes Server.Close interrupt a pending read.
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	resp, _, err := c.ExchangeWithConnContext(ctx, m, conn)
	if err != nil {
		return nil, fmt.Errorf("exchange over %s: %w", netw, err)
	}
	return resp, nil
}
