package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"

	"github.com/airlock-sandbox/airlock/internal/diskquota"
	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/envd"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/server"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/template"
)

type serveConfig struct {
	apiAddr, sandboxAddr string
	dataDir              string
	domain               string
	maxTimeout           time.Duration
	templates            []string
	killOnExit           bool
	logLevel             string
	warmPool             int
	limits               e2b.Limits
	maxPerKey            int
	runtime              string
	diskQuota            bool
	diskImageMB          int64
	// Sandbox network (internal/netpolicy).
	network     bool
	sandboxCIDR string
	egress      bool
	dnsUpstream []string
	dnsListen   string
	// allowPrivate: private ranges every sandbox may reach (closed by default).
	allowPrivate []string
}

func serveCmd() *cobra.Command {
	var c serveConfig
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
			return runServe(ctx, c)
		},
	}
	f := cmd.Flags()
	f.StringVar(&c.apiAddr, "api-addr", "127.0.0.1:3000", "listen address of the control-plane API")
	f.StringVar(&c.sandboxAddr, "sandbox-addr", "127.0.0.1:3001", "listen address for all sandbox traffic (E2B_SANDBOX_URL)")
	f.StringVar(&c.dataDir, "data-dir", "/var/lib/airlock", "directory for templates, sandboxes and state")
	f.StringVar(&c.domain, "domain", "", "domain sandboxes are reachable under as <port>-<id>.<domain> (optional)")
	f.DurationVar(&c.maxTimeout, "max-timeout", 24*time.Hour, "longest sandbox timeout a client may ask for")
	f.StringSliceVar(&c.templates, "templates", builtinTemplates, "templates to serve: the first is built (if needed) before the API answers, the others in the background")
	f.BoolVar(&c.killOnExit, "kill-on-exit", false, "kill every sandbox when the server stops (default: keep them and re-adopt them on the next start)")
	f.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	f.IntVar(&c.warmPool, "warm-pool", 10, "sandboxes per --templates template kept started ahead of demand, from when the template is ready (0: off)")
	f.Float64Var(&c.limits.Requests.Rate, "rate-limit", e2b.DefaultLimits.Requests.Rate, "API requests per second allowed per API key (0: no limit)")
	f.IntVar(&c.limits.Requests.Burst, "rate-burst", e2b.DefaultLimits.Requests.Burst, "API requests per API key allowed in a burst above --rate-limit")
	f.Float64Var(&c.limits.Creates.Rate, "create-rate-limit", e2b.DefaultLimits.Creates.Rate, "sandbox creations per second allowed per API key (0: no limit)")
	f.IntVar(&c.limits.Creates.Burst, "create-burst", e2b.DefaultLimits.Creates.Burst, "sandbox creations per API key allowed in a burst above --create-rate-limit")
	f.IntVar(&c.maxPerKey, "max-sandboxes-per-key", 100, "sandboxes one API key may have alive at once (0: no limit)")
	f.StringVar(&c.runtime, "runtime", "linux", `default isolation backend: "linux" (namespaces, cgroups, seccomp) or "gvisor" (runsc, systrap); a template's "runtime" setting overrides it`)
	f.BoolVar(&c.diskQuota, "disk-quota", true, "enforce each sandbox's diskSizeMB: sandboxes live on a btrfs image (<data-dir>/sandboxes.img, needs btrfs-progs) mounted on <data-dir>/sandboxes")
	f.Int64Var(&c.diskImageMB, "disk-image-size", 0, "size in MiB of the sparse sandbox image when it is created (0: min(free space, 64 GiB))")
	f.BoolVar(&c.network, "sandbox-network", true, "give every sandbox its own netns, veth, egress policy and DNS (off: loopback only)")
	f.StringVar(&c.sandboxCIDR, "sandbox-cidr", "", "private IPv4 range sandboxes get a /30 each from (default 10.77.0.0/16 for the default --data-dir, else a 10.x.0.0/16 derived from the data dir)")
	f.BoolVar(&c.egress, "sandbox-egress", true, "let sandboxes reach beyond the host (sets net.ipv4.ip_forward=1); off: no egress for any sandbox")
	f.StringSliceVar(&c.dnsUpstream, "dns-upstream", nil, "DNS servers (ip:port) the sandboxes' DNS forwarder asks (default: the host's /etc/resolv.conf nameservers)")
	f.StringSliceVar(&c.allowPrivate, "allow-private", nil, "private IPv4 ranges (CIDR or IP, comma-separated) every sandbox may reach; 10/8, 172.16/12, 192.168/16 and 100.64/10 are closed by default unless a sandbox's network.allowOut names them (169.254/16 stays closed)")
	f.StringVar(&c.dnsListen, "dns-listen", "0.0.0.0:0", "where the sandboxes' DNS forwarder listens; sandbox DNS to the gateway is redirected there, other sources get REFUSED")
	return cmd
}

