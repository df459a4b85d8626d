// Package sandbox owns the life of every sandbox: the state machine, timeouts,
// metrics sampling and re-adoption after a restart. It is the only writer of
// sandbox state; the API layers call it and never touch the runtime directly.
//
// A sandbox goes create -> running <-> paused -> killed:
//
// Create: resolve the template, persist a "creating" record, start the runtime
// sandbox with envd as its first process, wait until envd answers on its socket,
// run the template's start phase, persist "running", publish the sandbox (the
// live map) and arm its end-of-life timer. Until it is published no one else can
// reach it. Every step that acquires something (record, dir and disk quota,
// network, log, runtime sandbox) pushes the closer that releases it onto the
// sandbox's cleanup stack (cleanup.go); a failed create replays that stack.
//
// Pause freezes the sandbox (traffic gets "not found", the timer stops);
// Connect thaws a paused one and extends the end of life of either.
//
// Kill (by a client, or the timer at the end of life): mark the sandbox gone
// and forget it (so no new traffic reaches it and no other operation acts on
// it), then replay its cleanup stack, newest first: runtime (its Destroy: every
// process and the namespaces they held, the cgroup, the mounts, the sandbox's
// runtime files), log, network, dir and disk quota, record (a
// sandbox claimed from the warm pool got its record last, so loses it first).
// Teardown runs even if the request that asked for it goes away. Recover
// replays the same stack for a sandbox that did not survive a restart.
//
// Locks, always taken in this order, each optional:
//
//   - entry.op, one per sandbox, serializes its lifecycle operations (Kill,
//     Pause, Connect, SetTimeout, UpdateNetwork, the timer's expiry, and a
//     metrics sample, whose Stats must not run beside Destroy) and is held
//     across their runtime, network and store calls. Manager.with looks a
//     sandbox up and runs an operation under it; an entry whose Kill has begun
//     is gone, so nothing acts on (or writes back the record of) a killed
//     sandbox.
//   - Manager.mu guards the live map, the warm pool and the per-owner counts,
//     and is held only to read or change them: never across a call to the
//     runtime, the network or the store, so a slow sandbox holds up no other.
//   - entry.mu guards what readers see of a sandbox (its Info, timer and
//     metrics) and is held only to copy or change them; the proxy's look-ups
//     take it, never entry.op.
//
// Manager.New only builds a manager; Recover re-adopts what a previous server
// left, then Start starts the background work (end-of-life timers of re-adopted
// sandboxes, metrics sampling, warm pool refills, the retention sweep of paused
// sandboxes); Close stops it.
package sandbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/airlock-sandbox/airlock/internal/crashpoint"
	"github.com/airlock-sandbox/airlock/internal/diskquota"
	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/timing"
)

// Template is what the manager needs to know of a built template.
type Template struct {
	ID             string
	Alias          string
	Rootfs         string
	CPUCount       int
	MemoryMB       int
	DiskSizeMB     int
	DefaultUser    string
	DefaultWorkdir string
	// Runtime names the backend its sandboxes run on ("linux", "gvisor");
	// empty means the server's default, Options.Runtime.
	Runtime string
	// Env holds KEY=VALUE pairs from the template's ENV instructions. Every
	// process in the sandbox sees them; the create request's envVars
	// override them (Info.EnvVars stays what the client sent).
	Env []string
	// StartCmd runs at create, in the background, for the sandbox's whole
	// life (tagged StartCmdTag in the process list); empty means none.
	StartCmd string
	// ReadyCmd is run until it exits 0; create returns only then. Empty
	// means ready as soon as StartCmd runs.
	ReadyCmd string
	// ReadyTimeout is the deadline for ready, counted from when envd
	// answers; 0 means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// Kernels are the code-interpreter languages whose default contexts
	// envd starts at boot (["python","javascript"] for code-interpreter-v1);
	// the others start on first use.
	Kernels []string
	// BuildID names the template's build (lifecycle events' sandboxBuildId).
	BuildID string `json:",omitempty"`
}

// TemplateResolver resolves a template id or alias to a built template. It
// returns an error wrapping ErrTemplateNotFound for a name it does not know.
type TemplateResolver interface {
	Resolve(ctx context.Context, name string) (Template, error)
}

// Options configure a Manager.
type Options struct {
	// Runtime is the default backend; Runtimes are the others a template may
	// name (by Runtime.Name()). Recover looks for sandboxes in all of them.
	Runtime   runtime.Runtime
	Runtimes  []runtime.Runtime
	Store     store.Store
	Templates TemplateResolver
	// DataDir holds one directory per sandbox under DataDir/sandboxes.
	DataDir string
	// EnvdPath is the host path of the static envd binary, bound read-only into
	// every sandbox.
	EnvdPath string
	// MaxTimeout caps create and setTimeout durations.
	MaxTimeout time.Duration
	// MetricsInterval is how often resource use is sampled (default 5 s).
	MetricsInterval time.Duration
	// PidsMax limits processes per sandbox (default 4096).
	PidsMax int64
	// Quota, when set, gives each owner's (team's) quota (quota.go); a
	// zero Sandboxes in it falls back to MaxPerOwner.
	Quota func(owner string) Quota
	// MaxPerOwner caps the sandboxes one owner (API key) may have alive at
	// once, counting creations in flight; 0 means no cap.
	MaxPerOwner int
	// Disk, when set, holds every sandbox directory (DataDir/sandboxes is its
	// mount point) and enforces each sandbox's diskSizeMB (see limits.go).
	Disk *diskquota.Pool
	// MaxDiskSizeMB bounds a create request's diskSizeMB (default 64 GiB).
	MaxDiskSizeMB int
	// Network gives every sandbox its own netns, veth, firewall policy and
	// DNS; nil keeps the runtime's private, loopback-only namespace.
	Network *netpolicy.Network
	// EgressTrust, with Network, gives each sandbox a trust store that
	// includes the egress CA (bound over egress.SystemBundle), so that TLS
	// the egress terminates for rule hosts verifies inside; nil binds none.
	EgressTrust TrustStore
	// Secrets checks that the secrets network rules name exist; nil
	// refuses rules that name any.
	Secrets SecretChecker
	// PausedRetention is how long a paused sandbox is kept before it is
	// deleted with its disk (retention.go); 0 keeps them forever.
	PausedRetention time.Duration
	// LogRetention is how long a killed sandbox's log stays readable
	// (sblogs.go; default DefaultLogRetention).
	LogRetention time.Duration
	// Events records a lifecycle event at every transition (events.go);
	// nil records none.
	Events EventLog
	// Volumes finds the volumes sandboxes mount (volumes.go); nil refuses
	// creates that name any.
	Volumes Volumes
	Logger  *slog.Logger
	// Observe, when set, hears the end of every create, kill, pause,
	// resume, fork and snapshot, whatever asked for it (the API, the MCP
	// server, a timeout): the operation, how long it took and its error (nil
	// when it succeeded). The server's metrics count them.
	Observe func(op Op, took time.Duration, err error)
}

// Op names a sandbox operation for Options.Observe.
type Op string

const (
	OpCreate   Op = "create"
	OpKill     Op = "kill"
	OpPause    Op = "pause"
	OpResume   Op = "resume"
	OpFork     Op = "fork"
	OpSnapshot Op = "snapshot"
)

// observe reports op, begun at start, to Options.Observe (deferred with the
// operation's named error).
func (m *Manager) observe(op Op, start time.Time, err *error) {
	if m.opts.Observe != nil {
		m.opts.Observe(op, time.Since(start), *err)
	}
}

// metricsKept bounds the retained samples per sandbox (an hour at 5 s).
const metricsKept = 720

// Manager owns all sandboxes of one server.
type Manager struct {
	opts Options
	log  *slog.Logger

	// mu is held only for access to the fields below it (see the package
	// doc for the lock order).
	mu        sync.Mutex
	sandboxes map[string]*entry
	// pool holds warm, unclaimed sandboxes per template id (see pool.go).
	pool       map[string][]*entry
	poolTarget map[string]poolWant
	poolKick   chan struct{}
	lastClaim  time.Time
	started    bool
	closed     bool
	// snapMu keeps a snapshot's files from going while a sandbox starts
	// from them: creates from a snapshot hold it shared, changes to the
	// snapshots (snapshots.go) exclusively.
	snapMu sync.RWMutex
	// creating counts creations in flight per owner, so that concurrent
	// requests cannot all pass the MaxPerOwner check before any finishes.
	creating map[string]pending
	// envd is the current envd binary's stored copy (envdstore.go).
	envd envdStore
	// lastLogSweep is when a kill last swept old logs (unix ns; sblogs.go).
	lastLogSweep atomic.Int64
	// sockets wakes a create when its envd's socket appears (envdwait.go).
	sockets socketWatch

	stop chan struct{}
	// life ends at Close; background work that may wait long (a pooled
	// sandbox's start phase) runs under it.
	life    context.Context
	endLife context.CancelFunc
	// wg tracks background work and teardowns in flight; Close waits for it.
	wg sync.WaitGroup
	// netWG tracks network teardowns, which run after the runtime's Destroy
	// and off the request path; Close and KillAll wait for them.
	netWG sync.WaitGroup
}

