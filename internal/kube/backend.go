package kube

import (
	"context"
	"crypto/rand"
	"encoding/hex"
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

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// Template is what the backend needs of a template: the image its Pods
// run (by a reference the nodes can pull) and its defaults.
type Template struct {
	ID, Alias      string
	Image          string
	CPUs, MemoryMB int
	DiskSizeMB     int
	DefaultUser    string
	DefaultWorkdir string
	EnvVars        map[string]string
}

// Backend is the E2B API's sandbox manager when sandboxes are Pods: it
// implements the E2B handler's Manager and the proxy's Sandboxes. Create,
// get, list, timeouts, kill and connect work as on one box; pause, fork,
// snapshots, network updates, metrics and logs answer
// sandbox.ErrNotSupported naming the backend.
//
// It keeps the sandboxes it made in memory: one replica, and a restart
// forgets them (their Pods are left to a later adoption). A Pod that ends
// behind its back (Watch) is forgotten too, with its reason logged and
// kept for Get's answer.
type Backend struct {
	Pods      *Pods
	Templates func(ctx context.Context, name string) (Template, error)
	Log       *slog.Logger
	// Now is the clock (tests); nil is time.Now.
	Now func() time.Time

	mu   sync.Mutex
	live map[string]*podSandbox
	// ended holds why sandboxes that ended other than by Kill did, for
	// Get's message, a while.
	ended map[string]string
}

type podSandbox struct {
	info   sandbox.Info
	ip     net.IP
	envd   http.RoundTripper
	interp http.RoundTripper
	timer  *time.Timer
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
// the backend's back is no longer served as running.
func (b *Backend) Start(ctx context.Context) error {
	return b.Pods.Watch(ctx, func(g Gone) {
		b.mu.Lock()
		s, ok := b.live[g.ID]
		if ok {
			delete(b.live, g.ID)
			if s.timer != nil {
				s.timer.Stop()
			}
			b.rememberEnd(g.ID, g.Reason)
		}
		b.mu.Unlock()
		if ok {
			b.log().Warn("sandbox ended outside Airlock", "sandbox", g.ID, "reason", g.Reason)
		}
	})
}

// rememberEnd keeps why a sandbox ended; b.mu is held.
func (b *Backend) rememberEnd(id, reason string) {
	if b.ended == nil {
		b.ended = map[string]string{}
	}
	if len(b.ended) > 10000 { // a bound, not a history: Get's message only
		clear(b.ended)
	}
	b.ended[id] = reason
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
func (b *Backend) Create(ctx context.Context, req sandbox.CreateRequest) (sandbox.Info, error) {
	switch {
	case len(req.VolumeMounts) > 0:
		return sandbox.Info{}, errNotSupported("mounting volumes")
	case req.Network != nil:
		return sandbox.Info{}, errNotSupported("the network policy")
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
	info := sandbox.Info{
		ID: id, TemplateID: t.ID, Alias: t.Alias, Owner: req.Owner,
		Metadata: maps.Clone(req.Metadata), EnvVars: maps.Clone(req.EnvVars),
		CPUCount: t.CPUs, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
		EnvdVersion: envdapi.Version, AllowInternetAccess: req.AllowInternetAccess,
		Lifecycle: req.Lifecycle,
	}
	if req.Secure {
		info.AccessToken = newToken()
	}
	sb, err := b.Pods.Create(ctx, Spec{
		ID: id, Team: req.Owner, Template: t.ID, Image: t.Image, CPUs: t.CPUs, MemoryMB: t.MemoryMB,
		Envd: envdapi.Config{SandboxID: id, TemplateID: t.ID, AccessToken: info.AccessToken, EnvVars: env,
			DefaultUser: t.DefaultUser, DefaultWorkdir: t.DefaultWorkdir},
	})
	if err != nil {
		return sandbox.Info{}, err
	}
	now := b.now()
	info.StartedAt, info.EndAt, info.State = now, now.Add(req.Timeout), sandbox.StateRunning
	if a, ok := netip.AddrFromSlice(sb.IP.To4()); ok {
		info.Addr = a
	}
	s := &podSandbox{info: info, ip: sb.IP, envd: Transport(sb.IP, envdapi.Port), interp: Transport(sb.IP, envdapi.InterpPort)}
	b.mu.Lock()
	if b.live == nil {
		b.live = map[string]*podSandbox{}
	}
	b.live[id] = s
	b.armLocked(s)
	b.mu.Unlock()
	return info, nil
}

// armLocked (re)schedules the kill at the sandbox's EndAt; b.mu is held.
func (b *Backend) armLocked(s *podSandbox) {
	if s.timer != nil {
		s.timer.Stop()
	}
	id := s.info.ID
	s.timer = time.AfterFunc(s.info.EndAt.Sub(b.now()), func() {
		if err := b.kill(context.Background(), id, "its timeout was reached"); err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			b.log().Error("killing a sandbox at its timeout", "sandbox", id, "err", err)
		}
	})
}

func (b *Backend) notFound(id string) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.notFoundLocked(id)
}

// notFoundLocked is ErrNotFound for id, saying why it ended when that is
// known; b.mu is held.
func (b *Backend) notFoundLocked(id string) error {
	if why := b.ended[id]; why != "" {
		return fmt.Errorf("%w: %q (%s)", sandbox.ErrNotFound, id, why)
	}
	return fmt.Errorf("%w: %q", sandbox.ErrNotFound, id)
}

func (b *Backend) get(id string) (*podSandbox, error) {
	b.mu.Lock()
	s, ok := b.live[id]
	b.mu.Unlock()
	if !ok {
		return nil, b.notFound(id)
	}
	return s, nil
}

// Get returns a sandbox's info.
func (b *Backend) Get(_ context.Context, id string) (sandbox.Info, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.live[id]
	if !ok {
		return sandbox.Info{}, b.notFoundLocked(id)
	}
	return s.info, nil
}

func matches(in sandbox.Info, f sandbox.ListFilter) bool {
	switch {
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
func (b *Backend) List(_ context.Context, f sandbox.ListFilter) ([]sandbox.Info, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []sandbox.Info
	for _, s := range b.live {
		if matches(s.info, f) {
			out = append(out, s.info)
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
	return b.kill(ctx, id, "it was killed")
}

func (b *Backend) kill(ctx context.Context, id, why string) error {
	b.mu.Lock()
	s, ok := b.live[id]
	if ok {
		delete(b.live, id)
		if s.timer != nil {
			s.timer.Stop()
		}
		b.rememberEnd(id, why)
	}
	b.mu.Unlock()
	if !ok {
		return b.notFound(id)
	}
	return b.Pods.Delete(ctx, id)
}

// SetTimeout makes the sandbox end d from now.
func (b *Backend) SetTimeout(_ context.Context, id string, d time.Duration) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.live[id]
	if !ok {
		return b.notFoundLocked(id)
	}
	s.info.EndAt = b.now().Add(d)
	b.armLocked(s)
	return nil
}

// Connect returns a running sandbox and makes it end no sooner than
// timeout from now (nothing here is ever paused).
func (b *Backend) Connect(_ context.Context, id string, timeout time.Duration) (sandbox.Info, bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	s, ok := b.live[id]
	if !ok {
		return sandbox.Info{}, false, b.notFoundLocked(id)
	}
	if end := b.now().Add(timeout); end.After(s.info.EndAt) {
		s.info.EndAt = end
		b.armLocked(s)
	}
	return s.info, false, nil
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
func (b *Backend) UpdateNetwork(context.Context, string, sandbox.NetworkUpdate) error {
	return errNotSupported("the network policy")
}
func (b *Backend) Metrics(context.Context, string, time.Time, time.Time) ([]sandbox.Metric, error) {
	return nil, errNotSupported("metrics")
}
func (b *Backend) Logs(context.Context, string, sandbox.LogQuery) ([]sandbox.LogEntry, error) {
	return nil, errNotSupported("the sandbox log")
}

// What the proxy asks (proxy.Sandboxes).

// EnvdTransport reaches a sandbox's envd.
func (b *Backend) EnvdTransport(id string) (http.RoundTripper, error) {
	s, err := b.get(id)
	if err != nil {
		return nil, err
	}
	return s.envd, nil
}

// InterpTransport reaches a sandbox's code interpreter.
func (b *Backend) InterpTransport(id string) (http.RoundTripper, error) {
	s, err := b.get(id)
	if err != nil {
		return nil, err
	}
	return s.interp, nil
}

// UserPortTarget is the Pod's IP: the proxy dials its user ports there.
func (b *Backend) UserPortTarget(id string) (netip.Addr, string, string, error) {
	s, err := b.get(id)
	if err != nil {
		return netip.Addr{}, "", "", err
	}
	return s.info.Addr, s.info.TrafficAccessToken, "", nil
}

// Access returns a sandbox's access token and owner.
func (b *Backend) Access(id string) (string, string, error) {
	s, err := b.get(id)
	if err != nil {
		return "", "", err
	}
	return s.info.AccessToken, s.info.Owner, nil
}

// MatchToken returns the sandboxes whose token (with their owner) accept
// takes.
func (b *Backend) MatchToken(accept func(token, owner string) bool) []string {
	b.mu.Lock()
	type cand struct{ id, token, owner string }
	var cands []cand
	for id, s := range b.live {
		if s.info.AccessToken != "" {
			cands = append(cands, cand{id, s.info.AccessToken, s.info.Owner})
		}
	}
	b.mu.Unlock()
	var ids []string
	for _, c := range cands {
		if accept(c.token, c.owner) {
			ids = append(ids, c.id)
		}
	}
	return ids
}
