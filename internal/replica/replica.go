// Package replica assembles one replica of Airlock's control plane whose
// sandboxes are Kubernetes Pods (serve --backend kubernetes): the E2B API,
// the sandbox proxy and /mcp over a kube.Backend, the registry the nodes
// pull template images from, and the state every replica shares (the
// store: PostgreSQL for several replicas, SQLite for one).
//
// Lifecycle:
//
//	r := replica.New(cfg)  // nothing runs yet
//	err := r.Start(ctx)    // each step in order; each pushes a named closer
//	...                    // r.APIURL, r.SandboxURL, r.RegistryURL are live
//	err = r.Close()        // the closers in reverse, on a failed Start too
//
// Start's order, and why:
//
//  1. store         the records every replica reads and writes
//  2. API keys      from the store, reloaded every few seconds: a key
//     made or revoked through another replica reaches this one
//  3. templates     the template store of --template-data-dir, read only:
//     templates are built on a box (airlock template build) and served
//     to the cluster as images
//  4. registry      the images of the served templates, made once each and
//     kept on disk, on a listener the nodes reach
//  5. cluster       the Kubernetes client, the Pod informer (Watch), and
//     this replica's part in the reconciler's election
//  6. webhooks      this replica's dispatcher over the shared outbox
//  7. API, proxy, MCP on their listeners
//
// Sandboxes outlive a replica: Close stops serving and leaves the Pods and
// records to the other replicas, or to the next start.
package replica

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/h2c"
	"k8s.io/client-go/kubernetes"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/dashboard"
	"github.com/airlock-sandbox/airlock/internal/e2b"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/grant"
	"github.com/airlock-sandbox/airlock/internal/kube"
	"github.com/airlock-sandbox/airlock/internal/listeners"
	"github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/proxy"
	"github.com/airlock-sandbox/airlock/internal/registry"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/teardown"
	"github.com/airlock-sandbox/airlock/internal/template"
	"github.com/airlock-sandbox/airlock/internal/templatecatalog"
	"github.com/airlock-sandbox/airlock/internal/webhook"
)

// Config is what a replica is started with (serve's flags).
type Config struct {
	// APIAddr, SandboxAddr and RegistryAddr are the listen addresses of
	// the E2B API (with /mcp), the sandbox proxy and the template image
	// registry.
	APIAddr, SandboxAddr, RegistryAddr string
	// RegistryHost is how the nodes name the registry in image references
	// (host:port); empty: RegistryAddr's, with an unspecified host made
	// 127.0.0.1 (a node on this machine). With RegistryAddr empty the
	// replica serves no registry, and RegistryHost names another's.
	RegistryHost string
	// Kubeconfig is the kubeconfig file; empty: the in-cluster config.
	Kubeconfig string
	// Namespace holds the sandbox Pods; RuntimeClass is theirs.
	Namespace    string
	RuntimeClass string
	// Store is the shared state: a postgres:// URL, or a SQLite file.
	Store string
	// DataDir holds the registry's images (and the SQLite file by default);
	// TemplateDataDir the built templates (default DataDir).
	DataDir, TemplateDataDir string
	// Templates are the templates served, each by name.
	Templates []string
	// EnvdPath is the envd binary put into every image.
	EnvdPath string
	// APIKeys are the bootstrap keys; every replica must have the same.
	APIKeys []string
	// MaxTimeout is the longest sandbox timeout a client may ask for;
	// Limits the per-key request and create rates (of this replica).
	MaxTimeout time.Duration
	Limits     e2b.Limits
	// MaxPerKey caps each team's sandboxes where its quota sets none.
	MaxPerKey int
	// Ready bounds a sandbox Pod's start; CPURequest and MemoryRequest are
	// the fractions of its limits a Pod requests (kube.Pods).
	Ready                     time.Duration
	CPURequest, MemoryRequest float64
	// Webhooks configures the delivery of lifecycle webhooks; every
	// replica runs a dispatcher over the shared outbox (each delivery is
	// claimed by one).
	Webhooks WebhookConfig
	// WarmPool is how many started Pods each served template keeps
	// ahead of demand (0: none); WarmPools sets it for some by name.
	WarmPool  int
	WarmPools map[string]int
	// NodeAgent: a node agent on every node enforces each sandbox Pod's
	// egress policy (serve --pod-network agent; kube.Backend.NodeAgent).
	NodeAgent bool
	// Identity names this replica in the reconciler's election (default:
	// host name and a random suffix).
	Identity string
	Logger   *slog.Logger
}

// WebhookConfig is serve's --webhook-* flags.
type WebhookConfig struct {
	AllowPrivate          bool
	RetryMax, GiveUpAfter time.Duration
}

