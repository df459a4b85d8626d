package main

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/coreos/go-systemd/v22/journal"
	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/journallog"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/secret"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/tplbuild"
	"github.com/airlock-sandbox/airlock/internal/volume"
	"github.com/airlock-sandbox/airlock/internal/webhook"
)

func serveCmd() *cobra.Command {
	var c daemon.Config
	var acme daemon.ACMEConfig
	var logLevel, logFormat string
	var mirrors []string
	var nb neighbourFlags
	var kc kubeFlags
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the E2B-compatible API and the sandbox-traffic proxy",
		Long: `Run the E2B-compatible control-plane API and the proxy for all sandbox traffic.

The API key comes from AIRLOCK_API_KEY (several keys: separate them with commas;
rate limits and the sandbox cap apply to each key on its own); without it a key is
generated once, kept in the data dir, and printed. Every built-in template is served
by default (--templates narrows the set): the first is built before the API answers
(a few minutes on a new machine; progress is shown), the others build one after
another in the background while the server runs. Until a template is ready, a create
for it answers 503 with Retry-After and says which build step it is on.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			switch kc.backend {
			case "kubernetes":
				return runKube(ctx, cmd, c, kc, logLevel, logFormat)
			case "local":
			default:
				return fmt.Errorf("--backend %q: want local or kubernetes", kc.backend)
			}
			if err := kc.refuseWithLocal(cmd); err != nil {
				return err
			}
			var err error
			if c.RegistryMirrors, err = registryMirrors(mirrors); err != nil {
				return err
			}
			if err := nb.apply(&c); err != nil {
				return err
			}
			if acme.DNSProvider != "" {
				c.TLS.ACME = &acme
			} else if cmd.Flags().Changed("acme-email") || cmd.Flags().Changed("acme-ca") {
				return fmt.Errorf("--acme-email and --acme-ca need --acme-dns-provider (which turns ACME on)")
			}
			return runServe(ctx, c, logLevel, logFormat)
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.APIAddr, "api-addr", "127.0.0.1:3000", "listen address of the control-plane API")
	f.StringVar(&c.SandboxAddr, "sandbox-addr", "127.0.0.1:3001", "listen address for all sandbox traffic (E2B_SANDBOX_URL)")
	f.StringVar(&c.DataDir, "data-dir", layout.DefaultRoot, "directory for templates, sandboxes and state")
	f.StringVar(&c.Domain, "domain", "", "serve the API as https://api.<domain> and sandboxes as https://<port>-<id>.<domain> on one TLS listener (--tls-listen), so clients need only E2B_DOMAIN; airlock.localhost works on this machine without DNS set-up")
	f.StringVar(&c.TLS.Listen, "tls-listen", daemon.DefaultTLSListen, "listen address of the TLS listener for --domain")
	f.StringVar(&c.TLS.CertFile, "tls-cert", "", "PEM certificate (chain) covering --domain and *.<domain>, for the TLS listener; without it the server's own CA (<data-dir>/tls) issues one")
	f.StringVar(&c.TLS.KeyFile, "tls-key", "", "PEM private key of --tls-cert")
	f.StringVar(&acme.DNSProvider, "acme-dns-provider", "", "get and renew a certificate for --domain and *.<domain> through ACME's DNS-01 challenge with this DNS provider (e.g. cloudflare, route53, rfc2136, exec; configured by its environment variables; README: Public domain with automatic certificates)")
	f.StringVar(&acme.Email, "acme-email", "", "contact e-mail of the ACME account")
	f.StringVar(&acme.CA, "acme-ca", "letsencrypt", "ACME CA: letsencrypt, staging (Let's Encrypt's staging, try it first) or a directory URL")
	f.StringSliceVar(&acme.Resolvers, "acme-dns-resolvers", nil, "host:port DNS servers to check the challenge record's propagation with (default: the zone's authoritative servers)")
	f.DurationVar(&acme.RenewBefore, "acme-renew-before", 30*24*time.Hour, "renew the ACME certificate this long before it ends")
	f.DurationVar(&c.MaxTimeout, "max-timeout", 24*time.Hour, "longest sandbox timeout a client may ask for")
	f.StringSliceVar(&c.Templates, "templates", builtinTemplates, "templates to serve: the first is built (if needed) before the API answers, the others in the background")
	f.StringVar(&c.MetricsAddr, "metrics-addr", "127.0.0.1:3002", `listen address of the admin listener that serves Prometheus metrics at /metrics, without an API key (keep it on loopback or an internal network; "": none)`)
	f.BoolVar(&c.MetricsPerSandbox, "metrics-per-sandbox", false, "add each running sandbox's CPU, memory and disk to the metrics, labelled with its ID (one series per sandbox)")
	f.BoolVar(&c.KillOnClose, "kill-on-exit", false, "kill every sandbox when the server stops (default: keep them and re-adopt them on the next start)")
	f.DurationVar(&c.PausedRetention, "paused-retention", sandbox.DefaultPausedRetention, "delete a paused sandbox, with its disk, this long after it was paused (0: keep paused sandboxes forever)")
	f.DurationVar(&c.EventsRetention, "events-retention", daemon.DefaultEventsRetention, "keep sandbox lifecycle events (GET /events/sandboxes, webhooks) and killed sandboxes' logs this long")
	// Tests start many short-lived servers, each on a data dir of its own,
	// over one cache of built templates.
	f.StringVar(&c.TemplateDataDir, "template-data-dir", "", "data dir whose templates and layers to use (default: --data-dir)")
	_ = f.MarkHidden("template-data-dir")
	f.StringVar(&logLevel, "log-level", "info", "debug, info, warn or error")
	f.StringVar(&logFormat, "log-format", "auto", `"text", "json", "journal" (systemd's native protocol: each attribute a field, AIRLOCK_<KEY>) or "auto": journal when stderr is the journal (JOURNAL_STREAM, as under airlock service install), else text`)
	f.IntVar(&c.WarmPool, "warm-pool", 10, "sandboxes per --templates template kept started ahead of demand, from when the template is ready (0: off)")
	f.Float64Var(&c.Limits.Requests.Rate, "rate-limit", e2b.DefaultLimits.Requests.Rate, "API requests per second allowed per API key (0: no limit)")
	f.IntVar(&c.Limits.Requests.Burst, "rate-burst", e2b.DefaultLimits.Requests.Burst, "API requests per API key allowed in a burst above --rate-limit")
	f.Float64Var(&c.Limits.Creates.Rate, "create-rate-limit", e2b.DefaultLimits.Creates.Rate, "sandbox creations per second allowed per API key (0: no limit)")
	f.IntVar(&c.Limits.Creates.Burst, "create-burst", e2b.DefaultLimits.Creates.Burst, "sandbox creations per API key allowed in a burst above --create-rate-limit")
	f.IntVar(&c.MaxPerKey, "max-sandboxes-per-key", 100, "sandboxes one API key may have alive at once (0: no limit)")
	f.StringVar(&c.Runtime, "runtime", "linux", `default isolation backend: "linux" (namespaces, cgroups, seccomp) or "gvisor" (runsc, systrap); a template's "runtime" setting overrides it`)
	f.BoolVar(&c.DiskQuota, "disk-quota", true, "enforce each sandbox's diskSizeMB: sandboxes live on a btrfs image (<data-dir>/sandboxes.img, needs btrfs-progs) mounted on <data-dir>/sandboxes")
	f.Int64Var(&c.DiskImageMB, "disk-image-size", 0, "size in MiB of the sparse sandbox image when it is created (0: min(free space, 64 GiB))")
	f.BoolVar(&c.Network.Enabled, "sandbox-network", true, "give every sandbox its own netns, veth, egress policy and DNS (off: loopback only)")
	f.StringVar(&c.Network.CIDR, "sandbox-cidr", "", "private IPv4 range sandboxes get a /30 each from (default 10.77.0.0/16 for the default --data-dir, else a 10.x.0.0/16 derived from the data dir)")
	f.BoolVar(&c.Network.Egress, "sandbox-egress", true, "let sandboxes reach beyond the host (sets net.ipv4.ip_forward=1); off: no egress for any sandbox")
	f.StringSliceVar(&c.Network.DNSUpstreams, "dns-upstream", nil, "DNS servers (ip:port) the sandboxes' DNS forwarder asks (default: the host's /etc/resolv.conf nameservers)")
	f.StringSliceVar(&c.Network.AllowPrivate, "allow-private", nil, "private IPv4 or IPv6 ranges (CIDR or IP, comma-separated) every sandbox may reach; 10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7 and the other private and reserved ranges are closed by default unless a sandbox's network.allowOut names them (link-local and loopback stay closed)")
	f.StringVar(&c.Network.IPv6, "sandbox-ipv6", "auto", `IPv6 egress for sandboxes under the same policy (NAT66; sets net.ipv6.conf.all.forwarding=1): "auto" (when the host has an IPv6 default route), "on" or "off"`)
	f.StringVar(&c.Network.DNSListen, "dns-listen", "0.0.0.0:0", "where the sandboxes' DNS forwarder listens; sandbox DNS to the gateway is redirected there, other sources get REFUSED")
	f.StringVar(&c.Network.EgressListen, "egress-listen", "0.0.0.0:0", "where the egress proxy (network.rules, egressProxy) listens; the firewall redirects sandbox connections there and only sandbox interfaces reach it")
	f.StringVar(&c.Network.EgressUpstreamCA, "egress-upstream-ca", "", "PEM file of extra root certificates for verifying the real servers of hosts whose HTTPS the egress intercepts (network.rules); the host's roots are always used")
	f.IntVar(&c.Builds.Concurrent, "build-concurrency", 1, "template builds asked for through the E2B API that run at once; the others wait (status waiting)")
	f.IntVar(&c.Builds.PerKey, "builds-per-key", tplbuild.DefaultMaxPerOwner, "template builds one API key may have waiting or building at once (more answer 429)")
	f.Int64Var(&c.Builds.MaxContextMB, "build-context-max", tplbuild.DefaultMaxContext>>20, "MiB the uploaded files of one template build may unpack to (more answer 413)")
	f.DurationVar(&c.Builds.Timeout, "build-timeout", tplbuild.DefaultTimeout, "longest a template build may take, waiting included; then it fails saying so")
	f.StringSliceVar(&c.AllowRegistries, "allow-registry", nil, "registries (HOST:PORT, as in image references) at private or loopback addresses that templates built through the E2B API may pull from (others at such addresses are refused; registry mirrors are always allowed)")
	f.BoolVar(&c.Webhooks.AllowPrivate, "webhook-allow-private", false, "let lifecycle webhooks call loopback, private and link-local addresses (refused by default, when a webhook is registered and again at every delivery)")
	f.DurationVar(&c.Webhooks.RetryMax, "webhook-retry-max", webhook.DefaultRetryMax, "longest wait between two attempts of a failed webhook delivery (the wait doubles from 2 s up to this)")
	f.DurationVar(&c.Webhooks.GiveUpAfter, "webhook-give-up", webhook.DefaultGiveUpAfter, "how long a webhook delivery is retried before it is marked failed")
	f.Int64Var(&c.Volumes.DefaultMB, "volume-default-size", volume.DefaultSize>>20, "quota in MiB of a volume whose create names no size (POST /volumes sizeMB, Airlock's extension)")
	f.Int64Var(&c.Volumes.MaxMB, "volume-max-size", volume.DefaultMaxSize>>20, "largest quota in MiB a volume may be created with")
	f.IntVar(&c.Volumes.PerKey, "volumes-per-key", volume.DefaultMaxCount, "volumes one API key may have (0: no limit)")
	f.Int64Var(&c.Volumes.SizePerKeyMB, "volume-size-per-key", volume.DefaultMaxBytes>>20, "total quota in MiB of one API key's volumes (0: no limit)")
	f.IntVar(&c.Secrets.PerKey, "secrets-per-key", secret.DefaultMaxCount, "secrets one API key may have (POST /secrets past it answers 429; 0: no limit)")
	nb.add(f)
	kc.add(f)
	addRegistryMirrorFlag(cmd, &mirrors)
	return cmd
}

func runServe(ctx context.Context, c daemon.Config, logLevel, logFormat string) error {
	lg, err := newLogger(logLevel, logFormat)
	if err != nil {
		return err
	}
	c.Logger = lg
	if c.PausedRetention < 0 {
		return fmt.Errorf("--paused-retention %s: must not be negative (0 keeps paused sandboxes forever)", c.PausedRetention)
	}
	if c.EventsRetention <= 0 {
		return fmt.Errorf("--events-retention %s: must be positive", c.EventsRetention)
	}
	if w := c.Webhooks; w.RetryMax <= 0 || w.GiveUpAfter <= 0 {
		return fmt.Errorf("--webhook-retry-max and --webhook-give-up must be positive")
	}
	if v := c.Volumes; v.DefaultMB < 1 || v.MaxMB < v.DefaultMB || v.PerKey < 0 || v.SizePerKeyMB < 0 {
		return fmt.Errorf("--volume-default-size must be at least 1 MiB and at most --volume-max-size; --volumes-per-key and --volume-size-per-key must not be negative")
	}
	if c.Secrets.PerKey < 0 {
		return fmt.Errorf("--secrets-per-key must not be negative (0: no limit)")
	}
	if b := c.Builds; b.Concurrent < 1 || b.PerKey < 1 || b.MaxContextMB < 1 || b.Timeout <= 0 {
		return fmt.Errorf("--build-concurrency, --builds-per-key, --build-context-max and --build-timeout must be positive")
	}
	if v := os.Getenv("AIRLOCK_API_KEY"); v != "" {
		keys, err := daemon.ParseAPIKeys(v)
		if err != nil {
			return fmt.Errorf("AIRLOCK_API_KEY: %w", err)
		}
		c.APIKeys = keys
	}
	envdPath, err := findEnvd()
	if err != nil {
		return err
	}
	c.EnvdPath = envdPath
	t0 := time.Now()
	d := daemon.New(c)
	if err := d.Start(ctx); err != nil {
		return err
	}
	fmt.Printf("\nAirlock is serving (%s after start). For the E2B SDKs:\n\n", template.FormatDuration(time.Since(t0)))
	if d.ClientDomain != "" {
		printDomainExports(d)
		fmt.Printf("Or over plain HTTP on the API and sandbox listeners (no other E2B_ variable set):\n\n")
	}
	fmt.Printf(`  export E2B_API_URL=%s
  export E2B_SANDBOX_URL=%s
  export E2B_API_KEY=%s
  export E2B_VOLUME_API_URL=%s

`, d.APIURL, d.SandboxURL, d.APIKeys[0], d.APIURL)
	if d.MetricsURL != "" {
		fmt.Printf("Prometheus metrics: %s\n\n", d.MetricsURL)
	}
	if len(d.Pending) > 0 {
		fmt.Printf("Building in the background: %s. Creates for them answer 503 with Retry-After until they are ready.\n\n",
			strings.Join(d.Pending, ", "))
	}
	go func() {
		select {
		case <-d.Built():
		case <-ctx.Done():
			return
		}
		if err := d.BuildErr(); err != nil {
			fmt.Printf("\nSome templates could not be built (%v); the others are ready (%s after start).\n\n", err, template.FormatDuration(time.Since(t0)))
			return
		}
		fmt.Printf("\nAll templates are ready (%s): %s after start.\n\n", strings.Join(c.Templates, ", "), template.FormatDuration(time.Since(t0)))
	}()
	select {
	case <-ctx.Done():
	case err = <-d.Errors():
		c.Logger.Error("listener failed", "err", err)
	}
	c.Logger.Info("shutting down")
	_ = d.Close() // each failed step is logged
	return err
}

// logHandler is the server log's handler for --log-format.
// newLogger is the logger of --log-level and --log-format.
func newLogger(level, format string) (*slog.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	h, err := logHandler(format, l)
	if err != nil {
		return nil, err
	}
	return slog.New(h), nil
}

func logHandler(format string, level slog.Level) (slog.Handler, error) {
	opts := &slog.HandlerOptions{Level: level}
	switch format {
	case "auto":
		if journallog.Usable() {
			return journallog.New(level), nil
		}
		return slog.NewTextHandler(os.Stderr, opts), nil
	case "text":
		return slog.NewTextHandler(os.Stderr, opts), nil
	case "json":
		return slog.NewJSONHandler(os.Stderr, opts), nil
	case "journal":
		if !journal.Enabled() {
			return nil, fmt.Errorf("--log-format journal: the systemd journal's socket does not answer on this machine")
		}
		return journallog.New(level), nil
	}
	return nil, fmt.Errorf("--log-format %q: want auto, text, json or journal", format)
}

// builtinTemplates are served by default, in build order: each is FROM an
// earlier one, so the background builds never wait for each other.
var builtinTemplates = []string{"base", "python3", "node", "code-interpreter-v1", "mcp-gateway"}

// findEnvd locates the static envd binary: AIRLOCK_ENVD, else beside this
// executable (make build puts bin/airlock and bin/envd together).
func findEnvd() (string, error) {
	if p := os.Getenv("AIRLOCK_ENVD"); p != "" {
		return filepath.Abs(p)
	}
	exe, err := linux.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), "envd")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("envd binary not found beside %s (run `make build`, or set AIRLOCK_ENVD): %w", exe, err)
	}
	return p, nil
}

// printDomainExports prints what a client needs for serve --domain: the
// domain, the key and, with the server's own CA, how to trust it.
func printDomainExports(d *daemon.Daemon) {
	fmt.Printf("  export E2B_DOMAIN=%s\n  export E2B_API_KEY=%s\n", d.ClientDomain, d.APIKeys[0])
	if ca := d.DomainCA; ca != nil {
		fmt.Printf(`  export NODE_EXTRA_CA_CERTS=%s
  export SSL_CERT_FILE=%s
  export REQUESTS_CA_BUNDLE=%s

The certificates are issued by this server's own CA, %s
(NODE_EXTRA_CA_CERTS adds it for Node; SSL_CERT_FILE and REQUESTS_CA_BUNDLE
name the system trust store with it added, for Python, curl and OpenSSL).
Browsers: import that file as a trusted authority, or pass --tls-cert/--tls-key.
`, ca.CertPath(), ca.BundlePath(), ca.BundlePath(), ca.CertPath())
	}
	fmt.Printf("(API: %s; sandboxes: https://<port>-<sandboxID>.%s. Unset E2B_API_URL and E2B_SANDBOX_URL: they win over E2B_DOMAIN.)\n\n", d.DomainAPIURL, d.ClientDomain)
}
