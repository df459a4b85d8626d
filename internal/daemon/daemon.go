// Package daemon assembles an Airlock server: it names every subsystem in one
// struct and wires them in one place, so `airlock serve`, the benchmarks and
// the tests that need a whole server all start the same thing.
//
// Lifecycle:
//
//	d := daemon.New(cfg)   // nothing runs yet
//	err := d.Start(ctx)    // each step in dependency order; each pushes a named closer
//	...                    // d.APIURL, d.SandboxURL, d.Manager, ... are live
//	err = d.Close()        // the closers in reverse: the same code on a failed
//	                       // Start and on shutdown
//
// Start's order, and why:
//
//  1. data-dir lock      two servers on one data dir would each take the
//     other's sandboxes for orphans and destroy them
//  2. API keys           from Config, else generated once into the data dir
//     domain certificates with a domain: the TLS listener's certificate
//     source, checked now so that files not covering the domain stop
//     the server before anything else starts
//  3. templates          the store, then the first template built (the API
//     must be able to serve it when it answers); the rest queued
//  4. store              the sandboxes' records (SQLite)
//     lifecycle events   over the same database; pruned for age until Close
//     secrets            over the same database, values sealed with the
//     data dir's secrets.key (made once)
//  5. runtimes           every backend, so Recover finds any sandbox's
//  6. network            netns + veth + firewall + DNS per sandbox
//  7. disk pool          the btrfs image sandboxes' quotas live on
//     volumes            on the same pool (a subvolume and quota each); Recover
//     finishes or undoes a create or destroy a crash interrupted
//  8. manager            then Recover (re-adopt or clean up what a previous
//     server left), then the first template's warm pool
//  9. webhooks           the dispatcher: lifecycle events into the store's
//     delivery outbox, and workers that drain it
//  10. API, proxy, MCP   handlers over the manager, on the two listeners
//     domain listener    with a domain: the same handlers on one TLS
//     listener, routed by Host (internal/tlsfront)
//  11. background builds the other templates, one after another; each gets
//     its warm pool when ready
//
// Close stops the builds, shuts the listeners, then (with KillOnClose) kills
// every sandbox and removes what only they needed (firewall table, pool mount);
// without it sandboxes outlive the server and the next Start re-adopts them.
package daemon

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/dashboard"
	"github.com/airlock-sandbox/airlock/internal/diskquota"
	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/egress"
	"github.com/airlock-sandbox/airlock/internal/grant"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/listeners"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/metrics"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/ociimage"
	"github.com/airlock-sandbox/airlock/internal/proxy"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/secret"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/teamstats"
	"github.com/airlock-sandbox/airlock/internal/teardown"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/templatecatalog"
	"github.com/airlock-sandbox/airlock/internal/tlsfront"
	"github.com/airlock-sandbox/airlock/internal/tplbuild"
	"github.com/airlock-sandbox/airlock/internal/volume"
	"github.com/airlock-sandbox/airlock/internal/volumecontent"
	"github.com/airlock-sandbox/airlock/internal/webhook"
)

