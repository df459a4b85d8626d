package egress

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// CA is the server's egress certificate authority: created once in the data
// dir, trusted by every sandbox (Bundle), and used to issue a certificate
// for each rule host whose TLS the egress terminates. Its key never leaves
// the host.
type CA struct {
	cert    *x509.Certificate
	key     *ecdsa.PrivateKey
	certPEM []byte
	dir     string

	// leafKey signs every issued certificate: one key for all leaves keeps
	// issuing a certificate to one signature.
	leafKey *ecdsa.PrivateKey
	mu      sync.Mutex
	leaves  map[string]*tls.Certificate
	bundles map[string]string // rootfs -> bundle file
}

// caFile holds the CA's certificate and key; CertFile the certificate alone,
// for operators and tests.
const (
	caFile   = "ca.pem"
	CertFile = "ca.crt"
)

// leafLifetime bounds an issued certificate; leaves are re-issued a day
// before they end.
const leafLifetime = 7 * 24 * time.Hour

// maxLeaves bounds the issued-certificate cache (a sandbox naming many
// hosts in its rules).
const maxLeaves = 10000

// LoadOrCreateCA reads the CA in dir or creates it. Creation writes a temp
// file and renames it, so a crash leaves no CA or a whole one.
func LoadOrCreateCA(dir string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	path := filepath.Join(dir, caFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		data, err = newCAFile(path)
	}
	if err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	ca := &CA{dir: dir, leaves: map[string]*tls.Certificate{}, bundles: map[string]string{}}
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		switch b.Type {
		case "CERTIFICATE":
			ca.cert, err = x509.ParseCertificate(b.Bytes)
			ca.certPEM = pem.EncodeToMemory(b)
		case "EC PRIVATE KEY":
			ca.key, err = x509.ParseECPrivateKey(b.Bytes)
		}
		if err != nil {
			return nil, fmt.Errorf("egress CA %s: %w", path, err)
		}
	}
	if ca.cert == nil || ca.key == nil {
		return nil, fmt.Errorf("egress CA %s: no certificate and key in it", path)
	}
	if err := writeAtomic(filepath.Join(dir, CertFile), ca.certPEM, 0o644); err != nil {
		return nil, fmt.Errorf("egress CA: %w", err)
	}
	ca.leafKey, err = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("egress CA: leaf key: %w", err)
	}
	return ca, nil
}

func newCAFile(path string) ([]byte, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "Airlock egress CA (" + host + ")", Organization: []string{"Airlock"}},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	_ = pem.Encode(&buf, &pem.Block{Type: "EC PRIVATE KEY", Bytes: kder})
	if err := writeAtomic(path, buf.Bytes(), 0o600); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// CertPEM is the CA certificate, PEM-encoded.
func (ca *CA) CertPEM() []byte { return ca.certPEM }

// Pool is a pool holding the CA alone (tests, and clients on the host).
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Leaf returns a certificate for name (a DNS name or an IP address), issued
// on first use and cached until a day before it ends.
func (ca *CA) Leaf(name string) (*tls.Certificate, error) {
	ca.mu.Lock()
	defer ca.mu.Unlock()
	if c, ok := ca.leaves[name]; ok && time.Until(c.Leaf.NotAfter) > 24*time.Hour {
		return c, nil
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(leafLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	if a, err := netip.ParseAddr(name); err == nil {
		tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
	} else {
		tmpl.DNSNames = []string{name}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &ca.leafKey.PublicKey, ca.key)
	if err != nil {
		return nil, fmt.Errorf("egress CA: issue %q: %w", name, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	c := &tls.Certificate{Certificate: [][]byte{der, ca.cert.Raw}, PrivateKey: ca.leafKey, Leaf: leaf}
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
	path := filepath.Join(ca.dir, "bundles", hex.EncodeToString(sum[:12])+".crt")
	want := append(append(append([]byte(nil), sys...), "\n# Airlock egress CA: TLS to hosts with network rules ends at Airlock's egress\n"...), ca.certPEM...)
	if cur, err := os.ReadFile(path); err == nil && bytes.Equal(cur, want) {
		ca.bundles[rootfs] = path
		return path, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return "", fmt.Errorf("egress CA bundle: %w", err)
	}
	if err := writeAtomic(path, want, 0o644); err != nil {
		return "", fmt.Errorf("egress CA bundle: %w", err)
	}
	ca.bundles[rootfs] = path
	return path, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(mode); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}
