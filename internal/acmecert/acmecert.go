// Package acmecert obtains and renews the wildcard certificate of
// `airlock serve --domain D` from an ACME CA (Let's Encrypt by default) with
// the DNS-01 challenge, the only ACME challenge that can prove control of
// `*.D`. One certificate covers D and *.D (one SAN set): api.D, sandbox.D and
// every <port>-<id>.D.
//
// The ACME protocol and the DNS providers are lego's
// (github.com/go-acme/lego/v4): a well-kept client used by Traefik and
// others, with DNS-01 providers for the common DNS hosts and rfc2136 for a
// standard DNS server. certmagic was the alternative; it brings its own
// storage, scheduling and on-demand issuance for many names, which Airlock
// does not need for a single SAN set, and DNS providers only through libdns
// modules fewer hosts have. What this package adds around lego is the part
// a server needs: a cache on disk, serving through tls.Config.GetCertificate,
// and a renewal loop that swaps the certificate atomically and keeps the old
// one serving while the CA or the DNS host fails.
//
// Cache layout (Config.CacheDir, normally <data>/tls/acme), per CA so that
// staging and production never mix:
//
//	<CacheDir>/<ca-host-and-path>/account.key   ACME account private key (PEM)
//	<CacheDir>/<ca-host-and-path>/account.json  e-mail and registration (account URL)
//	<CacheDir>/<ca-host-and-path>/<D>.pem       certificate chain, then its private key
//
// Every file is 0600 and written atomically (temporary file, fsync, rename,
// fsync of the directory), so a crash leaves the old file or the new one.
// The certificate and its key share one file so they can never disagree.
package acmecert

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-acme/lego/v4/certcrypto"
	"github.com/go-acme/lego/v4/certificate"
	"github.com/go-acme/lego/v4/challenge"
	"github.com/go-acme/lego/v4/challenge/dns01"
	"github.com/go-acme/lego/v4/lego"
	"github.com/go-acme/lego/v4/registration"
)

// ACME directory URLs of Let's Encrypt. Use the staging one first: its
// certificates are not trusted by browsers, but its rate limits are generous,
// so a wrong DNS set-up does not lock the domain out of production for a week.
const (
	LetsEncryptProduction = lego.LEDirectoryProduction
	LetsEncryptStaging    = lego.LEDirectoryStaging
)

// CADirectory turns the value of a --acme-ca flag into a directory URL:
// "" or "letsencrypt" is Let's Encrypt production, "staging" or
// "letsencrypt-staging" its staging CA, anything else is taken as the URL of
// an ACME directory (a private step-ca, ...; CAs that require external
// account binding, like ZeroSSL and Google Trust Services, are not supported).
func CADirectory(v string) string {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "", "letsencrypt", "production":
		return LetsEncryptProduction
	case "staging", "letsencrypt-staging":
		return LetsEncryptStaging
	}
	return strings.TrimSpace(v)
}

// DefaultRenewBefore is how long before expiry a certificate is renewed.
const DefaultRenewBefore = 30 * 24 * time.Hour