// Config is everything a server is started with (serve's flags).
type Config struct {
	// APIAddr and SandboxAddr are the listen addresses of the control-plane
	// API (which also serves /mcp) and of all sandbox traffic; ":0" ports are
	// fine (the URLs say which were chosen).
	APIAddr, SandboxAddr string
	// DataDir holds the server's state (layout.DataDir).
	DataDir string
	// TemplateDataDir is where the template store lives; empty means DataDir.
	// Tests point many short-lived servers at one cache of built templates.
	TemplateDataDir string
	// EnvdPath is the static envd binary put into every sandbox.
	EnvdPath string
	// Domain, when set, makes sandboxes reachable as <port>-<id>.<domain>;
	// with TLS.Listen also set, one TLS listener serves the whole domain
	// (api.<domain>, <port>-<id>.<domain>, sandbox.<domain>).
	Domain string
	// TLS configures that listener.
	TLS TLSConfig
	// MaxTimeout is the longest sandbox timeout a client may ask for.
	MaxTimeout time.Duration
	// Templates are served: the first is built before the API answers, the
	// others in the background.
	Templates []string
	// WarmPool is how many started sandboxes each served template keeps.
	WarmPool int
	// Limits are the per-key request and create rates.
	Limits e2b.Limits
	// MaxPerKey caps the sandboxes one API key may have alive (0: none).
	MaxPerKey int
	// APIKeys are accepted keys; empty means the key stored in the data dir
	// (generated on first use). The first is the one printed for clients.
	APIKeys []string
	// Runtime is the default isolation backend ("linux" or "gvisor").
	Runtime string
	// DiskQuota puts sandboxes on a btrfs pool that enforces diskSizeMB;
	// DiskImageMB sizes its image when it is created (0: automatic).
	DiskQuota   bool
	DiskImageMB int64
	// Network configures per-sandbox networking.
	Network NetworkConfig
	// RegistryMirrors redirect template image pulls from a registry to a
	// mirror (serve --registry-mirror).
	RegistryMirrors []ociimage.Mirror
	// Builds bounds the template builds asked for through the E2B API.
	Builds BuildLimits
	// AllowRegistries are registries ("host:port") at private or loopback
	// addresses that API keys' template builds may pull from; others at
	// such addresses are refused (serve --allow-registry).
	AllowRegistries []string
	// Webhooks configures the delivery of lifecycle webhooks.
	Webhooks WebhookConfig
	// Volumes bounds the volumes' sizes and each key's volumes.
	Volumes VolumeConfig
	// Secrets bounds each key's secrets.
	Secrets SecretConfig
	// Neighbours bounds what one sandbox can take of what the host's
	// sandboxes share (README: Neighbours under attack).
	Neighbours NeighbourConfig
	// MetricsAddr is the admin listener serving Prometheus metrics at
	// /metrics ("": none); MetricsPerSandbox adds a series per running
	// sandbox (internal/metrics).
	MetricsAddr       string
	MetricsPerSandbox bool
	// KillOnClose kills every sandbox when the server closes.
	KillOnClose bool
	// PausedRetention is how long a paused sandbox is kept before it is
	// deleted with its disk; 0 keeps them forever.
	PausedRetention time.Duration
	// EventsRetention is how long lifecycle events are kept, of live and
	// killed sandboxes alike (default DefaultEventsRetention).
	EventsRetention time.Duration
	// WrapEvents, when set, stands between the manager and the lifecycle
	// event store (the events bench switches recording off through it);
	// records is the store of sandbox records the event store writes with
	// a transition's event.
	WrapEvents func(events sandbox.EventLog, records store.Store) sandbox.EventLog
	// Logger gets the server's log (default slog.Default()); BuildOutput the
	// template builds' progress (default os.Stderr); HTTPErrorLog the HTTP
	// servers' own errors (default: the standard logger).
	Logger       *slog.Logger
	BuildOutput  io.Writer
	HTTPErrorLog *log.Logger
}

// Daemon is a server: every subsystem, named. The fields are set by Start in
// the order of the package comment and are valid until Close.
type Daemon struct {
	cfg    Config
	log    *slog.Logger
	Layout layout.DataDir

	// APIKeys are the bootstrap keys; Keys holds them and the teams and
	// keys made through the API or `airlock keys`.
	APIKeys []string
	Keys    *apikey.Service
	// TeamStats samples each team's concurrent sandboxes and start rate.
	TeamStats *teamstats.Sampler
	Templates *template.Store
	Builds    *tplbuild.Service // template builds asked for through the E2B API
	Store     *store.SQLite
	// Events are the sandboxes' lifecycle events (the manager records them,
	// the events API reads them, webhooks follow their feed).
	Events   *store.LifecycleEvents
	Runtime  runtime.Runtime   // the default backend
	Runtimes []runtime.Runtime // every available backend, the default among them
	Network  *netpolicy.Network
	// Egress is the egress proxy (network.rules, egressProxy) and EgressCA
	// the CA whose certificates it presents to sandboxes; nil without Network.
	Egress   *egress.Proxy
	EgressCA *egress.CA
	Disk     *diskquota.Pool
	Volumes  *volume.Service // nil without a disk pool
	// Secrets keeps the API keys' secrets (the /secrets API). It is the
	// secret.Resolver the egress proxy fills ${e2b.secrets.<name>} with;
	// nothing else reads values.
	Secrets  *secret.Service
	Manager  *sandbox.Manager
	Proxy    *proxy.Proxy
	Webhooks *webhook.Dispatcher
	// Metrics are the server's Prometheus metrics, served at MetricsURL
	// (empty without MetricsAddr).
	Metrics    *metrics.Metrics
	MetricsURL string

	// APIURL and SandboxURL are where the listeners are (E2B_API_URL and
	// E2B_SANDBOX_URL for clients).
	APIURL, SandboxURL string
	// With Domain and TLS.Listen: Certs gives the TLS listener its
	// certificates, DomainCA is the server's own domain CA when it is the
	// source (nil with certificate files or another source), ClientDomain
	// is E2B_DOMAIN for clients (the domain, with the listener's port unless
	// it is 443) and DomainAPIURL https://api.<ClientDomain>.
	Certs        tlsfront.CertSource
	DomainCA     *tlsfront.CASource
	ClientDomain string
	DomainAPIURL string
	// Pending are the templates building in the background.
	Pending []string

	built    chan struct{} // closed when the background builds are done
	building bool          // the background builds were started
	buildErr error         // which of them failed, once built is closed
	errc     chan error    // a listener that stopped serving
	closers  teardown.Stack
}

