// Package buildbox is the sandbox a template build runs its RUN steps in. One
// step is one short-lived sandbox of the linux runtime: the parent layer's
// rootfs as the read-only lower, a fresh upper dir that receives the step's
// writes and is kept (Spec.Upper), envd as the first process in its "step"
// mode, and a network of the box's own with egress to the internet (never to
// the host or to sandboxes) so that apt and npm work.
//
// The box keeps its things apart from a server on the same data dir, which
// sweeps what it does not know:
//
//	<DataDir>/build/lock       flock: one box per data dir at a time
//	<DataDir>/build/runtime/   the box's own linux runtime state
//	<DataDir>/build/network/   the box's own netpolicy state (netns files)
//	<DataDir>/build/steps/<id> one step: sandbox dir, result dir, output
//
// and in the host's shared network state it uses names a server never does
// (see netInstanceOf): nftables table airlock_b<tag>, veths b<tag>…, a /24 of
// 10.200.0.0–10.249.255.255.
package buildbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/layer"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/netpolicy"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
)

// Options configure a Box.
type Options struct {
	DataDir  string // Airlock's data dir; the box keeps <DataDir>/build/ (its runtime state, step dirs, lock)
	EnvdPath string
	Egress   bool // steps reach the internet (never the host, never sandboxes), so apt and npm work
	// DNSUpstreams are "ip:port" servers the box's DNS forwarder asks;
	// default: the host's resolv.conf.
	DNSUpstreams []string
	Logger       *slog.Logger
	// Waiting, if set, is called when Open must wait for another build's box
	// (with the lock file's path), and what it returns when the wait is over:
	// the builder tells its user what it waits for instead of going silent.
	Waiting func(lock string) (done func())
	// NoWait makes Open fail with ErrBusy rather than wait while another
	// box holds the lock (a sweep after a crash need not wait for it: the
	// box that holds the lock swept already).
	NoWait bool
	// TrustBundle is a host file of PEM CA certificates that Node (npm) in
	// build steps trusts besides its own roots: "" means the host's trust
	// store (HostTrustBundles), "-" none. A host that reaches the npm
	// registry through a TLS-intercepting proxy trusts that proxy's CA; a
	// step's npm must too, or `npm install` fails with
	// SELF_SIGNED_CERT_IN_CHAIN where the host's own npm works. The file is
	// bound read-only for the step only and never lands in a layer.
	TrustBundle string
}

// HostTrustBundles are where Debian- and Red Hat-family hosts keep their
// trust store; the first that exists is a box's default TrustBundle.
var HostTrustBundles = []string{"/etc/ssl/certs/ca-certificates.crt", "/etc/pki/tls/certs/ca-bundle.crt"}

// stepTrustBundle is where a step sees Options.TrustBundle
// (NODE_EXTRA_CA_CERTS names it).
const stepTrustBundle = "/run/airlock-build/host-ca.crt"

// ErrBusy: another box holds the data dir's build lock (Options.NoWait).
var ErrBusy = errors.New("buildbox: another build holds the build sandbox")

// Default resources of a step (Step.Resources zero).
const (
	DefaultMemoryMB = 4096
	DefaultPidsMax  = 4096
)

// Box runs build steps. Its methods may be called from several goroutines;
// Close must be called once no Run is in flight.
type Box struct {
	opts Options
	dir  string
	log  *slog.Logger
	lock *os.File
	rt   *linux.Runtime
	nw   *netpolicy.Network
	ids  linux.IDMap
}

// Instance names what a box owns in the host's shared network state.
type Instance struct {
	Table, IfPrefix string
	CIDR            netip.Prefix
}