// Config says which certificate to keep and how to prove control of the
// domain.
type Config struct {
	// Domain is D: the certificate covers D and *.D.
	Domain string
	// Email is the ACME account's contact (expiry warnings). Optional.
	Email string
	// CADirURL is the ACME directory (or a name CADirectory knows).
	// Default LetsEncryptProduction; use LetsEncryptStaging while setting up.
	CADirURL string
	// Profile is the ACME certificate profile to order (Let's Encrypt:
	// "classic", "tlsserver", "shortlived"); empty lets the CA choose.
	Profile string
	// DNSProvider is a lego DNS provider name ("cloudflare", "route53",
	// "rfc2136", "exec", "httpreq", ... see DNSProviders), configured by
	// that provider's documented environment variables.
	DNSProvider string
	// Provider, when set, is used instead of DNSProvider (a provider built
	// in code: tests, or an embedding program).
	Provider challenge.Provider
	// Resolvers are the recursive DNS servers ("host:port") used to check
	// that the TXT record is visible before the CA is asked to look.
	// Default: the system's (/etc/resolv.conf).
	Resolvers []string
	// SkipAuthoritativeCheck checks propagation on Resolvers only, not on
	// the zone's authoritative servers (for split-horizon DNS, or
	// authoritative servers that cannot be reached from this host).
	SkipAuthoritativeCheck bool
	// CacheDir holds the account and the certificate (normally
	// <data>/tls/acme). Required.
	CacheDir string
	// RenewBefore is how long before expiry to renew. Default
	// DefaultRenewBefore. It is capped at a third of the certificate's
	// lifetime, so short-lived certificates are renewed at two thirds of
	// their life instead of continuously.
	RenewBefore time.Duration
	// HTTPClient talks to the CA. Default lego's (system roots, plus the
	// PEM files listed in LEGO_CA_CERTIFICATES for a private CA).
	HTTPClient *http.Client
	// Logger receives renewals and failures. Default slog.Default().
	Logger *slog.Logger

	precheck dns01.WrapPreCheckFunc // tests: replaces lego's propagation check
}

// Source serves the certificate of a Config and keeps it renewed. Its
// GetCertificate fits tls.Config.GetCertificate.
type Source struct {
	cfg   Config
	dir   string // CacheDir/<ca>
	log   *slog.Logger
	cert  atomic.Pointer[tls.Certificate]
	user  *acmeUser
	start sync.Once

	// Renewal loop timing; tests shorten them.
	maxSleep   time.Duration // longest wait between two looks at the clock
	minBackoff time.Duration // first retry after a failed renewal
	maxBackoff time.Duration

	cancel context.CancelFunc
	done   chan struct{}
}

// New loads the cached certificate for cfg.Domain, or obtains one from the
// CA if there is none (or it no longer covers D and *.D). It blocks while
// obtaining, which takes from seconds to a few minutes (DNS propagation). A
// cached certificate is served as it is, even if due for renewal: Start
// renews it in the background.
func New(cfg Config) (*Source, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	s := &Source{
		cfg:        cfg,
		dir:        filepath.Join(cfg.CacheDir, caDirName(cfg.CADirURL)),
		log:        cfg.Logger.With("component", "acme", "domain", cfg.Domain),
		maxSleep:   12 * time.Hour,
		minBackoff: time.Minute,
		maxBackoff: 2 * time.Hour,
	}
	routeLegoLog(cfg.Logger)
	if err := os.MkdirAll(s.dir, 0o700); err != nil {
		return nil, fmt.Errorf("acmecert: cache directory %s: %w", s.dir, err)
	}
	cert, err := s.loadCert()
	if err == nil {
		s.cert.Store(cert)
		s.log.Info("acme certificate loaded from cache", "not_after", cert.Leaf.NotAfter, "file", s.certPath())
		return s, nil
	}
	if !errors.Is(err, fs.ErrNotExist) {
		s.log.Warn("cached acme certificate not usable; obtaining a new one", "err", err)
	}
	cert, err = s.obtain()
	if err != nil {
		return nil, err
	}
	s.cert.Store(cert)
	return s, nil
}

