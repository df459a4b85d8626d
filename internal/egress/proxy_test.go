package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/netpolicy"
)

// fakeDirectory knows sandboxes by source address.
type fakeDirectory map[netip.Addr]netpolicy.Egress

func (d fakeDirectory) EgressFor(src netip.Addr) (netpolicy.Egress, bool) {
	eg, ok := d[src]
	return eg, ok
}

func (fakeDirectory) NameOf(netip.Addr, netip.Addr) string { return "" }

// TestUpstreamKeptAcrossConnections: a sandbox that opens a new connection
// per request to a rule host gets its rule header on every request, and the
// proxy reuses one upstream TLS connection for them; another sandbox never
// shares it.
func TestUpstreamKeptAcrossConnections(t *testing.T) {
	const host = "api.test"
	// The real server: a certificate for host from a CA of its own, which
	// the proxy's Roots trust.
	serverCA, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	leaf, err := serverCA.Leaf(host)
	if err != nil {
		t.Fatal(err)
	}
	var newConns atomic.Int32
	var mu sync.Mutex
	var auths []string
	ln, err := tls.Listen("tcp4", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{*leaf}})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			mu.Lock()
			auths = append(auths, r.Header.Get("Authorization"))
			mu.Unlock()
			fmt.Fprint(w, "ok")
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				newConns.Add(1)
			}
		},
	}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	dst := netip.MustParseAddrPort(ln.Addr().String())

	proxyCA, err := LoadOrCreateCA(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	rules := []netpolicy.RuleHost{{Key: host, Domain: host, Rules: []netpolicy.Rule{{
		Transform: &netpolicy.Transform{Headers: map[string]string{"Authorization": "Bearer ${e2b.secrets.tok}"}},
	}}}}
	sandboxA, sandboxB := netip.MustParseAddr("10.0.0.2"), netip.MustParseAddr("10.0.0.6")
	dir := fakeDirectory{
		sandboxA: {ID: "a", Owner: "o", Hosts: rules},
		sandboxB: {ID: "b", Owner: "o", Hosts: rules},
	}
	p := New(Config{
		Directory: dir, CA: proxyCA, Roots: serverCA.Pool(),
		Fill: func(_ context.Context, _, v string) (string, error) {
			return strings.ReplaceAll(v, "${e2b.secrets.tok}", "s3cret"), nil
		},
	})
	t.Cleanup(func() { p.Close() })

	// request opens a sandbox connection as the firewall would hand it to
	// the proxy (the handler is called directly: no redirect on loopback),
	// makes one request over TLS trusting the proxy's CA, and closes it.
	sl, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	request := func(src netip.Addr) {
		t.Helper()
		done := make(chan struct{})
		go func() {
			defer close(done)
			c, err := sl.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			eg, _ := dir.EgressFor(src)
			p.handleTLS(c.(*net.TCPConn), &flow{src: netip.AddrPortFrom(src, 40000), dst: dst, eg: eg})
		}()
		raw, err := net.Dial("tcp4", sl.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c := tls.Client(raw, &tls.Config{ServerName: host, RootCAs: proxyCA.Pool()})
		if _, err := io.WriteString(c, "GET / HTTP/1.1\r\nHost: "+host+"\r\nConnection: close\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		c.Close()
		<-done
		if resp.StatusCode != http.StatusOK || string(body) != "ok" {
			t.Fatalf("status %d, body %q", resp.StatusCode, body)
		}
	}
	for range 3 {
		request(sandboxA)
	}
	if n := newConns.Load(); n != 1 {
		t.Errorf("three connections of one sandbox made %d upstream connections, want 1", n)
	}
	request(sandboxB)
	if n := newConns.Load(); n != 2 {
		t.Errorf("another sandbox's connection made %d upstream connections in all, want 2 (never shared)", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(auths) != 4 {
		t.Fatalf("server got %d requests, want 4", len(auths))
	}
	for i, a := range auths {
		if a != "Bearer s3cret" {
			t.Errorf("request %d: Authorization %q", i, a)
		}
	}
}