// Replica is one replica: every subsystem, named, valid from Start to
// Close.
type Replica struct {
	cfg Config
	log *slog.Logger

	Store     *store.DB
	Events    *store.LifecycleEvents
	Keys      *apikey.Service
	Templates *template.Store
	Registry  *registry.Store
	Client    kubernetes.Interface
	Backend   *kube.Backend
	Proxy     *proxy.Proxy
	Webhooks  *webhook.Dispatcher

	// APIURL, SandboxURL and RegistryURL are where the listeners are.
	APIURL, SandboxURL, RegistryURL string

	envdDigest string // names envd in image tags
	mu         sync.Mutex
	// remoteReady holds the images another replica's registry has
	// answered for (without a registry of this replica's).
	remoteReady map[string]bool
	errc        chan error
	closers     teardown.Stack
}

// New returns a replica that Start will start.
func New(cfg Config) *Replica {
	lg := cfg.Logger
	if lg == nil {
		lg = slog.Default()
	}
	if cfg.TemplateDataDir == "" {
		cfg.TemplateDataDir = cfg.DataDir
	}
	return &Replica{cfg: cfg, log: lg, errc: make(chan error, 3)}
}

func (r *Replica) push(name string, fn func() error) { r.closers.Push(name, fn) }

// Errors reports a listener that stopped serving.
func (r *Replica) Errors() <-chan error { return r.errc }

// Close runs the teardown, last started first; safe to call again.
func (r *Replica) Close() error { return r.closers.Close(r.log) }

// Start starts the replica; on an error it closes what it started.
func (r *Replica) Start(ctx context.Context) (err error) {
	defer func() {
		if err != nil {
			_ = r.Close()
		}
	}()
	c := r.cfg
	switch {
	case c.DataDir == "" || c.EnvdPath == "":
		return errors.New("replica: DataDir and EnvdPath are required")
	case len(c.APIKeys) == 0:
		return errors.New("replica: the bootstrap API keys are required (AIRLOCK_API_KEY, the same on every replica)")
	case len(c.Templates) == 0:
		return errors.New("replica: no template to serve")
	case c.Namespace == "":
		return errors.New("replica: the namespace of the sandbox Pods is required")
	}
	if err := os.MkdirAll(c.DataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	if err := r.openStore(); err != nil {
		return err
	}
	if err := r.startKeys(ctx); err != nil {
		return err
	}
	if err := r.openTemplates(); err != nil {
		return err
	}
	if err := r.startRegistry(); err != nil {
		return err
	}
	if err := r.startCluster(ctx); err != nil {
		return err
	}
	r.startWebhooks()
	return r.startListeners()
}

func (r *Replica) openStore() error {
	path := r.cfg.Store
	if path == "" {
		path = filepath.Join(r.cfg.DataDir, "airlock.db")
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := store.Open(ctx, path)
	if err != nil {
		return fmt.Errorf("--store: %w", err)
	}
	r.Store = st
	r.push("store", st.Close)
	r.Events = store.NewLifecycleEvents(st)
	return nil
}

// keysReload is how often a replica reads the keys again: the longest a
// key made, changed or revoked through another replica takes to reach it.
const keysReload = 2 * time.Second

func (r *Replica) startKeys(ctx context.Context) error {
	keys, err := apikey.New(ctx, r.Store, apikey.Options{Bootstrap: r.cfg.APIKeys, TeamOf: e2b.OwnerOf, Logger: r.log})
	if err != nil {
		return fmt.Errorf("api keys: %w", err)
	}
	r.Keys = keys
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(keysReload)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				ctx, cancel := context.WithTimeout(context.Background(), keysReload)
				if err := keys.FlushUsage(ctx); err != nil {
					r.log.Warn("api keys: last use not written", "err", err)
				}
				if err := keys.Reload(ctx); err != nil {
					r.log.Warn("api keys: not reloaded", "err", err)
				}
				cancel()
			}
		}
	}()
	r.push("api keys", func() error {
		close(stop)
		<-done
		return keys.FlushUsage(context.Background())
	})
	return nil
}

func (r *Replica) openTemplates() error {
	ts, err := template.Open(template.Options{DataDir: r.cfg.TemplateDataDir, EnvdPath: r.cfg.EnvdPath, Logger: r.log})
	if err != nil {
		return err
	}
	r.Templates = ts
	for _, name := range r.cfg.Templates {
		if _, err := ts.Get(name); err != nil {
			return fmt.Errorf("--templates %s: %w (templates are built on a box: airlock template build %s --data-dir %s)", name, err, name, r.cfg.TemplateDataDir)
		}
	}
	return nil
}