func runServe(ctx context.Context, c serveConfig) error {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	t0 := time.Now()
	inst, err := start(ctx, c, log)
	if err != nil {
		return err
	}
	fmt.Printf(`
Airlock is serving (%s after start). For the E2B SDKs:

  export E2B_API_URL=%s
  export E2B_SANDBOX_URL=%s
  export E2B_API_KEY=%s

`, template.FormatDuration(time.Since(t0)), inst.apiURL, inst.sandboxURL, inst.apiKey)
	if len(inst.pending) > 0 {
		fmt.Printf("Building in the background: %s. Creates for them answer 503 with Retry-After until they are ready.\n\n",
			strings.Join(inst.pending, ", "))
	}
	go func() {
		select {
		case <-inst.built:
		case <-ctx.Done():
			return
		}
		if inst.buildErr != nil {
			fmt.Printf("\nSome templates could not be built (%v); the others are ready (%s after start).\n\n", inst.buildErr, template.FormatDuration(time.Since(t0)))
			return
		}
		fmt.Printf("\nAll templates are ready (%s): %s after start.\n\n", strings.Join(c.templates, ", "), template.FormatDuration(time.Since(t0)))
	}()
	select {
	case <-ctx.Done():
	case err = <-inst.errc:
		log.Error("listener failed", "err", err)
	}
	log.Info("shutting down")
	inst.close(c.killOnExit)
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	return err
}

// instance is a running server: both listeners over one manager.
type instance struct {
	apiURL, sandboxURL, apiKey string
	mgr                        *sandbox.Manager
	net                        *netpolicy.Network // nil without --sandbox-network
	tpls                       *template.Store
	errc                       chan error
	close                      func(killAll bool)
	// pending are the templates building in the background; built is closed
	// when they are all done, and buildErr then says which failed.
	pending  []string
	built    chan struct{}
	buildErr error
}

// builtinTemplates are served by default, in build order: each is FROM an
// earlier one, so the background builds never wait for each other.
var builtinTemplates = []string{"base", "python3", "node", "code-interpreter-v1"}