// New returns a server that Start will start; nothing runs yet.
func New(cfg Config) *Daemon {
	lg := cfg.Logger
	if lg == nil {
		lg = slog.Default()
	}
	if cfg.BuildOutput == nil {
		cfg.BuildOutput = os.Stderr
	}
	if cfg.TemplateDataDir == "" {
		cfg.TemplateDataDir = cfg.DataDir
	}
	return &Daemon{cfg: cfg, log: lg, built: make(chan struct{}), errc: make(chan error, 5)}
}

// push adds a step to the teardown; Close runs them last pushed first.
func (d *Daemon) push(name string, fn func() error) { d.closers.Push(name, fn) }

// Start starts every subsystem in dependency order. On an error it closes
// what it had started and returns the error; the Daemon is then spent.
func (d *Daemon) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			_ = d.Close()
			if !d.building {
				close(d.built) // nothing will build: Built must not block
			}
		}
	}()
	if d.cfg.DataDir == "" || d.cfg.EnvdPath == "" {
		return errors.New("daemon: DataDir and EnvdPath are required")
	}
	if err := os.MkdirAll(d.cfg.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	root, err := filepath.Abs(d.cfg.DataDir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	d.Layout = layout.DataDir{Root: root}
	if err := d.lockDataDir(); err != nil {
		return err
	}
	if d.APIKeys = d.cfg.APIKeys; len(d.APIKeys) == 0 {
		key, err := StoredAPIKey(d.Layout)
		if err != nil {
			return err
		}
		d.APIKeys = []string{key}
	}
	if err := d.startCerts(); err != nil {
		return err
	}
	first, rest, err := d.startTemplates(ctx)
	if err != nil {
		return err
	}
	if d.Store, err = store.OpenSQLite(d.Layout.DB()); err != nil {
		return err
	}
	d.push("store", d.Store.Close)
	if err := d.startKeys(ctx); err != nil {
		return err
	}
	d.startEvents()
	if err := d.startSecrets(ctx); err != nil {
		return err
	}
	if d.Runtime, d.Runtimes, err = openRuntimes(d.cfg.Runtime, d.Layout, d.log); err != nil {
		return err
	}
	var eg *egressParts
	if d.Network, eg, err = startNetwork(d.cfg.Network, d.Layout, d.fillSecrets, d.log); err != nil {
		return err
	}
	if d.Network != nil {
		nw := d.Network
		d.Egress, d.EgressCA = eg.proxy, eg.ca
		d.push("egress proxy", d.Egress.Close)
		d.push("network", func() error {
			// The nftables table stays: sandboxes that outlive the server
			// keep their isolation and egress policy until a new server
			// adopts them. With every sandbox killed nothing needs it, and a
			// server on a throw-away data dir must leave none behind.
			var errs []error
			if d.cfg.KillOnClose {
				if err := nw.RemoveTable(); err != nil {
					errs = append(errs, fmt.Errorf("remove the sandbox firewall table: %w", err))
				}
			}
			return errors.Join(append(errs, nw.Close())...)
		})
	}
	if d.cfg.DiskQuota {
		// Mounted once per boot; a restarted server adopts the mount, and
		// the per-sandbox limits live in the filesystem.
		d.Disk, err = diskquota.Open(d.Layout.SandboxImage(), d.Layout.Sandboxes(), d.cfg.DiskImageMB<<20)
		if err != nil {
			return fmt.Errorf("disk quota (--disk-quota=false to run without): %w", err)
		}
		d.push("disk pool", func() error {
			if !d.cfg.KillOnClose {
				return nil
			}
			// Nothing is left on the pool: unmount it (the image file
			// stays for the next start).
			return d.Disk.Close(false)
		})
		if err := d.throttleDisk(); err != nil {
			return err
		}
	}
	if err := d.startVolumes(ctx); err != nil {
		return err
	}
	if err := d.startManager(ctx, first); err != nil {
		return err
	}
	d.checkVolumeMounts()
	if err := d.startTemplateBuilds(); err != nil {
		return err
	}
	d.startWebhooks()
	if err := d.startListeners(); err != nil {
		return err
	}
	d.startBackgroundBuilds(ctx, rest)
	return nil
}

// Errors reports a listener that stopped serving (the server should stop).
func (d *Daemon) Errors() <-chan error { return d.errc }

// Built is closed when the background template builds are done; BuildErr
// then says which failed.
func (d *Daemon) Built() <-chan struct{} { return d.built }

// BuildErr is the background builds' failures, valid once Built is closed.
func (d *Daemon) BuildErr() error {
	select {
	case <-d.built:
		return d.buildErr
	default:
		return nil
	}
}

// Close runs the teardown, last started first, and returns every step's
// error, named. It is safe to call more than once.
func (d *Daemon) Close() error { return d.closers.Close(d.log) }

// lockDataDir takes the data dir's server lock (an flock, released by the
// kernel if the process dies).
func (d *Daemon) lockDataDir() error {
	f, err := os.OpenFile(d.Layout.ServeLock(), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("data dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return fmt.Errorf("another airlock server is using the data dir %s (%w); stop it or pass a different --data-dir", d.Layout.Root, err)
	}
	d.push("data-dir lock", f.Close)
	return nil
}

// startTemplates opens the template store, queues every served template but
// the first (so a create meanwhile learns they are coming rather than "not
// built") and builds the first.
func (d *Daemon) startTemplates(ctx context.Context) (first, rest []string, err error) {
	// API keys' build steps reach the private ranges sandboxes reach.
	allowPrivate, err := netpolicy.ParseAllowPrivate(d.cfg.Network.AllowPrivate)
	if err != nil {
		return nil, nil, fmt.Errorf("--allow-private: %w", err)
	}
	d.Templates, err = template.Open(template.Options{
		DataDir: d.cfg.TemplateDataDir, EnvdPath: d.cfg.EnvdPath, NoEgress: !d.cfg.Network.Egress,
		DNSUpstreams: d.cfg.Network.DNSUpstreams, RegistryMirrors: d.cfg.RegistryMirrors,
		AllowPrivate: allowPrivate, AllowRegistries: d.cfg.AllowRegistries, Logger: d.log,
	})
	if err != nil {
		return nil, nil, err
	}
	for i, name := range d.cfg.Templates {
		if !d.Templates.IsBuiltin(name) {
			if _, err := d.Templates.Get(name); err != nil {
				return nil, nil, fmt.Errorf("--templates %s: %w (built-ins: %s)", name, err, strings.Join(d.Templates.Builtins(), ", "))
			}
		}
		if i == 0 {
			first = append(first, name)
		} else {
			rest = append(rest, name)
		}
	}
	d.Templates.Queue(rest...)
	d.push("template queue", func() error { d.Templates.Dequeue(rest...); return nil })
	for _, name := range first {
		if _, err := d.Templates.Ensure(ctx, name, d.cfg.BuildOutput); err != nil {
			return nil, nil, fmt.Errorf("template %s: %w", name, err)
		}
	}
	d.Pending = rest
	return first, rest, nil
}

// startManager starts the sandbox manager, lets it re-adopt what a previous
// server left, and fills the first templates' warm pools.
func (d *Daemon) startManager(ctx context.Context, first []string) error {
	// Made first, so that the manager reports from its first operation
	// (Recover's resumes included); it reads the manager only at a scrape,
	// after the listeners start.
	d.Metrics = metrics.New(metrics.Options{Sandboxes: managerOf{d}, DataDir: d.Layout.Root, PerSandbox: d.cfg.MetricsPerSandbox})
	d.Manager = sandbox.New(sandbox.Options{
		Observe:         d.Metrics.Observe,
		Disk:            d.Disk,
		Runtime:         d.Runtime,
		Runtimes:        d.Runtimes,
		Store:           d.Store,
		Templates:       template.Resolver{Store: d.Templates},
		DataDir:         d.Layout.Root,
		EnvdPath:        d.cfg.EnvdPath,
		MaxTimeout:      d.cfg.MaxTimeout,
		MaxPerOwner:     d.cfg.MaxPerKey,
		Quota:           d.teamQuota,
		Network:         d.Network,
		EgressTrust:     d.egressTrust(),
		Secrets:         d.managerSecrets(),
		Logger:          d.log,
		PausedRetention: d.cfg.PausedRetention,
		// A killed sandbox's log is kept as long as its lifecycle events.
		LogRetention: cmp.Or(d.cfg.EventsRetention, DefaultEventsRetention),
		Events:       d.managerEvents(),
		Volumes:      d.managerVolumes(),
	})
	d.push("sandbox manager", func() error {
		if d.cfg.KillOnClose {
			d.Manager.KillAll(context.Background())
		}
		d.Manager.Close()
		return nil
	})
	if err := d.Manager.Recover(ctx); err != nil {
		return fmt.Errorf("recover sandboxes: %w", err)
	}
	// Timers, metrics and pools only after Recover: they act on what Recover
	// re-adopted.
	d.Manager.Start()
	d.startTeamStats()
	for _, name := range first {
		if t, err := (template.Resolver{Store: d.Templates}).Resolve(ctx, name); err == nil {
			d.Manager.SetWarmPool(t, d.cfg.WarmPool)
		}
	}
	return nil
}

// authenticate reports whether key is a live API key of the server's.
func (d *Daemon) authenticate(key string) bool {
	_, err := d.Keys.Authenticate(key)
	return err == nil
}

// startTeamStats samples every team's sandboxes every 5 s for GET
// /teams/{teamID}/metrics.
func (d *Daemon) startTeamStats() {
	d.TeamStats = teamstats.New(func(ctx context.Context) ([]sandbox.Info, error) {
		return d.Manager.List(ctx, sandbox.ListFilter{})
	}, 5*time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		d.TeamStats.Run(ctx)
	}()
	d.push("team metrics", func() error {
		cancel()
		<-done
		return nil
	})
}

// teamQuota is a team's quota as the manager enforces it.
func (d *Daemon) teamQuota(owner string) sandbox.Quota {
	q := d.Keys.Quotas(owner)
	t, _ := d.Keys.Team(owner)
	return sandbox.Quota{Team: t.Name, Sandboxes: q.Sandboxes, VCPUs: q.VCPUs, MemoryMB: q.MemoryMB, Paused: q.PausedSandboxes,
		PausedDiskMB: q.PausedDiskMB}
}

// startKeys loads the teams and keys; the bootstrap keys hold every scope,
// each in the team whose ID is the digest Airlock has always recorded as
// the owner of what a key made. Last uses are written every few seconds.
func (d *Daemon) startKeys(ctx context.Context) error {
	keys, err := apikey.New(ctx, d.Store, apikey.Options{Bootstrap: d.APIKeys, TeamOf: e2b.OwnerOf, Logger: d.log})
	if err != nil {
		return fmt.Errorf("api keys: %w", err)
	}
	d.Keys = keys
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(5 * time.Second)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if err := keys.FlushUsage(context.Background()); err != nil {
					d.log.Warn("api keys: last use not written", "err", err)
				}
			}
		}
	}()
	d.push("api keys", func() error {
		close(stop)
		<-done
		return keys.FlushUsage(context.Background())
	})
	return nil
}