// entry is a sandbox: live (in Manager.sandboxes), pooled, or being created
// or torn down by whoever holds it alone.
type entry struct {
	// Set before the entry is published, then only read.
	id  string
	rt  runtime.Sandbox
	dir string
	// started is what the sandbox was started from (a digest of its
	// template); a pooled sandbox whose template changed since is not
	// claimed.
	started   startedFrom
	transport *http.Transport
	// interp reaches the code interpreter (port 49999) over its socket.
	interp *http.Transport
	// conns are the open connections of transport and interp (persist.go).
	conns *connTracker
	// net is the sandbox's network (nil without Options.Network).
	net *netpolicy.Sandbox

	// op serializes the sandbox's lifecycle operations and guards gone and
	// undo; it is held across runtime, network and store calls.
	op sync.Mutex
	// gone is set when Kill begins: no operation acts on the entry after.
	gone bool
	// undo is the cleanup stack (cleanup.go).
	undo undo

	// mu guards the fields below; it is a leaf, held for memory access only.
	mu      sync.Mutex
	info    Info
	timer   *time.Timer
	metrics []Metric
	lastCPU time.Duration
	lastAt  time.Time
	// seenOOM is the OOM-kill count already recorded as events.
	seenOOM int64
	// exec is the sandbox's current or last execution (events.go).
	exec execution
}

// newEntry returns an unpublished entry for info, which its creator owns
// alone until it publishes it.
func (m *Manager) newEntry(info Info) *entry {
	dir := m.sandboxDir(info.ID)
	conns := &connTracker{}
	return &entry{
		id: info.ID, info: info, dir: dir, conns: conns,
		transport: envdTransport(filepath.Join(dir, envdapi.HostRunDir, envdapi.SocketName), conns),
		interp:    envdTransport(filepath.Join(dir, envdapi.HostRunDir, envdapi.InterpSocketName), conns),
	}
}

// New returns a manager. It starts nothing: call Recover, then Start before
// serving, and Close at shutdown.
func New(opts Options) *Manager {
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MaxTimeout <= 0 {
		opts.MaxTimeout = 24 * time.Hour
	}
	if opts.MetricsInterval <= 0 {
		opts.MetricsInterval = 5 * time.Second
	}
	if opts.PidsMax <= 0 {
		opts.PidsMax = 4096
	}
	m := &Manager{
		opts:       opts,
		log:        opts.Logger,
		sandboxes:  map[string]*entry{},
		pool:       map[string][]*entry{},
		poolTarget: map[string]poolWant{},
		poolKick:   make(chan struct{}, 1),
		stop:       make(chan struct{}),
		creating:   map[string]pending{},
	}
	m.life, m.endLife = context.WithCancel(context.Background())
	return m
}

// Start starts the background work: the end-of-life timers of the sandboxes
// Recover re-adopted, metrics sampling and the warm pool's refills (a
// SetWarmPool made before Start takes effect now). Call it once, after
// Recover; later calls, and calls after Close, do nothing.
func (m *Manager) Start() {
	m.mu.Lock()
	if m.started || m.closed {
		m.mu.Unlock()
		return
	}
	m.started = true
	// Under mu, so that Close (which sets closed under mu, then waits)
	// either sees these or is seen above.
	m.wg.Add(3)
	live := m.liveLocked()
	m.mu.Unlock()
	for _, e := range live {
		e.mu.Lock()
		if e.info.State == StateRunning && e.timer == nil {
			m.armTimerLocked(e)
		}
		e.mu.Unlock()
	}
	go m.sampleLoop()
	go m.poolLoop()
	go m.retentionLoop()
}

// liveLocked returns the live entries; m.mu is held.
func (m *Manager) liveLocked() []*entry {
	out := make([]*entry, 0, len(m.sandboxes))
	for _, e := range m.sandboxes {
		out = append(out, e)
	}
	return out
}

func (m *Manager) sandboxDir(id string) string {
	return layout.DataDir{Root: m.opts.DataDir}.Sandbox(id)
}

