package acmecert

// The ACME path is tested against a real ACME server: Let's Encrypt's pebble
// (github.com/letsencrypt/pebble/v2: its CA, VA and web front end, run in
// this process) with its DNS-01 validation pointed at a challtestsrv DNS
// server (github.com/letsencrypt/challtestsrv, the library behind
// pebble-challtestsrv) on loopback. The test's DNS provider sets the TXT
// records in that server, lego checks propagation against it, and pebble's
// VA validates against it. Nothing leaves 127.0.0.1.

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"io"
	"io/fs"
	"log"
	"log/slog"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-acme/lego/v4/challenge/dns01"
	"github.com/letsencrypt/challtestsrv"
	"github.com/letsencrypt/pebble/v2/ca"
	"github.com/letsencrypt/pebble/v2/db"
	"github.com/letsencrypt/pebble/v2/va"
	"github.com/letsencrypt/pebble/v2/wfe"
	"github.com/miekg/dns"
)

const shortLived = 9 // seconds of validity of the "shortlived" profile

// acmeEnv is one pebble and one challtestsrv for the whole test binary
// (challtestsrv registers its DNS handler on miekg/dns's global mux).
type acmeEnv struct {
	handler  http.Handler    // pebble's ACME front end
	client   *http.Client    // trusts the front end's TLS certificate
	tlsCert  tls.Certificate // of the front end
	roots    *x509.CertPool  // pebble's issuing root, from its management API
	dns      *challtestsrv.ChallSrv
	dnsAddr  string
	setupErr error
}

var (
	envOnce sync.Once
	env     acmeEnv
)

func testEnv(t *testing.T) *acmeEnv {
	t.Helper()
	envOnce.Do(func() { env.setupErr = env.setup() })
	if env.setupErr != nil {
		t.Fatalf("pebble: %v", env.setupErr)
	}
	return &env
}

func (e *acmeEnv) setup() error {
	// Deterministic pebble: no random VA sleeps, no injected bad nonces, no
	// reuse of valid authorizations (every order solves DNS-01 again).
	os.Setenv("PEBBLE_VA_NOSLEEP", "1")
	os.Setenv("PEBBLE_WFE_NONCEREJECT", "0")
	os.Setenv("PEBBLE_AUTHZREUSE", "0")
	quiet := log.New(io.Discard, "", 0)
	if testing.Verbose() {
		quiet = log.New(os.Stderr, "pebble ", log.Lmicroseconds)
	}

	e.dnsAddr = freeLoopbackAddr()
	srv, err := challtestsrv.New(challtestsrv.Config{DNSAddrs: []string{e.dnsAddr}, Log: quiet})
	if err != nil {
		return err
	}
	srv.Run()
	e.dns = srv
	// Wait until the DNS server answers over TCP (pebble's VA uses TCP).
	for i := 0; ; i++ {
		c, err := net.DialTimeout("tcp", e.dnsAddr, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if i == 50 {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}

	store := db.NewMemoryStore()
	profiles := map[string]ca.Profile{
		"default":    {Description: "90 days", ValidityPeriod: 90 * 24 * 3600},
		"shortlived": {Description: "seconds", ValidityPeriod: shortLived},
	}
	authority := ca.New(quiet, store, "", "ecdsa", 0, 1, profiles)
	validator := va.New(quiet, 0, 0, false, e.dnsAddr, store)
	front := wfe.New(quiet, store, validator, authority, []string{"pebble.letsencrypt.org"}, false, false, 1, 1)
	e.handler = paced(front.Handler())

	e.tlsCert, err = loopbackCert()
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	pool.AddCert(e.tlsCert.Leaf)
	e.client = &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}},
	}

	// The root pebble issues under, fetched from its management API.
	mgmt, err := e.serve(freeLoopbackAddr(), front.ManagementHandler())
	if err != nil {
		return err
	}
	defer mgmt.Close()
	resp, err := e.client.Get("https://" + mgmt.Addr + wfe.RootCertPath + "0")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rootPEM, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	e.roots = x509.NewCertPool()
	if !e.roots.AppendCertsFromPEM(rootPEM) {
		return errors.New("no root certificate from pebble's management API")
	}
	return nil
}