func (c *Config) fill() error {
	d := strings.TrimSuffix(strings.ToLower(strings.TrimSpace(c.Domain)), ".")
	if d == "" {
		return errors.New("acmecert: no domain: set --domain to the public domain whose DNS you control")
	}
	if strings.HasPrefix(d, "*.") || strings.ContainsAny(d, "/: ") || !strings.Contains(d, ".") {
		return fmt.Errorf("acmecert: %q is not a domain name: give the bare domain D (e.g. sandboxes.example.com); the certificate covers D and *.D", c.Domain)
	}
	if d == "localhost" || strings.HasSuffix(d, ".localhost") {
		return fmt.Errorf("acmecert: %s is a local name no public CA will certify: use Airlock's own CA for it (no ACME flags)", d)
	}
	c.Domain = d
	c.CADirURL = CADirectory(c.CADirURL)
	if u, err := url.Parse(c.CADirURL); err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return fmt.Errorf("acmecert: ACME directory %q is not an http(s) URL (Let's Encrypt: %s, staging: %s)", c.CADirURL, LetsEncryptProduction, LetsEncryptStaging)
	}
	if c.Provider == nil {
		if c.DNSProvider == "" {
			return fmt.Errorf("acmecert: no DNS provider: wildcard certificates need the DNS-01 challenge; name your DNS host (one of %s) and set its environment variables", strings.Join(DNSProviders(), ", "))
		}
		p, err := newProvider(c.DNSProvider)
		if err != nil {
			return err
		}
		c.Provider = p
	}
	if c.CacheDir == "" {
		return errors.New("acmecert: no cache directory (normally <data>/tls/acme)")
	}
	if c.RenewBefore <= 0 {
		c.RenewBefore = DefaultRenewBefore
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return nil
}

// caDirName turns a directory URL into a directory name:
// https://acme-v02.api.letsencrypt.org/directory ->
// acme-v02.api.letsencrypt.org_directory.
func caDirName(dirURL string) string {
	u, _ := url.Parse(dirURL)
	name := u.Host + strings.TrimSuffix(u.Path, "/")
	return strings.NewReplacer("/", "_", ":", "_", "\\", "_").Replace(name)
}

// Source fits the TLS listener's certificate seam.
var _ interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
} = (*Source)(nil)

// GetCertificate serves the current certificate; it has the shape of
// tls.Config.GetCertificate. Names outside D and *.D are refused.
func (s *Source) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	c := s.cert.Load()
	if c == nil {
		return nil, errors.New("acmecert: no certificate")
	}
	if hello != nil && hello.ServerName != "" {
		if err := c.Leaf.VerifyHostname(hello.ServerName); err != nil {
			return nil, fmt.Errorf("acmecert: %q is not served here (only %s and *.%s)", hello.ServerName, s.cfg.Domain, s.cfg.Domain)
		}
	}
	return c, nil
}

// Leaf is the certificate being served.
func (s *Source) Leaf() *x509.Certificate {
	if c := s.cert.Load(); c != nil {
		return c.Leaf
	}
	return nil
}

// CertFile is where the certificate chain and its key are kept (one PEM
// file: the chain, then the key).
func (s *Source) CertFile() string { return s.certPath() }

// Start runs the renewal loop until ctx ends or Close is called. Calling it
// more than once does nothing.
func (s *Source) Start(ctx context.Context) {
	s.start.Do(func() {
		ctx, s.cancel = context.WithCancel(ctx)
		s.done = make(chan struct{})
		go s.loop(ctx)
	})
}

// Close stops the renewal loop and waits for it (an ACME conversation in
// progress finishes first). The last certificate keeps being served.
func (s *Source) Close() error {
	s.start.Do(func() {}) // a later Start does nothing
	if s.cancel != nil {
		s.cancel()
		<-s.done
	}
	return nil
}

// renewAt is when leaf is due: RenewBefore before expiry, but no earlier
// than two thirds into its lifetime.
func (s *Source) renewAt(leaf *x509.Certificate) time.Time {
	before := s.cfg.RenewBefore
	if third := leaf.NotAfter.Sub(leaf.NotBefore) / 3; before > third {
		before = third
	}
	return leaf.NotAfter.Add(-before)
}

