package e2b

import (
	"context"
	"errors"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

const otherKey = "e2b_fedcba9876543210fedcba9876543210fedcba98"

func twoKeys(o *Options) {
	o.Authenticate = func(k string) bool { return k == testKey || k == otherKey }
}

func TestRateLimitPerKey(t *testing.T) {
	h, _ := newTestHandler(t, twoKeys, func(o *Options) {
		// A rate so low that no token comes back during the test.
		o.Limits = Limits{Requests: RateLimit{Rate: 0.01, Burst: 3}}
	})
	for i := range 3 {
		if rec := request(t, h, "GET", "/v2/sandboxes", ""); rec.Code != http.StatusOK {
			t.Fatalf("request %d within the burst: %d %s", i, rec.Code, rec.Body)
		}
	}
	rec := request(t, h, "GET", "/v2/sandboxes", "")
	checkError(t, rec, http.StatusTooManyRequests, "rate limit exceeded: at most 0.01 requests per second (bursts of 3) per API key; retry after 100 s")
	secs, err := strconv.Atoi(rec.Header().Get("Retry-After"))
	if err != nil || secs < 90 || secs > 101 {
		t.Fatalf("Retry-After = %q, want about 100 s for one token at 0.01/s", rec.Header().Get("Retry-After"))
	}
	// The other key has its own bucket.
	if rec := request(t, h, "GET", "/v2/sandboxes", "", "X-API-KEY", otherKey); rec.Code != http.StatusOK {
		t.Fatalf("other key was limited too: %d %s", rec.Code, rec.Body)
	}
	// A bad key is refused as unauthenticated before it can touch any bucket.
	checkError(t, request(t, h, "GET", "/v2/sandboxes", "", "X-API-KEY", "e2b_nope"), http.StatusUnauthorized, "Invalid API key")
}

func TestRateLimitRefills(t *testing.T) {
	h, _ := newTestHandler(t, func(o *Options) {
		o.Limits = Limits{Requests: RateLimit{Rate: 50, Burst: 1}}
	})
	if rec := request(t, h, "GET", "/v2/sandboxes", ""); rec.Code != http.StatusOK {
		t.Fatalf("first: %d", rec.Code)
	}
	rec := request(t, h, "GET", "/v2/sandboxes", "")
	if rec.Code != http.StatusTooManyRequests || rec.Header().Get("Retry-After") != "1" {
		t.Fatalf("second = %d, Retry-After %q; want 429 and a rounded-up 1 s", rec.Code, rec.Header().Get("Retry-After"))
	}
	time.Sleep(60 * time.Millisecond) // 3 token intervals: a token is back
	if rec := request(t, h, "GET", "/v2/sandboxes", ""); rec.Code != http.StatusOK {
		t.Fatalf("after refill: %d %s", rec.Code, rec.Body)
	}
}

func TestCreateRateLimitIsSeparate(t *testing.T) {
	h, m := newTestHandler(t, func(o *Options) {
		o.Limits = Limits{Requests: RateLimit{Rate: 1000, Burst: 1000}, Creates: RateLimit{Rate: 0.01, Burst: 2}}
	})
	for i := range 2 {
		if rec := request(t, h, "POST", "/v2/sandboxes", `{"templateID":"base"}`); rec.Code != http.StatusCreated {
			t.Fatalf("create %d: %d %s", i, rec.Code, rec.Body)
		}
	}
	rec := request(t, h, "POST", "/sandboxes", `{"templateID":"base"}`)
	checkError(t, rec, http.StatusTooManyRequests, "rate limit exceeded: at most 0.01 sandbox creations per second (bursts of 2) per API key; retry after 100 s")
	if rec.Header().Get("Retry-After") == "" {
		t.Fatal("429 without Retry-After")
	}
	if m.calls != 2 {
		t.Fatalf("manager saw %d creates, want the 2 allowed ones", m.calls)
	}
	// Other calls are not held back by the create bucket.
	if rec := request(t, h, "GET", "/v2/sandboxes", ""); rec.Code != http.StatusOK {
		t.Fatalf("list after create limit: %d", rec.Code)
	}
}

func TestCreatePassesOwnerDigest(t *testing.T) {
	h, m := newTestHandler(t, twoKeys)
	if rec := request(t, h, "POST", "/v2/sandboxes", `{"templateID":"base"}`); rec.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	first := m.lastCreate.Owner
	if rec := request(t, h, "POST", "/v2/sandboxes", `{"templateID":"base"}`, "X-API-KEY", otherKey); rec.Code != http.StatusCreated {
		t.Fatalf("create: %d %s", rec.Code, rec.Body)
	}
	second := m.lastCreate.Owner
	if first == "" || second == "" || first == second {
		t.Fatalf("owners %q and %q: want two distinct digests", first, second)
	}
	if strings.Contains(testKey, first) || first != OwnerOf(testKey) {
		t.Fatalf("owner %q must be the digest of the key, not part of it", first)
	}
}

// TestRateLimitSharedBuckets: two handlers (replicas) over one store take
// from the same buckets, so a key's burst is spent once between them; a
// store that cannot answer lets requests through rather than fail them.
func TestRateLimitSharedBuckets(t *testing.T) {
	db, err := store.OpenSQLite(filepath.Join(t.TempDir(), "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	shared := func(o *Options) {
		o.Limits = Limits{Requests: RateLimit{Rate: 0.01, Burst: 3}}
		o.Buckets = db
	}
	a, _ := newTestHandler(t, shared)
	b, _ := newTestHandler(t, shared)
	for i, h := range []http.Handler{a, b, a} {
		if rec := request(t, h, "GET", "/v2/sandboxes", ""); rec.Code != http.StatusOK {
			t.Fatalf("request %d within the shared burst: %d %s", i, rec.Code, rec.Body)
		}
	}
	for name, h := range map[string]http.Handler{"a": a, "b": b} {
		rec := request(t, h, "GET", "/v2/sandboxes", "")
		checkError(t, rec, http.StatusTooManyRequests, "rate limit exceeded: at most 0.01 requests per second (bursts of 3) per API key; retry after 100 s")
		if rec.Header().Get("Retry-After") == "" {
			t.Errorf("replica %s: no Retry-After", name)
		}
	}

	broken, _ := newTestHandler(t, func(o *Options) {
		o.Limits = Limits{Requests: RateLimit{Rate: 0.01, Burst: 1}}
		o.Buckets = failingBuckets{}
	})
	for i := range 3 {
		if rec := request(t, broken, "GET", "/v2/sandboxes", ""); rec.Code != http.StatusOK {
			t.Fatalf("request %d with the store down: %d %s", i, rec.Code, rec.Body)
		}
	}
}

type failingBuckets struct{}

func (failingBuckets) TakeToken(context.Context, string, float64, int, time.Time) (bool, time.Duration, error) {
	return false, 0, errors.New("connection refused")
}
