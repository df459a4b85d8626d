package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Template is what the backend needs of a template: the image its Pods
// run (by a reference the nodes can pull) and its defaults.
type Template struct {
	ID, Alias      string
	BuildID        string
	Image          string
	CPUs, MemoryMB int
	DiskSizeMB     int
	DefaultUser    string
	DefaultWorkdir string
	EnvVars        map[string]string
	// Kernels are the code-interpreter languages envd starts at boot.
	Kernels []string
}

// EventLog is where the backend records lifecycle events: the store's
// LifecycleEvents over the same database as Records.
type EventLog interface {
	lifecycle.Recorder
	RecordWithSandbox(ctx context.Context, e lifecycle.Event, rec store.Sandbox) (lifecycle.Event, error)
}

// Backend is the E2B API's sandbox manager when sandboxes are Pods: it
// implements the E2B handler's Manager and the proxy's Sandboxes. Create,
// get, list, timeouts, kill, connect and the egress policy (with NodeAgent)
// work as on one box; pause, fork, snapshots, egress rules and logs answer
// sandbox.ErrNotSupported naming the backend.
//
// Every replica of the control plane runs a Backend over the same Records
// (PostgreSQL for more than one) and the same namespace, and each serves
// every sandbox:
//
//	Create   the record first (state "creating": counted by quotas, shown
//	         by nothing), then the Pod; once envd answers, the record is
//	         "running" with its created event. A failure deletes both.
//	Get/List read the records: what another replica made or changed is
//	         seen at once.
//	proxy    reaches the Pod's IP, from this replica's Pod informer (or the
//	         API server, before the informer has the Pod); the access token
//	         and owner come from the record and are cached, since neither
//	         changes in a sandbox's life.
//	Kill     the killed event and the record's deletion, then the Pod's.
//	reconcile one replica at a time (a Lease, Reconciler): timeouts, Pods
//	         that ended behind Airlock's back (killed events with the
//	         reason), records whose create a crash cut short, and Pods no
//	         record names.
type Backend struct {
	Pods      *Pods
	Templates func(ctx context.Context, name string) (Template, error)
	// Records are the sandboxes' records, shared by the replicas.
	Records Records
	// Events, when set, gets the sandboxes' lifecycle events.
	Events EventLog
	// Samples, when set, keeps the sandboxes' resource samples (Sample);
	// without it, metrics answer 501.
	Samples MetricsStore
	// Quota, when set, is each team's quota (Sandboxes, VCPUs, MemoryMB
	// are enforced, over every replica's records: Records.InsertSandbox).
	Quota func(owner string) sandbox.Quota
	// Pools are the warm pools' sizes by template name (pool.go), as set
	// before Start; SetPool changes one later.
	Pools map[string]int
	Log   *slog.Logger
	// NodeAgent: every sandbox Pod's egress policy is enforced by the node
	// agent of its node (internal/nodeagent; podnetwork.go), and creates
	// and network updates wait for it. Without it the cluster's
	// NetworkPolicy is all there is, and a create or update that asks for a
	// policy is refused (501).
	NodeAgent bool
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time

	mu sync.Mutex
	// routes caches what the proxy needs of each sandbox this replica
	// served; a sandbox that ends is dropped (Watch, Kill, reconcile).
	routes map[string]*route
	// ended holds why sandboxes ended, for the message of a not-found, a
	// while.
	ended map[string]string
}

// Records is what the backend keeps in the store (store.DB): the
// sandboxes' records, shared by every replica.
type Records interface {
	// InsertSandbox writes a new record if its owner's records stay
	// within the limits (store.SandboxLimitError otherwise).
	InsertSandbox(ctx context.Context, s store.Sandbox, lim store.SandboxLimits) error
	Put(ctx context.Context, s store.Sandbox) error
	Get(ctx context.Context, id string) (store.Sandbox, error)
	List(ctx context.Context) ([]store.Sandbox, error)
	Delete(ctx context.Context, id string) error
}