// Create starts a sandbox and returns when its envd answers.
func (m *Manager) Create(ctx context.Context, req CreateRequest) (_ Info, err error) {
	defer m.observe(OpCreate, time.Now(), &err)
	if err := m.checkTimeout(req.Timeout, false); err != nil {
		return Info{}, err
	}
	if info, ok, err := m.createFromSnapshot(ctx, req); ok {
		return info, err
	}
	if req.SnapshotOnly {
		return Info{}, fmt.Errorf("template %q: %w", req.Template, ErrTemplateNotFound)
	}
	stop := timing.Start(ctx, "resolve")
	tpl, err := m.opts.Templates.Resolve(ctx, req.Template)
	stop()
	if err != nil {
		return Info{}, err
	}
	diskMB, err := m.diskSize(req, tpl)
	if err != nil {
		return Info{}, err
	}
	release, err := m.reserve(req.Owner, tpl.CPUCount, tpl.MemoryMB, false)
	if err != nil {
		return Info{}, err
	}
	defer release()
	now := time.Now()
	info := Info{
		ID:                  newID(),
		TemplateID:          tpl.ID,
		Alias:               tpl.Alias,
		ClientID:            "airlock",
		Metadata:            copyMap(req.Metadata),
		EnvVars:             copyMap(req.EnvVars),
		StartedAt:           now,
		EndAt:               now.Add(req.Timeout),
		State:               StateCreating,
		CPUCount:            tpl.CPUCount,
		MemoryMB:            tpl.MemoryMB,
		DiskSizeMB:          diskMB,
		EnvdVersion:         envdapi.Version,
		AllowInternetAccess: req.AllowInternetAccess,
		Owner:               req.Owner,
		Lifecycle:           req.Lifecycle,
	}
	if err := checkLifecycle(info.Lifecycle); err != nil {
		return Info{}, err
	}
	if req.Secure {
		info.AccessToken = newToken()
	}
	if req.Network != nil {
		info.Network = CopyNetwork(*req.Network)
	}
	if ap := info.Network.AllowPublicTraffic; ap != nil && !*ap {
		info.TrafficAccessToken = newToken()
	}
	if err := PolicyOf(info).Validate(); err != nil {
		return Info{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	stop = timing.Start(ctx, "egress_check")
	err = m.checkEgress(ctx, PolicyOf(info))
	stop()
	if err != nil {
		return Info{}, err
	}
	if _, err := templateEnv(tpl, info.EnvVars); err != nil {
		return Info{}, err
	}
	mounts, releaseVolumes, err := m.leaseVolumes(ctx, req.Owner, req.VolumeMounts)
	if err != nil {
		return Info{}, err
	}
	defer releaseVolumes()
	info.VolumeMounts = mounts
	var e *entry
	if len(mounts) == 0 {
		// A warm sandbox runs already, without any volume.
		stop = timing.Start(ctx, "claim")
		e = m.claim(ctx, info, tpl)
		stop()
	}
	claimed := e != nil
	if claimed {
		// Already serving: its one record write is the commit below.
		m.pushRecord(e)
	} else {
		e = m.newEntry(info)
		err = m.createCold(ctx, e, tpl)
	}
	if err == nil && claimed {
		// A pooled sandbox's boot record was written for the pool; this one
		// is the client's (its timeout and lifecycle), with the envd it
		// booted. A cold one's was written with the client's already.
		stop = timing.Start(ctx, "boot_record")
		var rec bootRecord
		if rec, err = readBootRecord(e.dir); err == nil {
			rec.Template, rec.Timeout, rec.Lifecycle = tpl, req.Timeout, req.Lifecycle
			err = writeBootRecord(e.dir, rec)
		}
		stop()
	}
	if err == nil {
		// The commit: the record says running, with the created event.
		// Before publishing: nothing else can act on the sandbox yet, so no
		// event of it comes before this one.
		stop = timing.Start(ctx, "commit")
		m.beginExecution(e, tpl.BuildID)
		e.info.State = StateRunning
		err = m.commit(context.WithoutCancel(ctx), e, ToRecord(e.info), lifecycle.Created, lifecycle.EventData{})
		stop()
	}
	if err != nil {
		_ = m.destroy(context.WithoutCancel(ctx), e)
		return Info{}, err
	}
	return m.publish(e), nil
}

// publish makes e, running and until now its creator's alone, a live
// sandbox with its timer armed, and returns its info.
func (m *Manager) publish(e *entry) Info {
	// Published under op, so that its timer, if it fires at once, finds it
	// in the map.
	e.op.Lock()
	m.mu.Lock()
	m.sandboxes[e.id] = e
	m.mu.Unlock()
	e.mu.Lock()
	m.armTimerLocked(e)
	out := e.info
	e.mu.Unlock()
	e.op.Unlock()
	// A first sample right away, off the request path, so metrics exist before
	// the first tick.
	go m.sample(e)
	return out
}

// createCold makes e, not yet published, a running sandbox of tpl whose
// record still says creating (the caller commits it); on error the caller
// replays e's cleanup stack.
func (m *Manager) createCold(ctx context.Context, e *entry, tpl Template) error {
	// The record exists before the runtime sandbox does, so a crash between
	// the two leaves something Recover can find and clean.
	stop := timing.Start(ctx, "record")
	err := m.opts.Store.Put(ctx, ToRecord(e.info))
	stop()
	if err != nil {
		return err
	}
	m.pushRecord(e)
	if err := m.start(context.WithoutCancel(ctx), e, tpl, false); err != nil {
		return err
	}
	// The start phase may take seconds and runs the template's code, so
	// unlike the steps above it stops when the request goes away.
	defer timing.Start(ctx, "start_cmd")()
	return m.startPhase(ctx, e, tpl)
}

// SetMaxPerOwner changes Options.MaxPerOwner; sandboxes already alive are
// left alone even when they exceed the new cap.
func (m *Manager) SetMaxPerOwner(n int) {
	m.mu.Lock()
	m.opts.MaxPerOwner = n
	m.mu.Unlock()
}

// start creates the runtime sandbox of e, not yet published, and waits for
// envd; each thing it acquires goes onto e's cleanup stack, which the caller
// replays on error. A pooled sandbox's envd waits for its access token and env
// vars (POST /init) before serving.
func (m *Manager) start(ctx context.Context, e *entry, tpl Template, pooled bool) error {
	return m.boot(ctx, e, tpl, bootMode{pooled: pooled})
}

// bootMode says how boot starts a sandbox.
type bootMode struct {
	// pooled: for the warm pool (envd waits for /init).
	pooled bool
	// existingDir: the sandbox dir already holds its writable layer (a
	// resume, a fork, a sandbox from a snapshot); its closers are on e's
	// stack already, or the caller pushes them.
	existingDir bool
	// image, when set, is a checkpoint to restore instead of starting
	// envd afresh.
	image string
	// envd is the digest of the envd binary image was taken with (the boot
	// record's Envd; envdstore.go); empty for an image from before those
	// were recorded.
	envd string
}

// boot is start, for every way a sandbox comes up: created afresh, from a
// writable layer kept by a pause (a cold boot), or restored from a checkpoint.
func (m *Manager) boot(ctx context.Context, e *entry, tpl Template, mode bootMode) error {
	pooled := mode.pooled
	info := e.info
	dir := e.dir
	runDir := filepath.Join(dir, envdapi.HostRunDir)
	// A pooled sandbox has no client env yet: it gets the template's alone,
	// and the rest with POST /init at claim.
	env, err := templateEnv(tpl, info.EnvVars)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", info.ID, err)
	}
	trust := ""
	if m.opts.Network != nil && m.opts.EgressTrust != nil {
		if trust, err = m.opts.EgressTrust.Bundle(tpl.Rootfs); err != nil {
			return fmt.Errorf("sandbox %s: %w", info.ID, err)
		}
		if trust != "" {
			env = trustEnv(env)
		}
	}
	envd, err := m.envdForBoot(mode)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", info.ID, err)
	}
	if !mode.existingDir {
		m.pushDir(e)
		stop := timing.Start(ctx, "disk")
		err := m.makeSandboxDir(dir, startDiskMB(info, tpl))
		stop()
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", info.ID, err)
		}
		stop = timing.Start(ctx, "boot_record")
		err = writeBootRecord(dir, bootRecord{Template: tpl, Timeout: info.EndAt.Sub(info.StartedAt), Lifecycle: info.Lifecycle, Envd: envd})
		stop()
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", info.ID, err)
		}
	}
	// Sockets left by an earlier boot of this writable layer: envd (or a
	// restore) binds them anew.
	for _, name := range []string{envdapi.SocketName, envdapi.InterpSocketName} {
		_ = os.Remove(filepath.Join(runDir, name))
	}
	cfg := envdapi.Config{
		SandboxID:      info.ID,
		TemplateID:     info.TemplateID,
		AccessToken:    info.AccessToken,
		EnvVars:        env,
		DefaultUser:    tpl.DefaultUser,
		DefaultWorkdir: tpl.DefaultWorkdir,
		Listen:         []string{"unix:" + envdapi.Socket, fmt.Sprintf("tcp:127.0.0.1:%d", envdapi.Port)},
		DiskPath:       "/",
		LogPath:        envdapi.RunDir + "/" + envdapi.LogName,
		AwaitInit:      pooled,
		// The interpreter over the socket for the host proxy, and on every
		// interface inside the sandbox so its code can use localhost:49999.
		InterpListen: []string{"unix:" + envdapi.InterpSocket, fmt.Sprintf("tcp:0.0.0.0:%d", envdapi.InterpPort)},
		Kernels:      tpl.Kernels,
	}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return fmt.Errorf("sandbox %s: envd config: %w", info.ID, err)
	}
	stop := timing.Start(ctx, "volumes")
	volumes, err := m.volumeRuntimeMounts(ctx, info)
	stop()
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", info.ID, err)
	}
	spec := runtime.Spec{
		ID:       info.ID,
		Hostname: "airlock",
		Lower:    tpl.Rootfs,
		Dir:      dir,
		Mounts: []runtime.Mount{
			{Source: m.envdPath(envd), Target: envdapi.BinaryPath, ReadOnly: true},
			{Source: m.envdPath(envd), Target: "/usr/bin/sudo", ReadOnly: true},        // envd as `sudo` is the no-setuid sudo shim (internal/sudo)
			{Source: m.envdPath(envd), Target: envdapi.MCPGatewayPath, ReadOnly: true}, // and as `mcp-gateway`, the MCP gateway (internal/mcpgateway)
			{Source: runDir, Target: envdapi.RunDir},
		},
		Init: runtime.Process{
			Args:    []string{envdapi.BinaryPath},
			Env:     []string{"PATH=" + envdapi.DefaultPath},
			Stdin:   cfgJSON,
			LogPath: m.logPath(info.ID),
		},
		Resources: runtime.Resources{
			CPUs:     float64(tpl.CPUCount),
			MemoryMB: int64(tpl.MemoryMB),
			PidsMax:  m.opts.PidsMax,
		},
	}
	spec.Mounts = append(spec.Mounts, volumes...)
	backend, err := m.runtimeFor(tpl.Runtime)
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", info.ID, err)
	}
	if m.opts.Network != nil && e.net == nil {
		// A pooled sandbox has no client yet: it starts with all egress denied
		// and gets the client's policy when claimed.
		p := PolicyOf(info)
		if pooled {
			p = netpolicy.Policy{DenyOut: []string{netpolicy.AllTraffic}}
		}
		stop := timing.Start(ctx, "network")
		var ns *netpolicy.Sandbox
		if mode.image == "" {
			// The runtime has the veth made in the sandbox's own
			// namespace (Spec.NetLink), not moved there.
			if pooled {
				// Closed rather than under a deny-all policy: the claim's
				// Update then only adds to the firewall (PrepareClosed).
				ns, err = m.opts.Network.PrepareClosed(ctx, info.ID)
			} else {
				ns, err = m.opts.Network.Prepare(ctx, info.ID, p)
			}
			spec.NetLink = func(netns string) error { return m.opts.Network.Link(info.ID, netns) }
		} else {
			// A restore moves the interfaces from NetNS.
			ns, err = m.opts.Network.Setup(ctx, info.ID, p)
		}
		stop()
		if err != nil {
			return fmt.Errorf("sandbox %s: %w", info.ID, err)
		}
		m.pushNetwork(e)
		e.net = ns
	}
	if ns := e.net; ns != nil {
		// A paused sandbox keeps its network namespace (and address, which
		// restored connections are bound to).
		spec.NetNS = ns.NetNS
		spec.Mounts = append(spec.Mounts,
			runtime.Mount{Source: ns.ResolvConf, Target: "/etc/resolv.conf", ReadOnly: true},
			runtime.Mount{Source: ns.Hosts, Target: "/etc/hosts", ReadOnly: true})
		if trust != "" {
			spec.Mounts = append(spec.Mounts, runtime.Mount{Source: trust, Target: TrustBundlePath, ReadOnly: true})
		}
		e.info.Addr = ns.Addr
	}
	if !mode.existingDir {
		m.pushLog(e)
	}
	var rt runtime.Sandbox
	stop = timing.Start(ctx, "runtime")
	if mode.image != "" {
		restorer, ok := backend.(runtime.Restorer)
		if !ok {
			return fmt.Errorf("sandbox %s: the %s runtime cannot restore checkpoints", info.ID, backend.Name())
		}
		rt, err = restorer.Restore(ctx, spec, mode.image)
	} else {
		rt, err = backend.Create(ctx, spec)
	}
	stop()
	if err != nil {
		return fmt.Errorf("sandbox %s: %w", info.ID, err)
	}
	e.rt = rt
	if pooled {
		e.started = startedFromOf(tpl)
	}
	m.pushRuntime(e, rt)
	if sig, ok := rt.(runtime.InitSignaler); ok && mode.image != "" {
		// The image's envd was quiesced for the checkpoint: it listens again
		// once woken (envdapi.QuiesceSignal).
		if err := sig.SignalInit(envdapi.WakeSignal); err != nil {
			return fmt.Errorf("sandbox %s: wake the restored envd: %w", info.ID, err)
		}
	}
	stop = timing.Start(ctx, "envd")
	err = m.waitEnvd(ctx, e, 10*time.Second)
	stop()
	if err != nil {
		// The log goes with the teardown; keep its end in the error.
		tail := logTail(spec.Init.LogPath, 1024) + logTail(filepath.Join(runDir, envdapi.LogName), 1024)
		return fmt.Errorf("sandbox %s: envd did not start: %w; envd log: %q", info.ID, err, tail)
	}
	if r, ok := rt.(runtime.EnvdReadier); ok {
		// Best effort: the sandbox works without it, less protected.
		if err := r.EnvdReady(); err != nil {
			m.log.Warn("sandbox envd ready hook", "id", info.ID, "err", err)
		}
	}
	return nil
}