// startListeners serves the API (with /mcp and the info endpoint) and the
// sandbox proxy, each over HTTP/1.1 and h2c.
func (d *Daemon) startListeners() error {
	lns, err := listeners.Open(d.cfg.APIAddr, d.cfg.SandboxAddr)
	if err != nil {
		return err
	}
	opts := e2b.Options{
		Identify:   d.Keys.Authenticate,
		MaxTimeout: d.cfg.MaxTimeout,
		Domain:     d.cfg.Domain,
		DomainFor:  d.domainFor,
		Limits:     d.cfg.Limits,
		Templates: templatecatalog.Catalog{Store: d.Templates, Builds: d.Builds, InUse: func(ctx context.Context, id string) (int, error) {
			live, err := d.Manager.List(ctx, sandbox.ListFilter{Template: id})
			return len(live), err
		}},
		Builds:      d.Builds,
		Events:      d.Events,
		Secrets:     d.Secrets,
		Keys:        d.Keys,
		Audit:       d.Store,
		TeamMetrics: d.TeamStats,
		TeamRate:    func(team string) float64 { return d.Keys.Quotas(team).RequestsPerSecond },
		Grants:      true,
		Logger:      d.log,

		Webhooks:            d.Store,
		WebhookAllowPrivate: d.cfg.Webhooks.AllowPrivate,
	}
	var contentVolumes volumecontent.Opener // nil: the content API answers 501
	if d.Volumes != nil {                   // never a typed nil in an interface
		opts.Volumes = d.Volumes
		contentVolumes = d.Volumes
	}
	api := e2b.NewHandler(d.Manager, opts)
	// Tokens handed out are keys' grants; the proxy and the volume content
	// API check each against the key's current record.
	grants := grant.Checker{Keys: d.Keys, Refused: grant.AuditRefusals(d.Store, d.log)}
	d.Proxy = proxy.New(d.Manager, d.log)
	d.Proxy.SetGrants(grants)
	d.Proxy.SetStats(d.Metrics)
	if b := d.cfg.Neighbours.ProxyBudget; b != nil {
		d.Proxy.SetBudget(*b)
	}
	// The API listener also serves MCP (/mcp), whose tools call this
	// server's own API and proxy over loopback.
	apiMux := http.NewServeMux()
	// How this server reaches its own API and proxy (/mcp and the
	// dashboard call them).
	selfAPI, selfProxy := listeners.LoopbackURL(lns[0].Addr()), listeners.LoopbackURL(lns[1].Addr())
	apiMux.Handle("/mcp", mcp.NewStreamableHandler(selfAPI, selfProxy, d.Keys.Authenticate))
	apiMux.Handle("GET "+e2bwire.InfoPath, mcp.InfoHandler(lns[1].Addr()))
	// The volume content API, authorised by the volume tokens GET
	// /volumes/{id} hands out (E2B_VOLUME_API_URL is the API URL): each a
	// key's grant.
	content := volumecontent.New(contentVolumes, d.log)
	content.SetGrants(grants)
	apiMux.Handle(e2bwire.VolumeContentPrefix, content)
	dash, err := d.dashboard(api, selfAPI, selfProxy)
	if err != nil {
		for _, l := range lns {
			l.Close()
		}
		return err
	}
	apiMux.Handle(dashboard.Prefix, dash)
	apiMux.Handle("/dashboard", dash)
	apiMux.Handle("/", dashboard.RedirectRoot(api))
	servers := []*http.Server{
		{Handler: h2c.NewHandler(apiMux, &http2.Server{}), ReadHeaderTimeout: 30 * time.Second, ErrorLog: d.cfg.HTTPErrorLog},
		{Handler: h2c.NewHandler(d.Proxy, &http2.Server{}), ReadHeaderTimeout: 30 * time.Second, ErrorLog: d.cfg.HTTPErrorLog},
	}
	d.APIURL = "http://" + lns[0].Addr().String()
	d.SandboxURL = "http://" + lns[1].Addr().String()
	for i, ln := range lns {
		go func() {
			if err := servers[i].Serve(ln); !errors.Is(err, http.ErrServerClosed) {
				d.errc <- err
			}
		}()
	}
	d.push("listeners", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		var errs []error
		for _, s := range servers {
			errs = append(errs, shutdownHTTP(ctx, s))
		}
		return errors.Join(errs...)
	})
	if err := d.startMetricsListener(); err != nil {
		return err
	}
	return d.startDomainListener(apiMux, d.Proxy)
}