// start assembles and starts every subsystem, in dependency order: templates,
// store, runtime, manager, then the two listeners over the manager.
func start(ctx context.Context, c serveConfig, log *slog.Logger) (*instance, error) {
	if err := os.MkdirAll(c.dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	dataDir, err := filepath.Abs(c.dataDir)
	if err != nil {
		return nil, err
	}
	// Two servers on one data dir would each take the other's sandboxes for
	// orphans and destroy them.
	unlock, err := lockDataDir(dataDir)
	if err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			unlock()
		}
	}()
	apiKeys, err := loadAPIKeys(dataDir)
	if err != nil {
		return nil, err
	}
	envdPath, err := findEnvd()
	if err != nil {
		return nil, err
	}
	tpls, err := template.Open(template.Options{
		DataDir: dataDir, EnvdPath: envdPath, NoEgress: !c.egress, DNSUpstreams: c.dnsUpstream, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	// The first template is built before serving; the rest are queued, so a
	// create meanwhile learns they are coming rather than "not built".
	var first, rest []string
	for i, name := range c.templates {
		if !tpls.IsBuiltin(name) {
			if _, err := tpls.Get(name); err != nil {
				return nil, fmt.Errorf("--templates %s: %w (built-ins: %s)", name, err, strings.Join(tpls.Builtins(), ", "))
			}
		}
		if i == 0 {
			first = append(first, name)
		} else {
			rest = append(rest, name)
		}
	}
	tpls.Queue(rest...)
	for _, name := range first {
		if _, err := tpls.Ensure(ctx, name, os.Stderr); err != nil {
			tpls.Dequeue(rest...)
			return nil, fmt.Errorf("template %s: %w", name, err)
		}
	}
	db, err := store.OpenSQLite(filepath.Join(dataDir, "airlock.db"))
	if err != nil {
		return nil, err
	}
	rt, others, err := runtimes(c.runtime, dataDir, log)
	if err != nil {
		db.Close()
		return nil, err
	}
	nw, err := startNetwork(c, dataDir, log)
	if err != nil {
		db.Close()
		return nil, err
	}
	closeNetwork := func() {
		if nw != nil {
			_ = nw.Close()
		}
	}
	var disk *diskquota.Pool
	if c.diskQuota {
		// Mounted once per boot; a restarted server adopts the mount, and the
		// per-sandbox limits live in the filesystem.
		disk, err = diskquota.Open(filepath.Join(dataDir, "sandboxes.img"), filepath.Join(dataDir, "sandboxes"), c.diskImageMB<<20)
		if err != nil {
			closeNetwork()
			db.Close()
			return nil, fmt.Errorf("disk quota (--disk-quota=false to run without): %w", err)
		}
	}
	mgr := sandbox.New(sandbox.Options{
		Disk:        disk,
		Runtime:     rt,
		Runtimes:    others,
		Store:       db,
		Templates:   template.Resolver{Store: tpls},
		DataDir:     dataDir,
		EnvdPath:    envdPath,
		MaxTimeout:  c.maxTimeout,
		MaxPerOwner: c.maxPerKey,
		Network:     nw,
		Logger:      log,
	})
	if err := mgr.Recover(ctx); err != nil {
		mgr.Close()
		closeNetwork()
		db.Close()
		return nil, fmt.Errorf("recover sandboxes: %w", err)
	}
	mgr.Start()
	for _, name := range first {
		if t, err := (template.Resolver{Store: tpls}).Resolve(ctx, name); err == nil {
			mgr.SetWarmPool(t, c.warmPool)
		}
	}
	authenticate := func(key string) bool {
		ok := 0
		for _, k := range apiKeys { // no early exit: time does not tell which key matched
			ok |= subtle.ConstantTimeCompare([]byte(key), []byte(k))
		}
		return ok == 1
	}
	api := e2b.NewHandler(mgr, e2b.Options{
		Authenticate: authenticate,
		MaxTimeout:   c.maxTimeout,
		Domain:       c.domain,
		Limits:       c.limits,
		Templates:    e2bTemplates{s: tpls, mgr: mgr},
		Logger:       log,
	})
	proxy := server.NewProxy(mgr, log)

	var lns []net.Listener
	for _, addr := range []string{c.apiAddr, c.sandboxAddr} {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			for _, l := range lns {
				l.Close()
			}
			mgr.Close()
			closeNetwork()
			db.Close()
			return nil, fmt.Errorf("listen on %s: %w", addr, err)
		}
		lns = append(lns, ln)
	}
	// The API listener also serves MCP (/mcp), whose tools call this server's
	// own API and proxy over loopback.
	apiMux := http.NewServeMux()
	apiMux.Handle("/mcp", mcpHandler(loopbackURL(lns[0].Addr()), loopbackURL(lns[1].Addr()), authenticate))
	apiMux.Handle("GET "+mcp.InfoPath, infoHandler(lns[1].Addr()))
	apiMux.Handle("/", api)
	servers := []*http.Server{
		{Handler: h2c.NewHandler(apiMux, &http2.Server{}), ReadHeaderTimeout: 30 * time.Second},
		{Handler: h2c.NewHandler(proxy, &http2.Server{}), ReadHeaderTimeout: 30 * time.Second},
	}
	inst := &instance{
		apiURL:     "http://" + lns[0].Addr().String(),
		sandboxURL: "http://" + lns[1].Addr().String(),
		apiKey:     apiKeys[0],
		mgr:        mgr,
		net:        nw,
		tpls:       tpls,
		errc:       make(chan error, 2),
		pending:    rest,
		built:      make(chan struct{}),
	}
	for i, ln := range lns {
		go func() { inst.errc <- servers[i].Serve(ln) }()
	}
	// The other templates build one after another while the server serves;
	// each gets its warm pool as soon as it is ready.
	buildCtx, stopBuilds := context.WithCancel(context.WithoutCancel(ctx))
	go func() {
		defer close(inst.built)
		var errs []error
		for i, name := range rest {
			t, err := tpls.Ensure(buildCtx, name, os.Stderr)
			if err != nil {
				tpls.Dequeue(name)
				if buildCtx.Err() != nil {
					tpls.Dequeue(rest[i:]...)
					inst.buildErr = buildCtx.Err()
					return
				}
				log.Error("background template build failed; creates for it will fail until `airlock template build "+name+"` succeeds", "template", name, "err", err)
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
				continue
			}
			mgr.SetWarmPool(t.ForSandbox(), c.warmPool)
		}
		inst.buildErr = errors.Join(errs...)
	}()
	// Teardown in reverse: stop taking requests, then (optionally) kill the
	// sandboxes, stop the manager's background work, close the store.
	inst.close = func(killAll bool) {
		// A background build stops first (cancelled, it cleans up after
		// itself), so no warm pool is set on a closing manager.
		stopBuilds()
		<-inst.built
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for _, s := range servers {
			_ = s.Shutdown(shutdownCtx)
		}
		if killAll {
			mgr.KillAll(context.Background())
		}
		mgr.Close()
		// The nftables table stays: sandboxes that outlive the server keep
		// their isolation and egress policy until a new server adopts them.
		// With every sandbox killed nothing needs it, and a server on a
		// throw-away data dir (the first-run test) must leave none behind.
		if killAll && nw != nil {
			if err := nw.RemoveTable(); err != nil {
				log.Warn("remove the sandbox firewall table", "err", err)
			}
		}
		closeNetwork()
		if killAll && disk != nil {
			// Nothing is left on the sandbox image: unmount it (the image
			// file stays for the next start).
			if err := disk.Close(false); err != nil {
				log.Warn("unmount sandbox image", "err", err)
			}
		}
		db.Close()
		unlock()
	}
	ok = true
	return inst, nil
}

