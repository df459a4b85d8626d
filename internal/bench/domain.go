package bench

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"sort"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// DomainConfig measures one server through its plain HTTP listeners and
// through its TLS listener (serve --domain), in the same run.
type DomainConfig struct {
	// Config holds the plain listeners' URLs, the key, the template and the
	// counts (Sequential creates, RoundTrips commands).
	Config
	// TLSAPIURL and TLSSandboxURL are https://api.<domain> and
	// https://sandbox.<domain> (port included); Roots verify the listener's
	// certificate; DialAddr is where every TLS connection goes, so the
	// bench needs no resolver for the domain's names.
	TLSAPIURL, TLSSandboxURL string
	Roots                    *x509.CertPool
	DialAddr                 string
}

// RunDomain measures create + first command and the commands.run round
// trip over plain HTTP and over TLS, alternating request by request so
// both see the same machine; each client keeps its connections (HTTP/1.1
// keep-alive in plain, HTTP/2 over TLS, as the SDKs do). The last row
// holds the p50 differences.
func RunDomain(ctx context.Context, cfg DomainConfig) ([]Row, error) {
	plain := newClient(cfg.Config)
	tr := &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: cfg.Roots},
		ForceAttemptHTTP2:   true,
		MaxIdleConnsPerHost: 256,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, network, cfg.DialAddr)
		},
	}
	defer tr.CloseIdleConnections()
	secure := &client{cfg: cfg.Config, c: e2bclient.New(e2bclient.Config{
		APIURL: cfg.TLSAPIURL, SandboxURL: cfg.TLSSandboxURL, APIKey: cfg.APIKey, HTTPClient: &http.Client{Transport: tr},
	})}
	// Warm-up: page cache, and each client's first connection.
	for _, c := range []*client{plain, secure} {
		if _, err := c.createAndRun(ctx, nil); err != nil {
			return nil, fmt.Errorf("warm-up: %w", err)
		}
	}
	ttiPlain := Row{Name: fmt.Sprintf("create + first commands.run, plain HTTP/1.1, %d", cfg.Sequential)}
	ttiTLS := Row{Name: fmt.Sprintf("create + first commands.run, TLS (HTTP/2), %d", cfg.Sequential)}
	for i := 0; i < cfg.Sequential; i++ {
		for _, x := range []struct {
			c *client
			r *Row
		}{{plain, &ttiPlain}, {secure, &ttiTLS}} {
			d, err := x.c.createAndRun(ctx, nil)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", x.r.Name, err)
			}
			x.r.Samples = append(x.r.Samples, d)
		}
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "create %d/%d over each listener\n", i+1, cfg.Sequential)
		}
	}

	// One sandbox, reached through both listeners.
	timeout := int64(300)
	created, err := plain.c.Create(ctx, e2bwire.NewSandbox{TemplateID: cfg.Template, Timeout: &timeout})
	if err != nil {
		return nil, fmt.Errorf("create: %w", err)
	}
	sb := plain.c.Sandbox(created.SandboxID, created.EnvdAccessToken)
	defer plain.kill(context.WithoutCancel(ctx), sb)
	sbTLS := secure.c.Sandbox(created.SandboxID, created.EnvdAccessToken)
	rtPlain := Row{Name: fmt.Sprintf("commands.run('true') round trip, plain HTTP/1.1, %d", cfg.RoundTrips)}
	rtTLS := Row{Name: fmt.Sprintf("commands.run('true') round trip, TLS (HTTP/2), %d", cfg.RoundTrips)}
	if _, err := plain.run(ctx, sb, "true"); err != nil { // each client's connection open
		return nil, err
	}
	if _, err := secure.run(ctx, sbTLS, "true"); err != nil {
		return nil, err
	}
	for i := 0; i < cfg.RoundTrips; i++ {
		for _, x := range []struct {
			c  *client
			sb *e2bclient.Sandbox
			r  *Row
		}{{plain, sb, &rtPlain}, {secure, sbTLS, &rtTLS}} {
			start := time.Now()
			if _, err := x.c.run(ctx, x.sb, "true"); err != nil {
				return nil, fmt.Errorf("%s: %w", x.r.Name, err)
			}
			x.r.Samples = append(x.r.Samples, time.Since(start))
		}
	}
	ttiTLS.Note = fmt.Sprintf("TLS - plain at p50: %+.2f ms", p50diff(ttiTLS, ttiPlain))
	rtTLS.Note = fmt.Sprintf("TLS - plain at p50: %+.2f ms (target: within 1 ms)", p50diff(rtTLS, rtPlain))
	return []Row{ttiPlain, ttiTLS, rtPlain, rtTLS}, nil
}

func p50diff(a, b Row) float64 {
	p := func(r Row) time.Duration {
		s := append([]time.Duration(nil), r.Samples...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return Percentile(s, 50)
	}
	return float64(p(a)-p(b)) / float64(time.Millisecond)
}
