// Package linux is the default runtime backend: Linux namespaces, cgroups and
// pivot_root through runc's libcontainer, driven in-process.
//
// libcontainer starts every container by re-executing the current binary with the
// argument "init" inside the new namespaces. Every binary that links this package
// must therefore call MaybeInit first thing in main (or TestMain).
//
// On the host, a sandbox is:
//
//	<Spec.Dir>/upper, work   overlay upper and work dirs (the sandbox's writes)
//	<Spec.Dir>/rootfs        the overlay mount point, pivot_root'ed into
//	<stateRoot>/<id>/        libcontainer's state (survives our restarts)
//	cgroup <each controller>/airlock/<id>
package linux

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"syscall"
	"time"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	// The device cgroup rules and the namespace-joining C constructor are
	// registered by import; without them container start fails.
	_ "github.com/opencontainers/cgroups/devices"
	_ "github.com/opencontainers/runc/libcontainer/nsenter"

	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// MaybeInit turns this process into libcontainer's container init when it was
// started as one ("<binary> init"). It does not return in that case.
//
// It must be called from an init function of package main: it also pins the
// main goroutine to the main thread. libcontainer joins a container's mount
// namespace from a locked goroutine that then exits; were that on the main
// thread, the thread would be parked (not killed) inside the sandbox, and
// /proc/self, which follows the main thread, would show the sandbox's mounts.
func MaybeInit() {
	goruntime.LockOSThread()
	if len(os.Args) > 1 && os.Args[1] == "init" {
		libcontainer.Init()
	}
}

// CgroupParent is the cgroup under which every sandbox cgroup is created. It
// belongs to Airlock alone; nothing outside it is ever touched.
const CgroupParent = "/airlock"

// Runtime is the libcontainer backend.
type Runtime struct {
	stateRoot string
	log       *slog.Logger
}

// New returns a backend keeping libcontainer state under stateRoot.
func New(stateRoot string, log *slog.Logger) (*Runtime, error) {
	if log == nil {
		log = slog.Default()
	}
	if err := os.MkdirAll(stateRoot, 0o700); err != nil {
		return nil, fmt.Errorf("linux runtime: state dir: %w", err)
	}
	return &Runtime{stateRoot: stateRoot, log: log}, nil
}

func (r *Runtime) Name() string { return "linux" }

// Create assembles the root filesystem and starts Spec.Init in new namespaces.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (_ runtime.Sandbox, retErr error) {
	if spec.ID == "" || spec.Dir == "" || spec.Lower == "" || len(spec.Init.Args) == 0 {
		return nil, errors.New("linux runtime: spec needs ID, Dir, Lower and Init.Args")
	}
	s := &sandbox{id: spec.ID, dir: spec.Dir, stateRoot: r.stateRoot, log: r.log}
	defer func() {
		if retErr != nil {
			_ = s.Destroy(context.WithoutCancel(ctx))
		}
	}()
	rootfs, err := mountOverlay(spec.Lower, spec.Dir)
	if err != nil {
		return nil, err
	}
	cfg, err := containerConfig(spec, rootfs)
	if err != nil {
		return nil, err
	}
	c, err := libcontainer.Create(r.stateRoot, spec.ID, cfg)
	if err != nil {
		return nil, fmt.Errorf("linux runtime: create container: %w", err)
	}
	s.c = c
	proc, closeStdio, err := initProcess(spec)
	if err != nil {
		return nil, err
	}
	err = c.Run(proc)
	closeStdio()
	if err != nil {
		return nil, fmt.Errorf("linux runtime: start init: %w", err)
	}
	// The init process is our child until we exit; reap it so it does not stay a
	// zombie. After a restart of ours, the host's init reaps it instead.
	s.reaped = make(chan struct{})
	go func() {
		_, _ = proc.Wait()
		close(s.reaped)
	}()
	return s, nil
}

// Load re-attaches to a sandbox created earlier, by this or a previous process.
func (r *Runtime) Load(id string) (runtime.Sandbox, error) {
	c, err := libcontainer.Load(r.stateRoot, id)
	if err != nil {
		if errors.Is(err, libcontainer.ErrNotExist) {
			return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
		}
		return nil, fmt.Errorf("linux runtime: load %s: %w", id, err)
	}
	cfg := c.Config()
	return &sandbox{id: id, dir: filepath.Dir(cfg.Rootfs), stateRoot: r.stateRoot, c: c, log: r.log}, nil
}