// logPath is where envd's output goes (beside, not in, the sandbox dir).
func (m *Manager) logPath(id string) string {
	return layout.DataDir{Root: m.opts.DataDir}.SandboxLog(id)
}

// logTail returns up to n bytes from the end of a file.
func logTail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil && st.Size() > n {
		_, _ = f.Seek(st.Size()-n, 0)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// envdTransport reaches one sandbox's envd through its unix socket.
func envdTransport(socket string, conns *connTracker) *http.Transport {
	return &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", socket)
			if err != nil {
				return nil, err
			}
			return conns.track(c), nil
		},
		MaxIdleConnsPerHost:   64,
		IdleConnTimeout:       90 * time.Second,
		ResponseHeaderTimeout: 0,
		DisableCompression:    true,
	}
}

// netTeardown removes a sandbox's network in the background: deleting a veth
// takes tens of milliseconds, and nothing is waiting for it. It runs only
// after the runtime destroyed the sandbox (no process holds the netns).
func (m *Manager) netTeardown(id string) {
	m.netWG.Add(1)
	go func() {
		defer m.netWG.Done()
		if err := m.opts.Network.Teardown(id); err != nil {
			m.log.Error("sandbox network teardown", "id", id, "err", err)
		}
	}()
}

// PolicyOf is the egress policy a sandbox's info asks for (the kube
// backend's too).
func PolicyOf(info Info) netpolicy.Policy {
	p := netpolicy.Policy{
		AllowOut:    append([]string(nil), info.Network.AllowOut...),
		DenyOut:     append([]string(nil), info.Network.DenyOut...),
		Rules:       info.Network.Rules,
		EgressProxy: info.Network.EgressProxy,
		Owner:       info.Owner,
	}
	if a := info.AllowInternetAccess; a != nil && !*a {
		p.DenyOut = append(p.DenyOut, netpolicy.AllTraffic)
	}
	return p
}

// CopyNetwork is a deep copy of n.
func CopyNetwork(n NetworkConfig) NetworkConfig {
	out := NetworkConfig{
		AllowOut:        append([]string(nil), n.AllowOut...),
		DenyOut:         append([]string(nil), n.DenyOut...),
		MaskRequestHost: n.MaskRequestHost,
		Rules:           copyRules(n.Rules),
	}
	if n.EgressProxy != nil {
		ep := *n.EgressProxy
		out.EgressProxy = &ep
	}
	if n.AllowPublicTraffic != nil {
		v := *n.AllowPublicTraffic
		out.AllowPublicTraffic = &v
	}
	return out
}

// UpdateNetwork replaces a running sandbox's egress rules (E2B's PUT
// /sandboxes/{id}/network). The firewall changes in one transaction.
func (m *Manager) UpdateNetwork(ctx context.Context, id string, u NetworkUpdate) error {
	return m.with(id, func(e *entry) error {
		e.mu.Lock()
		info := e.info
		e.mu.Unlock()
		u.ApplyTo(&info)
		p := PolicyOf(info)
		if err := p.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalid, err)
		}
		if m.opts.Network == nil {
			return fmt.Errorf("%w: sandbox networking is off on this server (serve --sandbox-network)", ErrInvalid)
		}
		if err := m.checkEgress(ctx, p); err != nil {
			return err
		}
		if err := m.opts.Network.Update(id, p); err != nil {
			return fmt.Errorf("update network of %s: %w", id, err)
		}
		e.mu.Lock()
		e.info.Network = info.Network
		e.info.AllowInternetAccess = info.AllowInternetAccess
		info = e.info
		e.mu.Unlock()
		return m.commit(ctx, e, ToRecord(info), lifecycle.Updated, lifecycle.EventData{NetworkEgress: EgressOf(info)})
	})
}

// with runs fn on the live sandbox id under its op lock, which serializes the
// sandbox's lifecycle operations; fn may call the runtime, the network and the
// store. The manager's lock is held only to find the entry. A sandbox whose
// Kill has begun is ErrNotFound here, so no operation can act on a killed
// sandbox or write its record back.
func (m *Manager) with(id string, fn func(e *entry) error) error {
	m.mu.Lock()
	e, ok := m.sandboxes[id]
	m.mu.Unlock()
	if !ok {
		return notFound(id)
	}
	e.op.Lock()
	defer e.op.Unlock()
	if e.gone {
		return notFound(id)
	}
	return fn(e)
}

func notFound(id string) error { return fmt.Errorf("%w: %q", ErrNotFound, id) }