// dashboard makes the web dashboard over the API handler; its envd work
// goes through this server's own proxy, as the MCP tools' does.
func (d *Daemon) dashboard(api http.Handler, apiURL, sandboxURL string) (*dashboard.Dashboard, error) {
	o := dashboard.Options{
		Identify: d.Keys.Authenticate, API: api, Grants: true,
		Sandboxes: d.Manager, Events: d.Events, Templates: d.Templates,
		DataDir: d.Layout.Root, Logger: d.log,
	}
	if d.Builds != nil { // never a typed nil in an interface
		o.Builds = d.Builds
	}
	o.Envd = dashboard.EnvdClients(apiURL, sandboxURL)
	dash, err := dashboard.New(o)
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	return dash, nil
}

// startMetricsListener serves the metrics on the admin listener, apart from
// the API: scrapers need no API key, and operators keep it on loopback or
// an internal network.
func (d *Daemon) startMetricsListener() error {
	if d.cfg.MetricsAddr == "" {
		return nil
	}
	ln, err := net.Listen("tcp", d.cfg.MetricsAddr)
	if err != nil {
		return fmt.Errorf("listen on %s (--metrics-addr): %w", d.cfg.MetricsAddr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", d.Metrics.Handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 30 * time.Second, ErrorLog: d.cfg.HTTPErrorLog}
	d.MetricsURL = "http://" + ln.Addr().String() + "/metrics"
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			d.errc <- err
		}
	}()
	d.push("metrics listener", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
		defer cancel()
		return shutdownHTTP(ctx, srv)
	})
	return nil
}

