package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/fsnotify/fsnotify"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
)

// A booting sandbox's envd is ready once it answers /health on its unix
// socket. Until the socket exists there is nothing to ask, and a poll that
// sleeps between tries adds up to its whole last sleep to every create (with
// a backoff, several milliseconds on a start that takes ten). So the wait
// sleeps on the socket's appearance in the run directory (one inotify
// instance for the whole manager, socketWatch), and once the socket is there
// it asks at once and then with a short backoff. Without inotify (none left:
// fs.inotify.max_user_instances) it polls as before.

// socketWatch tells waiters that something was created in a directory they
// watch. Its zero value is ready; the inotify instance is made on first use.
type socketWatch struct {
	once sync.Once
	w    *fsnotify.Watcher // nil: inotify unavailable; waiters poll

	mu      sync.Mutex
	waiters map[string]map[chan struct{}]struct{} // by directory
}

func (s *socketWatch) init() {
	w, err := fsnotify.NewBufferedWatcher(64)
	if err != nil {
		return
	}
	s.w = w
	s.waiters = map[string]map[chan struct{}]struct{}{}
	go s.dispatch()
}

// dispatch wakes every waiter of the directory an event happened in. A
// waiter's channel holds one wake-up: more are the same news.
func (s *socketWatch) dispatch() {
	for {
		select {
		case ev, ok := <-s.w.Events:
			if !ok {
				return
			}
			if !ev.Has(fsnotify.Create) && !ev.Has(fsnotify.Rename) {
				continue
			}
			s.mu.Lock()
			for ch := range s.waiters[filepath.Dir(ev.Name)] {
				select {
				case ch <- struct{}{}:
				default:
				}
			}
			s.mu.Unlock()
		case _, ok := <-s.w.Errors:
			// An overflow loses events: waiters fall back on their timer.
			if !ok {
				return
			}
		}
	}
}

// watch returns a channel that receives after something is created in dir,
// and the function that stops watching. A nil channel means no watch (the
// caller polls).
func (s *socketWatch) watch(dir string) (<-chan struct{}, func()) {
	s.once.Do(s.init)
	if s.w == nil {
		return nil, func() {}
	}
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.waiters[dir] == nil {
		if err := s.w.Add(dir); err != nil {
			return nil, func() {}
		}
		s.waiters[dir] = map[chan struct{}]struct{}{}
	}
	s.waiters[dir][ch] = struct{}{}
	return ch, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		delete(s.waiters[dir], ch)
		if len(s.waiters[dir]) == 0 {
			delete(s.waiters, dir)
			_ = s.w.Remove(dir) // the directory may be gone with its sandbox
		}
	}
}

// close ends the inotify instance, if one was made.
func (s *socketWatch) close() {
	s.once.Do(func() {}) // none made after this
	if s.w != nil {
		_ = s.w.Close()
	}
}

// waitEnvd waits until e's envd answers /health, for at most limit.
func (m *Manager) waitEnvd(ctx context.Context, e *entry, limit time.Duration) error {
	runDir := filepath.Join(e.dir, envdapi.HostRunDir)
	created, stop := m.sockets.watch(runDir)
	defer stop()
	return waitEnvd(ctx, e.transport, filepath.Join(runDir, envdapi.SocketName), created, limit)
}

// waitEnvd asks envd's /health over tr until it answers 2xx. While socket
// does not exist it waits for created (a nil channel: a growing poll); once
// the socket is there, envd is a bind-to-listen away from answering, and the
// asking starts again at a short delay.
func waitEnvd(ctx context.Context, tr *http.Transport, socket string, created <-chan struct{}, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	client := &http.Client{Transport: tr, Timeout: time.Second}
	const (
		first = 100 * time.Microsecond
		most  = 10 * time.Millisecond
	)
	delay := 2 * first
	sawSocket := false
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	var lastErr error // the last try's error that was not the limit's
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://envd/health", nil)
		resp, err := client.Do(req)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return nil
			}
			err = fmt.Errorf("health answered %s", resp.Status)
		}
		if ctx.Err() != nil {
			// The limit (or the caller) ended this try: the one before
			// says more about why envd does not answer.
			return waitEnd(ctx, lastErr)
		}
		lastErr = err
		wake := created
		if _, statErr := os.Stat(socket); statErr == nil {
			wake = nil // there: only the delay is worth waiting for
			if !sawSocket {
				sawSocket, delay = true, first
			}
		} else if created != nil {
			// Absent: the socket's creation wakes us; the timer is a
			// fallback for a lost event.
			delay = most
		}
		timer.Reset(delay)
		select {
		case <-ctx.Done():
			return waitEnd(ctx, lastErr)
		case <-wake:
			if !timer.Stop() {
				<-timer.C
			}
		case <-timer.C:
		}
		delay = min(delay*2, most)
	}
}

// waitEnd is waitEnvd's error once ctx is done: the caller's own error if it
// cancelled, else the last try's (the limit passed), else the limit's.
func waitEnd(ctx context.Context, last error) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) && last != nil {
		return last
	}
	return ctx.Err()
}
