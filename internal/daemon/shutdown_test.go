package daemon

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestShutdownCutsHeldStreams: a client that holds a stream open (it never
// ends on its own) does not keep a stopping server from stopping: after the
// grace the connection is cut, the client's read ends, and the stop is no
// failure.
func TestShutdownCutsHeldStreams(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started := make(chan struct{})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		close(started)
		<-r.Context().Done() // a stream that only its client ends
	})}
	go func() { _ = srv.Serve(ln) }()
	resp, err := http.Get("http://" + ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	<-started
	read := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		read <- err
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	begin := time.Now()
	if err := shutdownHTTP(ctx, srv); err != nil {
		t.Fatalf("shutdown: %v", err)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Errorf("shutdown took %v", d)
	}
	select {
	case <-read:
	case <-time.After(5 * time.Second):
		t.Fatal("the client's stream was not cut")
	}
}