// InstanceOf derives the box's network names from the data dir. A server's
// (cmd/airlock netInstanceOf) are table "airlock" or "airlock_<2 chars>",
// veth prefix "alk" or "a<2 chars>", range 10.77/16 or 10.100–199.x/16;
// the box's never collide with them: table "airlock_b<2 chars>", prefix
// "b<2 chars>", a /24 in 10.200–249.x.
func InstanceOf(dataDir string) Instance {
	h := fnv.New32a()
	_, _ = h.Write([]byte(filepath.Clean(dataDir)))
	v := h.Sum32()
	const digits = "0123456789abcdefghijklmnopqrstuvwxyz"
	tag := string([]byte{digits[v%36], digits[(v/36)%36]})
	addr := netip.AddrFrom4([4]byte{10, byte(200 + (v>>12)%50), byte(v >> 20), 0})
	return Instance{Table: "airlock_b" + tag, IfPrefix: "b" + tag, CIDR: netip.PrefixFrom(addr, 24)}
}

// Open takes the data dir's build lock (waiting, cancellably, while another
// box holds it), sweeps what a crashed box left, and sets up the box's runtime
// and network.
func Open(ctx context.Context, opts Options) (_ *Box, retErr error) {
	if opts.DataDir == "" || opts.EnvdPath == "" {
		return nil, errors.New("buildbox: Options need DataDir and EnvdPath")
	}
	if _, err := os.Stat(opts.EnvdPath); err != nil {
		return nil, fmt.Errorf("buildbox: envd: %w", err)
	}
	log := opts.Logger
	if log == nil {
		log = slog.Default()
	}
	switch opts.TrustBundle {
	case "":
		for _, p := range HostTrustBundles {
			if _, err := os.Stat(p); err == nil {
				opts.TrustBundle = p
				break
			}
		}
	case "-":
		opts.TrustBundle = ""
	default:
		if _, err := os.Stat(opts.TrustBundle); err != nil {
			return nil, fmt.Errorf("buildbox: trust bundle: %w", err)
		}
	}
	b := &Box{opts: opts, dir: layout.DataDir{Root: opts.DataDir}.Build(), log: log, ids: linux.DefaultIDMap}
	if err := os.MkdirAll(b.dir, 0o700); err != nil {
		return nil, fmt.Errorf("buildbox: %w", err)
	}
	if err := b.takeLock(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			_ = b.Close()
		}
	}()
	rt, err := linux.NewWithOptions(filepath.Join(b.dir, "runtime"), log, linux.Options{IDMap: b.ids})
	if err != nil {
		return nil, fmt.Errorf("buildbox: %w", err)
	}
	b.rt = rt
	// We hold the lock: every sandbox of this runtime is a leftover.
	if ids, err := rt.List(); err == nil {
		for _, id := range ids {
			log.Info("buildbox: removing a leftover build sandbox", "id", id)
			if sb, err := rt.Load(id); err == nil {
				if err := sb.Destroy(ctx); err != nil {
					log.Warn("buildbox: leftover build sandbox", "id", id, "err", err)
				}
			}
		}
	}
	if opts.Egress {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			return nil, fmt.Errorf("buildbox: enable IPv4 forwarding for build egress: %w", err)
		}
	}
	inst := InstanceOf(opts.DataDir)
	nw, err := netpolicy.New(netpolicy.Config{
		CIDR:         inst.CIDR,
		StateDir:     filepath.Join(b.dir, "network"),
		Table:        inst.Table,
		IfPrefix:     inst.IfPrefix,
		DNSUpstreams: opts.DNSUpstreams,
		NoEgress:     !opts.Egress,
		// The operator's build steps reach a company's package mirror or
		// proxy, usually on a private address; a step of an API key's build
		// gets them closed by its own policy (Step.Network).
		AllowPrivate: netpolicy.PrivateRanges,
		Logger:       log,
	})
	if err != nil {
		return nil, fmt.Errorf("buildbox: network: %w", err)
	}
	b.nw = nw
	nw.Sweep(nil)
	// Step dirs of a crashed box (their sandboxes are gone by now).
	if err := os.RemoveAll(filepath.Join(b.dir, "steps")); err != nil {
		log.Warn("buildbox: leftover step dirs", "err", err)
	}
	return b, nil
}

