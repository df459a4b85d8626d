package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLimit is a token bucket: Rate requests per second on average, bursts of
// up to Burst. A zero Rate means no limit.
type RateLimit struct {
	Rate  float64
	Burst int
}

// Limits bound what one API key may do, so that one runaway client (an agent in
// a retry loop, a leaked key) cannot starve the others or the machine.
type Limits struct {
	// Requests applies to every authenticated request.
	Requests RateLimit
	// Creates applies to sandbox creation on top of Requests: each one costs
	// tens of milliseconds of CPU, where a list or get costs microseconds.
	Creates RateLimit
}

// DefaultLimits are generous for one user's agents and still stop a loop.
var DefaultLimits = Limits{
	Requests: RateLimit{Rate: 200, Burst: 400},
	Creates:  RateLimit{Rate: 20, Burst: 40},
}

// TokenBuckets keep token buckets where every replica of the control plane
// takes from the same ones (store.DB.TakeToken): a key's requests count
// once whichever replica serves them.
type TokenBuckets interface {
	// TakeToken spends one token of the named bucket (rate a second,
	// bursts of burst), or none and says how long until one is there.
	TakeToken(ctx context.Context, bucket string, rate float64, burst int, now time.Time) (bool, time.Duration, error)
}

// keyLimiters holds one token bucket per API key. It is keyed by owner digest,
// and only authenticated keys reach it, so it grows with the configured keys,
// not with what clients send.
type keyLimiters struct {
	kind  string // names the shared buckets: kind + ":" + owner
	limit RateLimit
	// shared, when set, holds the buckets instead of byKey.
	shared TokenBuckets
	log    *slog.Logger
	mu     sync.Mutex
	byKey  map[string]*rate.Limiter
}

func newKeyLimiters(kind string, l RateLimit, shared TokenBuckets, log *slog.Logger) *keyLimiters {
	if l.Rate <= 0 {
		return nil
	}
	if l.Burst < 1 {
		l.Burst = max(1, int(math.Ceil(l.Rate)))
	}
	return &keyLimiters{kind: kind, limit: l, shared: shared, log: log, byKey: map[string]*rate.Limiter{}}
}

// take spends one token of owner's bucket. When the bucket is empty it spends
// nothing and says how long until a token is there.
func (k *keyLimiters) take(ctx context.Context, owner string, now time.Time) (ok bool, retryAfter time.Duration) {
	if k == nil {
		return true, 0
	}
	if k.shared != nil {
		return takeShared(ctx, k.shared, k.log, k.kind+":"+owner, k.limit.Rate, k.limit.Burst, now)
	}
	k.mu.Lock()
	l := k.byKey[owner]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(k.limit.Rate), k.limit.Burst)
		k.byKey[owner] = l
	}
	k.mu.Unlock()
	return spend(l, now)
}

// spend takes one token of l, or none and says how long until one is there.
func spend(l *rate.Limiter, now time.Time) (ok bool, retryAfter time.Duration) {
	r := l.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// tooManyRequests writes a 429 with Retry-After in whole seconds, rounded up
// (a client that waits that long is sure to find a token).
func tooManyRequests(w http.ResponseWriter, what string, l RateLimit, retryAfter time.Duration) {
	secs := max(1, int(math.Ceil(retryAfter.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeError(w, http.StatusTooManyRequests,
		fmt.Sprintf("rate limit exceeded: at most %g %s per second (bursts of %d) per API key; retry after %d s", l.Rate, what, l.Burst, secs))
}

// OwnerOf is the identity per-key limits and sandbox ownership use for an API
// key: a digest, so that the key itself is never stored or logged.
func OwnerOf(apiKey string) string {
	sum := sha256.Sum256([]byte(apiKey))
	return hex.EncodeToString(sum[:8])
}

type ownerKey struct{}

func withOwner(ctx context.Context, owner string) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

func ownerFrom(ctx context.Context) string {
	s, _ := ctx.Value(ownerKey{}).(string)
	return s
}

// takeShared takes a token of a shared bucket. A store that cannot answer
// lets the request through (and says so in the log): a rate limit guards
// the machine against a runaway client, and the request that follows needs
// the store anyway, which reports its own failure.
func takeShared(ctx context.Context, b TokenBuckets, log *slog.Logger, bucket string, rate float64, burst int, now time.Time) (bool, time.Duration) {
	ok, wait, err := b.TakeToken(ctx, bucket, rate, burst, now)
	if err != nil {
		log.Warn("rate limit: the shared bucket did not answer; letting the request through", "bucket", bucket, "err", err)
		return true, 0
	}
	return ok, wait
}

// takeRequest spends one of team's requests: from its own bucket when it
// has a rate of its own (TeamRate), else from the server's per-team one.
func (h *Handler) takeRequest(ctx context.Context, team string, now time.Time) (ok bool, retryAfter time.Duration) {
	own := 0.0
	if h.opts.TeamRate != nil {
		own = h.opts.TeamRate(team)
	}
	if own <= 0 {
		return h.requests.take(ctx, team, now)
	}
	burst := max(1, int(math.Ceil(own)))
	if h.opts.Buckets != nil {
		return takeShared(ctx, h.opts.Buckets, h.log, "team-requests:"+team, own, burst, now)
	}
	h.teamMu.Lock()
	l := h.teamRates[team]
	if l == nil {
		l = rate.NewLimiter(rate.Limit(own), burst)
		h.teamRates[team] = l
	} else if float64(l.Limit()) != own {
		l.SetLimitAt(now, rate.Limit(own))
		l.SetBurstAt(now, burst)
	}
	h.teamMu.Unlock()
	return spend(l, now)
}

// tooManyTeamRequests is tooManyRequests for the request rate, naming the
// team's own quota when it has one.
func (h *Handler) tooManyTeamRequests(w http.ResponseWriter, team string, wait time.Duration) {
	if h.opts.TeamRate == nil || h.opts.TeamRate(team) <= 0 {
		tooManyRequests(w, "requests", h.opts.Limits.Requests, wait)
		return
	}
	own := h.opts.TeamRate(team)
	secs := max(1, int(math.Ceil(wait.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeError(w, http.StatusTooManyRequests,
		fmt.Sprintf("quota of API requests reached: the team may make %g requests per second (bursts of %d), and has used them; retry after %d s",
			own, max(1, int(math.Ceil(own))), secs))
}