// view returns a live sandbox and a copy of its info, without waiting for an
// operation in progress on it: what readers (the API's get and list, the
// proxy) see is the state before or after it.
func (m *Manager) view(id string) (*entry, Info, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	e, ok := m.sandboxes[id]
	if !ok {
		return nil, Info{}, notFound(id)
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return e, e.info, nil
}

// running returns a live, running sandbox (the proxy's look-up).
func (m *Manager) running(id string) (*entry, Info, error) {
	e, info, err := m.view(id)
	if err == nil && info.State != StateRunning {
		return nil, Info{}, notFound(id)
	}
	return e, info, err
}

// reachable is running for traffic through the proxy: a paused sandbox
// with auto-resume is resumed first.
func (m *Manager) reachable(id string) (*entry, Info, error) {
	e, info, err := m.running(id)
	if err != nil && m.autoResume(id) {
		return m.running(id)
	}
	return e, info, err
}

// UserPortTarget returns where the proxy reaches a running sandbox's user
// ports, the traffic access token they require ("" for none) and the Host
// their requests carry (network.maskRequestHost; "" for the client's).
func (m *Manager) UserPortTarget(id string) (addr netip.Addr, token, maskHost string, err error) {
	_, info, err := m.reachable(id)
	if err != nil {
		return netip.Addr{}, "", "", err
	}
	return info.Addr, info.TrafficAccessToken, info.Network.MaskRequestHost, nil
}

// Get returns a sandbox's current info.
func (m *Manager) Get(_ context.Context, id string) (Info, error) {
	_, info, err := m.view(id)
	return info, err
}

// ListKey is a sandbox's place in a list: its start, id and state.
type ListKey struct {
	ID        string
	StartedAt time.Time
	State     State
}

// ListKeys returns the keys of the sandboxes matching f, in no order. A page
// of a list takes these of every sandbox and Get of its own few: List copies
// every sandbox's Info, which took a page about 1 ms at 1,000 sandboxes.
func (m *Manager) ListKeys(_ context.Context, f ListFilter) ([]ListKey, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	keys := make([]ListKey, 0, len(m.sandboxes))
	for _, e := range m.sandboxes {
		e.mu.Lock()
		if matches(&e.info, f) {
			keys = append(keys, ListKey{ID: e.info.ID, StartedAt: e.info.StartedAt, State: e.info.State})
		}
		e.mu.Unlock()
	}
	return keys, nil
}

// List returns the sandboxes matching f, oldest first.
func (m *Manager) List(_ context.Context, f ListFilter) ([]Info, error) {
	m.mu.Lock()
	found := make([]Info, 0, len(m.sandboxes))
	for _, e := range m.sandboxes {
		e.mu.Lock()
		if matches(&e.info, f) {
			found = append(found, e.info)
		}
		e.mu.Unlock()
	}
	m.mu.Unlock()
	// Sorted by pointer, then copied once: an Info is large, and sorting
	// the values themselves moved megabytes per list at a thousand
	// sandboxes.
	order := make([]*Info, len(found))
	for i := range found {
		order[i] = &found[i]
	}
	slices.SortFunc(order, func(a, b *Info) int {
		if c := a.StartedAt.Compare(b.StartedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	out := make([]Info, len(order))
	for i, p := range order {
		out[i] = *p
	}
	return out, nil
}

func matches(info *Info, f ListFilter) bool {
	if f.Owner != "" && info.Owner != f.Owner {
		return false
	}
	if len(f.States) > 0 {
		ok := false
		for _, s := range f.States {
			ok = ok || s == info.State
		}
		if !ok {
			return false
		}
	}
	for k, v := range f.Metadata {
		if got, ok := info.Metadata[k]; !ok || got != v {
			return false
		}
	}
	if f.Template != "" && f.Template != info.TemplateID && f.Template != info.Alias {
		return false
	}
	if !f.StartedAfter.IsZero() && info.StartedAt.Before(f.StartedAfter) {
		return false
	}
	return true
}

// Kill destroys a sandbox (a client's request).
func (m *Manager) Kill(ctx context.Context, id string) error {
	return m.killFor(ctx, id, lifecycle.KillRequest)
}

// killFor destroys sandbox id; reason goes into its killed event.
func (m *Manager) killFor(ctx context.Context, id, reason string) (err error) {
	defer m.observe(OpKill, time.Now(), &err)
	return m.with(id, func(e *entry) error {
		m.kill(ctx, e, reason)
		return nil
	})
}

// trackLocked counts work in flight that Close waits for, and returns the
// call that ends it; m.mu is held. Work that starts after Close began is
// not counted (Add must not race with Wait).
func (m *Manager) trackLocked() (done func()) {
	if m.closed {
		return func() {}
	}
	m.wg.Add(1)
	return m.wg.Done
}

// background runs fn in a goroutine Close waits for; once Close began, it
// runs fn in the caller's.
func (m *Manager) background(fn func()) {
	m.mu.Lock()
	closed := m.closed
	done := m.trackLocked()
	m.mu.Unlock()
	if closed {
		fn()
		return
	}
	go func() {
		defer done()
		fn()
	}()
}

// kill ends a live sandbox; the caller holds e.op. The sandbox is gone and out
// of the map (so no new traffic reaches it) before its teardown starts, and
// op stays held until the teardown ends, so whoever waits for the sandbox
// finds it gone only once nothing of it is left. Teardown runs even when ctx
// ends. reason (a lifecycle.Kill* value) goes into the killed event, which is
// recorded before the teardown: the sandbox is gone for good from here, and
// a crash during the teardown must not lose the event (Recover then finishes
// the teardown without recording a second one).
func (m *Manager) kill(ctx context.Context, e *entry, reason string) {
	e.gone = true
	m.mu.Lock()
	delete(m.sandboxes, e.id)
	// Close waits for kills in flight.
	done := m.trackLocked()
	m.mu.Unlock()
	defer done()
	e.mu.Lock()
	if e.timer != nil {
		e.timer.Stop()
	}
	e.mu.Unlock()
	m.keepLogs(e, reason)
	m.recordKilled(ctx, e, reason)
	crashpoint.Hit(crashpoint.KillRecorded)
	_ = m.destroy(context.WithoutCancel(ctx), e)
	m.log.Info("sandbox killed", "id", e.id, "reason", reason)
}

// checkLifecycle enforces what E2B's API does: auto-resume only for a
// sandbox that pauses at its timeout, with its memory (traffic cannot
// cold-boot a sandbox).
func checkLifecycle(l Lifecycle) error {
	switch l.OnTimeout {
	case "", OnTimeoutKill, OnTimeoutPause:
	default:
		return fmt.Errorf("%w: lifecycle onTimeout must be %q or %q, not %q", ErrInvalid, OnTimeoutKill, OnTimeoutPause, l.OnTimeout)
	}
	if l.OnTimeout != OnTimeoutPause && (l.AutoResume || l.DropMemory) {
		return fmt.Errorf("%w: autoResume and autoPauseMemory apply only when the sandbox pauses at its timeout (autoPause)", ErrInvalid)
	}
	if l.AutoResume && l.DropMemory {
		return fmt.Errorf("%w: a sandbox paused without its memory cannot be resumed by traffic: autoResume needs autoPauseMemory", ErrInvalid)
	}
	return nil
}

// checkTimeout enforces the bounds every timeout shares: positive (or zero
// where that means "now") and at most MaxTimeout.
func (m *Manager) checkTimeout(d time.Duration, allowZero bool) error {
	switch {
	case d < 0 || (d == 0 && !allowZero):
		if allowZero {
			return fmt.Errorf("%w: timeout must not be negative", ErrInvalid)
		}
		return fmt.Errorf("%w: timeout must be positive", ErrInvalid)
	case d > m.opts.MaxTimeout:
		return fmt.Errorf("%w: timeout cannot be greater than %s", ErrInvalid, m.opts.MaxTimeout)
	}
	return nil
}

// SetTimeout makes the sandbox end d from now; 0 ends it now (E2B's SDK tests
// use setTimeout(0) to force expiry).
func (m *Manager) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if err := m.checkTimeout(d, true); err != nil {
		return err
	}
	return m.with(id, func(e *entry) error {
		e.mu.Lock()
		e.info.EndAt = time.Now().Add(d)
		m.armTimerLocked(e)
		rec := ToRecord(e.info)
		e.mu.Unlock()
		return m.commit(ctx, e, rec, lifecycle.Updated, lifecycle.EventData{SetTimeout: rec.EndAt.UTC().Format(time.RFC3339)})
	})
}

// Connect returns a running sandbox, resuming it if paused, and extends its
// life to at least timeout from now.
func (m *Manager) Connect(ctx context.Context, id string, timeout time.Duration) (info Info, resumed bool, err error) {
	if err := m.checkTimeout(timeout, false); err != nil {
		return Info{}, false, err
	}
	err = m.with(id, func(e *entry) error {
		info, resumed, err = m.connect(ctx, e, timeout)
		return err
	})
	return info, resumed, err
}

// connect is Connect on a sandbox whose op lock the caller holds.
func (m *Manager) connect(ctx context.Context, e *entry, timeout time.Duration) (Info, bool, error) {
	e.mu.Lock()
	paused := e.info.State == StatePaused
	e.mu.Unlock()
	if paused {
		e.mu.Lock()
		owner, cpu, mem := e.info.Owner, e.info.CPUCount, e.info.MemoryMB
		e.mu.Unlock()
		release, err := m.reserve(owner, cpu, mem, true)
		if err != nil {
			return Info{}, false, err
		}
		defer release()
		if e.rt != nil {
			// Frozen in place (a runtime without checkpoints).
			err = e.rt.Resume()
		} else {
			err = m.resume(ctx, e)
		}
		if err != nil {
			return Info{}, false, fmt.Errorf("resume %s: %w", e.id, err)
		}
	}
	e.mu.Lock()
	if paused {
		e.info.unpause()
	}
	if end := time.Now().Add(timeout); end.After(e.info.EndAt) || paused {
		e.info.EndAt = end
	}
	m.armTimerLocked(e)
	info := e.info
	e.mu.Unlock()
	if paused {
		// Before the record: its event must name this execution.
		e.mu.Lock()
		build := e.exec.buildID
		e.mu.Unlock()
		m.beginExecution(e, build)
	}
	var err error
	if paused {
		err = m.commit(ctx, e, ToRecord(info), lifecycle.Resumed, lifecycle.EventData{})
	} else {
		err = m.opts.Store.Put(ctx, ToRecord(info))
	}
	if err != nil {
		return Info{}, false, err
	}
	return info, paused, nil
}

// Pause saves the sandbox to disk and frees its memory (persist.go); on a
// runtime without checkpoints it freezes every process, its memory resident.
// A paused sandbox does not time out.
//
// The team's quotas of paused sandboxes (their count, and the disk they
// hold) apply to a pause asked for, not to the auto-pause at a timeout,
// which would otherwise have to kill.
func (m *Manager) Pause(ctx context.Context, id string, opts PauseOptions) error {
	return m.with(id, func(e *entry) error {
		e.mu.Lock()
		owner, state := e.info.Owner, e.info.State
		e.mu.Unlock()
		if state != StatePaused {
			if err := m.checkPausedQuota(owner); err != nil {
				return err
			}
		}
		return m.pause(ctx, e, opts)
	})
}

// freeze pauses e in place: every process frozen, its memory resident. The
// caller holds e.op.
func (m *Manager) freeze(ctx context.Context, e *entry) error {
	if err := e.rt.Pause(); err != nil {
		return fmt.Errorf("pause %s: %w", e.id, err)
	}
	return m.markPaused(ctx, e, true)
}

// markPaused records that e, whose op lock the caller holds, is paused (with
// its memory kept, on disk or frozen, or not) and stops its timer: a paused
// sandbox does not time out.
func (m *Manager) markPaused(ctx context.Context, e *entry, withMemory bool) error {
	// Measured before the state changes, so that a paused sandbox is never
	// counted against its team's disk quota without its size. Paused without
	// memory, its processes run on until the release that follows the
	// record: what they write in between is not counted.
	size := m.pausedDiskBytes(e)
	e.mu.Lock()
	e.info.State = StatePaused
	e.info.PausedWithMemory = withMemory
	e.info.PausedAt = time.Now()
	e.info.PausedDiskBytes = size
	if e.timer != nil {
		e.timer.Stop()
	}
	rec := ToRecord(e.info)
	e.mu.Unlock()
	return m.commit(ctx, e, rec, lifecycle.Paused, lifecycle.EventData{Execution: executionData(e)})
}

// Resume is Connect for the older resume endpoint: it fails unless paused.
func (m *Manager) Resume(ctx context.Context, id string, timeout time.Duration) (Info, error) {
	var info Info
	err := m.with(id, func(e *entry) error {
		e.mu.Lock()
		paused := e.info.State == StatePaused
		e.mu.Unlock()
		if !paused {
			return fmt.Errorf("%w: sandbox %q is not paused", ErrConflict, id)
		}
		if err := m.checkTimeout(timeout, false); err != nil {
			return err
		}
		var err error
		info, _, err = m.connect(ctx, e, timeout)
		return err
	})
	return info, err
}

// Metrics returns the retained samples in [start, end]; zero bounds are open.
func (m *Manager) Metrics(_ context.Context, id string, start, end time.Time) ([]Metric, error) {
	e, _, err := m.view(id)
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	out := []Metric{}
	for _, s := range e.metrics {
		if (!start.IsZero() && s.Time.Before(start)) || (!end.IsZero() && s.Time.After(end)) {
			continue
		}
		out = append(out, s)
	}
	return out, nil
}

// EnvdTransport returns the transport to a running sandbox's envd, for the
// sandbox-traffic proxy. A paused sandbox has none: its envd cannot answer.
func (m *Manager) EnvdTransport(id string) (http.RoundTripper, error) {
	e, _, err := m.reachable(id)
	if err != nil {
		return nil, err
	}
	return e.transport, nil
}

// InterpTransport returns the transport to a running sandbox's code
// interpreter (in-sandbox port 49999), for the sandbox-traffic proxy.
func (m *Manager) InterpTransport(id string) (http.RoundTripper, error) {
	e, _, err := m.reachable(id)
	if err != nil {
		return nil, err
	}
	return e.interp, nil
}

// MatchToken returns the ids of running sandboxes for which accept(token,
// owner) is true; the proxy routes header-less signed /files URLs with it.
func (m *Manager) MatchToken(accept func(token, owner string) bool) []string {
	m.mu.Lock()
	type cand struct{ id, token, owner string }
	var cands []cand
	for id, e := range m.sandboxes {
		e.mu.Lock()
		if e.info.State == StateRunning && e.info.AccessToken != "" {
			cands = append(cands, cand{id, e.info.AccessToken, e.info.Owner})
		}
		e.mu.Unlock()
	}
	m.mu.Unlock()
	var ids []string
	for _, c := range cands {
		if accept(c.token, c.owner) {
			ids = append(ids, c.id)
		}
	}
	return ids
}

// Access returns a sandbox's access token and owner, for the proxy's check
// of the grants clients present. A paused sandbox's too, and without
// resuming it: a request must pass the check before its traffic can wake
// the sandbox (Lifecycle.AutoResume).
func (m *Manager) Access(id string) (token, owner string, err error) {
	_, info, err := m.view(id)
	if err == nil && info.State == StateKilled {
		err = notFound(id)
	}
	if err != nil {
		return "", "", err
	}
	return info.AccessToken, info.Owner, nil
}

// armTimerLocked (re)schedules the kill at EndAt; e.mu is held.
func (m *Manager) armTimerLocked(e *entry) {
	if e.timer != nil {
		e.timer.Stop()
	}
	e.timer = time.AfterFunc(time.Until(e.info.EndAt), func() { m.expire(e) })
}

// expire kills e if its end of life has come. It decides under e's op lock,
// so a Connect or SetTimeout that extended the life first wins.
func (m *Manager) expire(e *entry) {
	e.op.Lock()
	defer e.op.Unlock()
	if e.gone {
		return
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	e.mu.Lock()
	due := e.info.State == StateRunning && !time.Now().Before(e.info.EndAt)
	e.mu.Unlock()
	// After Close the sandbox is the next server's: its Recover ends it.
	if !due || closed {
		return
	}
	e.mu.Lock()
	lc := e.info.Lifecycle
	e.mu.Unlock()
	if lc.OnTimeout == OnTimeoutPause {
		m.log.Info("sandbox timed out; pausing", "id", e.id)
		err := m.pause(context.Background(), e, PauseOptions{DropMemory: lc.DropMemory})
		if err == nil || e.gone {
			return
		}
		m.log.Error("sandbox timed out and could not be paused; killing it", "id", e.id, "err", err)
	} else {
		m.log.Info("sandbox timed out", "id", e.id)
	}
	m.kill(context.Background(), e, lifecycle.KillTimeout)
}

// sampleLoop samples every running sandbox once per MetricsInterval, spread
// evenly over the interval: at once, a thousand sandboxes' samples were a
// burst every few seconds that creates and commands queued behind.
func (m *Manager) sampleLoop() {
	defer m.wg.Done()
	for {
		m.mu.Lock()
		entries := make([]*entry, 0, len(m.sandboxes))
		for _, e := range m.sandboxes {
			e.mu.Lock()
			if e.info.State == StateRunning {
				entries = append(entries, e)
			}
			e.mu.Unlock()
		}
		m.mu.Unlock()
		// In a stable order, so a sandbox's samples stay about an
		// interval apart.
		slices.SortFunc(entries, func(a, b *entry) int { return strings.Compare(a.id, b.id) })
		round := time.Now()
		gap := m.opts.MetricsInterval / time.Duration(max(len(entries), 1))
		for i, e := range entries {
			if !m.sleep(time.Until(round.Add(gap * time.Duration(i)))) {
				return
			}
			m.sample(e)
		}
		if !m.sleep(time.Until(round.Add(m.opts.MetricsInterval))) {
			return
		}
	}
}

// sample records one metric: CPU use since the previous sample (or since start)
// as a percentage of the sandbox's CPUs, memory from its cgroup, and disk as the
// size of its writable layer against its disk size.
func (m *Manager) sample(e *entry) {
	// Under op: the runtime's Stats must not run beside its Destroy (Kill)
	// or Pause, and an OOM event must not be written after Kill deleted the
	// sandbox's events. Stats reads a few cgroup files, so an operation
	// waits for it no more than for a sample's worth of reads.
	e.op.Lock()
	defer e.op.Unlock()
	// The sandbox was running when the loop listed it; a pause that let go
	// of its runtime sandbox (to disk, or memory=false) may have come first.
	if e.gone || e.rt == nil {
		return
	}
	st, err := m.stats(e.rt)
	e.mu.Lock()
	oom := err == nil && st.OOMKills > e.seenOOM
	e.mu.Unlock()
	// Only when something is amiss (Stats failed, an OOM kill, no process
	// left in its cgroup), as Status may cost a process (gVisor's runsc
	// state): an init that died takes the sandbox down with it, and the
	// kernel counts it among the OOM kills when memory was the cause.
	if (err != nil || oom || st.Pids == 0) && m.endIfInitGone(e, oom) {
		return
	}
	if err != nil {
		return
	}
	m.noteOOM(e, st)
	diskUsed := m.diskUsed(e, st)
	e.mu.Lock()
	defer e.mu.Unlock()
	prevCPU, prevAt := e.lastCPU, e.lastAt
	if prevAt.IsZero() {
		prevAt = e.info.StartedAt
	}
	cpus := max(e.info.CPUCount, 1)
	pct := 0.0
	if wall := st.Time.Sub(prevAt); wall > 0 {
		pct = 100 * float64(st.CPUUsage-prevCPU) / float64(wall) / float64(cpus)
	}
	e.lastCPU, e.lastAt = st.CPUUsage, st.Time
	memTotal := st.MemoryLimit
	if memTotal <= 0 || memTotal > int64(e.info.MemoryMB)<<20 {
		memTotal = int64(e.info.MemoryMB) << 20
	}
	e.metrics = append(e.metrics, Metric{
		Time:       st.Time,
		CPUCount:   e.info.CPUCount,
		CPUUsedPct: min(max(pct, 0), 100),
		MemUsed:    st.MemoryUsed,
		MemTotal:   memTotal,
		MemCache:   st.MemoryCache,
		DiskUsed:   diskUsed,
		DiskTotal:  int64(e.info.DiskSizeMB) << 20,
	})
	if len(e.metrics) > metricsKept {
		e.metrics = e.metrics[len(e.metrics)-metricsKept:]
	}
}

// endIfInitGone kills e, whose op lock the caller holds, when its init
// (envd) is no longer running: nothing of the sandbox works any more, and
// its owner learns why from the killed event. oom says the kernel killed
// some process of it for memory since the last sample.
func (m *Manager) endIfInitGone(e *entry, oom bool) bool {
	st, err := e.rt.Status()
	if err != nil || st != runtime.StatusStopped {
		return false
	}
	reason := lifecycle.KillExited
	if oom {
		reason = lifecycle.KillOOM
	}
	m.log.Warn("sandbox init ended; killing the sandbox", "id", e.id, "reason", reason)
	m.kill(context.Background(), e, reason)
	return true
}

// Recover re-adopts the sandboxes a previous server left running and cleans up
// everything else it left: records of dead sandboxes, runtime sandboxes with no
// record, and stray sandbox directories. It runs before Start.
func (m *Manager) Recover(ctx context.Context) error {
	m.mu.Lock()
	started := m.started
	m.mu.Unlock()
	if started {
		return errors.New("sandbox: Recover after Start")
	}
	recs, err := m.opts.Store.List(ctx)
	if err != nil {
		return err
	}
	known := map[string]bool{}
	for _, rec := range recs {
		known[rec.ID] = true
		e := m.newEntry(FromRecord(rec))
		// A sandbox whose killed event is recorded was being killed when
		// the server stopped: its teardown is finished, not undone. One
		// that never got to running had no created event, so has no
		// killed one either.
		killedBefore, reported := false, e.info.State != StateCreating
		if reported {
			br, _ := readBootRecord(e.dir)
			killedBefore = m.recoverExecution(ctx, e, br.Template.BuildID)
		}
		reason := lifecycle.KillOrphaned
		// What a sandbox of this record may hold, in the order create
		// acquires it; what it does not hold (any more) releases as a no-op.
		m.pushRecord(e)
		m.pushDir(e)
		if m.opts.Network != nil {
			m.pushNetwork(e)
		}
		m.pushLog(e)
		rt, err := m.loadAny(rec.ID)
		alive := err == nil
		var st runtime.Status
		if alive {
			e.rt = rt
			m.pushRuntime(e, rt)
			st, err = rt.Status()
			alive = err == nil && (st == runtime.StatusRunning || st == runtime.StatusPaused)
		}
		if alive && (e.info.State == StateCreating || killedBefore) {
			alive = false
		}
		if alive && st == runtime.StatusPaused {
			if _, err := os.Stat(m.layout().PausedComplete(rec.ID)); err == nil {
				// A pause with memory takes its image of the frozen sandbox
				// and releases it only after marking the image complete: a
				// crash came in between. The complete image is the commit
				// point, so the sandbox is paused to disk, and what is left
				// of it in the runtime is released (recoverPaused).
				alive = false
			}
		}
		// A running sandbox whose record says paused is one a crash caught
		// between the two: a pause without memory that had written its
		// record but not yet released the sandbox, or a resume that had
		// booted it but not yet written its record. It is running, so it
		// is taken back as running (the record's end time is a paused
		// sandbox's, stale: it gets the time a resume would give it).
		resumed := alive && st == runtime.StatusRunning && e.info.State == StatePaused
		if resumed {
			timeout := DefaultAutoResumeTimeout
			if br, err := readBootRecord(e.dir); err == nil && br.Timeout > 0 {
				timeout = min(br.Timeout, m.opts.MaxTimeout)
			}
			e.info.EndAt = later(e.info.EndAt, time.Now().Add(timeout))
		}
		if alive && st == runtime.StatusRunning && !time.Now().Before(e.info.EndAt) {
			alive = false
			reason = lifecycle.KillTimeout
		}
		if alive && st == runtime.StatusRunning {
			if err := m.waitEnvd(ctx, e, 2*time.Second); err != nil {
				// The server may have died while envd was quiesced for a
				// checkpoint that never came: wake it.
				alive = m.wakeEnvd(ctx, e, 2*time.Second) == nil
			}
		}
		if !alive && !killedBefore && m.recoverPaused(ctx, e, rt) {
			m.log.Info("paused sandbox re-adopted", "id", rec.ID, "memory", e.info.PausedWithMemory)
			m.mu.Lock()
			m.sandboxes[rec.ID] = e
			m.mu.Unlock()
			continue
		}
		if alive && m.opts.Network != nil {
			// The firewall was rebuilt empty at start; put this sandbox's
			// policy back before it is reachable again.
			ns, err := m.opts.Network.Adopt(rec.ID, PolicyOf(e.info))
			if err != nil {
				m.log.Warn("sandbox network could not be re-adopted", "id", rec.ID, "err", err)
				alive = false
			} else {
				e.net = ns
				e.info.Addr = ns.Addr
			}
		}
		if !alive {
			m.log.Info("sandbox did not survive the restart; reported killed", "id", rec.ID, "reason", reason)
			m.keepLogs(e, reason)
			if reported && !killedBefore {
				m.recordKilled(ctx, e, reason)
			}
			if err := m.destroy(context.WithoutCancel(ctx), e); stepFailed(err, stepRecord) {
				return err
			}
			continue
		}
		e.seenOOM = m.seenOOMOf(ctx, rec.ID)
		if br, err := readBootRecord(e.dir); err == nil {
			e.info.Lifecycle = br.Lifecycle
		}
		if st == runtime.StatusPaused && e.info.State != StatePaused {
			// Frozen, but never recorded paused: a fork's or snapshot's
			// capture (or a freeze) that a crash interrupted. The sandbox
			// was running, and runs on.
			if err := rt.Resume(); err != nil {
				m.log.Warn("sandbox frozen by an interrupted operation could not be thawed", "id", rec.ID, "err", err)
				e.info.State = StatePaused
				e.info.PausedWithMemory = true
			} else {
				st = runtime.StatusRunning
				// The operation quiesced envd before it froze the sandbox
				// (envdapi.QuiesceSignal): wake it.
				if err := m.wakeEnvd(ctx, e, envdWakeLimit); err != nil {
					m.log.Warn("sandbox thawed after an interrupted operation: envd does not answer", "id", rec.ID, "err", err)
				}
			}
		}
		changed := resumed
		if st == runtime.StatusPaused {
			e.info.State = StatePaused
			e.info.PausedWithMemory = true
			if e.info.PausedAt.IsZero() {
				e.info.PausedAt = time.Now()
				changed = true
			}
			if e.info.PausedDiskBytes == 0 {
				// Frozen by a pause whose record did not get to say it, or
				// recorded by an Airlock that did not measure it.
				e.info.PausedDiskBytes = m.pausedDiskBytes(e)
				changed = true
			}
		} else {
			changed = changed || e.info.State != StateRunning
			e.info.unpause()
			// A checkpoint image beside a running sandbox is stale (a
			// resume that booted from it, or a pause whose checkpoint
			// never completed): it is never restored again.
			if err := m.discard(m.layout().Paused(rec.ID)); err != nil {
				m.log.Warn("sandbox re-adopted: removing a stale checkpoint image", "id", rec.ID, "err", err)
			}
		}
		if resumed {
			// A resume the crash caught after its boot: its execution
			// began, and its event was not recorded yet.
			m.beginExecution(e, e.exec.buildID)
		}
		var werr error
		if resumed {
			werr = m.commit(ctx, e, ToRecord(e.info), lifecycle.Resumed, lifecycle.EventData{})
		} else if changed {
			werr = m.opts.Store.Put(ctx, ToRecord(e.info))
		}
		if err := werr; err != nil {
			m.log.Warn("sandbox re-adopted: record", "id", rec.ID, "err", err)
		}
		m.log.Info("sandbox re-adopted", "id", rec.ID, "state", e.info.State)
		// Its timer is armed by Start.
		m.mu.Lock()
		m.sandboxes[rec.ID] = e
		m.mu.Unlock()
	}
	for _, backend := range m.runtimes() {
		ids, err := backend.List()
		if err != nil {
			return err
		}
		for _, id := range ids {
			if known[id] {
				continue
			}
			if rt, err := backend.Load(id); err == nil {
				m.log.Info("destroying orphaned sandbox", "id", id, "runtime", backend.Name())
				_ = rt.Destroy(ctx)
			}
		}
	}
	if m.opts.Network != nil {
		m.netWG.Wait()
		m.mu.Lock()
		keep := map[string]bool{}
		for id := range m.sandboxes {
			keep[id] = true
		}
		m.mu.Unlock()
		m.opts.Network.Sweep(keep)
	}
	m.sweepCaptures(ctx)
	dirs, _ := os.ReadDir(layout.DataDir{Root: m.opts.DataDir}.Sandboxes())
	for _, d := range dirs {
		id := d.Name()
		// Dot-directories are the captures forks and snapshots keep (persist.go).
		if d.IsDir() && !known[id] && !strings.HasPrefix(id, ".") {
			_ = removeSandboxDir(m.sandboxDir(id))
			m.releaseDisk(m.sandboxDir(id))
		}
	}
	m.sweepEnvd(ctx)
	return nil
}

// runtimes returns every backend: the default first.
func (m *Manager) runtimes() []runtime.Runtime {
	all := []runtime.Runtime{m.opts.Runtime}
	for _, r := range m.opts.Runtimes {
		if r != nil && r != m.opts.Runtime {
			all = append(all, r)
		}
	}
	return all
}

// runtimeFor returns the backend a template names; empty is the default.
func (m *Manager) runtimeFor(name string) (runtime.Runtime, error) {
	if name == "" {
		return m.opts.Runtime, nil
	}
	for _, r := range m.runtimes() {
		if r.Name() == name {
			return r, nil
		}
	}
	return nil, fmt.Errorf("%w: runtime %q is not available on this server", ErrInvalid, name)
}

// loadAny finds a sandbox in whichever backend holds it: the store does not
// record the backend, and ids are unique across backends.
func (m *Manager) loadAny(id string) (runtime.Sandbox, error) {
	var firstErr error
	for _, r := range m.runtimes() {
		sb, err := r.Load(id)
		if err == nil {
			return sb, nil
		}
		if firstErr == nil || !errors.Is(err, runtime.ErrNotFound) {
			firstErr = err
		}
	}
	return nil, firstErr
}

// removeSandboxDir removes a sandbox directory whose runtime state is gone,
// unmounting a leftover overlay first.
func removeSandboxDir(dir string) error {
	// rootfs: a gVisor sandbox's overlay; sys: the netns sysfs the linux
	// runtime binds for a prepared netns. RemoveAll never crosses a mount,
	// so what is not unmounted here would be left behind.
	_ = mountutil.Unmount(filepath.Join(dir, "rootfs"))
	_ = mountutil.Unmount(filepath.Join(dir, "sys"))
	return mountutil.RemoveAll(dir)
}

// Close stops background work and destroys the warm pool. Claimed sandboxes
// keep running: a restarted server re-adopts them.
func (m *Manager) Close() {
	m.mu.Lock()
	m.closed = true
	m.mu.Unlock()
	m.endLife()
	close(m.stop)
	m.wg.Wait()
	m.drainPool()
	m.mu.Lock()
	live := m.liveLocked()
	m.mu.Unlock()
	for _, e := range live {
		e.mu.Lock()
		if e.timer != nil {
			e.timer.Stop()
		}
		e.mu.Unlock()
		e.transport.CloseIdleConnections()
		e.interp.CloseIdleConnections()
	}
	m.netWG.Wait()
	m.sockets.close()
}

// KillAll destroys every sandbox (for tests and `serve --kill-on-exit`).
func (m *Manager) KillAll(ctx context.Context) {
	m.mu.Lock()
	ids := make([]string, 0, len(m.sandboxes))
	for id := range m.sandboxes {
		ids = append(ids, id)
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, id := range ids {
		wg.Add(1)
		go func() { defer wg.Done(); _ = m.killFor(ctx, id, lifecycle.KillShutdown) }()
	}
	wg.Wait()
	m.netWG.Wait()
}

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// newID returns 20 characters of [a-z0-9], the shape E2B's SDKs and host-based
// routing expect.
func newID() string {
	b := make([]byte, 20)
	_, _ = rand.Read(b)
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return string(b)
}

func newToken() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func copyMap(in map[string]string) map[string]string {
	out := make(map[string]string, len(in))
	for k, v := range in {
		out[k] = v
	}
	return out
}

// ToRecord is the persisted record of a sandbox's info (FromRecord's
// inverse): the manager's, and any backend keeping sandboxes in a store.
func ToRecord(i Info) store.Sandbox {
	return store.Sandbox{
		ID: i.ID, TemplateID: i.TemplateID, Alias: i.Alias, ClientID: i.ClientID,
		Metadata: i.Metadata, EnvVars: i.EnvVars, AccessToken: i.AccessToken,
		StartedAt: i.StartedAt, EndAt: i.EndAt, State: string(i.State),
		CPUCount: i.CPUCount, MemoryMB: i.MemoryMB, DiskSizeMB: i.DiskSizeMB,
		AllowInternet: i.AllowInternetAccess, Owner: i.Owner,
		Lifecycle: store.Lifecycle{
			OnTimeout: string(i.Lifecycle.OnTimeout), DropMemory: i.Lifecycle.DropMemory, AutoResume: i.Lifecycle.AutoResume,
		},
		PausedWithMemory: i.PausedWithMemory, PausedAt: i.PausedAt, PausedDiskBytes: i.PausedDiskBytes,
		VolumeMounts: slices.Clone(i.VolumeMounts),
		Network: store.Network{
			AllowOut: i.Network.AllowOut, DenyOut: i.Network.DenyOut,
			AllowPublicTraffic: i.Network.AllowPublicTraffic, TrafficAccessToken: i.TrafficAccessToken,
			MaskRequestHost: i.Network.MaskRequestHost,
			Rules:           rawJSON(i.Network.Rules),
			EgressProxy:     rawJSON(i.Network.EgressProxy),
		},
	}
}

// rawJSON encodes the egress parts of a network config for the record; nil
// and empty values are left out.
func rawJSON[T any](v T) json.RawMessage {
	b, err := json.Marshal(v)
	if err != nil || string(b) == "null" || string(b) == "{}" {
		return nil
	}
	return b
}

func copyRules(r map[string][]netpolicy.Rule) map[string][]netpolicy.Rule {
	if len(r) == 0 {
		return nil
	}
	out := make(map[string][]netpolicy.Rule, len(r))
	for k, v := range r {
		out[k] = slices.Clone(v)
	}
	return out
}

// FromRecord is the info a persisted record holds; Addr is not kept (the
// backend knows where its sandboxes are).
func FromRecord(r store.Sandbox) Info {
	return Info{
		ID: r.ID, TemplateID: r.TemplateID, Alias: r.Alias, ClientID: r.ClientID,
		Metadata: r.Metadata, EnvVars: r.EnvVars, AccessToken: r.AccessToken,
		StartedAt: r.StartedAt, EndAt: r.EndAt, State: State(r.State),
		CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, DiskSizeMB: r.DiskSizeMB,
		EnvdVersion: envdapi.Version, AllowInternetAccess: r.AllowInternet, Owner: r.Owner,
		Lifecycle: Lifecycle{
			OnTimeout: OnTimeout(r.Lifecycle.OnTimeout), DropMemory: r.Lifecycle.DropMemory, AutoResume: r.Lifecycle.AutoResume,
		},
		PausedWithMemory: r.PausedWithMemory, PausedAt: r.PausedAt, PausedDiskBytes: r.PausedDiskBytes,
		VolumeMounts:       r.VolumeMounts,
		Network:            networkFromRecord(r.Network),
		TrafficAccessToken: r.Network.TrafficAccessToken,
	}
}

func networkFromRecord(n store.Network) NetworkConfig {
	out := NetworkConfig{
		AllowOut: n.AllowOut, DenyOut: n.DenyOut, AllowPublicTraffic: n.AllowPublicTraffic,
		MaskRequestHost: n.MaskRequestHost,
	}
	// Written by rawJSON from these types: a record that does not decode
	// was not written by Airlock, and its egress parts are left out (the
	// sandbox then has no rules rather than a failed adoption).
	if len(n.Rules) > 0 {
		_ = json.Unmarshal(n.Rules, &out.Rules)
	}
	if len(n.EgressProxy) > 0 {
		_ = json.Unmarshal(n.EgressProxy, &out.EgressProxy)
	}
	return out
}

// later returns the later of two times.
func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