// runtimes returns the default backend named by --runtime and every backend
// available: linux always, gvisor when runsc is installed (a template may ask
// for it, and Recover must find its sandboxes whatever the default).
func runtimes(name, dataDir string, log *slog.Logger) (runtime.Runtime, []runtime.Runtime, error) {
	if name == "" {
		name = "linux"
	}
	lx, err := linux.New(filepath.Join(dataDir, "runtime", "linux"), log)
	if err != nil {
		return nil, nil, err
	}
	all := []runtime.Runtime{lx}
	gv, gvErr := gvisor.New(filepath.Join(dataDir, "runtime", "gvisor"), log)
	if gvErr == nil {
		all = append(all, gv)
	}
	for _, r := range all {
		if r.Name() == name {
			return r, all, nil
		}
	}
	if name == "gvisor" {
		return nil, nil, fmt.Errorf("--runtime gvisor: %w", gvErr)
	}
	return nil, nil, fmt.Errorf("--runtime %q: want linux or gvisor", name)
}

// lockDataDir takes the data dir's server lock (an flock, released by the
// kernel if the process dies).
func lockDataDir(dataDir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dataDir, "serve.lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("data dir lock: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another airlock server is using the data dir %s (%w); stop it or pass a different --data-dir", dataDir, err)
	}
	return func() { f.Close() }, nil
}

