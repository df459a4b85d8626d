package store

import (
	"context"
	"testing"
	"time"
)

// TestTakeToken: a bucket gives its burst at once, then one token per
// interval; a refusal spends nothing and says when the next token comes;
// buckets are independent; a bucket whose rate changes goes on from its
// state.
func TestTakeToken(t *testing.T) { forEachDB(t, testTakeToken) }

func testTakeToken(t *testing.T, open func() *DB) {
	s := open()
	ctx := context.Background()
	t0 := time.Unix(1800000000, 0)
	take := func(bucket string, rate float64, burst int, at time.Time) (bool, time.Duration) {
		t.Helper()
		ok, wait, err := s.TakeToken(ctx, bucket, rate, burst, at)
		if err != nil {
			t.Fatal(err)
		}
		return ok, wait
	}
	// 10 a second, bursts of 3: three at once, the fourth refused.
	for i := range 3 {
		if ok, _ := take("a", 10, 3, t0); !ok {
			t.Fatalf("take %d of a burst of 3 refused", i+1)
		}
	}
	ok, wait := take("a", 10, 3, t0)
	if ok || wait != 100*time.Millisecond {
		t.Fatalf("the fourth at once: ok=%v wait=%v, want refused for 100ms", ok, wait)
	}
	// The refusal spent nothing: the token is there at exactly that time.
	if ok, wait := take("a", 10, 3, t0.Add(99*time.Millisecond)); ok || wait != time.Millisecond {
		t.Fatalf("1 ms early: ok=%v wait=%v", ok, wait)
	}
	if ok, _ := take("a", 10, 3, t0.Add(100*time.Millisecond)); !ok {
		t.Fatal("refused when the next token was due")
	}
	// Another bucket is full.
	if ok, _ := take("b", 10, 3, t0); !ok {
		t.Fatal("bucket b refused after a's use")
	}
	// Idle long enough, a bucket is full again, and no fuller than its burst.
	later := t0.Add(time.Hour)
	for i := range 3 {
		if ok, _ := take("a", 10, 3, later); !ok {
			t.Fatalf("after an hour, take %d refused", i+1)
		}
	}
	if ok, _ := take("a", 10, 3, later); ok {
		t.Fatal("after an hour, a bucket held more than its burst")
	}
	// No rate: no limit, and no bucket state.
	if ok, _ := take("c", 0, 0, t0); !ok {
		t.Fatal("a zero rate refused")
	}
}

// TestPostgresTokensAcrossReplicas: two replicas taking from one bucket at
// once spend exactly its burst between them.
func TestPostgresTokensAcrossReplicas(t *testing.T) {
	ctx := context.Background()
	dbs := replicas(t, 2)
	now := time.Now()
	const n, burst = 20, 5
	oks := make([]bool, n)
	errs := make([]error, n)
	together(n, func(i int) {
		// A rate so slow that no token comes back during the test.
		oks[i], _, errs[i] = dbs[i%2].TakeToken(ctx, "shared", 0.001, burst, now)
	})
	got := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if oks[i] {
			got++
		}
	}
	if got != burst {
		t.Fatalf("%d tokens spent through two replicas, want the burst of %d", got, burst)
	}
}