// List returns the ids of all containers with state on disk.
func (r *Runtime) List() ([]string, error) {
	entries, err := os.ReadDir(r.stateRoot)
	if err != nil {
		return nil, fmt.Errorf("linux runtime: list: %w", err)
	}
	var ids []string
	for _, e := range entries {
		if e.IsDir() {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// mountOverlay mounts the template (read-only lower) under a private writable
// upper at dir/rootfs. The template itself is never copied or written.
func mountOverlay(lower, dir string) (string, error) {
	upper, work, rootfs := filepath.Join(dir, "upper"), filepath.Join(dir, "work"), filepath.Join(dir, "rootfs")
	for _, d := range []string{upper, work, rootfs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("linux runtime: %w", err)
		}
	}
	opts := "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", rootfs, "overlay", 0, opts); err != nil {
		return "", fmt.Errorf("linux runtime: mount overlay on %s: %w", rootfs, err)
	}
	return rootfs, nil
}

// defaultCaps is Docker's default capability set: enough for envd (running as
// root in the sandbox) to switch users and chown, and for sudo to work, without
// SYS_ADMIN, SYS_MODULE, SYS_PTRACE, NET_ADMIN and the like.
var defaultCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD",
	"CAP_NET_RAW", "CAP_SETGID", "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP",
	"CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL", "CAP_AUDIT_WRITE",
}

func containerConfig(spec runtime.Spec, rootfs string) (*configs.Config, error) {
	s := specconv.Example()
	s.Root = &specs.Root{Path: rootfs}
	s.Hostname = spec.Hostname
	s.Process.Terminal = false
	s.Process.Args = spec.Init.Args
	s.Process.Env = spec.Init.Env
	s.Process.Cwd = "/"
	if spec.Init.Cwd != "" {
		s.Process.Cwd = spec.Init.Cwd
	}
	// sudo in the sandbox needs setuid to work, which no_new_privs forbids; the
	// sandbox's root is confined by namespaces, capabilities and cgroups instead.
	s.Process.NoNewPrivileges = false
	s.Process.Capabilities = &specs.LinuxCapabilities{
		Bounding: defaultCaps, Permitted: defaultCaps, Effective: defaultCaps,
	}
	s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Hard: 65536, Soft: 65536}}
	s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.CgroupNamespace})
	// Network: join the caller's prepared namespace (netns + veth, owned by the
	// sandbox manager) instead of a new one with only loopback.
	if spec.NetNS != "" {
		for i := range s.Linux.Namespaces {
			if s.Linux.Namespaces[i].Type == specs.NetworkNamespace {
				s.Linux.Namespaces[i].Path = spec.NetNS
			}
		}
	}
	for _, m := range spec.Mounts {
		opts := []string{"rbind", "nosuid", "nodev"}
		if m.ReadOnly {
			opts = append(opts, "ro")
		}
		s.Mounts = append(s.Mounts, specs.Mount{Source: m.Source, Destination: m.Target, Type: "bind", Options: opts})
	}
	res := spec.Resources
	if res.MemoryMB > 0 {
		limit := res.MemoryMB << 20
		s.Linux.Resources.Memory = &specs.LinuxMemory{Limit: &limit, Swap: &limit}
	}
	if res.CPUs > 0 {
		period := uint64(100000)
		quota := int64(res.CPUs * float64(period))
		s.Linux.Resources.CPU = &specs.LinuxCPU{Period: &period, Quota: &quota}
	}
	if res.PidsMax > 0 {
		s.Linux.Resources.Pids = &specs.LinuxPids{Limit: &res.PidsMax}
	}
	s.Linux.CgroupsPath = CgroupParent + "/" + spec.ID
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:   spec.ID,
		NoNewKeyring: true,
		Spec:         s,
	})
	if err != nil {
		return nil, fmt.Errorf("linux runtime: config: %w", err)
	}
	return cfg, nil
}

// initProcess builds the libcontainer process for Spec.Init. Its stdio are files,
// not pipes, so that the sandbox outlives the process that created it.
func initProcess(spec runtime.Spec) (*libcontainer.Process, func(), error) {
	var closers []*os.File
	closeAll := func() {
		for _, f := range closers {
			f.Close()
		}
	}
	stdin, err := os.Open(os.DevNull)
	if err != nil {
		return nil, nil, err
	}
	closers = append(closers, stdin)
	if len(spec.Init.Stdin) > 0 {
		// An unlinked temp file holds the input: it never appears in any
		// directory, and the process reads it from offset 0.
		f, err := os.CreateTemp(spec.Dir, ".stdin-*")
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("linux runtime: stdin: %w", err)
		}
		_ = os.Remove(f.Name())
		closers = append(closers, f)
		if _, err := f.Write(spec.Init.Stdin); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("linux runtime: stdin: %w", err)
		}
		if _, err := f.Seek(0, 0); err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("linux runtime: stdin: %w", err)
		}
		stdin = f
	}
	out, err := os.Open(os.DevNull)
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	if spec.Init.LogPath != "" {
		out.Close()
		out, err = os.OpenFile(spec.Init.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			closeAll()
			return nil, nil, fmt.Errorf("linux runtime: log: %w", err)
		}
	}
	closers = append(closers, out)
	cwd := spec.Init.Cwd
	if cwd == "" {
		cwd = "/"
	}
	p := &libcontainer.Process{
		Args:   spec.Init.Args,
		Env:    spec.Init.Env,
		Cwd:    cwd,
		Stdin:  stdin,
		Stdout: out,
		Stderr: out,
		Init:   true,
	}
	return p, closeAll, nil
}