// imageName is a template's image name in the registry.
func imageName(templateID string) string { return "airlock/" + templateID }

// imageTag names an image by what makes it: the template's build and the
// envd put in it (and the image's layout, imageFormat). Nodes keep images
// by tag, so a new envd must make a new tag.
func (r *Replica) imageTag(t template.Template) string {
	return t.BuildID + "-" + r.envdDigest
}

// imageFormat changes when TemplateImage lays images out differently.
const imageFormat = "3"

// digestEnvd names the envd binary (with imageFormat) in image tags.
func digestEnvd(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	h.Write([]byte(imageFormat))
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("envd: %w", err)
	}
	return hex.EncodeToString(h.Sum(nil))[:12], nil
}

// served returns a served template by name, alias or ID.
func (r *Replica) served(name string) (template.Template, error) {
	t, err := r.Templates.Get(name)
	if errors.Is(err, template.ErrNotFound) || (err == nil && !slices.Contains(r.cfg.Templates, t.ID) && !slices.Contains(r.cfg.Templates, t.Name)) {
		return template.Template{}, fmt.Errorf("%w: %q (this server serves %s)", sandbox.ErrTemplateNotFound, name, strings.Join(r.cfg.Templates, ", "))
	}
	if err != nil {
		return template.Template{}, fmt.Errorf("%w: %w", sandbox.ErrInvalid, err)
	}
	return t, nil
}

func (r *Replica) startRegistry() (err error) {
	if r.envdDigest, err = digestEnvd(r.cfg.EnvdPath); err != nil {
		return err
	}
	dir := filepath.Join(r.cfg.DataDir, "registry")
	r.Registry = &registry.Store{Dir: filepath.Join(dir, "oci"), Log: r.log, Build: func(_ context.Context, name, tag string) (v1.Image, error) {
		id, ok := strings.CutPrefix(name, "airlock/")
		if !ok {
			return nil, registry.ErrNotFound
		}
		t, err := r.served(id)
		if err != nil || r.imageTag(t) != tag {
			return nil, registry.ErrNotFound
		}
		work := filepath.Join(dir, "work", id+"-"+tag)
		if err := os.MkdirAll(work, 0o700); err != nil {
			return nil, err
		}
		return kube.TemplateImage(t.RootFS, r.cfg.EnvdPath, work)
	}, Made: func(name, tag string) {
		if id, ok := strings.CutPrefix(name, "airlock/"); ok {
			_ = os.RemoveAll(filepath.Join(dir, "work", id+"-"+tag))
		}
	}}
	ctx, cancel := context.WithCancel(context.Background())
	r.push("template images", func() error { cancel(); return nil })
	r.Registry.Background = ctx
	if r.cfg.RegistryAddr == "" {
		// The nodes pull from another replica's registry.
		if r.cfg.RegistryHost == "" {
			return errors.New("--registry-addr \"\" (no registry of this replica's) needs --registry-host, another replica's registry")
		}
		return nil
	}
	ln, err := net.Listen("tcp", r.cfg.RegistryAddr)
	if err != nil {
		return fmt.Errorf("registry: listen on %s: %w", r.cfg.RegistryAddr, err)
	}
	r.RegistryURL = "http://" + ln.Addr().String()
	if r.cfg.RegistryHost == "" {
		r.cfg.RegistryHost = listeners.LoopbackHost(ln.Addr())
	}
	r.serve("registry", ln, r.Registry)
	// Each served template's image is made now, in the background, so that
	// the first sandbox of each waits only for the node's pull.
	for _, name := range r.cfg.Templates {
		if t, err := r.served(name); err == nil {
			r.Registry.Prepare(ctx, imageName(t.ID), r.imageTag(t))
		}
	}
	return nil
}

// imagePending is a create for a template whose image the nodes cannot
// pull yet: 503 with Retry-After, as a template still building is.
type imagePending struct{ template, why string }

func (e *imagePending) Error() string {
	return fmt.Sprintf("the image of template %s is not ready for the cluster yet (%s); try again shortly", e.template, e.why)
}

func (e *imagePending) RetryAfter() time.Duration { return 5 * time.Second }

