package tlsfront

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/localca"
)

// Files of the domain CA's directory besides localca's ca.pem and ca.crt.
const (
	// LeafFile holds the certificate issued for the domain (chain, then key).
	LeafFile = "leaf.pem"
	// BundleFile is the host's trust store with the CA appended: what
	// SSL_CERT_FILE and REQUESTS_CA_BUNDLE point at, so that a client
	// trusting it still trusts every public CA.
	BundleFile = "bundle.crt"
)

// leafLifetime is how long an issued certificate lasts; renewBefore is how
// long before its end it is replaced (at start, or by the handshake that
// finds it so old).
const (
	leafLifetime = 90 * 24 * time.Hour
	renewBefore  = 30 * 24 * time.Hour
)

// hostBundles are where Debian-family and Red Hat-family hosts keep the
// system trust store.
var hostBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"}

// CASource issues the domain's certificate from the server's own domain CA:
// one certificate for D and *.D, kept in the CA's directory, issued again
// when the domain changes or it nears its end.
type CASource struct {
	ca     *localca.CA
	domain string

	mu   sync.Mutex
	leaf *tls.Certificate
}

// LoadOrCreateCA opens the domain CA in dir (made on first use) and the
// certificate for domain it issued, issuing one if there is none, it is for
// another domain or another CA, or it ends within 30 days.
func LoadOrCreateCA(dir, domain string) (*CASource, error) {
	ca, err := localca.LoadOrCreate(dir, "Airlock domain CA")
	if err != nil {
		return nil, fmt.Errorf("domain CA: %w", err)
	}
	s := &CASource{ca: ca, domain: domain}
	if c, err := s.readLeaf(); err == nil && s.fresh(c) {
		s.leaf = c
	} else if err := s.issue(); err != nil {
		return nil, err
	}
	if err := s.writeBundle(); err != nil {
		return nil, fmt.Errorf("domain CA: %w", err)
	}
	return s, nil
}

// CertPath is the CA certificate's file (NODE_EXTRA_CA_CERTS).
func (s *CASource) CertPath() string { return s.ca.CertPath }

// BundlePath is the host's trust store plus the CA (SSL_CERT_FILE,
// REQUESTS_CA_BUNDLE).
func (s *CASource) BundlePath() string { return filepath.Join(s.ca.Dir, BundleFile) }

// Pool holds the CA alone (tests).
func (s *CASource) Pool() *x509.CertPool { return s.ca.Pool() }

// GetCertificate returns the domain's certificate, issued again first if it
// nears its end.
func (s *CASource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.fresh(s.leaf) {
		if err := s.issueLocked(); err != nil {
			return nil, err
		}
	}
	return s.leaf, nil
}

// fresh reports whether c is this CA's certificate for exactly D and *.D and
// has more than renewBefore left.
func (s *CASource) fresh(c *tls.Certificate) bool {
	if c == nil || c.Leaf == nil || time.Until(c.Leaf.NotAfter) < renewBefore {
		return false
	}
	if !slices.Equal(c.Leaf.DNSNames, []string{s.domain, "*." + s.domain}) {
		return false
	}
	return c.Leaf.CheckSignatureFrom(s.ca.Cert) == nil
}

func (s *CASource) readLeaf() (*tls.Certificate, error) {
	data, err := os.ReadFile(filepath.Join(s.ca.Dir, LeafFile))
	if err != nil {
		return nil, err
	}
	c, err := tls.X509KeyPair(data, data)
	if err != nil {
		return nil, err
	}
	return &c, nil
}

func (s *CASource) issue() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.issueLocked()
}

func (s *CASource) issueLocked() error {
	key, err := localca.NewKey()
	if err != nil {
		return fmt.Errorf("domain CA: certificate key: %w", err)
	}
	c, err := s.ca.Issue([]string{s.domain, "*." + s.domain}, key, leafLifetime)
	if err != nil {
		return fmt.Errorf("domain CA: %w", err)
	}
	var buf bytes.Buffer
	for _, der := range c.Certificate {
		_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	kb, err := localca.KeyPEM(key)
	if err != nil {
		return fmt.Errorf("domain CA: %w", err)
	}
	buf.Write(kb)
	if err := localca.WriteAtomic(filepath.Join(s.ca.Dir, LeafFile), buf.Bytes(), 0o600); err != nil {
		return fmt.Errorf("domain CA: %w", err)
	}
	s.leaf = c
	return nil
}

// writeBundle writes the host's trust store with the CA appended (the CA
// alone when the host has none).
func (s *CASource) writeBundle() error {
	var sys []byte
	for _, p := range hostBundles {
		b, err := os.ReadFile(p)
		if err == nil {
			sys = b
			break
		}
		if !errors.Is(err, os.ErrNotExist) {
			return err
		}
	}
	want := append(append(append([]byte(nil), sys...), "\n# Airlock domain CA (serve --domain "+s.domain+")\n"...), s.ca.CertPEM...)
	path := s.BundlePath()
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, want) {
		return nil
	}
	return localca.WriteAtomic(path, want, 0o644)
}
