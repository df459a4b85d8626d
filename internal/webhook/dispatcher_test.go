package webhook

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// fakeFeed is an in-memory lifecycle.Feed: the events engineer's store is
// the real one.
type fakeFeed struct {
	mu     sync.Mutex
	events []lifecycle.Event
	notify chan struct{}
}

func newFeed() *fakeFeed { return &fakeFeed{notify: make(chan struct{}, 1)} }

func (f *fakeFeed) add(owner, sandbox, typ string) lifecycle.Event {
	f.mu.Lock()
	e := lifecycle.Event{
		Version: lifecycle.Version, Type: typ, SandboxID: sandbox, SandboxTeamID: owner,
		SandboxExecutionID: "exec-" + sandbox, SandboxTemplateID: "base", SandboxBuildID: "build",
		Timestamp: time.Now().UTC(), Seq: int64(len(f.events) + 1),
	}
	e.ID = fmt.Sprintf("event-%d", e.Seq)
	f.events = append(f.events, e)
	f.mu.Unlock()
	select {
	case f.notify <- struct{}{}:
	default:
	}
	return e
}

func (f *fakeFeed) After(_ context.Context, after int64, limit int) ([]lifecycle.Event, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []lifecycle.Event
	for _, e := range f.events {
		if e.Seq > after && len(out) < limit {
			out = append(out, e)
		}
	}
	return out, nil
}

func (f *fakeFeed) Notify() <-chan struct{} { return f.notify }

// received is one request a receiver got, and what it answered.
type received struct {
	header http.Header
	body   []byte
	event  lifecycle.Event
	status int
}

// receiver is an HTTP server on loopback that records every request and
// answers with what answer says (200 when nil).
type receiver struct {
	srv    *httptest.Server
	mu     sync.Mutex
	got    []received
	answer func(e lifecycle.Event, n int) int // n: earlier requests for the same event
}

func newReceiver(t *testing.T) *receiver {
	t.Helper()
	rc := &receiver{}
	rc.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var e lifecycle.Event
		_ = json.Unmarshal(body, &e)
		rc.mu.Lock()
		n := 0
		for _, g := range rc.got {
			if g.event.ID == e.ID {
				n++
			}
		}
		status := http.StatusOK
		if rc.answer != nil {
			status = rc.answer(e, n)
		}
		rc.got = append(rc.got, received{header: r.Header.Clone(), body: body, event: e, status: status})
		rc.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(rc.srv.Close)
	return rc
}

func (rc *receiver) requests() []received {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]received(nil), rc.got...)
}

// delivered are the events answered with a 2xx, in the order they came.
func (rc *receiver) delivered() []lifecycle.Event {
	var out []lifecycle.Event
	for _, g := range rc.requests() {
		if g.status/100 == 2 {
			out = append(out, g.event)
		}
	}
	return out
}

func openStore(t *testing.T, dir string) *store.SQLite {
	t.Helper()
	st, err := store.OpenSQLite(filepath.Join(dir, "airlock.db"))
	if err != nil {
		t.Fatal(err)
	}
	// Before start's cleanup in the list, so after it in time: the
	// dispatcher stops before its store closes.
	t.Cleanup(func() { st.Close() })
	return st
}

var hookN atomic.Int64

func addWebhook(t *testing.T, st *store.SQLite, owner, url, secret string, events ...string) store.Webhook {
	t.Helper()
	now := time.Now().Add(-time.Second)
	w := store.Webhook{
		ID: fmt.Sprintf("%08d-0000-4000-8000-000000000000", hookN.Add(1)), Owner: owner, Name: "test",
		URL: url, Enabled: true, Events: events, Secret: secret, CreatedAt: now, UpdatedAt: now,
	}
	if err := st.PutWebhook(context.Background(), w); err != nil {
		t.Fatal(err)
	}
	return w
}

func start(t *testing.T, opts Options) *Dispatcher {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	d := New(opts)
	d.Start()
	t.Cleanup(func() { _ = d.Close() })
	return d
}

