package sandbox

import (
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEnvd serves /health on a unix socket it binds after delay, answering
// status.
func fakeEnvd(t *testing.T, socket string, delay time.Duration, status *atomic.Int32) {
	t.Helper()
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(int(status.Load()))
	})}
	t.Cleanup(func() { srv.Close() })
	go func() {
		time.Sleep(delay)
		ln, err := net.Listen("unix", socket)
		if err != nil {
			t.Errorf("listen: %v", err)
			return
		}
		_ = srv.Serve(ln)
	}()
}

func TestWaitEnvdWakesOnTheSocket(t *testing.T) {
	var sw socketWatch
	defer sw.close()
	for _, tc := range []struct {
		name  string
		watch bool
	}{{"inotify", true}, {"poll", false}} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			sock := filepath.Join(dir, "envd.sock")
			var status atomic.Int32
			status.Store(http.StatusNoContent)
			fakeEnvd(t, sock, 30*time.Millisecond, &status)
			var created <-chan struct{}
			stop := func() {}
			if tc.watch {
				created, stop = sw.watch(dir)
				if created == nil {
					t.Fatal("no inotify watch on a plain directory")
				}
			}
			defer stop()
			tr := envdTransport(sock, &connTracker{})
			defer tr.CloseIdleConnections()
			if err := waitEnvd(context.Background(), tr, sock, created, 5*time.Second); err != nil {
				t.Fatalf("waitEnvd: %v", err)
			}
		})
	}
}

func TestWaitEnvdGivesTheLastError(t *testing.T) {
	dir := t.TempDir()
	sock := filepath.Join(dir, "envd.sock")
	var status atomic.Int32
	status.Store(http.StatusServiceUnavailable)
	fakeEnvd(t, sock, 0, &status)
	tr := envdTransport(sock, &connTracker{})
	defer tr.CloseIdleConnections()
	err := waitEnvd(context.Background(), tr, sock, nil, 200*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "503") {
		t.Fatalf("waitEnvd against a 503: %v, want the health answer", err)
	}

	// Nothing ever binds here: the error is the dial's (not the limit's,
	// which may fall during a try), within the limit.
	missing := filepath.Join(dir, "none.sock")
	tr2 := envdTransport(missing, &connTracker{})
	start := time.Now()
	err = waitEnvd(context.Background(), tr2, missing, nil, 500*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("waitEnvd on no socket: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("waitEnvd ran %s past a 500ms limit", d)
	}

	// A cancelled caller gets its own error.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := waitEnvd(ctx, tr2, missing, nil, time.Second); err != context.Canceled {
		t.Fatalf("waitEnvd cancelled: %v", err)
	}
}

func TestSocketWatchStopsWatching(t *testing.T) {
	var sw socketWatch
	defer sw.close()
	dir := t.TempDir()
	a, stopA := sw.watch(dir)
	b, stopB := sw.watch(dir)
	if err := os.WriteFile(filepath.Join(dir, "x"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for i, ch := range []<-chan struct{}{a, b} {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatalf("waiter %d not woken by a create", i)
		}
	}
	stopA()
	stopB()
	sw.mu.Lock()
	left := len(sw.waiters)
	sw.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d directories still watched after every waiter stopped", left)
	}
	if got := sw.w.WatchList(); len(got) != 0 {
		t.Fatalf("inotify still watches %v", got)
	}
}
