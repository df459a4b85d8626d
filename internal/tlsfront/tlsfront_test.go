package tlsfront

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/localca"
)

const domain = "airlock.localhost"

// tagged answers with its name, the Host it saw and whether it came over TLS.
func tagged(name string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, name+" "+r.Host)
	})
}

func TestRouter(t *testing.T) {
	rt := &Router{Domain: domain, API: tagged("api"), Sandbox: tagged("sandbox")}
	for _, c := range []struct {
		host   string
		status int
		body   string // prefix of the body
	}{
		{"api." + domain, 200, "api "},
		{"api." + domain + ":8443", 200, "api "},
		{"API.Airlock.Localhost", 200, "api "},
		{"api." + domain + ".", 200, "api "},
		{"sandbox." + domain, 200, "sandbox "},
		{"8000-abc123." + domain + ":8443", 200, "sandbox 8000-abc123." + domain + ":8443"},
		{"49983-abc123." + domain, 200, "sandbox "},
		{"www." + domain, 404, `{"code":404`},
		{"a.b." + domain, 404, `{"code":404`},
		{"x-abc." + domain, 404, `{"code":404`},
		{domain, 404, `{"code":404`},
		{"example.com", 404, `{"code":404,"message":"unknown host example.com`},
		{"127.0.0.1:8443", 404, `{"code":404`},
		{"", 400, `{"code":400`},
		{"api." + domain + ":x", 400, `{"code":400`},
		{"bad host!." + domain, 400, `{"code":400`},
		{"a..b", 400, `{"code":400`},
	} {
		r := httptest.NewRequest("GET", "/health", nil)
		r.Host = c.host
		w := httptest.NewRecorder()
		rt.ServeHTTP(w, r)
		if w.Code != c.status || !strings.HasPrefix(w.Body.String(), c.body) {
			t.Errorf("Host %q: %d %q, want %d %q…", c.host, w.Code, w.Body.String(), c.status, c.body)
		}
		if c.status >= 400 {
			var body struct {
				Code    int    `json:"code"`
				Message string `json:"message"`
			}
			if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil || body.Code != c.status || body.Message == "" {
				t.Errorf("Host %q: error body %q is not {code, message}", c.host, w.Body.String())
			}
		}
	}
	// A browser gets a page.
	r := httptest.NewRequest("GET", "/", nil)
	r.Host = "www." + domain
	r.Header.Set("Accept", "text/html,application/xhtml+xml")
	w := httptest.NewRecorder()
	rt.ServeHTTP(w, r)
	if w.Code != 404 || !strings.HasPrefix(w.Header().Get("Content-Type"), "text/html") || !strings.Contains(w.Body.String(), "nothing is served at www.") {
		t.Errorf("browser: %d %s %q", w.Code, w.Header().Get("Content-Type"), w.Body.String())
	}
}

func TestInDomain(t *testing.T) {
	for name, want := range map[string]bool{
		domain: true, "api." + domain: true, "8000-abc." + domain: true, "API." + strings.ToUpper(domain): true,
		"a.b." + domain: false, "x" + domain: false, "localhost": false, "": false, "example.com": false,
	} {
		if got := InDomain(name, domain); got != want {
			t.Errorf("InDomain(%q) = %v", name, got)
		}
	}
	for _, bad := range []string{"", "localhost", "airlock.localhost:443", "Airlock.localhost", "a_b.localhost", "-a.localhost"} {
		if CheckDomain(bad) == nil {
			t.Errorf("CheckDomain(%q) accepted it", bad)
		}
	}
	if err := CheckDomain(domain); err != nil {
		t.Error(err)
	}
}

func TestClientDomain(t *testing.T) {
	for host, want := range map[string]string{
		"api." + domain:           domain,
		"api." + domain + ":443":  domain,
		"api." + domain + ":8443": domain + ":8443",
		"sandbox." + domain:       "",
	} {
		r := httptest.NewRequest("GET", "https://x/", nil)
		r.Host = host
		got, ok := ClientDomain(r, domain)
		if got != want || ok != (want != "") {
			t.Errorf("ClientDomain(%q) = %q %v, want %q", host, got, ok, want)
		}
	}
	r := httptest.NewRequest("GET", "http://x/", nil) // not TLS
	r.Host = "api." + domain
	if _, ok := ClientDomain(r, domain); ok {
		t.Error("a plain-HTTP request has a client domain")
	}
}

// serve starts the front door on loopback with src and returns its address.
func serve(t *testing.T, src CertSource) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(domain, src, &Router{Domain: domain, API: tagged("api"), Sandbox: tagged("sandbox")}, nil)
	srv.ErrorLog = nil
	go srv.ServeTLS(ln, "", "")
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}

// client trusts pool and dials addr whatever the name.
func client(pool *x509.CertPool, addr string, h2 bool) *http.Client {
	tr := &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: pool},
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
		ForceAttemptHTTP2: h2,
	}
	if !h2 {
		tr.TLSNextProto = map[string]func(string, *tls.Conn) http.RoundTripper{}
	}
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