// takeLock flocks <build>/lock. flock(2) cannot be interrupted by a context,
// so a busy lock is polled.
func (b *Box) takeLock(ctx context.Context) error {
	f, err := os.OpenFile(filepath.Join(b.dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("buildbox: lock: %w", err)
	}
	said := false
	for {
		err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			b.lock = f
			return nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			f.Close()
			return fmt.Errorf("buildbox: lock: %w", err)
		}
		if b.opts.NoWait {
			f.Close()
			return ErrBusy
		}
		if !said {
			b.log.Info("buildbox: another build holds this data dir's build sandbox; waiting", "lock", f.Name())
			said = true
			if b.opts.Waiting != nil {
				done := b.opts.Waiting(f.Name())
				defer done()
			}
		}
		select {
		case <-ctx.Done():
			f.Close()
			return fmt.Errorf("buildbox: waiting for the build lock: %w", ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// Close tears down, in order, what Open made: the network (DNS forwarder,
// nftables table) and the lock.
func (b *Box) Close() error {
	var errs []error
	if b.nw != nil {
		if err := b.nw.Close(); err != nil {
			errs = append(errs, err)
		}
		if err := b.nw.RemoveTable(); err != nil {
			errs = append(errs, err)
		}
		b.nw = nil
	}
	if b.lock != nil {
		b.lock.Close()
		b.lock = nil
	}
	if len(errs) > 0 {
		return fmt.Errorf("buildbox: close: %w", errors.Join(errs...))
	}
	return nil
}

// Step is one command to run.
type Step struct {
	Lower     string // parent rootfs, read-only, never written
	Upper     string // empty dir on the same fs as <DataDir>/build; receives the step's writes, kept
	Args      []string
	Env       []string
	Cwd       string
	User      string
	Resources runtime.Resources // zero → defaults: all host CPUs, 4096 MB, 4096 pids
	// Network narrows what the step reaches beyond the box's own egress
	// (internet and every private range): a step of a build an API key
	// asked for gets the private ranges denied (template.BuildRequest.Untrusted).
	Network netpolicy.Policy
}

// Run runs one step to completion and returns its exit code (a non-zero exit is not an error; err is
// for failures to run it at all). Output streams to out as it is produced. When Run returns, nothing of
// the sandbox is left but Upper, whose ownership is already shifted back to image ids
// (layer.ShiftOwnership) and from which the artefacts of mount points the box created (files/dirs that
// exist in upper only because a bind mount needed a target, e.g. /etc/resolv.conf, /etc/hosts,
// /usr/local/bin/envd, /run/airlock — only when absent from Lower) are removed. Cancelling ctx kills
// the step and cleans up.
//
// A step killed by a signal reports 128+signal, as a shell does.
func (b *Box) Run(ctx context.Context, st Step, out io.Writer) (exitCode int, err error) {
	if len(st.Args) == 0 {
		return -1, errors.New("buildbox: step has no command")
	}
	if fi, err := os.Stat(st.Lower); err != nil || !fi.IsDir() {
		return -1, fmt.Errorf("buildbox: lower %s is not a directory (%v)", st.Lower, err)
	}
	if names, err := readNames(st.Upper); err != nil {
		return -1, fmt.Errorf("buildbox: upper: %w", err)
	} else if len(names) > 0 {
		return -1, fmt.Errorf("buildbox: upper %s is not empty", st.Upper)
	}
	if out == nil {
		out = io.Discard
	}
	idb := make([]byte, 5)
	_, _ = rand.Read(idb)
	id := "s" + hex.EncodeToString(idb) // 11 chars: the veth name takes 12
	stepDir := filepath.Join(b.dir, "steps", id)
	runDir := filepath.Join(stepDir, "run")
	logPath := filepath.Join(stepDir, "output")
	if err := os.MkdirAll(runDir, 0o700); err != nil {
		return -1, fmt.Errorf("buildbox: %w", err)
	}
	r := &run{b: b, id: id, stepDir: stepDir}
	defer func() {
		if cerr := r.cleanup(st); cerr != nil {
			if err == nil {
				exitCode, err = -1, cerr
			} else {
				b.log.Warn("buildbox: cleanup after a failed step", "id", id, "err", cerr)
			}
		}
	}()

	// The upper's root is the merged root's: give it lower's mode, so that
	// the step's layer does not change / unless the step does.
	var lst unix.Stat_t
	if err := unix.Stat(st.Lower, &lst); err != nil {
		return -1, fmt.Errorf("buildbox: %w", err)
	}
	if err := unix.Chmod(st.Upper, lst.Mode&0o7777); err != nil {
		return -1, fmt.Errorf("buildbox: %w", err)
	}
	ns, err := b.nw.Setup(ctx, id, st.Network)
	if err != nil {
		return -1, fmt.Errorf("buildbox: step network: %w", err)
	}
	r.net = true
	env := st.Env
	if b.opts.TrustBundle != "" && !hasEnv(env, "NODE_EXTRA_CA_CERTS") {
		env = append(slices.Clip(env), "NODE_EXTRA_CA_CERTS="+stepTrustBundle)
	}
	spec, err := json.Marshal(envdapi.StepSpec{
		Args: st.Args, Env: env, Cwd: st.Cwd, User: st.User,
		ExitFile: envdapi.StepExitFile,
	})
	if err != nil {
		return -1, fmt.Errorf("buildbox: %w", err)
	}
	res := st.Resources
	if res.CPUs == 0 {
		res.CPUs = float64(goruntime.NumCPU())
	}
	if res.MemoryMB == 0 {
		res.MemoryMB = DefaultMemoryMB
	}
	if res.PidsMax == 0 {
		res.PidsMax = DefaultPidsMax
	}
	r.mounts = []runtime.Mount{
		{Source: b.opts.EnvdPath, Target: envdapi.BinaryPath, ReadOnly: true},
		// envd is also the MCP gateway: the SDK's Template.addMcpServer
		// runs `mcp-gateway pull` in a step.
		{Source: b.opts.EnvdPath, Target: envdapi.MCPGatewayPath, ReadOnly: true},
		{Source: runDir, Target: envdapi.RunDir},
		{Source: ns.ResolvConf, Target: "/etc/resolv.conf", ReadOnly: true},
		{Source: ns.Hosts, Target: "/etc/hosts", ReadOnly: true},
	}
	if b.opts.TrustBundle != "" {
		r.mounts = append(r.mounts, runtime.Mount{Source: b.opts.TrustBundle, Target: stepTrustBundle, ReadOnly: true})
	}
	r.artefacts = b.artefacts(st.Lower, r.mounts)
	sb, err := b.rt.Create(ctx, runtime.Spec{
		ID: id, Hostname: "build", Lower: st.Lower, Dir: filepath.Join(stepDir, "sandbox"), Upper: st.Upper,
		Mounts: r.mounts, NetNS: ns.NetNS, Resources: res,
		Init: runtime.Process{
			Args:    []string{envdapi.BinaryPath, "step"},
			Env:     []string{"PATH=" + envdapi.DefaultPath},
			Stdin:   spec,
			LogPath: logPath,
		},
	})
	if err != nil {
		return -1, fmt.Errorf("buildbox: start step sandbox: %w", err)
	}
	r.sb = sb
	if err := b.wait(ctx, sb, logPath, out); err != nil {
		return -1, err
	}
	result, err := envdapi.ReadStepResult(filepath.Join(runDir, envdapi.StepExitName))
	if err != nil {
		return -1, fmt.Errorf("buildbox: the step's init ended without a result (see its output): %w", err)
	}
	if result.Error != "" {
		return -1, fmt.Errorf("buildbox: step could not run: %s", result.Error)
	}
	return result.ExitCode, nil
}

// wait copies the step's output to out as it grows until the sandbox's first
// process has exited, or ctx is done.
func (b *Box) wait(ctx context.Context, sb runtime.Sandbox, logPath string, out io.Writer) error {
	var f *os.File
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	drain := func() {
		if f == nil {
			var err error
			if f, err = os.Open(logPath); err != nil {
				return
			}
		}
		_, _ = io.Copy(out, f)
	}
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		drain()
		st, err := sb.Status()
		if err != nil {
			return fmt.Errorf("buildbox: step status: %w", err)
		}
		if st == runtime.StatusStopped {
			drain()
			return nil
		}
		select {
		case <-ctx.Done():
			drain()
			return fmt.Errorf("buildbox: step cancelled: %w", ctx.Err())
		case <-time.After(delay):
		}
	}
}

// run is what one Run holds, for cleanup.
type run struct {
	b         *Box
	id        string
	stepDir   string
	sb        runtime.Sandbox
	net       bool
	mounts    []runtime.Mount
	artefacts []string
}

// cleanup tears the step down in order (sandbox, network, step dir), even
// when Run's context was cancelled, then makes Upper a clean diff: mount
// point artefacts removed, ids shifted back to the image's.
func (r *run) cleanup(st Step) error {
	ctx := context.Background()
	var errs []error
	if r.sb != nil {
		if err := r.sb.Destroy(ctx); err != nil {
			errs = append(errs, err)
		}
	} else if sb, err := r.b.rt.Load(r.id); err == nil {
		// Create failed half-way (it destroys what it made; be sure).
		if err := sb.Destroy(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	if r.net {
		if err := r.b.nw.Teardown(r.id); err != nil {
			errs = append(errs, err)
		}
	}
	if err := mountutil.RemoveAll(r.stepDir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		// Something may still be mounted over Upper's files: do not touch it.
		return fmt.Errorf("buildbox: tear down step %s: %w", r.id, errors.Join(errs...))
	}
	for _, p := range r.artefacts {
		if err := removeArtefact(st.Upper, p); err != nil {
			errs = append(errs, err)
		}
	}
	if err := layer.ShiftOwnership(st.Upper, r.b.ids.HostID, r.b.ids.Size); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("buildbox: step %s upper: %w", r.id, errors.Join(errs...))
	}
	return nil
}

// artefacts lists the paths (relative to the root, deepest first) that the
// runtime may create in the upper only as mount points: each bind target
// absent from lower, its parents absent from lower, and the kernel file
// system mount points (/proc, /sys, /dev) when lower lacks them.
func (b *Box) artefacts(lower string, mounts []runtime.Mount) []string {
	var out []string
	seen := map[string]bool{}
	add := func(p string) {
		for ; p != "/" && p != "." && !seen[p]; p = filepath.Dir(p) {
			if _, err := os.Lstat(filepath.Join(lower, p)); err == nil {
				return
			}
			seen[p] = true
			out = append(out, p)
		}
	}
	for _, m := range mounts {
		add(m.Target)
	}
	for _, p := range []string{"/proc", "/sys", "/dev"} {
		add(p)
	}
	return out // children are added before their parents
}

// removeArtefact removes a mount point the runtime created in upper: an empty
// file or an empty dir (never something the step filled).
func removeArtefact(upper, p string) error {
	full := filepath.Join(upper, p)
	fi, err := os.Lstat(full)
	if err != nil {
		return nil
	}
	switch {
	case fi.Mode().IsRegular() && fi.Size() == 0:
	case fi.IsDir():
		names, err := readNames(full)
		if err != nil || len(names) > 0 {
			return nil
		}
	default:
		return nil
	}
	if err := os.Remove(full); err != nil {
		return fmt.Errorf("remove mount point %s: %w", p, err)
	}
	return nil
}

func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return f.Readdirnames(-1)
}

// hasEnv reports whether env (KEY=value entries) sets key.
func hasEnv(env []string, key string) bool {
	for _, e := range env {
		if k, _, _ := strings.Cut(e, "="); k == key {
			return true
		}
	}
	return false
}
