package testenv

import (
	"bytes"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// ServerLog records what a server started by a test logs, and fails the test
// at its end if any of it mentions a panic: net/http and x/net/http2 recover a
// handler's panic and only log it ("http: panic serving …"), so a test whose
// requests all got answers would otherwise pass over one. Give ErrorLog to the
// http.Server (or httptest.Server.Config) and Slog to the code under test.
type ServerLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// NewServerLog returns a recorder checked when t ends (after the cleanups
// registered later, such as the server's Close, have run).
func NewServerLog(t testing.TB) *ServerLog {
	t.Helper()
	l := &ServerLog{}
	t.Cleanup(func() {
		s := l.String()
		if strings.Contains(strings.ToLower(s), "panic") {
			t.Errorf("the server logged a panic:\n%s", s)
		} else if testing.Verbose() && s != "" {
			t.Logf("server log:\n%s", s)
		}
	})
	return l
}

func (l *ServerLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything logged so far.
func (l *ServerLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// ErrorLog is the logger for http.Server.ErrorLog.
func (l *ServerLog) ErrorLog() *log.Logger { return log.New(l, "", 0) }

// Slog is a debug-level structured logger into the same record.
func (l *ServerLog) Slog() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// NewHTTPServer starts an httptest server for h whose error log is a
// ServerLog, so a handler panic that net/http recovers fails t; the server is
// closed when t ends, before the log is checked.
func NewHTTPServer(t testing.TB, h http.Handler) *httptest.Server {
	t.Helper()
	l := NewServerLog(t)
	srv := httptest.NewUnstartedServer(h)
	srv.Config.ErrorLog = l.ErrorLog()
	srv.Start()
	t.Cleanup(srv.Close)
	return srv
}