// imageReady reports whether the nodes can pull t's image now: from this
// replica's registry (starting to make it if needed), or, without one,
// as the other replica's registry answers.
func (r *Replica) imageReady(ctx context.Context, t template.Template, ref string) error {
	name, tag := imageName(t.ID), r.imageTag(t)
	if r.RegistryURL != "" {
		err := r.Registry.Ready(name, tag)
		if errors.Is(err, registry.ErrPreparing) {
			r.Registry.Prepare(r.Registry.Background, name, tag)
			return &imagePending{t.ID, "it is being made"}
		}
		if err != nil {
			return fmt.Errorf("the image of template %s: %w", t.ID, err)
		}
		return nil
	}
	r.mu.Lock()
	ok := r.remoteReady[ref]
	r.mu.Unlock()
	if ok {
		return nil
	}
	hctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(hctx, http.MethodHead, "http://"+r.cfg.RegistryHost+"/v2/"+name+"/manifests/"+tag, nil)
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return &imagePending{t.ID, "its registry " + r.cfg.RegistryHost + " does not answer: " + err.Error()}
	}
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		return &imagePending{t.ID, "its registry " + r.cfg.RegistryHost + " answers " + res.Status}
	}
	r.mu.Lock()
	if r.remoteReady == nil {
		r.remoteReady = map[string]bool{}
	}
	r.remoteReady[ref] = true
	r.mu.Unlock()
	return nil
}

// kubeTemplate is what the backend needs of a served template.
func (r *Replica) kubeTemplate(ctx context.Context, name string) (kube.Template, error) {
	t, err := r.served(name)
	if err != nil {
		return kube.Template{}, err
	}
	st := t.Settings
	env := map[string]string{}
	for _, kv := range t.Config.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			env[k] = v
		}
	}
	ref := r.cfg.RegistryHost + "/" + imageName(t.ID) + ":" + r.imageTag(t)
	if err := r.imageReady(ctx, t, ref); err != nil {
		return kube.Template{}, err
	}
	return kube.Template{
		ID: t.ID, Alias: t.Alias, BuildID: t.BuildID,
		Image: ref,
		CPUs:  st.CPUCount, MemoryMB: st.MemoryMB, DiskSizeMB: st.DiskSizeMB,
		DefaultUser: st.DefaultUser, DefaultWorkdir: st.DefaultWorkdir, EnvVars: env, Kernels: st.Kernels,
	}, nil
}

