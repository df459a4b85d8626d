// Package localca is a certificate authority kept in a directory of the data
// dir: created once (ca.pem, the certificate and key, 0600; ca.crt, the
// certificate alone, for clients to trust), then used to issue server
// certificates. The server has two, each in a directory of its own and never
// sharing a key: the egress CA (internal/egress: certificates sandboxes see for
// rule hosts) and the domain CA (internal/tlsfront: the certificates of
// serve --domain when no certificate files are given).
package localca

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net/netip"
	"os"
	"path/filepath"
	"time"
)

// KeyFile holds a CA's certificate and key; CertFile the certificate alone.
const (
	KeyFile  = "ca.pem"
	CertFile = "ca.crt"
)

// CA is a loaded certificate authority.
type CA struct {
	Cert    *x509.Certificate
	Key     *ecdsa.PrivateKey
	CertPEM []byte
	// Dir is the directory it lives in; CertPath its certificate file.
	Dir, CertPath string
}

// LoadOrCreate reads the CA in dir or creates it, named commonName (the
// host's name is appended). Creation writes a temp file and renames it, so a
// crash leaves no CA or a whole one.
func LoadOrCreate(dir, commonName string) (*CA, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	path := filepath.Join(dir, KeyFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		data, err = newCAFile(path, commonName)
	}
	if err != nil {
		return nil, err
	}
	ca := &CA{Dir: dir, CertPath: filepath.Join(dir, CertFile)}
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		switch b.Type {
		case "CERTIFICATE":
			ca.Cert, err = x509.ParseCertificate(b.Bytes)
			ca.CertPEM = pem.EncodeToMemory(b)
		case "EC PRIVATE KEY":
			ca.Key, err = x509.ParseECPrivateKey(b.Bytes)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
	}
	if ca.Cert == nil || ca.Key == nil {
		return nil, fmt.Errorf("%s: no certificate and key in it", path)
	}
	if err := WriteAtomic(ca.CertPath, ca.CertPEM, 0o644); err != nil {
		return nil, err
	}
	return ca, nil
}

func newCAFile(path, commonName string) ([]byte, error) {
	key, err := NewKey()
	if err != nil {
		return nil, err
	}
	host, _ := os.Hostname()
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: commonName + " (" + host + ")", Organization: []string{"Airlock"}},
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
	var buf bytes.Buffer
	_ = pem.Encode(&buf, &pem.Block{Type: "CERTIFICATE", Bytes: der})
	kb, err := KeyPEM(key)
	if err != nil {
		return nil, err
	}
	buf.Write(kb)
	if err := WriteAtomic(path, buf.Bytes(), 0o600); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// NewKey makes a P-256 key (leaves and CAs alike).
func NewKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

// KeyPEM encodes an EC key as an "EC PRIVATE KEY" PEM block.
func KeyPEM(key *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

// Pool is a pool holding the CA alone (tests, and clients on the host).
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// Issue returns a server certificate for names (DNS names, wildcards or IP
// addresses; the first is also its common name), valid from an hour ago for
// lifetime, for key's public half; the chain includes the CA.
func (ca *CA) Issue(names []string, key crypto.Signer, lifetime time.Duration) (*tls.Certificate, error) {
	if len(names) == 0 {
		return nil, errors.New("no names to issue a certificate for")
	}
	tmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: names[0]},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	for _, name := range names {
		if a, err := netip.ParseAddr(name); err == nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, a.AsSlice())
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, name)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Cert, key.Public(), ca.Key)
	if err != nil {
		return nil, fmt.Errorf("issue %q: %w", names, err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &tls.Certificate{Certificate: [][]byte{der, ca.Cert.Raw}, PrivateKey: key, Leaf: leaf}, nil
}

func serial() *big.Int {
	n, _ := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	return n
}

// WriteAtomic writes data to path through a synced temp file in the same
// directory and a rename: readers see the old content or the new, whole.
func WriteAtomic(path string, data []byte, mode os.FileMode) error {
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
