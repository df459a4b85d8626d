// Package tlsfront is serve --domain's front door: one TLS listener for the
// whole of a domain D, which routes each request by its Host — api.D to the
// control-plane API, <port>-<id>.D and sandbox.D to the sandbox proxy — and
// refuses handshakes for names outside D. Its certificates come from a
// CertSource: files the operator gives (FileSource), the server's own domain
// CA (CASource), or ACME (internal/acmecert).
package tlsfront

import (
	"crypto/tls"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// CertSource hands the TLS listener its certificate for a handshake. The
// listener calls it only for names within the domain (InDomain), so a source
// need not check that again.
type CertSource interface {
	GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error)
}

// SampleSandboxHost is a name of the <port>-<id> form whose coverage stands
// for every sandbox host's (a certificate covers all of them through *.D, or
// none).
const SampleSandboxHost = "49983-airlocksample0000000000"

// CoveredNames are the names a certificate for domain must cover: the API,
// the shared sandbox host and a <port>-<id> host.
func CoveredNames(domain string) []string {
	return []string{"api." + domain, "sandbox." + domain, SampleSandboxHost + "." + domain}
}

// label is one DNS label as a Host or --domain may spell it (lower case).
var label = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// CheckDomain validates --domain: a DNS name without a port or trailing dot,
// at least two labels (a certificate for *.D with D a bare top-level name is
// refused by browsers), lower case.
func CheckDomain(domain string) error {
	if domain == "" {
		return errors.New("empty domain")
	}
	if strings.Contains(domain, ":") {
		return fmt.Errorf("domain %q: give the name alone (the port is --tls-listen's)", domain)
	}
	if domain != strings.ToLower(domain) {
		return fmt.Errorf("domain %q: use lower case", domain)
	}
	labels := strings.Split(domain, ".")
	if len(labels) < 2 {
		return fmt.Errorf("domain %q: needs at least two labels (e.g. airlock.localhost)", domain)
	}
	for _, l := range labels {
		if !label.MatchString(l) {
			return fmt.Errorf("domain %q: %q is not a valid DNS label", domain, l)
		}
	}
	if len(domain) > 200 {
		return fmt.Errorf("domain %q: too long for <port>-<sandboxID>.<domain> names", domain)
	}
	return nil
}

// InDomain reports whether name (a TLS server name or a Host without port)
// is the domain itself or one label under it: the names the listener
// serves.
func InDomain(name, domain string) bool {
	name = strings.TrimSuffix(strings.ToLower(name), ".")
	if name == domain {
		return true
	}
	sub, ok := strings.CutSuffix(name, "."+domain)
	return ok && label.MatchString(sub)
}

// restrict refuses a handshake for a name outside domain (no certificate is
// presented: the client sees a handshake failure), else asks src.
func restrict(domain string, src CertSource) func(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
		if hello.ServerName == "" {
			return nil, fmt.Errorf("no server name (SNI) in the handshake: this listener serves %s and *.%s only", domain, domain)
		}
		if !InDomain(hello.ServerName, domain) {
			return nil, fmt.Errorf("server name %q is outside %s: this listener serves %s and *.%s only", hello.ServerName, domain, domain, domain)
		}
		return src.GetCertificate(hello)
	}
}

// FileSource serves one certificate read from files (serve --tls-cert and
// --tls-key).
type FileSource struct {
	cert *tls.Certificate
}

// LoadFiles reads a certificate chain and its key (PEM) and checks that the
// key matches and that the certificate covers every name the listener serves
// for domain (CoveredNames); otherwise the error says which name is not
// covered.
func LoadFiles(certFile, keyFile, domain string) (*FileSource, error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, fmt.Errorf("--tls-cert %s and --tls-key %s: %w", certFile, keyFile, err)
	}
	if err := checkCovers(&cert, domain); err != nil {
		return nil, fmt.Errorf("--tls-cert %s: %w", certFile, err)
	}
	return &FileSource{cert: &cert}, nil
}

// checkCovers reports the first name of CoveredNames(domain) cert does not
// cover.
func checkCovers(cert *tls.Certificate, domain string) error {
	leaf := cert.Leaf // LoadX509KeyPair parses it
	if leaf == nil {
		return errors.New("no certificate")
	}
	for _, name := range CoveredNames(domain) {
		if err := leaf.VerifyHostname(name); err != nil {
			return fmt.Errorf("the certificate does not cover %s (it names %s; a certificate for --domain %s must cover %s and *.%s): %w",
				name, strings.Join(leaf.DNSNames, ", "), domain, domain, domain, err)
		}
	}
	return nil
}

// GetCertificate returns the certificate from the files.
func (s *FileSource) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return s.cert, nil
}
