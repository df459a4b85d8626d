package proxy

import (
	"context"
	"io"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Budget bounds the bytes the proxy copies for one sandbox, in both
// directions and over all of its requests together (envd, the code
// interpreter, user ports, upgraded connections).
//
// Why: the proxy runs in the server's process, outside every sandbox's
// cgroup, so the CPU it spends copying a sandbox's traffic is charged to no
// sandbox. A command printing as fast as it can (`cat /dev/zero` through
// commands.run) made the proxy and its client copy ~180 MiB/s, which took the
// host's CPUs from every other sandbox's round trip (issue 21: a neighbour's
// commands.run('true') went from 6.1 to 10.8 ms p50). A token bucket per
// sandbox makes that work proportional to a rate the operator chose; the
// stream is slowed, not cut, and the backpressure reaches the command
// (envd stops reading its pipe), so the sandbox's own CPU use drops too.
type Budget struct {
	// Rate is the sustained bytes per second; 0 means no budget.
	Rate int64
	// Burst is how many bytes may go through at once above Rate (a
	// sandbox that was quiet can send this much without waiting); at
	// least 64 KiB, twice the proxy's read buffer, is used.
	Burst int64
}

// DefaultBudget leaves interactive traffic untouched (a few MiB at once) and
// holds a sustained stream to about a sixth of what the proxy moved
// unmetered on the project machine (README: Neighbours under attack).
var DefaultBudget = Budget{Rate: 32 << 20, Burst: 8 << 20}

// budgets holds one token bucket per sandbox with traffic under way. A bucket
// is kept after its last request for as long as it takes to fill up again,
// so a sandbox cannot earn a fresh burst by ending one stream and starting
// the next.
type budgets struct {
	limit  rate.Limit
	burst  int
	refill time.Duration // how long an empty bucket takes to fill

	mu    sync.Mutex
	m     map[string]*bucket
	swept time.Time // the last look for buckets to forget
}

type bucket struct {
	lim   *rate.Limiter
	users int
	idle  time.Time // when users last dropped to 0
}

func newBudgets(b Budget) *budgets {
	if b.Rate <= 0 {
		return nil
	}
	burst := max(b.Burst, 64<<10)
	return &budgets{
		limit: rate.Limit(b.Rate), burst: int(burst),
		refill: time.Duration(float64(burst) / float64(b.Rate) * float64(time.Second)),
		m:      map[string]*bucket{},
	}
}

// acquire returns the bucket of sandbox id for one request; release gives it
// back when the request is done.
func (b *budgets) acquire(id string) *bucket {
	if b == nil {
		return nil
	}
	now := time.Now()
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.swept) > b.refill {
		// Lazily and at most once per refill time, so no goroutine is
		// needed and a request does not walk every sandbox's bucket: a
		// full bucket is the same as none.
		b.swept = now
		for k, bk := range b.m {
			if bk.users == 0 && now.Sub(bk.idle) > b.refill {
				delete(b.m, k)
			}
		}
	}
	bk := b.m[id]
	if bk == nil {
		bk = &bucket{lim: rate.NewLimiter(b.limit, b.burst)}
		b.m[id] = bk
	}
	bk.users++
	return bk
}

func (b *budgets) release(bk *bucket) {
	if b == nil || bk == nil {
		return
	}
	b.mu.Lock()
	bk.users--
	if bk.users == 0 {
		bk.idle = time.Now()
	}
	b.mu.Unlock()
}

// spend waits until n bytes fit the bucket. n above the burst is paid in
// burst-sized parts. It returns early only when ctx ends.
func (bk *bucket) spend(ctx context.Context, n int) error {
	if bk == nil {
		return nil
	}
	burst := bk.lim.Burst()
	for n > 0 {
		k := min(n, burst)
		if err := bk.lim.WaitN(ctx, k); err != nil {
			return err
		}
		n -= k
	}
	return nil
}

// meteredReader charges what it reads to a sandbox's bucket. The bytes are
// paid for after they are read and before they are handed on, so the rate
// holds on average whatever the size of each read.
type meteredReader struct {
	r   io.Reader
	bk  *bucket
	ctx context.Context
	// count, when set, is told the bytes read (Stats).
	count func(int)
}

func (m *meteredReader) Read(p []byte) (int, error) {
	n, err := m.r.Read(p)
	if n > 0 {
		if m.count != nil {
			m.count(n)
		}
		if werr := m.bk.spend(m.ctx, n); werr != nil && err == nil {
			// The bytes read are still delivered; the next Read fails.
			m.r = errReader{werr}
		}
	}
	return n, err
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// meteredBody is a response body charged to a sandbox's bucket.
type meteredBody struct {
	meteredReader
	rc io.ReadCloser
}

func (m *meteredBody) Close() error { return m.rc.Close() }

// meteredConn is an upgraded connection's upstream side (a WebSocket to a
// user port) charged to the bucket in both directions. ReverseProxy relays
// an upgrade only through an io.ReadWriteCloser body, which this stays.
type meteredConn struct {
	meteredBody
	w      io.Writer
	countW func(int)
}

func (m *meteredConn) Write(p []byte) (int, error) {
	if err := m.bk.spend(m.ctx, len(p)); err != nil {
		return 0, err
	}
	n, err := m.w.Write(p)
	if n > 0 && m.countW != nil {
		m.countW(n)
	}
	return n, err
}

// meter wraps a response body (or an upgraded connection) so that reading
// it spends bk and is counted by fromSandbox (writing to an upgraded
// connection: toSandbox); with neither a bucket nor counters it leaves it
// as it is.
func meter(ctx context.Context, body io.ReadCloser, bk *bucket, fromSandbox, toSandbox func(int)) io.ReadCloser {
	if bk == nil && fromSandbox == nil {
		return body
	}
	mb := meteredBody{meteredReader: meteredReader{r: body, bk: bk, ctx: ctx, count: fromSandbox}, rc: body}
	if rwc, ok := body.(io.ReadWriteCloser); ok {
		return &meteredConn{meteredBody: mb, w: rwc, countW: toSandbox}
	}
	return &mb
}