func (s *Source) loop(ctx context.Context) {
	defer close(s.done)
	backoff := time.Duration(0)
	for {
		wait := time.Until(s.renewAt(s.Leaf()))
		if backoff > 0 {
			wait = backoff
		}
		if wait > s.maxSleep {
			wait = s.maxSleep // look at the clock again: suspend, clock jumps
		}
		if wait > 0 {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			if time.Now().Before(s.renewAt(s.Leaf())) {
				backoff = 0
				continue
			}
		}
		if ctx.Err() != nil {
			return
		}
		old := s.Leaf()
		cert, err := s.obtain()
		if err != nil {
			switch {
			case backoff == 0:
				backoff = s.minBackoff
			case backoff < s.maxBackoff:
				backoff = min(2*backoff, s.maxBackoff)
			}
			level := slog.LevelWarn
			if time.Now().After(old.NotAfter) {
				level = slog.LevelError
			}
			s.log.Log(ctx, level, "acme renewal failed; the current certificate keeps serving",
				"err", err, "not_after", old.NotAfter, "retry_in", backoff)
			continue
		}
		backoff = 0
		s.cert.Store(cert)
		s.log.Info("acme certificate renewed", "old_not_after", old.NotAfter, "not_after", cert.Leaf.NotAfter)
	}
}

// legoMu makes one ACME conversation at a time in this process: lego keeps
// the DNS-01 resolvers and timeouts in package variables, so two Sources
// with different Resolvers must not overlap.
var legoMu sync.Mutex

// obtain runs one ACME order for D and *.D and writes the result to the
// cache. It registers the account first if needed.
func (s *Source) obtain() (*tls.Certificate, error) {
	legoMu.Lock()
	defer legoMu.Unlock()
	d := s.cfg.Domain
	user, err := s.loadUser()
	if err != nil {
		return nil, err
	}
	lc := lego.NewConfig(user)
	lc.CADirURL = s.cfg.CADirURL
	lc.UserAgent = "airlock"
	lc.Certificate.KeyType = certcrypto.EC256
	if s.cfg.HTTPClient != nil {
		// A copy: lego wraps the client's Transport in place, so handing
		// it the same client on every renewal would nest the wrappers (and
		// race with another Source sharing it).
		c := *s.cfg.HTTPClient
		lc.HTTPClient = &c
	}
	client, err := lego.NewClient(lc)
	if err != nil {
		return nil, fmt.Errorf("acmecert: cannot reach the ACME CA at %s (check the URL and that this host can make outbound HTTPS requests): %w", s.cfg.CADirURL, err)
	}
	var opts []dns01.ChallengeOption
	if len(s.cfg.Resolvers) > 0 {
		opts = append(opts, dns01.AddRecursiveNameservers(dns01.ParseNameservers(s.cfg.Resolvers)))
	}
	if s.cfg.SkipAuthoritativeCheck {
		opts = append(opts, dns01.DisableAuthoritativeNssPropagationRequirement())
	}
	if s.cfg.precheck != nil {
		opts = append(opts, dns01.WrapPreCheck(s.cfg.precheck))
	}
	if err := client.Challenge.SetDNS01Provider(s.cfg.Provider, opts...); err != nil {
		return nil, fmt.Errorf("acmecert: DNS-01 provider: %w", err)
	}
	if user.Registration == nil {
		reg, err := client.Registration.Register(registration.RegisterOptions{TermsOfServiceAgreed: true})
		if err != nil {
			return nil, fmt.Errorf("acmecert: registering an ACME account at %s (check the e-mail address and the CA URL): %w", s.cfg.CADirURL, err)
		}
		user.Registration = reg
		if err := s.saveUser(user); err != nil {
			return nil, err
		}
		s.log.Info("acme account registered", "account", reg.URI)
	}
	s.log.Info("obtaining acme certificate", "names", []string{d, "*." + d}, "ca", s.cfg.CADirURL)
	res, err := client.Certificate.Obtain(certificate.ObtainRequest{
		Domains: []string{d, "*." + d},
		Bundle:  true,
		Profile: s.cfg.Profile,
	})
	if err != nil {
		return nil, fmt.Errorf("acmecert: obtaining a certificate for %s and *.%s failed: check that the DNS provider's credentials may create TXT records in the zone of %s, and that %s is really a domain you own: %w", d, d, d, d, err)
	}
	data := append(append([]byte{}, res.Certificate...), res.PrivateKey...)
	cert, err := parseCert(data, d)
	if err != nil {
		return nil, fmt.Errorf("acmecert: the CA returned an unusable certificate: %w", err)
	}
	if err := writeAtomic(s.certPath(), data); err != nil {
		return nil, err
	}
	s.log.Info("acme certificate obtained", "not_after", cert.Leaf.NotAfter, "file", s.certPath())
	return cert, nil
}