func TestOwnCA(t *testing.T) {
	dir := t.TempDir()
	src, err := LoadOrCreateCA(dir, domain)
	if err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(filepath.Join(dir, localca.KeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("ca.pem: %v %v", fi.Mode(), err)
	}
	bundle, err := os.ReadFile(src.BundlePath())
	if err != nil || !strings.Contains(string(bundle), "Airlock domain CA") {
		t.Fatalf("bundle: %v", err)
	}
	addr := serve(t, src)
	for _, h2 := range []bool{true, false} {
		c := client(src.Pool(), addr, h2)
		for _, host := range []string{"api." + domain, "8000-abc." + domain, "sandbox." + domain} {
			res, err := c.Get("https://" + host + "/")
			if err != nil {
				t.Fatalf("h2=%v %s: %v", h2, host, err)
			}
			b, _ := io.ReadAll(res.Body)
			res.Body.Close()
			wantProto := map[bool]int{true: 2, false: 1}[h2]
			if res.StatusCode != 200 || res.ProtoMajor != wantProto {
				t.Errorf("h2=%v %s: %d %s %q", h2, host, res.StatusCode, res.Proto, b)
			}
		}
	}
	// Names outside the domain: no certificate, the handshake fails.
	for _, sni := range []string{"example.com", "a.b." + domain, "localhost", ""} {
		conn, err := tls.Dial("tcp", addr, &tls.Config{ServerName: sni, InsecureSkipVerify: true})
		if err == nil {
			conn.Close()
			t.Errorf("SNI %q: handshake succeeded", sni)
		} else if !strings.Contains(err.Error(), "internal error") {
			t.Logf("SNI %q: %v", sni, err)
		}
	}

	// The same CA and certificate on the next start; a new certificate, from
	// the same CA, for another domain.
	first, _ := src.GetCertificate(nil)
	again, err := LoadOrCreateCA(dir, domain)
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := again.GetCertificate(nil)
	if !c2.Leaf.Equal(first.Leaf) {
		t.Error("the certificate was issued again on a restart with the same domain")
	}
	other, err := LoadOrCreateCA(dir, "other.test")
	if err != nil {
		t.Fatal(err)
	}
	c3, _ := other.GetCertificate(nil)
	if c3.Leaf.Equal(first.Leaf) || c3.Leaf.VerifyHostname("api.other.test") != nil || c3.Leaf.CheckSignatureFrom(first.Leaf) == nil {
		t.Errorf("domain change: got a certificate for %v", c3.Leaf.DNSNames)
	}
	if _, err := c3.Leaf.Verify(x509.VerifyOptions{Roots: src.Pool(), DNSName: "8000-x.other.test"}); err != nil {
		t.Errorf("the new certificate is not from the same CA: %v", err)
	}
	// Near its end: issued again at the next handshake.
	other.leaf.Leaf.NotAfter = time.Now().Add(time.Hour)
	c4, _ := other.GetCertificate(nil)
	if c4 == c3 || time.Until(c4.Leaf.NotAfter) < renewBefore {
		t.Error("a certificate near its end was not issued again")
	}
}

// writeCert issues a certificate for names from a throw-away CA and writes
// it and its key; it returns the CA's pool.
func writeCert(t *testing.T, names ...string) (certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	dir := t.TempDir()
	ca, err := localca.LoadOrCreate(filepath.Join(dir, "ca"), "test CA")
	if err != nil {
		t.Fatal(err)
	}
	key, _ := localca.NewKey()
	c, err := ca.Issue(names, key, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	var chain []byte
	for _, der := range c.Certificate {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	kp, _ := localca.KeyPEM(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, chain, 0o644)
	os.WriteFile(keyFile, kp, 0o600)
	return certFile, keyFile, ca.Pool()
}

func TestFiles(t *testing.T) {
	certFile, keyFile, pool := writeCert(t, domain, "*."+domain)
	src, err := LoadFiles(certFile, keyFile, domain)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, src)
	res, err := client(pool, addr, true).Get("https://8000-abc." + domain + "/")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 200 {
		t.Errorf("status %d", res.StatusCode)
	}
	if _, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "example.com", InsecureSkipVerify: true}); err == nil {
		t.Error("SNI outside the domain: handshake succeeded with certificate files")
	}

	// Not covering the domain: the error names the first name missing.
	for _, c := range []struct {
		names []string
		miss  string
	}{
		{[]string{domain}, "api." + domain},
		{[]string{"api." + domain, "sandbox." + domain}, SampleSandboxHost + "." + domain},
		{[]string{"*.example.com"}, "api." + domain},
	} {
		cf, kf, _ := writeCert(t, c.names...)
		_, err := LoadFiles(cf, kf, domain)
		if err == nil || !strings.Contains(err.Error(), "does not cover "+c.miss) {
			t.Errorf("names %v: %v, want it to say %s is not covered", c.names, err, c.miss)
		}
	}
	// A key that is not the certificate's.
	_, otherKey, _ := writeCert(t, domain, "*."+domain)
	if _, err := LoadFiles(certFile, otherKey, domain); err == nil || !strings.Contains(err.Error(), "private key does not match") {
		t.Errorf("mismatching key: %v", err)
	}
	if _, err := LoadFiles(certFile, filepath.Join(t.TempDir(), "none"), domain); err == nil {
		t.Error("a missing key file was accepted")
	}
}
