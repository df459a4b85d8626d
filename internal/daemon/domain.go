package daemon

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/acmecert"
	"github.com/airlock-sandbox/airlock/internal/tlsfront"
)

// DefaultTLSListen is where serve --domain's TLS listener listens unless
// --tls-listen says otherwise.
const DefaultTLSListen = ":443"

// TLSConfig is serve --domain's TLS listener.
type TLSConfig struct {
	// Listen is its address (serve's default DefaultTLSListen); empty means
	// no TLS listener even with a Domain.
	Listen string
	// CertFile and KeyFile are a certificate (chain) and key covering
	// Domain and *.Domain (--tls-cert, --tls-key); without them the
	// server's own domain CA issues one (<data>/tls).
	CertFile, KeyFile string
	// Certs, when set, is the certificate source; CertFile and KeyFile
	// must then be empty (tests).
	Certs tlsfront.CertSource
	// ACME, when set, gets and renews a certificate for Domain and
	// *.Domain through ACME's DNS-01 challenge (--acme-*), kept in
	// <data>/tls/acme; it excludes CertFile, KeyFile and Certs.
	ACME *ACMEConfig
}

// ACMEConfig is serve's --acme-* flags (see internal/acmecert).
type ACMEConfig struct {
	// DNSProvider is a lego DNS provider name (acmecert.DNSProviders),
	// configured by that provider's environment variables.
	DNSProvider string
	Email       string
	// CA is "letsencrypt" (default), "staging" or an ACME directory URL.
	CA string
	// Resolvers check the TXT record's propagation (host:port); empty:
	// the zone's authoritative servers.
	Resolvers   []string
	RenewBefore time.Duration
}

// domainTLS reports whether the server has a TLS listener for its domain.
func (d *Daemon) domainTLS() bool { return d.cfg.Domain != "" && d.cfg.TLS.Listen != "" }

// startCerts picks the TLS listener's certificate source, early: certificate
// files that do not fit the domain stop the server before anything starts.
func (d *Daemon) startCerts() error {
	if !d.domainTLS() {
		if d.cfg.TLS.CertFile != "" || d.cfg.TLS.KeyFile != "" || d.cfg.TLS.Certs != nil || d.cfg.TLS.ACME != nil {
			return errors.New("--tls-cert/--tls-key need --domain (the TLS listener serves the domain)")
		}
		return nil
	}
	tc := d.cfg.TLS
	if err := tlsfront.CheckDomain(d.cfg.Domain); err != nil {
		return fmt.Errorf("--domain: %w", err)
	}
	switch {
	case tc.ACME != nil:
		if tc.CertFile != "" || tc.KeyFile != "" || tc.Certs != nil {
			return errors.New("--acme-dns-provider and --tls-cert/--tls-key exclude each other")
		}
		src, err := acmecert.New(acmecert.Config{
			Domain: d.cfg.Domain, Email: tc.ACME.Email, CADirURL: acmecert.CADirectory(tc.ACME.CA),
			DNSProvider: tc.ACME.DNSProvider, Resolvers: tc.ACME.Resolvers, RenewBefore: tc.ACME.RenewBefore,
			CacheDir: filepath.Join(d.Layout.DomainTLS(), "acme"), Logger: d.log,
		})
		if err != nil {
			return fmt.Errorf("ACME certificate for %s: %w", d.cfg.Domain, err)
		}
		src.Start(context.Background())
		d.push("acme renewal", src.Close)
		d.Certs = src
	case tc.Certs != nil:
		if tc.CertFile != "" || tc.KeyFile != "" {
			return errors.New("--tls-cert/--tls-key and another certificate source (ACME) exclude each other")
		}
		d.Certs = tc.Certs
	case tc.CertFile != "" || tc.KeyFile != "":
		if tc.CertFile == "" || tc.KeyFile == "" {
			return errors.New("--tls-cert and --tls-key go together")
		}
		src, err := tlsfront.LoadFiles(tc.CertFile, tc.KeyFile, d.cfg.Domain)
		if err != nil {
			return err
		}
		d.Certs = src
	default:
		src, err := tlsfront.LoadOrCreateCA(d.Layout.DomainTLS(), d.cfg.Domain)
		if err != nil {
			return err
		}
		d.Certs, d.DomainCA = src, src
	}
	return nil
}

// domainFor is the E2B handler's DomainFor: the domain as the client reached
// api.<domain> (port included), else ClientDomain ("" without a domain
// listener: the handler then returns Config.Domain).
func (d *Daemon) domainFor(r *http.Request) string {
	if !d.domainTLS() {
		return ""
	}
	if v, ok := tlsfront.ClientDomain(r, d.cfg.Domain); ok {
		return v
	}
	return d.ClientDomain
}

// startDomainListener serves the domain on one TLS listener: api.<domain> is
// api (exactly what the API listener serves), <port>-<id>.<domain> and
// sandbox.<domain> the sandbox proxy.
func (d *Daemon) startDomainListener(api, sandboxes http.Handler) error {
	if !d.domainTLS() {
		return nil
	}
	ln, err := net.Listen("tcp", d.cfg.TLS.Listen)
	if err != nil {
		return fmt.Errorf("--tls-listen %s: %w", d.cfg.TLS.Listen, err)
	}
	d.ClientDomain = d.cfg.Domain
	if port := ln.Addr().(*net.TCPAddr).Port; port != 443 {
		d.ClientDomain = net.JoinHostPort(d.cfg.Domain, strconv.Itoa(port))
	}
	d.DomainAPIURL = "https://api." + d.ClientDomain
	router := &tlsfront.Router{Domain: d.cfg.Domain, API: api, Sandbox: sandboxes}
	srv := tlsfront.NewServer(d.cfg.Domain, d.Certs, router, d.cfg.HTTPErrorLog)
	go func() {
		if err := srv.ServeTLS(ln, "", ""); !errors.Is(err, http.ErrServerClosed) {
			d.errc <- fmt.Errorf("domain listener: %w", err)
		}
	}()
	d.push("domain listener", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		return shutdownHTTP(ctx, srv)
	})
	return nil
}