func (s *Source) certPath() string { return filepath.Join(s.dir, s.cfg.Domain+".pem") }

// loadCert reads the cached certificate; fs.ErrNotExist when there is none.
func (s *Source) loadCert() (*tls.Certificate, error) {
	data, err := os.ReadFile(s.certPath())
	if err != nil {
		return nil, err
	}
	cert, err := parseCert(data, s.cfg.Domain)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.certPath(), err)
	}
	return cert, nil
}

// parseCert parses a chain-then-key PEM and checks that it covers D and *.D.
func parseCert(data []byte, domain string) (*tls.Certificate, error) {
	cert, err := tls.X509KeyPair(data, data)
	if err != nil {
		return nil, err
	}
	if cert.Leaf == nil {
		if cert.Leaf, err = x509.ParseCertificate(cert.Certificate[0]); err != nil {
			return nil, err
		}
	}
	for _, n := range []string{domain, "x." + domain} {
		if err := cert.Leaf.VerifyHostname(n); err != nil {
			return nil, fmt.Errorf("certificate does not cover %s and *.%s: %w", domain, domain, err)
		}
	}
	return &cert, nil
}

// acmeUser is lego's registration.User.
type acmeUser struct {
	Email        string                 `json:"email"`
	Registration *registration.Resource `json:"registration"`
	key          crypto.PrivateKey
}

func (u *acmeUser) GetEmail() string                        { return u.Email }
func (u *acmeUser) GetRegistration() *registration.Resource { return u.Registration }
func (u *acmeUser) GetPrivateKey() crypto.PrivateKey        { return u.key }

// loadUser reads the account, creating its key on first use. The key is
// written before the registration; a crash between the two registers the
// same key again, which the CA answers with the existing account.
func (s *Source) loadUser() (*acmeUser, error) {
	if s.user != nil {
		return s.user, nil
	}
	keyPath := filepath.Join(s.dir, "account.key")
	u := &acmeUser{Email: s.cfg.Email}
	if data, err := os.ReadFile(keyPath); err == nil {
		if u.key, err = certcrypto.ParsePEMPrivateKey(data); err != nil {
			return nil, fmt.Errorf("acmecert: %s: %w (remove it to register a new account)", keyPath, err)
		}
	} else if errors.Is(err, fs.ErrNotExist) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		der, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			return nil, err
		}
		if err := writeAtomic(keyPath, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der})); err != nil {
			return nil, err
		}
		u.key = k
	} else {
		return nil, fmt.Errorf("acmecert: %w", err)
	}
	regPath := filepath.Join(s.dir, "account.json")
	if data, err := os.ReadFile(regPath); err == nil {
		var saved acmeUser
		if err := json.Unmarshal(data, &saved); err != nil {
			return nil, fmt.Errorf("acmecert: %s: %w (remove it to register again)", regPath, err)
		}
		if saved.Email == s.cfg.Email {
			u.Registration = saved.Registration
		} // else: register again with the new contact; the CA keeps the account of this key
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("acmecert: %w", err)
	}
	s.user = u
	return u, nil
}

func (s *Source) saveUser(u *acmeUser) error {
	data, err := json.MarshalIndent(u, "", "  ")
	if err != nil {
		return err
	}
	return writeAtomic(filepath.Join(s.dir, "account.json"), data)
}

// writeAtomic replaces path with data (0600): temporary file, fsync, rename,
// fsync of the directory.
func writeAtomic(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("acmecert: %w", err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after a successful rename, a no-op
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return fmt.Errorf("acmecert: %w", err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("acmecert: writing %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("acmecert: writing %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("acmecert: writing %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("acmecert: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}