// paced shortens lego's waits against pebble without skipping any step.
// pebble answers a challenge POST without Retry-After, and lego then polls
// the authorization every ~5 s; pebble's VA, here on loopback, is done in
// milliseconds. So: a challenge response says Retry-After: 1 (RFC 8555
// §7.5.1 lets a server say so), and an authorization poll waits 100 ms, long
// enough for the VA to have looked at the DNS server.
func paced(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.HasPrefix(r.URL.Path, "/chalZ/"):
			w.Header().Set("Retry-After", "1")
		case strings.HasPrefix(r.URL.Path, "/authZ/"):
			time.Sleep(100 * time.Millisecond)
		}
		h.ServeHTTP(w, r)
	})
}

// serve runs h over TLS on addr until the returned server is closed.
func (e *acmeEnv) serve(addr string, h http.Handler) (*http.Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	srv := &http.Server{Addr: ln.Addr().String(), Handler: h, ErrorLog: log.New(io.Discard, "", 0),
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{e.tlsCert}}}
	go srv.ServeTLS(ln, "", "")
	return srv, nil
}

// startCA runs an ACME directory on its own loopback address (so that a test
// can take it down and bring it back) and returns the directory URL.
func (e *acmeEnv) startCA(t *testing.T, addr string) (*http.Server, string) {
	t.Helper()
	srv, err := e.serve(addr, e.handler)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	return srv, "https://" + srv.Addr + wfe.DirectoryPath
}

// config is a Config for domain against the CA at dirURL, with the test
// DNS provider.
func (e *acmeEnv) config(t *testing.T, domain, dirURL, profile string, logs *logBuf) Config {
	return Config{
		Domain:                 domain,
		Email:                  "ops@" + domain,
		CADirURL:               dirURL,
		Profile:                profile,
		Provider:               challDNS{e.dns},
		Resolvers:              []string{e.dnsAddr},
		SkipAuthoritativeCheck: true, // challtestsrv serves no NS records
		CacheDir:               t.TempDir(),
		HTTPClient:             e.client,
		Logger:                 slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// challDNS is a lego DNS-01 provider that sets the TXT records in the
// challtestsrv that pebble's VA queries.
type challDNS struct{ srv *challtestsrv.ChallSrv }

func (p challDNS) Present(domain, _, keyAuth string) error {
	info := dns01.GetChallengeInfo(domain, keyAuth)
	p.srv.AddDNSTXTRecord(info.EffectiveFQDN, info.Value)
	return nil
}

// Timeout: poll the loopback DNS server every 100 ms (lego's default waits
// 2 s before the first look).
func (challDNS) Timeout() (timeout, interval time.Duration) {
	return 10 * time.Second, 100 * time.Millisecond
}

func (p challDNS) CleanUp(domain, _, keyAuth string) error {
	p.srv.DeleteDNSTXTRecord(dns01.GetChallengeInfo(domain, keyAuth).EffectiveFQDN)
	return nil
}

// logBuf collects log lines from several goroutines.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestObtainCacheRenew(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	const d = "sandboxes.airlock.test"
	caSrv, dirURL := e.startCA(t, freeLoopbackAddr())
	logs := &logBuf{}
	cfg := e.config(t, d, dirURL, "default", logs)

	// First obtain.
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v\n%s", err, logs)
	}
	leaf := s.Leaf()
	for _, want := range []string{d, "*." + d} {
		if !containsName(leaf.DNSNames, want) {
			t.Errorf("certificate names %v lack %s", leaf.DNSNames, want)
		}
	}
	for _, host := range []string{d, "api." + d, "8000-abc123.", "sandbox." + d} {
		if host == "8000-abc123." {
			host += d
		}
		c, err := s.GetCertificate(&tls.ClientHelloInfo{ServerName: host})
		if err != nil {
			t.Fatalf("GetCertificate(%s): %v", host, err)
		}
		if err := verifyChain(c, host, e.roots); err != nil {
			t.Fatalf("chain for %s does not verify against pebble's root: %v", host, err)
		}
	}
	// The proof went through DNS: TXT queries for _acme-challenge.D reached
	// the DNS server (from lego's propagation check and pebble's VA).
	txtQueries := 0
	for _, ev := range e.dns.RequestHistory("_acme-challenge."+d, challtestsrv.DNSRequestEventType) {
		if ev.(challtestsrv.DNSRequestEvent).Question.Qtype == dns.TypeTXT {
			txtQueries++
		}
	}
	if txtQueries < 2 {
		t.Errorf("%d TXT queries for _acme-challenge.%s, want the DNS-01 lookups", txtQueries, d)
	}
	for _, host := range []string{"a.b." + d, "other.test", "airlock.test"} {
		if _, err := s.GetCertificate(&tls.ClientHelloInfo{ServerName: host}); err == nil {
			t.Errorf("GetCertificate(%s) served a certificate for a name outside %s", host, d)
		}
	}

	// What is on disk: per-CA directory, 0600 files, the chain then the key.
	dir := filepath.Join(cfg.CacheDir, caDirName(dirURL))
	for _, name := range []string{"account.key", "account.json", d + ".pem"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", name, fi.Mode().Perm())
		}
	}
	if s.CertFile() != filepath.Join(dir, d+".pem") {
		t.Errorf("CertFile %s", s.CertFile())
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".*tmp*")); len(left) > 0 {
		t.Errorf("temporary files left: %v", left)
	}

	// Cache reload: a new Source with the CA down serves the same certificate.
	caSrv.Close()
	s2, err := New(cfg)
	if err != nil {
		t.Fatalf("New from cache with the CA down: %v", err)
	}
	if s2.Leaf().SerialNumber.Cmp(leaf.SerialNumber) != 0 {
		t.Fatalf("cache reload served serial %x, want %x", s2.Leaf().SerialNumber, leaf.SerialNumber)
	}

	// A CA that cannot be reached and no cache: a clear error.
	cfg3 := cfg
	cfg3.CacheDir = t.TempDir()
	if _, err := New(cfg3); err == nil || !strings.Contains(err.Error(), "cannot reach the ACME CA") {
		t.Fatalf("New with the CA down and no cache: %v", err)
	}
}