// route is how the proxy reaches one sandbox.
type route struct {
	ip           net.IP
	token, owner string
	traffic      string
	envd, interp http.RoundTripper
}

// errNotSupported names what this backend does not do (yet).
func errNotSupported(what string) error {
	return fmt.Errorf("%w: %s is not available with the kubernetes backend (sandboxes are Pods); use the single-box backend for it", sandbox.ErrNotSupported, what)
}

func (b *Backend) now() time.Time {
	if b.Now != nil {
		return b.Now()
	}
	return time.Now()
}

func (b *Backend) log() *slog.Logger {
	if b.Log == nil {
		return slog.Default()
	}
	return b.Log
}

// Start watches the namespace's sandbox Pods, so that one ending behind
// the backend's back is no longer served, and says why when asked.
func (b *Backend) Start(ctx context.Context) error {
	return b.Pods.Watch(ctx, func(g Gone) {
		// Another replica's kill deletes the record before the Pod: a
		// Pod gone with its record is Airlock's doing, not news.
		_, err := b.Records.Get(ctx, g.ID)
		if errors.Is(err, store.ErrNotFound) {
			b.mu.Lock()
			delete(b.routes, g.ID)
			b.mu.Unlock()
			return
		}
		b.forget(g.ID, g.Reason)
		b.log().Warn("sandbox Pod ended outside Airlock", "sandbox", g.ID, "reason", g.Reason)
	})
}

// rememberEnd keeps why a sandbox ended; b.mu is held.
func (b *Backend) rememberEnd(id, reason string) {
	if b.ended == nil {
		b.ended = map[string]string{}
	}
	if len(b.ended) > 10000 { // a bound, not a history: messages only
		clear(b.ended)
	}
	b.ended[id] = reason
}

// forget drops a sandbox that ended from this replica's caches.
func (b *Backend) forget(id, why string) {
	b.mu.Lock()
	delete(b.routes, id)
	b.rememberEnd(id, why)
	b.mu.Unlock()
}

func newID() string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	buf := make([]byte, 20)
	_, _ = rand.Read(buf)
	for i, c := range buf {
		buf[i] = alphabet[int(c)%len(alphabet)]
	}
	return string(buf)
}