type sandbox struct {
	id, dir   string
	stateRoot string
	c         *libcontainer.Container
	log       *slog.Logger
	// reaped is closed once we have reaped the init process; nil when the
	// sandbox was loaded and its init is not our child.
	reaped chan struct{}
}

func (s *sandbox) ID() string { return s.id }

func (s *sandbox) Status() (runtime.Status, error) {
	st, err := s.c.Status()
	if err != nil {
		return "", fmt.Errorf("linux runtime: status: %w", err)
	}
	switch st {
	case libcontainer.Running, libcontainer.Created:
		return runtime.StatusRunning, nil
	case libcontainer.Paused:
		return runtime.StatusPaused, nil
	default:
		return runtime.StatusStopped, nil
	}
}

func (s *sandbox) Stats() (runtime.Stats, error) {
	st, err := s.c.Stats()
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("linux runtime: stats: %w", err)
	}
	out := runtime.Stats{Time: time.Now()}
	if cg := st.CgroupStats; cg != nil {
		out.CPUUsage = time.Duration(cg.CpuStats.CpuUsage.TotalUsage)
		mem := cg.MemoryStats
		out.MemoryCache = int64(mem.Cache)
		out.MemoryUsed = int64(mem.Usage.Usage) - int64(mem.Cache)
		if out.MemoryUsed < 0 {
			out.MemoryUsed = int64(mem.Usage.Usage)
		}
		out.MemoryLimit = int64(mem.Usage.Limit)
		out.Pids = int64(cg.PidsStats.Current)
	}
	out.WritableBytes = diskUsage(filepath.Join(s.dir, "upper"))
	out.OOMKills = oomKills(s.c)
	return out, nil
}

// diskUsage sums the allocated blocks under dir, as du does; hard links inside
// the upper dir are rare enough that counting them twice is acceptable.
func diskUsage(dir string) int64 {
	var total int64
	_ = filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		}
		return nil
	})
	return total
}

func (s *sandbox) Pause() error {
	if err := s.c.Pause(); err != nil {
		return fmt.Errorf("linux runtime: pause: %w", err)
	}
	return nil
}

func (s *sandbox) Resume() error {
	if err := s.c.Resume(); err != nil {
		return fmt.Errorf("linux runtime: resume: %w", err)
	}
	return nil
}

// Destroy tears down in order: processes and cgroups (libcontainer kills every
// process of the cgroup, then removes it and its state), the overlay mount, and
// the sandbox directory with the writable layer.
func (s *sandbox) Destroy(ctx context.Context) error {
	var errs []error
	if s.c == nil {
		// Create failed before the container existed, or state was lost: there
		// may still be a container of that id on disk.
		if c, err := libcontainer.Load(s.stateRoot, s.id); err == nil {
			s.c = c
		}
	}
	if s.c != nil {
		// Killing the init of a pid namespace kills every process in it (and
		// libcontainer thaws a frozen cgroup first so the signal is delivered).
		if err := s.c.Signal(unix.SIGKILL); err != nil && !errors.Is(err, libcontainer.ErrNotRunning) {
			errs = append(errs, fmt.Errorf("kill: %w", err))
		}
		waitStopped(ctx, s.c)
		if s.reaped != nil {
			select {
			case <-s.reaped:
			case <-time.After(5 * time.Second):
			}
		}
		if err := s.c.Destroy(); err != nil {
			errs = append(errs, fmt.Errorf("destroy container: %w", err))
		}
	}
	if err := mountutil.Unmount(filepath.Join(s.dir, "rootfs")); err != nil {
		errs = append(errs, err)
	}
	if err := mountutil.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("linux runtime: destroy %s: %w", s.id, errors.Join(errs...))
	}
	return nil
}

// waitStopped waits until the init process is gone (reaped by us or, after a
// restart of ours, by the host's init); libcontainer refuses to destroy before.
func waitStopped(ctx context.Context, c *libcontainer.Container) {
	deadline := time.Now().Add(10 * time.Second)
	for delay := 100 * time.Microsecond; time.Now().Before(deadline); delay = min(2*delay, 20*time.Millisecond) {
		if st, err := c.Status(); err != nil || st == libcontainer.Stopped {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(delay):
		}
	}
}