// eventually polls cond until it holds or the time is up.
func eventually(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func ids(es []lifecycle.Event) []string {
	out := make([]string, len(es))
	for i, e := range es {
		out[i] = e.ID
	}
	return out
}

// e2bVector is E2BSignature("my-secret", `{"id":"e1"}`) as openssl computes it.
const e2bVector = "Lm5h1rBFphbEBdrffK7Izr0j8I1ly_AkQKno3QmOiYA"

// TestSignatureVectors pins both signatures to values computed by other
// tools (openssl), so a change in either is seen.
func TestSignatureVectors(t *testing.T) {
	// printf '%s' 'my-secret{"id":"e1"}' | openssl dgst -sha256 -binary | basenc --base64url | tr -d =
	if got, want := E2BSignature("my-secret", []byte(`{"id":"e1"}`)), e2bVector; got != want {
		t.Errorf("E2BSignature = %q, want %q", got, want)
	}
	// The Standard Webhooks specification's own example.
	key := SWKey("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
	got := SWSignature(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", time.Unix(1614265330, 0), []byte(`{"test": 2432232314}`))
	if want := "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="; got != want {
		t.Errorf("SWSignature = %q, want %q", got, want)
	}
	// A free-form secret (E2B's) is the HMAC key as it is.
	if k := SWKey("plain secret"); string(k) != "plain secret" {
		t.Errorf("SWKey(plain) = %q", k)
	}
	if k := SWKey("whsec_not base64!"); string(k) != "whsec_not base64!" {
		t.Errorf("SWKey(whsec_ with no base64) = %q, want the raw secret", k)
	}
}

// TestDeliver: a subscribed owner's events reach its webhook, signed both
// ways, with the headers E2B documents; unsubscribed types and other owners'
// events do not.
func TestDeliver(t *testing.T) {
	st := openStore(t, t.TempDir())
	feed, rc := newFeed(), newReceiver(t)
	hook := addWebhook(t, st, "owner-a", rc.srv.URL+"/hook", "s3cret", lifecycle.Created, lifecycle.Killed)
	start(t, Options{Store: st, Feed: feed, AllowPrivate: true})

	created := feed.add("owner-a", "sbx1", lifecycle.Created)
	feed.add("owner-a", "sbx1", lifecycle.Updated) // not subscribed
	feed.add("owner-b", "sbx2", lifecycle.Created) // another owner's
	killed := feed.add("owner-a", "sbx1", lifecycle.Killed)
	eventually(t, 5*time.Second, "both events delivered", func() bool { return len(rc.delivered()) >= 2 })
	time.Sleep(100 * time.Millisecond) // room for a wrong extra delivery to show
	got := rc.requests()
	if want := []string{created.ID, killed.ID}; strings.Join(ids(rc.delivered()), ",") != strings.Join(want, ",") || len(got) != 2 {
		t.Fatalf("requests for %v, want exactly %v", ids(rc.delivered()), want)
	}
	verifier, err := standardwebhooks.NewWebhookRaw([]byte("s3cret"))
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range got {
		h := g.header
		sum := sha256.Sum256(append([]byte("s3cret"), g.body...))
		if want := base64.RawURLEncoding.EncodeToString(sum[:]); h.Get("e2b-signature") != want {
			t.Errorf("e2b-signature = %q, want %q", h.Get("e2b-signature"), want)
		}
		if h.Get("e2b-signature-version") != "v1" || h.Get("e2b-webhook-id") != hook.ID || h.Get("e2b-delivery-id") == "" {
			t.Errorf("e2b headers: %v", h)
		}
		if h.Get("Content-Type") != "application/json" {
			t.Errorf("Content-Type = %q", h.Get("Content-Type"))
		}
		ts := h.Get("webhook-timestamp")
		var sec int64
		if _, err := fmt.Sscan(ts, &sec); err != nil || time.Since(time.Unix(sec, 0)).Abs() > time.Minute {
			t.Errorf("webhook-timestamp = %q", ts)
		}
		if h.Get("webhook-id") != h.Get("e2b-delivery-id") {
			t.Errorf("webhook-id %q != e2b-delivery-id %q", h.Get("webhook-id"), h.Get("e2b-delivery-id"))
		}
		// A receiver's check, with the specification's library.
		if err := verifier.Verify(g.body, h); err != nil {
			t.Errorf("webhook-signature %q does not verify: %v", h.Get("webhook-signature"), err)
		}
		if g.event.SandboxTeamID != "owner-a" || g.event.Version != "v1" || g.event.SandboxID != "sbx1" {
			t.Errorf("payload: %s", g.body)
		}
	}
	ds, err := st.ListDeliveries(context.Background(), "owner-a", hook.ID, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Second, "deliveries recorded as delivered", func() bool {
		ds, _ = st.ListDeliveries(context.Background(), "owner-a", hook.ID, 0, 10)
		return len(ds) == 2 && ds[0].Status == store.DeliveryDelivered && ds[1].Status == store.DeliveryDelivered
	})
	for _, d := range ds {
		if d.Attempts != 1 || len(d.History) != 1 || d.History[0].HTTP != 200 || d.LastHTTP != 200 {
			t.Errorf("delivery %s: attempts %d, history %+v, last http %d", d.ID, d.Attempts, d.History, d.LastHTTP)
		}
	}
}

// TestOrderPerSandbox: while a sandbox's first event is being retried its
// next one waits, and another sandbox's events do not.
func TestOrderPerSandbox(t *testing.T) {
	st := openStore(t, t.TempDir())
	feed, rc := newFeed(), newReceiver(t)
	var a1 string
	rc.answer = func(e lifecycle.Event, n int) int {
		if e.ID == a1 && n < 3 {
			return http.StatusServiceUnavailable
		}
		return http.StatusOK
	}
	addWebhook(t, st, "o", rc.srv.URL, "k", lifecycle.Types...)
	rc.mu.Lock()
	a1 = feed.add("o", "a", lifecycle.Created).ID
	rc.mu.Unlock()
	a2 := feed.add("o", "a", lifecycle.Paused)
	b1 := feed.add("o", "b", lifecycle.Created)
	a3 := feed.add("o", "a", lifecycle.Killed)
	start(t, Options{Store: st, Feed: feed, AllowPrivate: true, RetryBase: 40 * time.Millisecond, RetryMax: 80 * time.Millisecond})
	eventually(t, 10*time.Second, "all four delivered", func() bool { return len(rc.delivered()) == 4 })

	var seq []string
	for _, g := range rc.requests() {
		seq = append(seq, fmt.Sprintf("%s:%d", g.event.ID, g.status))
	}
	pos := func(id string, status int) int {
		for i, s := range seq {
			if s == fmt.Sprintf("%s:%d", id, status) {
				return i
			}
		}
		return -1
	}
	a1ok := pos(a1, 200)
	if f := pos(a1, 503); f < 0 || a1ok < 0 {
		t.Fatalf("a1 was not retried after a 503: %v", seq)
	}
	if p := pos(b1.ID, 200); p > a1ok {
		t.Errorf("another sandbox's event waited for a1's retries: %v", seq)
	}
	for _, id := range []string{a2.ID, a3.ID} {
		for i, s := range seq {
			if strings.HasPrefix(s, id+":") && i < a1ok {
				t.Errorf("%s attempted before a1 was delivered: %v", id, seq)
			}
		}
	}
	if pos(a2.ID, 200) > pos(a3.ID, 200) {
		t.Errorf("a3 before a2: %v", seq)
	}
}

// TestRetryThenFail: a receiver that never accepts gets retries until the
// give-up time, then the delivery is failed, with every attempt recorded.
func TestRetryThenFail(t *testing.T) {
	st := openStore(t, t.TempDir())
	feed, rc := newFeed(), newReceiver(t)
	rc.answer = func(lifecycle.Event, int) int { return http.StatusBadGateway }
	hook := addWebhook(t, st, "o", rc.srv.URL, "k", lifecycle.Created)
	feed.add("o", "a", lifecycle.Created)
	start(t, Options{Store: st, Feed: feed, AllowPrivate: true,
		RetryBase: 20 * time.Millisecond, RetryMax: 40 * time.Millisecond, GiveUpAfter: 400 * time.Millisecond})
	var d store.Delivery
	eventually(t, 5*time.Second, "the delivery failed for good", func() bool {
		ds, err := st.ListDeliveries(context.Background(), "o", hook.ID, 0, 1)
		if err != nil || len(ds) != 1 {
			return false
		}
		d = ds[0]
		return d.Status == store.DeliveryFailed
	})
	if d.Attempts < 3 || len(d.History) != d.Attempts || d.LastHTTP != http.StatusBadGateway || !strings.Contains(d.LastError, "502") {
		t.Errorf("failed delivery: attempts %d, history %d, last http %d, last error %q", d.Attempts, len(d.History), d.LastHTTP, d.LastError)
	}
	if n := len(rc.requests()); n != d.Attempts {
		t.Errorf("receiver got %d requests, store counts %d attempts", n, d.Attempts)
	}
	// Spaced by the backoff, not hammered.
	h := d.History
	for i := 1; i < len(h); i++ {
		if gap := h[i].At.Sub(h[i-1].At); gap < 10*time.Millisecond {
			t.Errorf("attempts %d and %d only %s apart", i-1, i, gap)
		}
	}
}

// TestTimeout: a receiver that does not answer in time is a failed attempt,
// and it does not hold up another webhook's delivery.
func TestTimeout(t *testing.T) {
	st := openStore(t, t.TempDir())
	feed := newFeed()
	hang := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hang:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(hang)
	fast := newReceiver(t)
	slowHook := addWebhook(t, st, "o", slow.URL, "k", lifecycle.Created)
	addWebhook(t, st, "o", fast.srv.URL, "k", lifecycle.Created)
	feed.add("o", "a", lifecycle.Created)
	start(t, Options{Store: st, Feed: feed, AllowPrivate: true, Timeout: 300 * time.Millisecond, RetryBase: time.Hour})
	eventually(t, 2*time.Second, "the fast receiver got its event", func() bool { return len(fast.delivered()) == 1 })
	eventually(t, 3*time.Second, "the slow attempt recorded as timed out", func() bool {
		ds, _ := st.ListDeliveries(context.Background(), "o", slowHook.ID, 0, 1)
		return len(ds) == 1 && ds[0].Attempts == 1 && ds[0].Status == store.DeliveryPending &&
			strings.Contains(ds[0].LastError, "Timeout")
	})
}

// TestRestartResume: pending deliveries and the cursor survive a restart;
// the next dispatcher delivers them once and dispatches no event twice.
func TestRestartResume(t *testing.T) {
	dir := t.TempDir()
	st := openStore(t, dir)
	feed, rc := newFeed(), newReceiver(t)
	var up sync.Mutex
	down := true
	rc.answer = func(lifecycle.Event, int) int {
		up.Lock()
		defer up.Unlock()
		if down {
			return http.StatusServiceUnavailable
		}
		return http.StatusNoContent
	}
	hook := addWebhook(t, st, "o", rc.srv.URL, "k", lifecycle.Types...)
	var want []string
	for _, typ := range []string{lifecycle.Created, lifecycle.Paused, lifecycle.Resumed} {
		want = append(want, feed.add("o", "a", typ).ID)
	}
	d1 := New(Options{Store: st, Feed: feed, AllowPrivate: true, RetryBase: 300 * time.Millisecond, RetryMax: 300 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	d1.Start()
	eventually(t, 5*time.Second, "a first attempt", func() bool { return len(rc.requests()) > 0 })
	if err := d1.Close(); err != nil {
		t.Fatal(err)
	}
	if c, err := st.WebhookCursor(context.Background()); err != nil || c != 3 {
		t.Fatalf("cursor after the first run = %d, %v; want 3", c, err)
	}
	st.Close()

	up.Lock()
	down = false
	up.Unlock()
	st = openStore(t, dir)
	ds, _ := st.ListDeliveries(context.Background(), "o", hook.ID, 0, 10)
	for _, d := range ds {
		if d.Status != store.DeliveryPending {
			t.Fatalf("delivery %s is %s before the restart", d.ID, d.Status)
		}
	}
	start(t, Options{Store: st, Feed: feed, AllowPrivate: true, RetryBase: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond,
		Logger: slog.New(slog.DiscardHandler)})
	feed.add("o", "a", lifecycle.Killed) // wakes the new dispatcher
	eventually(t, 5*time.Second, "all four delivered after the restart", func() bool { return len(rc.delivered()) == 4 })
	got := ids(rc.delivered())
	if strings.Join(got[:3], ",") != strings.Join(want, ",") {
		t.Errorf("delivered %v, want %v first", got, want)
	}
	ds, _ = st.ListDeliveries(context.Background(), "o", hook.ID, 0, 10)
	if len(ds) != 4 {
		t.Errorf("%d deliveries after the restart, want 4 (one per event)", len(ds))
	}
}

// TestRefusedAtConnect: without AllowPrivate a delivery never connects to a
// loopback address, even when the URL got past registration (a DNS answer
// that changed since).
func TestRefusedAtConnect(t *testing.T) {
	st := openStore(t, t.TempDir())
	feed, rc := newFeed(), newReceiver(t)
	hook := addWebhook(t, st, "o", rc.srv.URL, "k", lifecycle.Created)
	feed.add("o", "a", lifecycle.Created)
	start(t, Options{Store: st, Feed: feed, RetryBase: time.Hour})
	eventually(t, 5*time.Second, "the attempt refused", func() bool {
		ds, _ := st.ListDeliveries(context.Background(), "o", hook.ID, 0, 1)
		return len(ds) == 1 && ds[0].Attempts == 1 && strings.Contains(ds[0].LastError, "address refused")
	})
	if n := len(rc.requests()); n != 0 {
		t.Errorf("the loopback receiver got %d requests", n)
	}
}

func TestBackoff(t *testing.T) {
	zero, one := func() float64 { return 0 }, func() float64 { return 0.999999 }
	base, maxDelay := 2*time.Second, 30*time.Second
	for n, want := range map[int]time.Duration{1: 2 * time.Second, 2: 4 * time.Second, 4: 16 * time.Second, 5: 30 * time.Second, 50: 30 * time.Second} {
		if lo := Backoff(n, base, maxDelay, zero); lo != want/2 {
			t.Errorf("Backoff(%d) low = %s, want %s", n, lo, want/2)
		}
		if hi := Backoff(n, base, maxDelay, one); hi > want || hi < want-time.Millisecond {
			t.Errorf("Backoff(%d) high = %s, want about %s", n, hi, want)
		}
	}
}

func TestCheckURL(t *testing.T) {
	ctx := context.Background()
	for _, c := range []struct {
		url, err string
	}{
		{"", "url is required"},
		{"ftp://example.com/x", "must start with http:// or https://"},
		{"example.com/hook", "must start with http:// or https://"},
		{"http:///path", "has no host"},
		{"http://8.8.8.8:99999/", "invalid port"},
		{"http://127.0.0.1:8080/hook", "non-public"},
		{"http://[::1]/hook", "non-public"},
		{"http://10.1.2.3/", "non-public"},
		{"http://192.168.1.1/", "non-public"},
		{"http://100.64.0.1/", "non-public"},
		{"http://169.254.169.254/latest/meta-data", "non-public"},
		{"http://0.0.0.0/", "non-public"},
		{"http://[::ffff:127.0.0.1]/", "non-public"},
		{"http://[fd00::1]/", "non-public"},
		{"http://localhost:3000/", "non-public"},
		{"https://8.8.8.8/hook", ""},
		{"http://[2001:4860:4860::8888]:8443/x", ""},
		{"http://" + strings.Repeat("a", MaxURLLength) + ".com/", "longer than"},
	} {
		_, err := CheckURL(ctx, c.url, false)
		switch {
		case c.err == "" && err != nil:
			t.Errorf("CheckURL(%q) = %v, want ok", c.url, err)
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("CheckURL(%q) = %v, want an error with %q", c.url, err, c.err)
		}
	}
	if _, err := CheckURL(ctx, "http://127.0.0.1:8080/hook", true); err != nil {
		t.Errorf("with allowPrivate: %v", err)
	}
	if _, err := CheckURL(ctx, "ftp://127.0.0.1/", true); err == nil {
		t.Error("allowPrivate let an ftp URL through")
	}
}

// TestManyEvents: more events than one feed batch, over several sandboxes,
// all arrive, each sandbox's in the order they happened.
func TestManyEvents(t *testing.T) {
	st := openStore(t, t.TempDir())
	feed, rc := newFeed(), newReceiver(t)
	addWebhook(t, st, "o", rc.srv.URL, "k", lifecycle.Types...)
	const n = 2*feedBatch + 50
	for i := range n {
		feed.add("o", fmt.Sprintf("s%d", i%3), lifecycle.Updated)
	}
	start(t, Options{Store: st, Feed: feed, AllowPrivate: true})
	eventually(t, 30*time.Second, fmt.Sprintf("%d events delivered", n), func() bool { return len(rc.delivered()) >= n })
	last := map[string]int64{}
	seen := map[string]bool{}
	for _, e := range rc.delivered() {
		var seq int64
		fmt.Sscanf(e.ID, "event-%d", &seq)
		if seq <= last[e.SandboxID] || seen[e.ID] {
			t.Fatalf("sandbox %s: event %d after %d (or twice)", e.SandboxID, seq, last[e.SandboxID])
		}
		last[e.SandboxID], seen[e.ID] = seq, true
	}
	if c, _ := st.WebhookCursor(context.Background()); c != n {
		t.Errorf("cursor = %d, want %d", c, n)
	}
}