func newToken() string {
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Create starts a sandbox Pod of the request's template.
func (b *Backend) Create(ctx context.Context, req sandbox.CreateRequest) (_ sandbox.Info, err error) {
	switch {
	case len(req.VolumeMounts) > 0:
		return sandbox.Info{}, errNotSupported("mounting volumes")
	case !b.NodeAgent && (req.Network != nil || req.AllowInternetAccess != nil && !*req.AllowInternetAccess):
		return sandbox.Info{}, errNotSupported("the network policy (this replica runs with --pod-network none: no node agent enforces one)")
	case req.Lifecycle.OnTimeout == sandbox.OnTimeoutPause:
		return sandbox.Info{}, errNotSupported("pausing at the timeout (autoPause)")
	case req.Timeout <= 0:
		return sandbox.Info{}, fmt.Errorf("%w: timeout must be positive", sandbox.ErrInvalid)
	}
	t, err := b.Templates(ctx, req.Template)
	if err != nil {
		return sandbox.Info{}, err
	}
	id := newID()
	env := maps.Clone(t.EnvVars)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, req.EnvVars)
	now := b.now()
	info := sandbox.Info{
		ID: id, TemplateID: t.ID, Alias: t.Alias, Owner: req.Owner,
		Metadata: maps.Clone(req.Metadata), EnvVars: maps.Clone(req.EnvVars),
		CPUCount: t.CPUs, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
		EnvdVersion: envdapi.Version, AllowInternetAccess: req.AllowInternetAccess,
		Lifecycle: req.Lifecycle, State: sandbox.StateCreating,
		StartedAt: now, EndAt: now.Add(req.Timeout),
	}
	if req.Network != nil {
		info.Network = sandbox.CopyNetwork(*req.Network)
	}
	var policy string
	if b.NodeAgent {
		if policy, err = podPolicy(info); err != nil {
			return sandbox.Info{}, err
		}
	}
	if req.Secure {
		info.AccessToken = newToken()
	}
	var ip net.IP
	if b.poolSize(t.ID) > 0 || b.poolSize(req.Template) > 0 {
		if ip, err = b.claimWarm(ctx, t, &info, env, policy); err != nil {
			return sandbox.Info{}, fmt.Errorf("sandbox %s: %w", info.ID, err)
		}
		id = info.ID
	}
	if ip == nil {
		id = newID()
		info.ID = id
		// The record first, within the team's quota: a replica that dies
		// now leaves a record the reconciler finds, never a Pod no record
		// names for long.
		if err := b.insert(ctx, info); err != nil {
			return sandbox.Info{}, fmt.Errorf("sandbox %s: %w", id, err)
		}
	}
	defer func() {
		if err != nil {
			if derr := b.Records.Delete(context.WithoutCancel(ctx), id); derr != nil {
				b.log().Error("deleting the record of a create that failed", "sandbox", id, "err", derr)
			}
			_ = b.Pods.Delete(context.WithoutCancel(ctx), id)
		}
	}()
	if ip == nil {
		sb, err := b.Pods.Create(ctx, Spec{
			ID: id, Team: req.Owner, Template: t.ID, Image: t.Image, CPUs: t.CPUs, MemoryMB: t.MemoryMB, Network: policy,
			Envd: envdapi.Config{SandboxID: id, TemplateID: t.ID, AccessToken: info.AccessToken, EnvVars: env,
				DefaultUser: t.DefaultUser, DefaultWorkdir: t.DefaultWorkdir, Kernels: t.Kernels},
		})
		if err != nil {
			return sandbox.Info{}, err
		}
		ip = sb.IP
	}
	if b.NodeAgent {
		if err := b.Pods.waitNetwork(ctx, id, NetworkDigest(policy)); err != nil {
			return sandbox.Info{}, err
		}
	}
	// The timeout counts from the create's start: the Pod's start (seconds
	// when its node pulls the image) is part of the sandbox's life.
	info.State = sandbox.StateRunning
	if err := b.commit(ctx, info, lifecycle.Created, lifecycle.EventData{}, t.BuildID); err != nil {
		return sandbox.Info{}, fmt.Errorf("sandbox %s: its record: %w", id, err)
	}
	if a, ok := netip.AddrFromSlice(ip.To4()); ok {
		info.Addr = a
	}
	b.mu.Lock()
	if b.routes == nil {
		b.routes = map[string]*route{}
	}
	b.routes[id] = newRoute(ip, info)
	b.mu.Unlock()
	return info, nil
}

func newRoute(ip net.IP, info sandbox.Info) *route {
	return &route{ip: ip, token: info.AccessToken, owner: info.Owner, traffic: info.TrafficAccessToken,
		envd: Transport(ip, envdapi.Port), interp: Transport(ip, envdapi.InterpPort)}
}

// insert writes a new sandbox's record, within its team's quota over
// every replica's records: the store checks and writes in one transaction
// under the team's lock, so two replicas cannot both pass where one fits.
func (b *Backend) insert(ctx context.Context, info sandbox.Info) error {
	var q sandbox.Quota
	if b.Quota != nil {
		q = b.Quota(info.Owner)
	}
	err := b.Records.InsertSandbox(ctx, sandbox.ToRecord(info), store.SandboxLimits{MaxCount: q.Sandboxes, MaxCPUs: q.VCPUs, MaxMemoryMB: q.MemoryMB})
	var le *store.SandboxLimitError
	if !errors.As(err, &le) {
		return err
	}
	team := "this team"
	if q.Team != "" {
		team = "team " + q.Team
	}
	switch le.Limit {
	case "vcpus":
		return fmt.Errorf("%w: quota of vCPUs reached: %s's sandboxes use %d of its %d vCPUs, and this one needs %d",
			sandbox.ErrLimit, team, le.Used, le.Max, le.Asked)
	case "memory":
		return fmt.Errorf("%w: quota of memory reached: %s's sandboxes use %d of its %d MiB, and this one needs %d MiB",
			sandbox.ErrLimit, team, le.Used, le.Max, le.Asked)
	}
	return fmt.Errorf("%w: quota of concurrent sandboxes reached: %s has %d running or starting, its limit is %d; kill one first",
		sandbox.ErrLimit, team, le.Used, le.Max)
}

