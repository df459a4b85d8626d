package daemon_test

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// TestDomainListener: with a domain, one TLS listener serves api.<domain>
// (the API, returning the domain as the client used it, port included) and
// <port>-<id>.<domain> (the sandbox proxy: envd, a closed port, an unknown
// sandbox), with certificates from the server's own domain CA in the data
// dir; names outside the domain are refused at the handshake.
func TestDomainListener(t *testing.T) {
	const domain = "airlock.localhost"
	d := daemontest.Start(t, func(c *daemon.Config) {
		c.Domain = domain
		c.TLS.Listen = "127.0.0.1:0"
	})
	if d.DomainCA == nil {
		t.Fatal("no domain CA without certificate files")
	}
	_, port, _ := strings.Cut(d.ClientDomain, ":")
	if d.ClientDomain != domain+":"+port || d.DomainAPIURL != "https://api."+d.ClientDomain {
		t.Fatalf("ClientDomain %q DomainAPIURL %q", d.ClientDomain, d.DomainAPIURL)
	}
	addr := net.JoinHostPort("127.0.0.1", port)
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: d.DomainCA.Pool()},
		ForceAttemptHTTP2: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		},
	}}
	do := func(method, url string, hdr map[string]string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, url, nil)
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatalf("%s %s: %v", method, url, err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		if res.ProtoMajor != 2 {
			t.Errorf("%s: %s, want HTTP/2", url, res.Proto)
		}
		return res.StatusCode, string(b)
	}
	api := d.DomainAPIURL
	if code, body := do("GET", api+"/health", nil); code != 200 {
		t.Fatalf("health: %d %s", code, body)
	}
	req, _ := http.NewRequest("POST", api+"/sandboxes", strings.NewReader(`{"templateID":"base","timeout":300}`))
	req.Header.Set("X-API-KEY", daemontest.Key)
	req.Header.Set("Content-Type", "application/json")
	res, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var sb struct {
		SandboxID       string  `json:"sandboxID"`
		Domain          *string `json:"domain"`
		EnvdAccessToken string  `json:"envdAccessToken"`
	}
	err = json.NewDecoder(res.Body).Decode(&sb)
	res.Body.Close()
	if err != nil || res.StatusCode != 201 {
		t.Fatalf("create: %d %v", res.StatusCode, err)
	}
	if sb.Domain == nil || *sb.Domain != d.ClientDomain {
		t.Errorf("create's domain %v, want %q (the domain as the client reached the API)", sb.Domain, d.ClientDomain)
	}
	envd := "https://49983-" + sb.SandboxID + "." + d.ClientDomain
	if code, body := do("GET", envd+"/health", nil); code != 204 {
		t.Errorf("envd health through the domain: %d %s", code, body)
	}
	if code, body := do("GET", "https://8000-"+sb.SandboxID+"."+d.ClientDomain+"/", nil); code != 502 || !strings.Contains(body, "port is not open") {
		t.Errorf("closed port: %d %s", code, body)
	}
	if code, body := do("GET", "https://sandbox."+d.ClientDomain+"/health", map[string]string{"E2b-Sandbox-Id": sb.SandboxID, "E2b-Sandbox-Port": "49983"}); code != 204 {
		t.Errorf("sandbox.<domain> with headers: %d %s", code, body)
	}
	if code, body := do("GET", "https://49983-nosuchsandbox."+d.ClientDomain+"/health", nil); code != 502 || !strings.Contains(body, "The sandbox was not found") {
		t.Errorf("unknown sandbox: %d %s", code, body)
	}
	if code, body := do("GET", "https://www."+d.ClientDomain+"/", nil); code != 404 || !strings.Contains(body, `"code":404`) {
		t.Errorf("unknown name under the domain: %d %s", code, body)
	}
	if _, err := tls.Dial("tcp", addr, &tls.Config{ServerName: "example.com", RootCAs: d.DomainCA.Pool()}); err == nil {
		t.Error("a handshake for example.com succeeded")
	}
	// The CA and bundle are in the data dir for clients.
	for _, f := range []string{"ca.crt", "bundle.crt"} {
		if _, err := os.Stat(filepath.Join(d.Layout.DomainTLS(), f)); err != nil {
			t.Error(err)
		}
	}
	// The plain API listener returns the client domain too.
	req, _ = http.NewRequest("GET", d.APIURL+"/sandboxes/"+sb.SandboxID, nil)
	req.Header.Set("X-API-KEY", daemontest.Key)
	res, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	err = json.NewDecoder(res.Body).Decode(&sb)
	res.Body.Close()
	if err != nil || sb.Domain == nil || *sb.Domain != d.ClientDomain {
		t.Errorf("plain API's domain: %v %v", sb.Domain, err)
	}
}

// TestDomainCertFilesMismatch: certificate files that do not cover the domain
// stop Start at once, saying which name is not covered.
func TestDomainCertFilesMismatch(t *testing.T) {
	testenv.NeedRoot(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	// A certificate for another domain, from the server's own CA code.
	other := daemontest.Start(t, func(c *daemon.Config) { c.Domain = "other.test"; c.TLS.Listen = "127.0.0.1:0" })
	leaf, err := os.ReadFile(filepath.Join(other.Layout.DomainTLS(), "leaf.pem"))
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(certFile, leaf, 0o600)
	os.WriteFile(keyFile, leaf, 0o600)
	d := daemon.New(daemon.Config{
		APIAddr: "127.0.0.1:0", SandboxAddr: "127.0.0.1:0", DataDir: t.TempDir(), TemplateDataDir: testenv.DataDir(),
		EnvdPath: testenv.EnvdBinary(t), MaxTimeout: time.Hour, Templates: []string{"base"}, APIKeys: []string{"k"},
		Domain: "airlock.localhost", TLS: daemon.TLSConfig{Listen: "127.0.0.1:0", CertFile: certFile, KeyFile: keyFile},
	})
	err = d.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "does not cover api.airlock.localhost") {
		t.Fatalf("Start with a certificate for other.test: %v", err)
	}
	t.Log(err)
}
