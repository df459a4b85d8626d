package egress

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/airlock-sandbox/airlock/internal/localca"
)

// CA is the server's egress certificate authority: created once in the data
// dir, trusted by every sandbox (Bundle), and used to issue a certificate
// for each rule host whose TLS the egress terminates. Its key never leaves
// the host.
type CA struct {
	ca *localca.CA

	// leafKey signs every issued certificate: one key for all leaves keeps
	// issuing a certificate to one signature.
	leafKey *ecdsa.PrivateKey
	mu      sync.Mutex
	leaves  map[string]*tls.Certificate
	bundles map[string]string // rootfs -> bundle file
}

// CertFile holds the CA's certificate alone, for operators and tests.
const CertFile = localca.CertFile

// leafLifetime bounds an issued certificate; leaves are re-issued a day
// before they end.
const leafLifetime = 7 * 24 * time.Hour

// maxLeaves bounds the issued-certificate cache (a sandbox naming many
// hosts in its rules).
const maxLeaves = 10000

// LoadOrCreateCA reads the CA in dir or creates it (localca: a crash leaves
// no CA or a whole one).
func LoadOrCreateCA(dir string) (*CA, error) {
	lca, err := localca.LoadOrCreate(dir, "Airlock egress CA")
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	ca := &CA{ca: lca, leaves: map[string]*tls.Certificate{}, bundles: map[string]string{}}
	ca.leafKey, err = localca.NewKey()
	if err != nil {
		return nil, fmt.Errorf("egress CA: leaf key: %w", err)
	}
	return ca, nil
}

// CertPEM is the CA certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte { return ca.ca.CertPEM }

// Pool is a pool holding the CA alone (tests, and clients on the host).
func (ca *CA) Pool() *x509.CertPool { return ca.ca.Pool() }

// Leaf returns a certificate for name (a DNS name or an IP address), issued
// on first use and cached until a day before it ends.
func (ca *CA) Leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[name]; ok && time.Until(c.Leaf.NotAfter) > 24*time.Hour {
		return c, nil
	}
	c, err := ca.ca.Issue([]string{name}, ca.leafKey, leafLifetime)
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	if len(ca.leaves) >= maxLeaves {
		clear(ca.leaves)
	}
	ca.leaves[name] = c
	return c, nil
}

// SystemBundle is where Debian-family root filesystems keep the trust store
// that OpenSSL, curl, Python's ssl and (through NODE_EXTRA_CA_CERTS) Node
// read.
const SystemBundle = "/etc/ssl/certs/ca-certificates.crt"

// Bundle returns a host file holding the trust store of the root filesystem
// rootfs with the CA appended, to bind read-only over SystemBundle, or ""
// if rootfs has no trust store (nothing to extend; TLS to rule hosts then
// fails verification inside, which is what such a sandbox gets for any
// host). Root filesystems are immutable layers, so one file per rootfs
// path serves every sandbox of it.
func (ca *CA) Bundle(rootfs string) (string, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if p, ok := ca.bundles[rootfs]; ok {
		return p, nil
	}
	sys, err := os.ReadFile(filepath.Join(rootfs, SystemBundle))
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("egress CA bundle: %w", err)
	}
	sum := sha256.Sum256([]byte(rootfs))
	path := filepath.Join(ca.ca.Dir, "bundles", hex.EncodeToString(sum[:12])+".crt")
	want := append(append(append([]byte(nil), sys...), "\n# Airlock egress CA: TLS to hosts with network rules ends at Airlock's egress\n"...), ca.ca.CertPEM...)
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, want) {
		ca.bundles[rootfs] = path
		return path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("egress CA bundle: %w", err)
	}
	if err := localca.WriteAtomic(path, want, 0o644); err != nil {
		return "", fmt.Errorf("egress CA bundle: %w", err)
	}
	ca.bundles[rootfs] = path
	return path, nil
}