// A DNS provider that does not publish the record: the CA refuses, New
// says what to check, and nothing is cached.
func TestDNSNotPublished(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	_, dirURL := e.startCA(t, freeLoopbackAddr())
	logs := &logBuf{}
	cfg := e.config(t, "nodns.airlock.test", dirURL, "default", logs)
	cfg.Provider = noDNS{}
	cfg.SkipAuthoritativeCheck = false
	cfg.Resolvers = nil
	// lego's own propagation check is skipped here (it would only time out);
	// pebble's VA looks and finds no TXT record.
	cfg.precheck = func(_, _, _ string, _ dns01.PreCheckFunc) (bool, error) { return true, nil }
	_, err := New(cfg)
	if err == nil || !strings.Contains(err.Error(), "obtaining a certificate for nodns.airlock.test and *.nodns.airlock.test failed") {
		t.Fatalf("New with no TXT record: %v", err)
	}
	if !strings.Contains(err.Error(), "may create TXT records") {
		t.Errorf("the error does not say what to check: %v", err)
	}
	if m, _ := filepath.Glob(filepath.Join(cfg.CacheDir, "*", "*.pem")); len(m) > 0 {
		t.Errorf("something was cached: %v", m)
	}
}

type noDNS struct{}

func (noDNS) Present(string, string, string) error { return nil }
func (noDNS) CleanUp(string, string, string) error { return nil }

func TestRenewWithinRenewBefore(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	const d = "renew.airlock.test"
	_, dirURL := e.startCA(t, freeLoopbackAddr())
	logs := &logBuf{}
	cfg := e.config(t, d, dirURL, "shortlived", logs)
	cfg.RenewBefore = 2 * time.Second // under a third of the 9 s lifetime
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v\n%s", err, logs)
	}
	first := s.Leaf()
	if life := first.NotAfter.Sub(first.NotBefore); life > shortLived*time.Second {
		t.Fatalf("pebble issued %v, want the %ds profile", life, shortLived)
	}
	if at, want := s.renewAt(first), first.NotAfter.Add(-2*time.Second); !at.Equal(want) {
		t.Fatalf("renewAt %v, want %v", at, want)
	}
	s.Start(context.Background())
	defer s.Close()

	// Before RenewBefore nothing happens; inside it the certificate is replaced.
	deadline := first.NotAfter.Add(5 * time.Second)
	for s.Leaf().SerialNumber.Cmp(first.SerialNumber) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not renewed by %v (not after %v)\n%s", deadline, first.NotAfter, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	renewedAt := time.Now()
	if renewedAt.Before(s.renewAt(first)) {
		t.Fatalf("renewed at %v, before it was due at %v", renewedAt, s.renewAt(first))
	}
	second := s.Leaf()
	if !second.NotAfter.After(first.NotAfter) {
		t.Fatalf("renewed certificate ends %v, not after the old %v", second.NotAfter, first.NotAfter)
	}
	c, _ := s.GetCertificate(&tls.ClientHelloInfo{ServerName: "api." + d})
	if err := verifyChain(c, "api."+d, e.roots); err != nil {
		t.Fatalf("renewed chain: %v", err)
	}
	// The renewal is on disk: a new Source loads it.
	s.Close()
	s2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if s2.Leaf().SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatal("the cache still holds the first certificate")
	}
	if !strings.Contains(logs.String(), "acme certificate renewed") {
		t.Errorf("no renewal logged:\n%s", logs)
	}
}