// executionID names a sandbox's one execution (a Pod is never resumed):
// derived from its record, so that every replica names it alike.
func executionID(info sandbox.Info) string {
	return uuid.NewSHA1(uuid.NameSpaceOID, []byte(info.ID+"/"+info.StartedAt.UTC().Format(time.RFC3339Nano))).String()
}

// event is info's lifecycle event of type typ.
func (b *Backend) event(info sandbox.Info, typ string, data lifecycle.EventData, buildID string) (lifecycle.Event, error) {
	data.SandboxMetadata = info.Metadata
	if data.SandboxMetadata == nil {
		data.SandboxMetadata = map[string]string{}
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return lifecycle.Event{}, err
	}
	return lifecycle.Event{
		Type: typ, EventData: raw, SandboxBuildID: buildID, SandboxExecutionID: executionID(info),
		SandboxID: info.ID, SandboxTeamID: info.Owner, SandboxTemplateID: info.TemplateID, Timestamp: b.now(),
	}, nil
}

// commit writes info's record with its event of type typ, in one
// transaction when there is an event log.
func (b *Backend) commit(ctx context.Context, info sandbox.Info, typ string, data lifecycle.EventData, buildID string) error {
	rec := sandbox.ToRecord(info)
	if b.Events == nil {
		return b.Records.Put(ctx, rec)
	}
	ev, err := b.event(info, typ, data, buildID)
	if err != nil {
		return err
	}
	_, err = b.Events.RecordWithSandbox(ctx, ev, rec)
	return err
}

// notFound is ErrNotFound for id, saying why it ended when this replica
// knows.
func (b *Backend) notFound(id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if why := b.ended[id]; why != "" {
		return fmt.Errorf("%w: %q (%s)", sandbox.ErrNotFound, id, why)
	}
	return fmt.Errorf("%w: %q", sandbox.ErrNotFound, id)
}

// record reads a live sandbox's record; one still being created is not
// found.
func (b *Backend) record(ctx context.Context, id string) (sandbox.Info, error) {
	r, err := b.Records.Get(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		return sandbox.Info{}, b.notFound(id)
	}
	if err != nil {
		return sandbox.Info{}, fmt.Errorf("sandbox %s: its record: %w", id, err)
	}
	info := sandbox.FromRecord(r)
	if info.State != sandbox.StateRunning {
		return sandbox.Info{}, b.notFound(id)
	}
	return info, nil
}

// Get returns a sandbox's info.
func (b *Backend) Get(ctx context.Context, id string) (sandbox.Info, error) {
	info, err := b.record(ctx, id)
	if err != nil {
		return sandbox.Info{}, err
	}
	if rt, err := b.route(id); err == nil {
		if a, ok := netip.AddrFromSlice(rt.ip.To4()); ok {
			info.Addr = a
		}
	}
	return info, nil
}

func matches(in sandbox.Info, f sandbox.ListFilter) bool {
	switch {
	case in.State != sandbox.StateRunning:
		return false
	case f.Owner != "" && in.Owner != f.Owner:
		return false
	case len(f.States) > 0 && !slices.Contains(f.States, in.State):
		return false
	case f.Template != "" && f.Template != in.TemplateID && f.Template != in.Alias:
		return false
	case !f.StartedAfter.IsZero() && !in.StartedAt.After(f.StartedAfter):
		return false
	}
	for k, v := range f.Metadata {
		if in.Metadata[k] != v {
			return false
		}
	}
	return true
}