// managerOf gives the metrics the manager once there is one.
type managerOf struct{ d *Daemon }

func (m managerOf) List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Info, error) {
	return m.d.Manager.List(ctx, f)
}

func (m managerOf) WarmPools() map[string]sandbox.PoolDepth { return m.d.Manager.WarmPools() }

func (m managerOf) Metrics(ctx context.Context, id string, start, end time.Time) ([]sandbox.Metric, error) {
	return m.d.Manager.Metrics(ctx, id, start, end)
}

// shutdownGrace is how long a stopping server lets its requests finish.
const shutdownGrace = 5 * time.Second

// shutdownHTTP stops s: it lets the requests in flight finish until ctx
// ends, then cuts the connections still busy. Those are clients holding a
// stream open (an MCP client's event stream, a command's output, a watch),
// which would hold a stopping server for as long as they like; they see their
// connection end, as when the server dies.
func shutdownHTTP(ctx context.Context, s *http.Server) error {
	err := s.Shutdown(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return s.Close()
	}
	return err
}

// startBackgroundBuilds builds the other served templates one after another
// while the server serves; each gets its warm pool as soon as it is ready.
func (d *Daemon) startBackgroundBuilds(ctx context.Context, rest []string) {
	buildCtx, stop := context.WithCancel(context.WithoutCancel(ctx))
	d.building = true
	go func() {
		defer close(d.built)
		var errs []error
		for i, name := range rest {
			t, err := d.Templates.Ensure(buildCtx, name, d.cfg.BuildOutput)
			if err != nil {
				d.Templates.Dequeue(name)
				if buildCtx.Err() != nil {
					d.Templates.Dequeue(rest[i:]...)
					d.buildErr = buildCtx.Err()
					return
				}
				d.log.Error("background template build failed; creates for it will fail until `airlock template build "+name+"` succeeds", "template", name, "err", err)
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
			d.Manager.SetWarmPool(t.ForSandbox(), d.cfg.WarmPool)
		}
		d.buildErr = errors.Join(errs...)
	}()
	// A background build stops first (cancelled, it cleans up after itself),
	// so no warm pool is set on a closing manager.
	d.push("background builds", func() error {
		stop()
		<-d.built
		return nil
	})
}