// loadAPIKeys returns the keys of AIRLOCK_API_KEY (comma-separated), or the
// key kept in the data dir, made on first use in the e2b_<40 hex> shape the
// Python SDK insists on. The first key is the one printed for clients.
func loadAPIKeys(dataDir string) ([]string, error) {
	if v := os.Getenv("AIRLOCK_API_KEY"); v != "" {
		var keys []string
		for _, k := range strings.Split(v, ",") {
			if k = strings.TrimSpace(k); k != "" {
				keys = append(keys, k)
			}
		}
		if len(keys) == 0 {
			return nil, errors.New("AIRLOCK_API_KEY holds no key")
		}
		return keys, nil
	}
	key, err := storedAPIKey(dataDir)
	if err != nil {
		return nil, err
	}
	return []string{key}, nil
}

func storedAPIKey(dataDir string) (string, error) {
	path := filepath.Join(dataDir, "api-key")
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), nil
	}
	raw := make([]byte, 20)
	if _, err := rand.Read(raw); err != nil {
		return "", err
	}
	key := "e2b_" + hex.EncodeToString(raw)
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("save api key: %w", err)
	}
	return key, nil
}

// findEnvd locates the static envd binary: AIRLOCK_ENVD, else beside this
// executable (make build puts bin/airlock and bin/envd together).
func findEnvd() (string, error) {
	if p := os.Getenv("AIRLOCK_ENVD"); p != "" {
		return filepath.Abs(p)
	}
	exe, err := os.Executable()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(exe), "envd")
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("envd binary not found beside %s (run `make build`, or set AIRLOCK_ENVD): %w", exe, err)
	}
	return p, nil
}

// e2bTemplates serves the E2B template endpoints from the template store. It
// lists built templates (an unbuilt built-in cannot make a sandbox, and the E2B
// shape describes a build); deleting refuses built-ins (serve --templates would
// rebuild them; `airlock template rm` can remove one) and templates that live
// sandboxes use, as the manager counts them.
type e2bTemplates struct {
	s   *template.Store
	mgr *sandbox.Manager
}

func (t e2bTemplates) List(context.Context) ([]e2b.TemplateInfo, error) {
	all, err := t.s.List()
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	var out []e2b.TemplateInfo
	for _, tpl := range all {
		if tpl.Ready {
			out = append(out, e2bTemplateInfo(tpl))
		}
	}
	return out, nil
}

func (t e2bTemplates) Get(_ context.Context, ref string) (e2b.TemplateInfo, error) {
	tpl, err := t.s.Get(ref)
	if errors.Is(err, template.ErrNotFound) || errors.Is(err, template.ErrNotBuilt) {
		return e2b.TemplateInfo{}, fmt.Errorf("%w: %w", e2b.ErrTemplateNotFound, err)
	}
	if err != nil {
		return e2b.TemplateInfo{}, fmt.Errorf("template %q: %w", ref, err)
	}
	return e2bTemplateInfo(tpl), nil
}

func (t e2bTemplates) Delete(ctx context.Context, ref string) error {
	tpl, err := t.Get(ctx, ref)
	if err != nil {
		return err
	}
	if t.s.IsBuiltin(tpl.ID) {
		return fmt.Errorf("template %q is built in; remove it with `airlock template rm` on the server: %w", ref, e2b.ErrTemplateProtected)
	}
	err = t.s.Remove(ctx, tpl.ID, func(tt template.Template) (int, error) {
		live, err := t.mgr.List(ctx, sandbox.ListFilter{Template: tt.ID})
		return len(live), err
	})
	if errors.Is(err, template.ErrInUse) {
		return fmt.Errorf("%w: %w", e2b.ErrTemplateInUse, err)
	}
	if errors.Is(err, template.ErrNotFound) {
		return fmt.Errorf("%w: %w", e2b.ErrTemplateNotFound, err)
	}
	return err
}