// List returns the sandboxes f selects, in no order.
func (b *Backend) List(ctx context.Context, f sandbox.ListFilter) ([]sandbox.Info, error) {
	recs, err := b.Records.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing sandboxes: %w", err)
	}
	var out []sandbox.Info
	for _, r := range recs {
		if in := sandbox.FromRecord(r); matches(in, f) {
			out = append(out, in)
		}
	}
	return out, nil
}

// ListKeys returns the keys of the sandboxes f selects.
func (b *Backend) ListKeys(ctx context.Context, f sandbox.ListFilter) ([]sandbox.ListKey, error) {
	infos, err := b.List(ctx, f)
	if err != nil {
		return nil, err
	}
	keys := make([]sandbox.ListKey, 0, len(infos))
	for _, in := range infos {
		keys = append(keys, sandbox.ListKey{ID: in.ID, StartedAt: in.StartedAt, State: in.State})
	}
	return keys, nil
}

// Kill deletes a sandbox's Pod.
func (b *Backend) Kill(ctx context.Context, id string) error {
	info, err := b.record(ctx, id)
	if err != nil {
		return err
	}
	return b.end(ctx, info, lifecycle.KillRequest, "", "it was killed")
}

// end ends a sandbox: its killed event (reason, detail), its record, then
// its Pod. The record goes first, so that the Pod's deletion is Airlock's
// to every replica's reconciler (a Pod gone whose record is gone too).
func (b *Backend) end(ctx context.Context, info sandbox.Info, reason, detail, why string) error {
	b.forget(info.ID, why)
	if b.Events != nil {
		ex := &lifecycle.Execution{
			StartedAt: info.StartedAt.UTC().Format(time.RFC3339), VCPUCount: info.CPUCount, MemoryMB: info.MemoryMB,
			ExecutionTime: max(b.now().Sub(info.StartedAt).Milliseconds(), 0),
		}
		ev, err := b.event(info, lifecycle.Killed, lifecycle.EventData{Execution: ex, KillReason: reason, KillDetail: detail}, "")
		if err == nil {
			_, err = b.Events.Record(ctx, ev)
		}
		if err != nil {
			b.log().Error("recording a killed event", "sandbox", info.ID, "err", err)
		}
	}
	if err := b.Records.Delete(ctx, info.ID); err != nil {
		return fmt.Errorf("sandbox %s: deleting its record: %w", info.ID, err)
	}
	return b.Pods.Delete(ctx, info.ID)
}

// SetTimeout makes the sandbox end d from now.
func (b *Backend) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	info, err := b.record(ctx, id)
	if err != nil {
		return err
	}
	info.EndAt = b.now().Add(d)
	return b.commit(ctx, info, lifecycle.Updated, lifecycle.EventData{SetTimeout: info.EndAt.UTC().Format(time.RFC3339)}, "")
}

// Connect returns a running sandbox and makes it end no sooner than
// timeout from now (nothing here is ever paused).
func (b *Backend) Connect(ctx context.Context, id string, timeout time.Duration) (sandbox.Info, bool, error) {
	info, err := b.record(ctx, id)
	if err != nil {
		return sandbox.Info{}, false, err
	}
	if end := b.now().Add(timeout); end.After(info.EndAt) {
		info.EndAt = end
		if err := b.commit(ctx, info, lifecycle.Updated, lifecycle.EventData{SetTimeout: end.UTC().Format(time.RFC3339)}, ""); err != nil {
			return sandbox.Info{}, false, err
		}
	}
	return info, false, nil
}

// The operations a Pod cannot do here yet.

func (b *Backend) Pause(context.Context, string, sandbox.PauseOptions) error {
	return errNotSupported("pause")
}
func (b *Backend) Fork(context.Context, string, sandbox.ForkRequest) ([]sandbox.ForkResult, error) {
	return nil, errNotSupported("fork")
}
func (b *Backend) CreateSnapshot(context.Context, string, sandbox.SnapshotRequest) (sandbox.Snapshot, error) {
	return sandbox.Snapshot{}, errNotSupported("snapshots")
}
func (b *Backend) ListSnapshots(context.Context, sandbox.SnapshotFilter) ([]sandbox.Snapshot, error) {
	return nil, nil // none can exist
}
func (b *Backend) DeleteSnapshot(_ context.Context, ref, _ string) error {
	return fmt.Errorf("%w: snapshot %q", sandbox.ErrNotFound, ref)
}