func TestCADownOldCertificateKeepsServing(t *testing.T) {
	t.Parallel()
	e := testEnv(t)
	const d = "down.airlock.test"
	addr := freeLoopbackAddr()
	caSrv, dirURL := e.startCA(t, addr)
	logs := &logBuf{}
	cfg := e.config(t, d, dirURL, "shortlived", logs)
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v\n%s", err, logs)
	}
	s.minBackoff, s.maxBackoff = 300*time.Millisecond, 600*time.Millisecond
	old := s.Leaf()
	caSrv.Close() // the CA goes away
	s.Start(context.Background())
	defer s.Close()

	// Renewal comes due (RenewBefore 30 days is capped at a third of the
	// lifetime) and fails; the old certificate is still served, and the
	// loop retries with backoff.
	deadline := old.NotAfter.Add(5 * time.Second)
	for strings.Count(logs.String(), "acme renewal failed") < 2 {
		if time.Now().After(deadline) {
			t.Fatalf("no failed renewals logged by %v:\n%s", deadline, logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
	c, err := s.GetCertificate(&tls.ClientHelloInfo{ServerName: "api." + d})
	if err != nil || c.Leaf.SerialNumber.Cmp(old.SerialNumber) != 0 {
		t.Fatalf("while the CA is down: GetCertificate = %v, %v; want the old certificate", c, err)
	}
	if !strings.Contains(logs.String(), "cannot reach the ACME CA") {
		t.Errorf("the failure does not say the CA is unreachable:\n%s", logs)
	}

	// The CA comes back on the same address: the next retry renews.
	e.startCA(t, addr)
	deadline = time.Now().Add(10 * time.Second)
	for s.Leaf().SerialNumber.Cmp(old.SerialNumber) == 0 {
		if time.Now().After(deadline) {
			t.Fatalf("not renewed after the CA came back:\n%s", logs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func TestConfigErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{CacheDir: dir, DNSProvider: "exec"}, "no domain"},
		{Config{Domain: "*.example.com", CacheDir: dir, DNSProvider: "exec"}, "not a domain name"},
		{Config{Domain: "airlock.localhost", CacheDir: dir, DNSProvider: "exec"}, "local name"},
		{Config{Domain: "example.com", CacheDir: dir}, "no DNS provider"},
		{Config{Domain: "example.com", CacheDir: dir, DNSProvider: "nosuch"}, "unknown DNS provider"},
		{Config{Domain: "example.com", CacheDir: dir, DNSProvider: "cloudflare"}, "CLOUDFLARE_DNS_API_TOKEN"},
		{Config{Domain: "example.com", CacheDir: dir, DNSProvider: "rfc2136"}, "DNSUPDATE_NAMESERVER"},
		{Config{Domain: "example.com", DNSProvider: "exec", Provider: challDNS{}}, "no cache directory"},
		{Config{Domain: "example.com", CacheDir: dir, CADirURL: "acme.example", Provider: challDNS{}}, "not an http(s) URL"},
	} {
		for _, k := range []string{"CLOUDFLARE_DNS_API_TOKEN", "CLOUDFLARE_ZONE_API_TOKEN", "CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY", "CF_DNS_API_TOKEN", "CF_API_TOKEN", "CF_ZONE_API_TOKEN", "CF_API_EMAIL", "CF_API_KEY", "RFC2136_NAMESERVER", "DNSUPDATE_NAMESERVER", "EXEC_PATH"} {
			t.Setenv(k, "")
		}
		_, err := New(tc.cfg)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want an error saying %q", tc.cfg, err, tc.want)
		}
	}
	if _, err := newProvider("exec"); err == nil || !strings.Contains(err.Error(), "EXEC_PATH") {
		t.Errorf("exec without EXEC_PATH: %v", err)
	}
	if _, err := newProvider(" DNSUpdate "); err == nil || !strings.Contains(err.Error(), "lego/dns/rfc2136/") {
		t.Errorf("dnsupdate without its variables: %v", err)
	}
}

// A cached file that is not usable (corrupt, or for other names) is not
// served; New goes to the CA (here: none, so it fails).
func TestCacheNotUsable(t *testing.T) {
	cfg := Config{Domain: "example.com", CacheDir: t.TempDir(), Provider: challDNS{},
		CADirURL: "https://127.0.0.1:1/dir", Logger: slog.New(slog.DiscardHandler)}
	s := &Source{cfg: cfg}
	if err := cfg.fill(); err != nil {
		t.Fatal(err)
	}
	s.cfg = cfg
	s.dir = filepath.Join(cfg.CacheDir, caDirName(cfg.CADirURL))
	if _, err := s.loadCert(); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("empty cache: %v", err)
	}
	os.MkdirAll(s.dir, 0o700)
	// A valid pair for other names.
	other, _ := loopbackCert()
	var pemData bytes.Buffer
	pemBlock(&pemData, "CERTIFICATE", other.Certificate[0])
	der, _ := x509.MarshalECPrivateKey(other.PrivateKey.(*ecdsa.PrivateKey))
	pemBlock(&pemData, "EC PRIVATE KEY", der)
	if err := writeAtomic(s.certPath(), pemData.Bytes()); err != nil {
		t.Fatal(err)
	}
	if _, err := s.loadCert(); err == nil || !strings.Contains(err.Error(), "does not cover example.com") {
		t.Fatalf("certificate for other names: %v", err)
	}
	if err := writeAtomic(s.certPath(), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	if _, err := s.loadCert(); err == nil || errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("garbage: %v", err)
	}
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "cannot reach the ACME CA") {
		t.Fatalf("New with an unusable cache and no CA: %v", err)
	}
}

