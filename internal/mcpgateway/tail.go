package mcpgateway

import (
	"bufio"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// Bounds of what is kept of a server's stderr for error messages: the last
// tailLines lines, each cut at tailLineBytes. Every line also goes to the log.
const (
	tailLines     = 20
	tailLineBytes = 512
)

// tail reads a server's stderr (or a clone's or installCmd's output): each
// line goes to the gateway's log with the server's name and label, and the
// last few are kept to explain a failure.
type tail struct {
	mu    sync.Mutex
	lines []string
	done  chan struct{}
}

func newTail(log *slog.Logger, r io.ReadCloser, label string) *tail {
	t := &tail{done: make(chan struct{})}
	go func() {
		defer close(t.done)
		defer r.Close()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := strings.TrimRight(sc.Text(), "\r")
			log.Info(label, "line", line)
			if len(line) > tailLineBytes {
				line = line[:tailLineBytes] + "…"
			}
			t.mu.Lock()
			t.lines = append(t.lines, line)
			if len(t.lines) > tailLines {
				t.lines = t.lines[len(t.lines)-tailLines:]
			}
			t.mu.Unlock()
		}
		// A line longer than the scanner's buffer ends the copy: drain
		// the rest so that the server never blocks on a full pipe.
		_, _ = io.Copy(io.Discard, r)
	}()
	return t
}

// wait waits up to d for stderr's end (every writer closed it).
func (t *tail) wait(d time.Duration) {
	select {
	case <-t.done:
	case <-time.After(d):
	}
}

// text is the kept lines.
func (t *tail) text() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

// suffix ends an error message with the kept lines, when there are any.
func (t *tail) suffix() string {
	return t.suffixFor("its stderr")
}

func (t *tail) suffixFor(what string) string {
	if s := t.text(); s != "" {
		return "; " + what + " ended with:\n" + s
	}
	return "; " + what + " was empty"
}