func (r *Replica) startCluster(ctx context.Context) error {
	rc, err := kube.RESTConfig(r.cfg.Kubeconfig)
	if err != nil {
		return err
	}
	rc.QPS, rc.Burst = 100, 200
	if r.Client, err = kubernetes.NewForConfig(rc); err != nil {
		return fmt.Errorf("kubernetes: %w", err)
	}
	r.Backend = &kube.Backend{
		Pods: &kube.Pods{Client: r.Client, Namespace: r.cfg.Namespace, RuntimeClass: r.cfg.RuntimeClass, Ready: r.cfg.Ready,
			CPURequest: r.cfg.CPURequest, MemoryRequest: r.cfg.MemoryRequest},
		Templates: r.kubeTemplate,
		Records:   r.Store,
		Events:    r.Events,
		Samples:   r.Store,
		Quota:     r.quota,
		NodeAgent: r.cfg.NodeAgent,
		Pools:     map[string]int{},
		Log:       r.log,
	}
	for _, name := range r.cfg.Templates {
		n, ok := r.cfg.WarmPools[name]
		if !ok {
			n = r.cfg.WarmPool
		}
		if n > 0 {
			r.Backend.Pools[name] = n
		}
	}
	wctx, cancel := context.WithCancel(context.Background())
	sctx, scancel := context.WithTimeout(ctx, time.Minute)
	defer scancel()
	if err := r.Backend.Start(wctx); err != nil {
		cancel()
		if sctx.Err() != nil || ctx.Err() != nil {
			return err
		}
		return fmt.Errorf("kubernetes: watching the sandbox Pods of %s: %w", r.cfg.Namespace, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		r.Backend.RunReconciler(wctx, r.cfg.Identity)
	}()
	r.push("cluster", func() error { cancel(); <-done; return nil })
	return nil
}

// startWebhooks runs this replica's webhook dispatcher: the lifecycle
// events into the shared delivery outbox, and workers that drain it. An
// event recorded through another replica wakes this dispatcher only at its
// next poll; its own, at once.
func (r *Replica) startWebhooks() {
	c := r.cfg.Webhooks
	r.Webhooks = webhook.New(webhook.Options{
		Store: r.Store, Feed: r.Events, AllowPrivate: c.AllowPrivate,
		RetryMax: c.RetryMax, GiveUpAfter: c.GiveUpAfter, Logger: r.log,
	})
	r.Webhooks.Start()
	r.push("webhooks", r.Webhooks.Close)
}

// quota is a team's quota, with --max-sandboxes-per-key where it sets
// none.
func (r *Replica) quota(owner string) sandbox.Quota {
	q := r.Keys.Quotas(owner)
	t, _ := r.Keys.Team(owner)
	out := sandbox.Quota{Team: t.Name, Sandboxes: q.Sandboxes, VCPUs: q.VCPUs, MemoryMB: q.MemoryMB}
	if out.Sandboxes <= 0 {
		out.Sandboxes = r.cfg.MaxPerKey
	}
	return out
}

func (r *Replica) startListeners() error {
	lns, err := listeners.Open(r.cfg.APIAddr, r.cfg.SandboxAddr)
	if err != nil {
		return err
	}
	api := e2b.NewHandler(r.Backend, e2b.Options{
		Identify:   r.Keys.Authenticate,
		MaxTimeout: r.cfg.MaxTimeout,
		Limits:     r.cfg.Limits,
		// The rate limits' buckets are the store's: a key's requests
		// count once, whichever replica serves them.
		Buckets:  r.Store,
		Events:   r.Events,
		Keys:     r.Keys,
		Audit:    r.Store,
		TeamRate: func(team string) float64 { return r.Keys.Quotas(team).RequestsPerSecond },
		// The served templates, read only: GET /templates lists them.
		Templates: templatecatalog.Catalog{Store: r.Templates, Served: r.cfg.Templates},
		Grants:    true,
		Logger:    r.log,

		Webhooks:            r.Store,
		WebhookAllowPrivate: r.cfg.Webhooks.AllowPrivate,
	})
	grants := grant.Checker{Keys: r.Keys, Refused: grant.AuditRefusals(r.Store, r.log)}
	r.Proxy = proxy.New(r.Backend, r.log)
	r.Proxy.SetGrants(grants)
	mux := http.NewServeMux()
	// How this server reaches its own API and proxy (/mcp and the
	// dashboard call them).
	selfAPI, selfProxy := listeners.LoopbackURL(lns[0].Addr()), listeners.LoopbackURL(lns[1].Addr())
	mux.Handle("/mcp", mcp.NewStreamableHandler(selfAPI, selfProxy, r.Keys.Authenticate))
	mux.Handle("GET "+e2bwire.InfoPath, mcp.InfoHandler(lns[1].Addr()))
	dash, err := r.dashboard(api, selfAPI, selfProxy)
	if err != nil {
		for _, l := range lns {
			l.Close()
		}
		return err
	}
	mux.Handle(dashboard.Prefix, dash)
	mux.Handle("/dashboard", dash)
	mux.Handle("/", dashboard.RedirectRoot(api))
	r.APIURL = "http://" + lns[0].Addr().String()
	r.SandboxURL = "http://" + lns[1].Addr().String()
	r.serve("API", lns[0], mux)
	r.serve("sandbox proxy", lns[1], r.Proxy)
	return nil
}

// dashboard is the web dashboard over the API handler and this replica's
// own proxy. Its sessions live in the replica that made them: a browser
// must keep to one replica (the Service's sessionAffinity).
func (r *Replica) dashboard(api http.Handler, apiURL, sandboxURL string) (*dashboard.Dashboard, error) {
	d, err := dashboard.New(dashboard.Options{
		Identify: r.Keys.Authenticate, API: api, Grants: true,
		Sandboxes: r.Backend, Events: r.Events, Templates: servedTemplates{r},
		DataDir: r.cfg.DataDir, Logger: r.log,
		Envd: dashboard.EnvdClients(apiURL, sandboxURL),
	})
	if err != nil {
		return nil, fmt.Errorf("dashboard: %w", err)
	}
	return d, nil
}

// servedTemplates is the dashboard's view of the template store: the
// served templates only.
type servedTemplates struct{ r *Replica }

func (s servedTemplates) List() ([]template.Template, error) {
	all, err := s.r.Templates.List()
	if err != nil {
		return nil, err
	}
	var out []template.Template
	for _, t := range all {
		if slices.Contains(s.r.cfg.Templates, t.ID) || slices.Contains(s.r.cfg.Templates, t.Name) {
			out = append(out, t)
		}
	}
	return out, nil
}

func (s servedTemplates) Builds(ref string) ([]template.Template, error) {
	if _, err := s.r.served(ref); err != nil {
		return nil, err
	}
	return s.r.Templates.Builds(ref)
}

// serve serves h on ln (HTTP/1.1 and h2c) until Close.
func (r *Replica) serve(name string, ln net.Listener, h http.Handler) {
	srv := &http.Server{Handler: h2c.NewHandler(h, &http2.Server{}), ReadHeaderTimeout: 30 * time.Second}
	go func() {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			r.errc <- fmt.Errorf("%s: %w", name, err)
		}
	}()
	r.push(name+" listener", func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			return srv.Close()
		}
		return nil
	})
}