func TestRenewAtCap(t *testing.T) {
	s := &Source{cfg: Config{RenewBefore: DefaultRenewBefore}}
	now := time.Now()
	for _, tc := range []struct {
		life, want time.Duration // want: before NotAfter
	}{
		{90 * 24 * time.Hour, 30 * 24 * time.Hour},
		{45 * 24 * time.Hour, 15 * 24 * time.Hour},
		{6 * 24 * time.Hour, 2 * 24 * time.Hour},
	} {
		leaf := &x509.Certificate{NotBefore: now, NotAfter: now.Add(tc.life)}
		if got := leaf.NotAfter.Sub(s.renewAt(leaf)); got != tc.want {
			t.Errorf("lifetime %v: renew %v before expiry, want %v", tc.life, got, tc.want)
		}
	}
}

func TestCADirectory(t *testing.T) {
	for in, want := range map[string]string{
		"":                              LetsEncryptProduction,
		"letsencrypt":                   LetsEncryptProduction,
		" Staging ":                     LetsEncryptStaging,
		"https://ca.internal/directory": "https://ca.internal/directory",
	} {
		if got := CADirectory(in); got != want {
			t.Errorf("CADirectory(%q) = %s, want %s", in, got, want)
		}
	}
}

func TestCADirName(t *testing.T) {
	for in, want := range map[string]string{
		LetsEncryptProduction:                      "acme-v02.api.letsencrypt.org_directory",
		LetsEncryptStaging:                         "acme-staging-v02.api.letsencrypt.org_directory",
		"https://127.0.0.1:14000/dir":              "127.0.0.1_14000_dir",
		"https://ca.internal/acme/acme/directory/": "ca.internal_acme_acme_directory",
	} {
		if got := caDirName(in); got != want {
			t.Errorf("caDirName(%s) = %s, want %s", in, got, want)
		}
	}
}

func verifyChain(c *tls.Certificate, host string, roots *x509.CertPool) error {
	inter := x509.NewCertPool()
	for _, der := range c.Certificate[1:] {
		ic, err := x509.ParseCertificate(der)
		if err != nil {
			return err
		}
		inter.AddCert(ic)
	}
	leaf, err := x509.ParseCertificate(c.Certificate[0])
	if err != nil {
		return err
	}
	_, err = leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots, Intermediates: inter})
	return err
}

func containsName(names []string, n string) bool {
	for _, x := range names {
		if x == n {
			return true
		}
	}
	return false
}

func freeLoopbackAddr() string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// loopbackCert is a self-signed certificate for 127.0.0.1 (the test CA's
// HTTPS front end).
func loopbackCert() (tls.Certificate, error) {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		Subject:      pkix.Name{CommonName: "acme test front end"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA:         true, BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		return tls.Certificate{}, err
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: k, Leaf: leaf}, nil
}

func pemBlock(w io.Writer, typ string, der []byte) {
	_ = pem.Encode(w, &pem.Block{Type: typ, Bytes: der})
}
