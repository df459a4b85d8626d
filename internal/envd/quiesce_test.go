package envd

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
)

// freeTCP returns a loopback address no one listens on.
func freeTCP(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	must(t, err)
	addr := l.Addr().String()
	l.Close()
	return addr
}

// health asks /health over c and reports the status.
func health(c *http.Client, url string) (int, error) {
	resp, err := c.Get(url + "/health")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestQuiesceWake checks what envd does around a checkpoint
// (envdapi.QuiesceSignal): Quiesce closes the unix listeners, cuts every
// connection accepted on them and removes the socket files, while the TCP
// listener serves on; Wake binds the sockets again, private, and they serve.
// Both are idempotent, and neither works on an envd that is not serving.
func TestQuiesceWake(t *testing.T) {
	dir := t.TempDir()
	sock, isock := filepath.Join(dir, "run", "envd.sock"), filepath.Join(dir, "run", "interp.sock")
	tcp := freeTCP(t)
	srv, err := NewServer(envdapi.Config{
		Listen: []string{"unix:" + sock, "tcp:" + tcp}, InterpListen: []string{"unix:" + isock},
	}, nil)
	must(t, err)
	if err := srv.Quiesce(); err == nil {
		t.Fatal("Quiesce before Serve succeeded")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	select {
	case <-srv.Ready():
	case err := <-done:
		t.Fatal(err)
	case <-time.After(5 * time.Second):
		t.Fatal("not ready")
	}

	// A connection held open over the socket, as the host's transport
	// keeps one.
	held, err := net.Dial("unix", sock)
	must(t, err)
	defer held.Close()
	_, err = fmt.Fprint(held, "GET /health HTTP/1.1\r\nHost: envd\r\n\r\n")
	must(t, err)
	br := bufio.NewReader(held)
	resp, err := http.ReadResponse(br, nil)
	must(t, err)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		t.Fatalf("health over the held connection: %d", resp.StatusCode)
	}

	for i := 0; i < 2; i++ {
		if err := srv.Quiesce(); err != nil {
			t.Fatalf("Quiesce %d: %v", i+1, err)
		}
		for _, p := range []string{sock, isock} {
			if _, err := os.Lstat(p); !os.IsNotExist(err) {
				t.Fatalf("Quiesce %d: %s is still there: %v", i+1, p, err)
			}
		}
		if code, err := health(&http.Client{}, "http://"+tcp); err != nil || code != http.StatusNoContent {
			t.Fatalf("Quiesce %d: the TCP listener answers %d, %v", i+1, code, err)
		}
	}
	_ = held.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("a connection accepted on the socket survived Quiesce: read gives %v", err)
	}
	if _, err := net.Dial("unix", sock); err == nil {
		t.Fatal("the socket takes connections while quiesced")
	}

	for i := 0; i < 2; i++ {
		if err := srv.Wake(); err != nil {
			t.Fatalf("Wake %d: %v", i+1, err)
		}
		for _, p := range []string{sock, isock} {
			fi, err := os.Lstat(p)
			if err != nil || fi.Mode()&os.ModeSocket == 0 || fi.Mode().Perm() != 0o600 {
				t.Fatalf("Wake %d: %s: %v, %v", i+1, p, fi, err)
			}
		}
		for _, p := range []string{sock, isock} {
			if code, err := health(unixClient(p, false), "http://envd"); err != nil || code >= 300 {
				t.Fatalf("Wake %d: health over %s: %d, %v", i+1, p, code, err)
			}
		}
	}
	// A second round trip: quiesce and wake again.
	must(t, srv.Quiesce())
	must(t, srv.Wake())
	if code, err := health(unixClient(sock, true), "http://envd"); err != nil || code != http.StatusNoContent {
		t.Fatalf("after a second quiesce and wake: %d, %v", code, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Serve: %v", err)
	}
	done <- nil
	if _, err := os.Lstat(sock); !os.IsNotExist(err) {
		t.Fatalf("the socket outlived Serve: %v", err)
	}
	if err := srv.Wake(); err == nil {
		t.Fatal("Wake after Serve ended succeeded")
	}
}