func e2bTemplateInfo(tpl template.Template) e2b.TemplateInfo {
	var aliases []string
	for _, a := range []string{tpl.Alias, tpl.Name} {
		if a != "" && a != tpl.ID && !slices.Contains(aliases, a) {
			aliases = append(aliases, a)
		}
	}
	if len(aliases) == 0 {
		aliases = []string{tpl.ID} // built-ins: the id is the name clients use
	}
	return e2b.TemplateInfo{
		ID:          tpl.ID,
		Aliases:     aliases,
		Public:      true, // no teams: every key of this server may use it
		BuildID:     tpl.Key,
		CPUCount:    tpl.Settings.CPUCount,
		MemoryMB:    tpl.Settings.MemoryMB,
		DiskSizeMB:  tpl.Settings.DiskSizeMB,
		EnvdVersion: envd.Version,
		CreatedAt:   tpl.BuiltAt,
		UpdatedAt:   tpl.BuiltAt,
	}
}

// startNetwork sets up sandbox networking unless --sandbox-network=false.
// Egress needs IPv4 forwarding, a host-wide setting: serve turns it on only
// when --sandbox-egress is on and never turns it off (other software may rely
// on it by then).
func startNetwork(c serveConfig, dataDir string, log *slog.Logger) (*netpolicy.Network, error) {
	if !c.network {
		return nil, nil
	}
	inst := netInstanceOf(dataDir)
	cidrStr := c.sandboxCIDR
	if cidrStr == "" {
		cidrStr = inst.cidr
	}
	cidr, err := netip.ParsePrefix(cidrStr)
	if err != nil {
		return nil, fmt.Errorf("--sandbox-cidr: %w", err)
	}
	allowPrivate, err := netpolicy.ParseAllowPrivate(c.allowPrivate)
	if err != nil {
		return nil, fmt.Errorf("--allow-private: %w", err)
	}
	if c.egress {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return nil, fmt.Errorf("enable IPv4 forwarding for sandbox egress (or pass --sandbox-egress=false): %w", err)
		}
	}
	nw, err := netpolicy.New(netpolicy.Config{
		CIDR:         cidr,
		StateDir:     filepath.Join(dataDir, "network"),
		Table:        inst.table,
		IfPrefix:     inst.prefix,
		DNSUpstreams: c.dnsUpstream,
		DNSListen:    c.dnsListen,
		NoEgress:     !c.egress,
		AllowPrivate: allowPrivate,
		Logger:       log,
	})
	if err != nil {
		return nil, fmt.Errorf("sandbox network: %w", err)
	}
	log.Info("sandbox network ready", "cidr", cidr, "egress", c.egress, "dns_port", nw.DNSPort(),
		"nft_table", "inet "+inst.table, "veth_prefix", inst.prefix, "allow_private", allowPrivate)
	return nw, nil
}

// netInstance names what one server owns in the host's shared network state.
type netInstance struct{ table, prefix, cidr string }

// netInstanceOf gives the server of the default data dir the plain names
// (table "airlock", veths "alk…", 10.77.0.0/16) and any other data dir (a
// test or a second server on the same host) its own, derived from the path:
// two servers must never share a table, an interface prefix or a range, or
// one's start would replace the other's firewall.
func netInstanceOf(dataDir string) netInstance {
	if dataDir == "/var/lib/airlock" {
		return netInstance{table: "airlock", prefix: "alk", cidr: "10.77.0.0/16"}
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(dataDir))
	v := h.Sum32()
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	tag := string([]byte{digits[v%36], digits[(v/36)%36]})
	if tag == "lk" || tag == "lt" { // the default server's and the Go tests' prefixes
		tag = "x" + tag[1:]
	}
	return netInstance{
		table:  "airlock_" + tag,
		prefix: "a" + tag,
		cidr:   fmt.Sprintf("10.%d.0.0/16", 100+(v>>16)%100),
	}
}