// UpdateNetwork replaces a sandbox's egress policy: the Pod's annotation,
// which its node agent applies (established connections go on, new ones
// follow the new policy, as on one box), then the record and the updated
// event.
func (b *Backend) UpdateNetwork(ctx context.Context, id string, u sandbox.NetworkUpdate) error {
	if !b.NodeAgent {
		return errNotSupported("the network policy (this replica runs with --pod-network none: no node agent enforces one)")
	}
	info, err := b.record(ctx, id)
	if err != nil {
		return err
	}
	u.ApplyTo(&info)
	policy, err := podPolicy(info)
	if err != nil {
		return err
	}
	if err := b.Pods.setNetwork(ctx, id, policy); err != nil {
		return err
	}
	if err := b.Pods.waitNetwork(ctx, id, NetworkDigest(policy)); err != nil {
		return err
	}
	return b.commit(ctx, info, lifecycle.Updated, lifecycle.EventData{NetworkEgress: sandbox.EgressOf(info)}, "")
}
func (b *Backend) Logs(context.Context, string, sandbox.LogQuery) ([]sandbox.LogEntry, error) {
	return nil, errNotSupported("the sandbox log")
}

// What the proxy asks (proxy.Sandboxes).

// route is how to reach a sandbox: this replica's cache, else its record
// and its Pod's IP.
func (b *Backend) route(id string) (*route, error) {
	b.mu.Lock()
	rt, ok := b.routes[id]
	b.mu.Unlock()
	if ok {
		return rt, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	info, err := b.record(ctx, id)
	if err != nil {
		return nil, err
	}
	ip, err := b.Pods.IP(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("%w: %q: %w", sandbox.ErrNotFound, id, err)
	}
	rt = newRoute(ip, info)
	b.mu.Lock()
	if b.routes == nil {
		b.routes = map[string]*route{}
	}
	if cur, ok := b.routes[id]; ok {
		rt = cur
	} else {
		b.routes[id] = rt
	}
	b.mu.Unlock()
	return rt, nil
}

// EnvdTransport reaches a sandbox's envd.
func (b *Backend) EnvdTransport(id string) (http.RoundTripper, error) {
	rt, err := b.route(id)
	if err != nil {
		return nil, err
	}
	return rt.envd, nil
}

// InterpTransport reaches a sandbox's code interpreter.
func (b *Backend) InterpTransport(id string) (http.RoundTripper, error) {
	rt, err := b.route(id)
	if err != nil {
		return nil, err
	}
	return rt.interp, nil
}

// UserPortTarget is the Pod's IP: the proxy dials its user ports there.
func (b *Backend) UserPortTarget(id string) (netip.Addr, string, string, error) {
	rt, err := b.route(id)
	if err != nil {
		return netip.Addr{}, "", "", err
	}
	a, _ := netip.AddrFromSlice(rt.ip.To4())
	return a, rt.traffic, "", nil
}

// Access returns a sandbox's access token and owner.
func (b *Backend) Access(id string) (string, string, error) {
	rt, err := b.route(id)
	if err != nil {
		return "", "", err
	}
	return rt.token, rt.owner, nil
}

// MatchToken returns the sandboxes whose token (with their owner) accept
// takes, among every replica's.
func (b *Backend) MatchToken(accept func(token, owner string) bool) []string {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	recs, err := b.Records.List(ctx)
	if err != nil {
		b.log().Error("listing sandboxes for a signed URL", "err", err)
		return nil
	}
	var ids []string
	for _, r := range recs {
		if r.State == string(sandbox.StateRunning) && r.AccessToken != "" && accept(r.AccessToken, r.Owner) {
			ids = append(ids, r.ID)
		}
	}
	return ids
}
