package proxy_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/proxy"
)

// fakeEnvds stands in for the manager: every sandbox id is served by one
// loopback HTTP server playing its envd.
type fakeEnvds struct{ tr http.RoundTripper }

func (f fakeEnvds) EnvdTransport(string) (http.RoundTripper, error)   { return f.tr, nil }
func (f fakeEnvds) InterpTransport(string) (http.RoundTripper, error) { return f.tr, nil }
func (fakeEnvds) MatchToken(func(string, string) bool) []string       { return nil }
func (fakeEnvds) Access(string) (string, string, error)               { return "", "", nil }
func (fakeEnvds) UserPortTarget(string) (netip.Addr, string, string, error) {
	return netip.Addr{}, "", "", errors.New("no user ports here")
}

// floodEnvd answers /flood with an endless stream (as fast as the proxy
// takes it), /small with a few bytes, and /upload by counting the body.
func floodEnvd(t *testing.T) *httptest.Server {
	chunk := make([]byte, 32<<10)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/flood":
			w.Header().Set("Content-Type", "application/octet-stream")
			for {
				if _, err := w.Write(chunk); err != nil {
					return
				}
			}
		case "/upload":
			n, _ := io.Copy(io.Discard, r.Body)
			w.Header().Set("X-Got", strconv.FormatInt(n, 10))
		default:
			_, _ = io.WriteString(w, "ok")
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

func budgetProxy(t *testing.T, b proxy.Budget) string {
	t.Helper()
	envd := floodEnvd(t)
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", envd.Listener.Addr().String())
		},
		DisableCompression: true,
	}
	t.Cleanup(tr.CloseIdleConnections)
	p := proxy.New(fakeEnvds{tr}, nil)
	p.SetBudget(b)
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL
}

func sandboxRequest(ctx context.Context, t *testing.T, method, base, id, path string, body io.Reader) *http.Request {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("E2b-Sandbox-Id", id)
	req.Header.Set("E2b-Sandbox-Port", strconv.Itoa(envdapi.Port))
	return req
}

// readFor reads a sandbox's flood through the proxy for d and returns the
// bytes it got.
func readFor(t *testing.T, base, id string, d time.Duration) int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	res, err := http.DefaultClient.Do(sandboxRequest(ctx, t, "GET", base, id, "/flood", nil))
	if err != nil {
		t.Fatalf("flood of %s: %v", id, err)
	}
	defer res.Body.Close()
	n, _ := io.Copy(io.Discard, res.Body)
	return n
}

// TestBudgetHoldsFloodLetsNeighbourThrough: a sandbox's endless response is
// held to its budget (burst + rate x time, not cut), a new stream right after
// gets no fresh burst, an upload is charged to the same budget, and meanwhile
// another sandbox's small requests and its own burst go through at once.
func TestBudgetHoldsFloodLetsNeighbourThrough(t *testing.T) {
	const rate, burst = 4 << 20, 1 << 20
	base := budgetProxy(t, proxy.Budget{Rate: rate, Burst: burst})

	var (
		wg      sync.WaitGroup
		flooded int64
		elapsed time.Duration
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		t0 := time.Now()
		flooded = readFor(t, base, "flooder", 1500*time.Millisecond)
		elapsed = time.Since(t0)
	}()
	// The neighbour, while the flood runs: each small round trip is quick,
	// and a 2 MiB read (its own burst and a bit) is not slowed by the
	// flooder's empty bucket.
	time.Sleep(200 * time.Millisecond)
	var worst time.Duration
	for range 20 {
		t0 := time.Now()
		res, err := http.DefaultClient.Do(sandboxRequest(context.Background(), t, "GET", base, "neighbour", "/small", nil))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		worst = max(worst, time.Since(t0))
	}
	if worst > 200*time.Millisecond {
		t.Errorf("neighbour's small round trip took up to %s during the flood", worst)
	}
	wg.Wait()
	want := float64(burst) + rate*elapsed.Seconds()
	t.Logf("flood: %d bytes in %s (budget allows %.0f)", flooded, elapsed, want)
	if float64(flooded) > want*1.1+64<<10 {
		t.Errorf("flood got %d bytes in %s; the budget allows %.0f", flooded, elapsed, want)
	}
	if float64(flooded) < want*0.5 {
		t.Errorf("flood got only %d bytes in %s; the budget allows %.0f: held far below its rate", flooded, elapsed, want)
	}

	// The bucket is empty now and outlives the request: the next stream
	// starts at the rate, without a fresh burst.
	next := readFor(t, base, "flooder", 500*time.Millisecond)
	if limit := float64(rate)*0.5*1.1 + 256<<10; float64(next) > limit {
		t.Errorf("a new stream right after got %d bytes in 0.5 s: a fresh burst (want <= %.0f)", next, limit)
	}

	// The neighbour's own burst is there at once.
	t0 := time.Now()
	got := readFor(t, base, "neighbour", 300*time.Millisecond)
	if got < burst {
		t.Errorf("neighbour got %d bytes in %s; its untouched bucket holds %d", got, time.Since(t0), burst)
	}

	// Uploads spend the same budget: a bucket holds at most its burst, so
	// 5 MiB take at least (5-1)/4 = 1 s at 4 MiB/s.
	const upload = 5 << 20
	t0 = time.Now()
	res, err := http.DefaultClient.Do(sandboxRequest(context.Background(), t, "POST", base, "flooder", "/upload", strings.NewReader(strings.Repeat("u", upload))))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.Header.Get("X-Got") != strconv.Itoa(upload) {
		t.Fatalf("upload: envd got %q bytes", res.Header.Get("X-Got"))
	}
	if d := time.Since(t0); d < 900*time.Millisecond {
		t.Errorf("a 5 MiB upload through a 4 MiB/s budget (1 MiB burst) took %s", d)
	}
}

// TestBudgetOff: a zero Rate leaves traffic unmetered.
func TestBudgetOff(t *testing.T) {
	base := budgetProxy(t, proxy.Budget{})
	if got := readFor(t, base, "flooder", 300*time.Millisecond); got < 16<<20 {
		t.Errorf("unmetered flood got only %d bytes in 0.3 s", got)
	}
}
