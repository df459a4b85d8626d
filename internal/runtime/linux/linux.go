// Package linux is the default runtime backend: Linux namespaces, cgroups and
// pivot_root through runc's libcontainer, driven in-process.
//
// libcontainer starts every container by re-executing the current binary with the
// argument "init" inside the new namespaces. Every binary that links this package
// must therefore call MaybeInit first thing in main (or TestMain).
//
// On the host, a sandbox is:
//
//	<Spec.Dir>/upper, work   overlay upper and work dirs (the sandbox's writes),
//	                         owned by the sandbox's mapped root; Spec.Upper, when
//	                         set, replaces <Spec.Dir>/upper and survives Destroy
//	<rootfsDir>/<key>-<id>   the overlay mount point, pivot_root'ed into
//	                         (see Options.RootfsDir for why it is not in Spec.Dir)
//	<stateRoot>/<id>/        libcontainer's state (survives our restarts)
//	<stateRoot>/.idmap/      idmapped views of templates (see idmapStore)
//	cgroup <each controller>/airlock/<id>
//
// Isolation layers, each of which must fail on its own for an escape:
// a user namespace (root inside is an unprivileged host uid), pid, mount, uts,
// ipc, net and cgroup namespaces, a small capability set (defaultCaps),
// no_new_privs, a seccomp allowlist (seccomp.go), runc's masked and read-only
// /proc and /sys paths, a devices cgroup that allows only the basic character
// devices, and cgroup limits. The conformance suite's escape tests
// (runtimetest/escape.go) try each escape from inside.
package linux

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	devices "github.com/opencontainers/cgroups/devices/config"
	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"github.com/opencontainers/runc/libcontainer/specconv"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"github.com/sirupsen/logrus"
	"golang.org/x/sys/unix"

	// The device cgroup rules and the namespace-joining C constructor are
	// registered by import; without them container start fails.
	_ "github.com/opencontainers/cgroups/devices"
	_ "github.com/opencontainers/runc/libcontainer/nsenter"

	"github.com/airlock-sandbox/airlock/internal/lxcfs"
	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/timing"
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
	if len(os.Args) > 1 && os.Args[1] == userNSHolderArg {
		holdUserNS()
	}
}

// CgroupParent is the cgroup under which every sandbox cgroup is created. It
// belongs to Airlock alone; nothing outside it is ever touched.
const CgroupParent = "/airlock"

// Runtime is the libcontainer backend.
type Runtime struct {
	stateRoot string
	log       *slog.Logger
	ids       IDMap
	idmaps    *idmapStore
	rootfsDir string
	// rootfsKey tells apart the roots of backends with different state dirs
	// (a daemon and test processes) in one RootfsDir.
	rootfsKey string
	// criuConfig is the CRIU configuration file of this backend's
	// checkpoints (writeCRIUConfig).
	criuConfig string
	// views serves the sandboxes' /proc views of their limits (nil: none);
	// viewsWarned keeps a missing lxcfs to one warning.
	views       *lxcfs.Service
	viewsWarned sync.Once
	cpus        *runtime.CPUPicker
	// disk is the blkio throttle sandboxes start with (SetDiskThrottle);
	// nil: none.
	disk atomic.Pointer[DiskThrottle]
}

// Options configure a backend beyond its state directory.
type Options struct {
	// IDMap is the host range the sandbox's uids and gids are shifted onto;
	// zero means DefaultIDMap. Every sandbox of a backend shares it: the
	// other layers (pid, mount, ipc namespaces) keep sandboxes apart, and one
	// range lets all of them share one idmapped view of each template.
	IDMap IDMap
	// RootfsDir holds the sandboxes' root mount points. Every directory on the
	// way to a root must be searchable by the sandbox's mapped root, an
	// unprivileged host uid: libcontainer's init resolves the path from inside
	// the user namespace. Data directories are usually private (0700), so the
	// roots live apart, in a directory made 0711 (search without listing),
	// as <hash of the state dir>-<id>. Empty means /run/airlock-rootfs.
	RootfsDir string
	// LXCFSDir is where lxcfs serves the sandboxes' views of their own
	// limits (limitsview.go); empty means lxcfs.DefaultDir. NoLXCFS turns
	// the views off: sandboxes then see the host's /proc/meminfo and CPUs.
	LXCFSDir string
	NoLXCFS  bool
}

// New returns a backend keeping libcontainer state under stateRoot, with
// default Options.
func New(stateRoot string, log *slog.Logger) (*Runtime, error) {
	return NewWithOptions(stateRoot, log, Options{})
}

// NewWithOptions returns a backend keeping libcontainer state under stateRoot.
func NewWithOptions(stateRoot string, log *slog.Logger, opts Options) (*Runtime, error) {
	if log == nil {
		log = slog.Default()
	}
	// libcontainer logs through logrus. At its default level it warns, at
	// every save of a sandbox's state, that it cannot serialize the
	// in-process hooks (netns.go, bootid.go), which are in-process by
	// design: a line per create in the server's log that says nothing. Its
	// failures come back to us as errors.
	logrus.SetLevel(logrus.ErrorLevel)
	ids := opts.IDMap
	if ids == (IDMap{}) {
		ids = DefaultIDMap
	}
	if ids.HostID == 0 || ids.Size == 0 {
		return nil, fmt.Errorf("linux runtime: id map %+v must start above host uid 0 and be non-empty", ids)
	}
	if err := os.MkdirAll(stateRoot, 0o700); err != nil {
		return nil, fmt.Errorf("linux runtime: state dir: %w", err)
	}
	rootfsDir := opts.RootfsDir
	if rootfsDir == "" {
		rootfsDir = "/run/airlock-rootfs"
	}
	if err := os.MkdirAll(rootfsDir, 0o711); err != nil {
		return nil, fmt.Errorf("linux runtime: rootfs dir: %w", err)
	}
	if err := os.Chmod(rootfsDir, 0o711); err != nil {
		return nil, fmt.Errorf("linux runtime: rootfs dir: %w", err)
	}
	abs, err := filepath.Abs(stateRoot)
	if err != nil {
		return nil, fmt.Errorf("linux runtime: state dir: %w", err)
	}
	h := sha256.Sum256([]byte(abs))
	idmaps := &idmapStore{dir: filepath.Join(stateRoot, ".idmap"), m: ids}
	if err := idmaps.prune(stateRoot); err != nil {
		log.Warn("linux runtime: pruning idmapped template views", "err", err)
	}
	r := &Runtime{
		stateRoot: stateRoot, log: log, ids: ids, rootfsDir: rootfsDir,
		rootfsKey: hex.EncodeToString(h[:6]),
		idmaps:    idmaps,
		cpus:      &runtime.CPUPicker{Parent: CgroupParent},
	}
	if r.criuConfig, err = writeCRIUConfig(stateRoot); err != nil {
		return nil, err
	}
	if !opts.NoLXCFS {
		dir := opts.LXCFSDir
		if dir == "" {
			dir = lxcfs.DefaultDir
		}
		r.views = &lxcfs.Service{Dir: dir, Log: log}
		// Started now so the first create does not wait for it; Create
		// checks again (and restarts a dead one) every time.
		r.viewDir()
	}
	return r, nil
}

// viewDir returns the live lxcfs mount point sandboxes bind their /proc
// views from, or "" when there is none: a sandbox then still starts, seeing
// the host's memory and CPUs (warned about once).
func (r *Runtime) viewDir() string {
	if r.views == nil {
		return ""
	}
	if err := r.views.Ensure(); err != nil {
		r.viewsWarned.Do(func() {
			r.log.Warn("linux runtime: sandboxes will see the host's memory and CPUs in /proc", "err", err)
		})
		return ""
	}
	return r.views.Dir
}

func (r *Runtime) Name() string { return "linux" }

// Create assembles the root filesystem and starts Spec.Init in new namespaces.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (runtime.Sandbox, error) {
	return r.start(ctx, spec, false, func(c *libcontainer.Container, proc *libcontainer.Process) error {
		if err := c.Run(proc); err != nil {
			return fmt.Errorf("linux runtime: start init: %w", err)
		}
		return nil
	})
}

// start assembles the root filesystem, namespaces and cgroups of spec and
// has run start the first process in them: Create runs Spec.Init, Restore
// the processes of a checkpoint. On error everything is torn down again
// (a Spec.Dir that held a writable layer before keeps it).
func (r *Runtime) start(ctx context.Context, spec runtime.Spec, restoring bool, run func(*libcontainer.Container, *libcontainer.Process) error) (_ runtime.Sandbox, retErr error) {
	if spec.ID == "" || spec.Dir == "" || spec.Lower == "" || len(spec.Init.Args) == 0 {
		return nil, errors.New("linux runtime: spec needs ID, Dir, Lower and Init.Args")
	}
	if err := runtime.CheckUpper(spec); err != nil {
		return nil, fmt.Errorf("linux runtime: %w", err)
	}
	s := &sandbox{
		id: spec.ID, dir: spec.Dir, rootfs: filepath.Join(r.rootfsDir, r.rootfsKey+"-"+spec.ID),
		stateRoot: r.stateRoot, log: r.log, idmaps: r.idmaps, upper: spec.Upper, cpus: r.cpus,
		hostID: int(r.ids.HostID),
	}
	// A Dir that holds a writable layer already (a pause without memory, a
	// restore) is not this attempt's to remove when it fails.
	_, statErr := os.Stat(spec.Dir)
	existed := statErr == nil
	defer func() {
		if retErr != nil {
			_ = s.teardown(context.WithoutCancel(ctx), !existed, true)
		}
	}()
	stop := timing.Start(ctx, "rt.idmap")
	lower, err := r.idmaps.acquire(spec.Lower, spec.ID)
	stop()
	if err != nil {
		return nil, fmt.Errorf("linux runtime: idmapped template: %w", err)
	}
	s.lower = lower
	stop = timing.Start(ctx, "rt.overlay")
	err = mountOverlay(lower, spec.Dir, s.upperDir(), s.rootfs, r.ids)
	stop()
	if err != nil {
		return nil, err
	}
	if err := r.chownWritableMounts(spec.Mounts); err != nil {
		return nil, err
	}
	cfg, err := containerConfig(spec, s.rootfs, r.ids, r.viewDir(), r.cpus.Pick(spec.ID, spec.Resources.CPUs), r.disk.Load())
	if err != nil {
		return nil, err
	}
	cfg.Labels = append(cfg.Labels, lowerLabel+lower, dirLabel+spec.Dir, criuConfigLabel+r.criuConfig)
	if spec.Upper != "" {
		cfg.Labels = append(cfg.Labels, upperLabel+spec.Upper)
	}
	if spec.NetNS != "" {
		s.parkNetNS = spec.NetNS
		if !restoring {
			s.netLink = spec.NetLink
		}
		cfg.Labels = append(cfg.Labels, netnsLabel+spec.NetNS)
		networkHook(ctx, cfg, s)
	}
	if !restoring && spec.Upper == "" {
		// Not for a build step (Spec.Upper): its writes become a template
		// layer, which must not carry a boot's id.
		bootIDHook(ctx, cfg, s.rootfs)
	}
	if restoring {
		if err := stageBindSources(cfg, s.stageDir(), r.idmaps); err != nil {
			return nil, err
		}
		defer unstageBindSources(s.stageDir())
	}
	stop = timing.Start(ctx, "rt.state")
	c, err := libcontainer.Create(r.stateRoot, spec.ID, cfg)
	stop()
	if err != nil {
		return nil, fmt.Errorf("linux runtime: create container: %w", err)
	}
	s.c = c
	// Before the init runs, so envd finds it from its first command on;
	// libcontainer creates the parent with the same path and removes both.
	stop = timing.Start(ctx, "rt.user_cgroups")
	err = makeUserCgroups(spec.ID, spec.Resources, int(r.ids.HostID))
	stop()
	if err != nil {
		return nil, err
	}
	proc, closeStdio, err := initProcess(spec)
	if err != nil {
		return nil, err
	}
	stop = timing.Start(ctx, "rt.start")
	err = run(c, proc)
	stop()
	closeStdio()
	if err != nil {
		return nil, err
	}
	// The init process is our child until we exit; reap it so it does not stay a
	// zombie. After a restart of ours, the host's init reaps it instead.
	s.reaped = make(chan struct{})
	if restoring {
		// CRIU restores the tree as our child (its sibling), but
		// libcontainer's handle for it signals and waits on CRIU, long gone:
		// a handle loaded from the state knows the init by pid, and we
		// reap it by pid.
		loaded, err := libcontainer.Load(r.stateRoot, spec.ID)
		if err != nil {
			return nil, fmt.Errorf("linux runtime: restored state: %w", err)
		}
		s.c = loaded
		st, err := loaded.State()
		if err != nil {
			return nil, fmt.Errorf("linux runtime: restored state: %w", err)
		}
		pid := st.InitProcessPid
		reapOnExit(pid, func() { waitPid(pid) }, s.reaped)
		s.detachRoot()
		return s, nil
	}
	pid, err := proc.Pid()
	if err != nil { // not after a run that worked; wait the blocking way then
		go func() {
			_, _ = proc.Wait()
			close(s.reaped)
		}()
		return s, nil
	}
	// libcontainer's Wait also releases what it holds for the process.
	reapOnExit(pid, func() { _, _ = proc.Wait() }, s.reaped)
	s.detachRoot()
	return s, nil
}

// detachRoot takes the sandbox's root off the server's mount namespace once
// its init runs on its own copy of it. Every sandbox start copies the
// server's namespace (libcontainer's CLONE_NEWNS) and walks each mount in
// it twice (making / a recursive slave, detaching the old root after
// pivot_root): with an overlay root left there per live sandbox, a start
// took 27 ms with 10 alive and 68 ms with 1,000. The sandbox keeps running
// on its copy, which holds the overlay; the host reaches that root through
// /proc/<init>/root (RootPath). CRIU's dump reads the init's own mounts and
// needs none at rootfs; a restore mounts the overlay there again, as a create
// does, and detaches it the same way. A detach that fails leaves the mount
// where it was, as before this existed: only slower starts for others.
func (s *sandbox) detachRoot() {
	if err := unix.Unmount(s.rootfs, unix.MNT_DETACH); err != nil {
		s.log.Warn("linux runtime: the sandbox's root stays mounted in the server's namespace", "id", s.id, "err", err)
		return
	}
	s.rootDetached = true
}

// waitPid reaps our child pid (gone already: nothing to do).
func waitPid(pid int) {
	var ws unix.WaitStatus
	for {
		if _, err := unix.Wait4(pid, &ws, 0, nil); err != unix.EINTR {
			return
		}
	}
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
	// Sandboxes made before the root moved out of Spec.Dir have no dir label.
	s := &sandbox{
		id: id, dir: filepath.Dir(cfg.Rootfs), rootfs: cfg.Rootfs,
		stateRoot: r.stateRoot, c: c, log: r.log, idmaps: r.idmaps, cpus: r.cpus,
		hostID: int(r.ids.HostID),
	}
	for _, l := range cfg.Labels {
		if v, ok := strings.CutPrefix(l, lowerLabel); ok {
			s.lower = v
		}
		if v, ok := strings.CutPrefix(l, dirLabel); ok {
			s.dir = v
		}
		if v, ok := strings.CutPrefix(l, upperLabel); ok {
			s.upper = v
		}
		if v, ok := strings.CutPrefix(l, netnsLabel); ok {
			s.parkNetNS = v
		}
	}
	if s.parkNetNS != "" {
		// Held from now on, as the start's hook holds it (netns.go); best
		// effort: without it a checkpoint binds the namespace by the pid.
		if pid, ok := s.initPid(); ok {
			_ = s.holdNSOf(pid)
		}
	}
	return s, nil
}

// Labels in libcontainer's state let a Destroy after a restart find what a
// sandbox holds: its idmapped template view, its Spec.Dir and its Spec.Upper
// (which Destroy must leave in place), and the caller's network namespace
// its interfaces go back to.
const (
	lowerLabel = "airlock.lower="
	dirLabel   = "airlock.dir="
	upperLabel = "airlock.upper="
	netnsLabel = "airlock.netns="
)

// List returns the ids of all containers with state on disk.
func (r *Runtime) List() ([]string, error) {
	entries, err := os.ReadDir(r.stateRoot)
	if err != nil {
		return nil, fmt.Errorf("linux runtime: list: %w", err)
	}
	var ids []string
	for _, e := range entries {
		// Dot entries are ours (the idmap store), not containers.
		if e.IsDir() && !strings.HasPrefix(e.Name(), ".") {
			ids = append(ids, e.Name())
		}
	}
	return ids, nil
}

// mountOverlay mounts the template (its idmapped, read-only view) under a
// private writable upper at rootfs; the work dir is in dir. The template itself
// is never copied or written. The host mounts the overlay, so its own xattrs
// (trusted.overlay.*) stay out of the sandbox's reach; upper and work belong to
// the sandbox's root so that what it writes is owned by its mapped ids on the
// host.
func mountOverlay(lower, dir, upper, rootfs string, ids IDMap) error {
	work := filepath.Join(dir, "work")
	for _, d := range []string{upper, work, rootfs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("linux runtime: %w", err)
		}
	}
	for _, d := range []string{upper, work} {
		if err := os.Chown(d, int(ids.HostID), int(ids.HostID)); err != nil {
			return fmt.Errorf("linux runtime: %w", err)
		}
	}
	if err := unix.Mount("overlay", rootfs, "overlay", 0, runtime.OverlayOptions(lower, upper, work)); err != nil {
		return fmt.Errorf("linux runtime: mount overlay on %s: %w", rootfs, err)
	}
	return nil
}

// chownWritableMounts gives the sandbox's root the writable bind mounts of its
// spec (envd's socket dir, a test's output dir): they belong to that sandbox,
// and its root is an unprivileged host uid that could not write them otherwise.
// Only the directory itself is chowned, not what may already be inside.
func (r *Runtime) chownWritableMounts(mounts []runtime.Mount) error {
	for _, m := range mounts {
		if m.ReadOnly || m.IDMapped {
			continue
		}
		if err := os.Chown(m.Source, int(r.ids.HostID), int(r.ids.HostID)); err != nil {
			return fmt.Errorf("linux runtime: give %s to the sandbox: %w", m.Source, err)
		}
	}
	return nil
}

// Capabilities is the capability set of a sandbox's root (bounding, permitted
// and effective; nothing inheritable or ambient): what envd and package
// installation need, all of it confined to the sandbox's user namespace. Each,
// and why:
//
//	CAP_CHOWN            envd creates files for users; dpkg and tar chown what they unpack
//	CAP_DAC_OVERRIDE     root (envd, apt) reads and writes files of any sandbox user
//	CAP_FOWNER           chmod/utime on files root does not own (dpkg, tar -p, envd)
//	CAP_FSETID           keep setgid bits when root chmods and chowns (dpkg)
//	CAP_SETUID           envd runs commands as the sandbox's users; apt drops to _apt
//	CAP_SETGID           same, for groups and supplementary groups
//	CAP_KILL             envd signals processes of any sandbox user
//	CAP_NET_BIND_SERVICE servers on ports below 1024 (port 80 is common in agents' code)
//	CAP_SYS_PTRACE       envd only: it answers sysinfo(2) for the sandbox's processes
//	                     by writing into the caller's memory (/proc/<pid>/mem), which
//	                     for another uid or a non-dumpable process needs it
//	                     (internal/sysinfo). Every thread of envd that forks a user
//	                     process drops it first, and no_new_privs keeps exec from
//	                     giving it back, so no user process, root's included, has
//	                     it; it reaches only processes of this user namespace.
//
// Dropped from Docker's default set: CAP_MKNOD (no device nodes; the devices
// cgroup would refuse them too), CAP_NET_RAW (raw sockets allow spoofing and
// have a long CVE history; it is only ping), CAP_SETFCAP and CAP_SETPCAP (file
// capabilities and capability juggling mean nothing under no_new_privs),
// CAP_SYS_CHROOT (nothing in the sandbox needs chroot) and CAP_AUDIT_WRITE.
var Capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
	"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_PTRACE",
}

// maskedPaths adds to runc's list (specconv.Example: /proc/kcore, keys,
// timer_list, sched_debug, acpi, asound, scsi, latency_stats, timer_stats,
// /sys/firmware) what Docker masks besides: RAPL energy counters (a power
// side channel) and /proc/interrupts (a timing side channel).
var extraMaskedPaths = []string{"/sys/devices/virtual/powercap", "/proc/interrupts"}

// allowedDevices are the only device nodes in a sandbox's /dev and the only
// ones its devices cgroup lets it open (never mknod): null, zero, full,
// random, urandom, tty, ptmx and the pts slaves.
var allowedDevices = []struct{ major, minor int64 }{
	{1, 3}, {1, 5}, {1, 7}, {1, 8}, {1, 9}, {5, 0}, {5, 2}, {136, devices.Wildcard},
}

// containerConfig is the libcontainer config of a sandbox. viewDir, when set,
// is the lxcfs mount its /proc and cpu/online views are bound from; cpuset,
// when set, the host CPUs it runs on (limitsview.go); disk, when set, its
// blkio throttle on the disk pool's device (diskio.go).
func containerConfig(spec runtime.Spec, rootfs string, ids IDMap, viewDir, cpuset string, disk *DiskThrottle) (*configs.Config, error) {
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
	// No setuid binary or file capability can raise privileges in the sandbox
	// (sudo is replaced by a shim that asks envd instead).
	s.Process.NoNewPrivileges = true
	s.Process.Capabilities = &specs.LinuxCapabilities{
		Bounding: Capabilities, Permitted: Capabilities, Effective: Capabilities,
	}
	s.Linux.MaskedPaths = append(s.Linux.MaskedPaths, extraMaskedPaths...)
	writableCgroupMount(s)
	s.Linux.Seccomp = seccompProfile()
	s.Linux.Namespaces = append(s.Linux.Namespaces,
		specs.LinuxNamespace{Type: specs.CgroupNamespace},
		specs.LinuxNamespace{Type: specs.UserNamespace})
	idm := []specs.LinuxIDMapping{{ContainerID: 0, HostID: ids.HostID, Size: ids.Size}}
	s.Linux.UIDMappings, s.Linux.GIDMappings = idm, idm
	runtime.ApplyToOCI(s, spec)
	applyDiskThrottle(s, disk)
	for _, m := range spec.Mounts {
		if !m.IDMapped {
			continue
		}
		// libcontainer makes it an idmapped bind mount: a file of uid n
		// under Source is uid n in the sandbox (HostID+n to the host).
		for i := range s.Mounts {
			if s.Mounts[i].Destination == m.Target && s.Mounts[i].Source == m.Source {
				s.Mounts[i].UIDMappings, s.Mounts[i].GIDMappings = idm, idm
			}
		}
	}
	if viewDir != "" {
		// After /proc and /sys (and a netns's sysfs) are mounted.
		s.Mounts = append(s.Mounts, viewMounts(viewDir)...)
	}
	if cpuset != "" {
		if s.Linux.Resources.CPU == nil {
			s.Linux.Resources.CPU = &specs.LinuxCPU{}
		}
		s.Linux.Resources.CPU.Cpus = cpuset
	}
	s.Linux.CgroupsPath = CgroupParent + "/" + spec.ID
	// specconv puts its package-level device nodes (AllowedDevices) into
	// every config and sets their owner on those shared nodes: concurrent
	// creates would write them at once, and each config would see the
	// others' writes. So configs are made one at a time, and each keeps
	// copies of its nodes (restrictDevices).
	specconvMu.Lock()
	cfg, err := specconv.CreateLibcontainerConfig(&specconv.CreateOpts{
		CgroupName:   spec.ID,
		NoNewKeyring: true,
		Spec:         s,
	})
	if err == nil {
		restrictDevices(cfg)
	}
	specconvMu.Unlock()
	if err != nil {
		return nil, fmt.Errorf("linux runtime: config: %w", err)
	}
	// specconv leaves the spec's process rlimits to its caller (runc's CLI
	// copies them), so they go on the config, which libcontainer applies to
	// the init process from the host with prlimit(2).
	cfg.Rlimits = rlimits()
	return cfg, nil
}

// writableCgroupMount drops "ro" from the sandbox's /sys/fs/cgroup mount. The
// mount shows only the sandbox's own cgroup (it is the root of the sandbox's
// cgroup namespace), and its files belong to the host's root, which the
// sandbox's root is not: the only files it can write are those of the "user"
// child given to it (makeUserCgroups), where envd places user processes.
func writableCgroupMount(s *specs.Spec) {
	for i, m := range s.Mounts {
		if m.Type != "cgroup" {
			continue
		}
		var opts []string
		for _, o := range m.Options {
			if o != "ro" {
				opts = append(opts, o)
			}
		}
		s.Mounts[i].Options = opts
	}
}

// rlimits of a sandbox's processes (they are inherited from init).
func rlimits() []configs.Rlimit {
	// The usual Linux default soft limit (select(2)-safe); a program that
	// needs more raises it up to the hard limit itself, as Go does at start.
	// Kernel memory for open files is charged to the sandbox's memory cgroup.
	// The hard limit is 65536, or ours if lower: raising it needs
	// CAP_SYS_RESOURCE, which a daemon may lack (this machine kind does).
	nofile := uint64(65536)
	var own unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &own); err == nil && own.Max < nofile {
		nofile = own.Max
	}
	return []configs.Rlimit{
		{Type: unix.RLIMIT_NOFILE, Soft: min(1024, nofile), Hard: nofile},
		// No core dumps, and no way to turn them back on: a core lands in the
		// writable layer (disk the sandbox is billed for) and may hold
		// secrets, and a host core_pattern handler such as systemd-coredump
		// would collect it on the host, honouring this limit.
		{Type: unix.RLIMIT_CORE, Soft: 0, Hard: 0},
	}
}

// specconvMu makes one libcontainer config at a time (see containerConfig).
var specconvMu sync.Mutex

// restrictDevices replaces what specconv adds on its own (mknod of any device,
// /dev/net/tun) with allowedDevices: those nodes only, readable and writable,
// never creatable. The nodes it keeps are copies, the config's own.
func restrictDevices(cfg *configs.Config) {
	allowed := func(major, minor int64) bool {
		for _, d := range allowedDevices {
			if d.major == major && (d.minor == devices.Wildcard || d.minor == minor) {
				return true
			}
		}
		return false
	}
	var nodes []*devices.Device
	for _, d := range cfg.Devices {
		if d.Type == devices.CharDevice && allowed(d.Major, d.Minor) {
			own := *d
			nodes = append(nodes, &own)
		}
	}
	cfg.Devices = nodes
	rules := []*devices.Rule{{Type: devices.WildcardDevice, Major: devices.Wildcard, Minor: devices.Wildcard, Permissions: "rwm", Allow: false}}
	for _, d := range allowedDevices {
		rules = append(rules, &devices.Rule{Type: devices.CharDevice, Major: d.major, Minor: d.minor, Permissions: "rw", Allow: true})
	}
	cfg.Cgroups.Resources.Devices = rules
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
	rootfs    string // the overlay mount point
	stateRoot string
	c         *libcontainer.Container
	log       *slog.Logger
	idmaps    *idmapStore
	// lower is the idmapped template view this sandbox holds, if any.
	lower string
	// upper is Spec.Upper: the writable layer kept after Destroy ("" means
	// <dir>/upper, removed with dir).
	upper string
	// reaped is closed once we have reaped the init process; nil when the
	// sandbox was loaded and its init is not our child.
	reaped chan struct{}
	// cpus is the runtime's cpuset picker; Destroy gives this sandbox's
	// CPUs back.
	cpus *runtime.CPUPicker
	// hostID is the host uid and gid of the sandbox's root.
	hostID int
	// parkNetNS is Spec.NetNS: where the sandbox's interfaces are kept
	// while it does not run (netns.go).
	parkNetNS string
	// netLink is Spec.NetLink on a Create: it makes the interfaces in the
	// sandbox's own namespace instead of their move from parkNetNS.
	netLink func(netns string) error
	// ownNS holds the sandbox's own network namespace open while this
	// process has it (netns.go); nil without a network of the caller's.
	ownNS *os.File
	// rootDetached says detachRoot took the root off the server's mount
	// namespace: the init's holds it alone. False while the root is
	// mounted at rootfs (before the start, or for a sandbox loaded after a
	// restart of ours).
	rootDetached bool
}

func (s *sandbox) ID() string { return s.id }

// upperDir is where the sandbox's writes land.
func (s *sandbox) upperDir() string {
	if s.upper != "" {
		return s.upper
	}
	return filepath.Join(s.dir, "upper")
}

// RootPath is where the host sees the sandbox's root (runtime.RootViewer):
// its init's root once detachRoot took the overlay off the server's mount
// namespace, the overlay mount point before.
func (s *sandbox) RootPath() string {
	if pid, ok := s.initPid(); ok && s.rootDetached {
		return fmt.Sprintf("/proc/%d/root", pid)
	}
	return s.rootfs
}

func (s *sandbox) Status() (runtime.Status, error) {
	if s.c == nil {
		return runtime.StatusStopped, nil
	}
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

func (s *sandbox) Pause() error {
	if s.c == nil {
		return fmt.Errorf("linux runtime: pause: sandbox %s is released", s.id)
	}
	if err := s.c.Pause(); err != nil {
		return fmt.Errorf("linux runtime: pause: %w", err)
	}
	return nil
}

func (s *sandbox) Resume() error {
	if s.c == nil {
		return fmt.Errorf("linux runtime: resume: sandbox %s is released", s.id)
	}
	if err := s.c.Resume(); err != nil {
		return fmt.Errorf("linux runtime: resume: %w", err)
	}
	return nil
}

// Destroy tears down in order: processes and cgroups (libcontainer kills every
// process of the cgroup, then removes it and its state), the overlay mount, and
// the sandbox directory with the writable layer (a Spec.Upper, outside the
// directory, stays).
func (s *sandbox) Destroy(ctx context.Context) error {
	// The caller tears its network down next: the interfaces go with
	// the sandbox's namespace instead of moving back (an RCU grace
	// period each).
	return s.teardown(ctx, true, false)
}

// teardown is Destroy, and with removeDir false Release: everything but
// Spec.Dir goes.
// teardown ends the sandbox and undoes its mounts; removeDir: Dir too;
// keepLinks: the interfaces go back into Spec.NetNS (for a later start)
// rather than with the sandbox's own namespace.
func (s *sandbox) teardown(ctx context.Context, removeDir, keepLinks bool) error {
	var errs []error
	if s.c == nil {
		// Create failed before the container existed, or state was lost: there
		// may still be a container of that id on disk.
		if c, err := libcontainer.Load(s.stateRoot, s.id); err == nil {
			s.c = c
		}
	}
	if s.c != nil {
		// Killing the init of a pid namespace kills every process in it,
		// and libcontainer thaws a frozen cgroup after signalling the init.
		// The other processes would then run until the kernel reaps the
		// namespace: a paused sandbox released after its checkpoint would
		// write to its files after the image was taken (CRIU then refuses
		// to restore a file whose size changed). So a frozen sandbox gets
		// SIGKILL queued to every process first: none runs again. Frozen
		// processes cannot exit, so their pids cannot be reused meanwhile.
		if st, err := s.c.Status(); err == nil && st == libcontainer.Paused {
			if pids, err := s.c.Processes(); err == nil {
				for _, pid := range pids {
					_ = unix.Kill(pid, unix.SIGKILL)
				}
			}
		}
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
	if err := mountutil.Unmount(s.rootfs); err != nil {
		errs = append(errs, err)
	} else if len(mountutil.MountedUnder(s.rootfs)) == 0 {
		if err := os.Remove(s.rootfs); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("remove %s: %w", s.rootfs, err))
		}
	}
	unstageBindSources(s.stageDir())
	// Sandboxes started by earlier versions joined the caller's network
	// namespace and had its sysfs mounted here.
	if err := mountutil.Unmount(filepath.Join(s.dir, "sys")); err != nil {
		errs = append(errs, err)
	}
	if err := s.detachNetwork(keepLinks); err != nil {
		errs = append(errs, err)
	}
	if err := s.idmaps.release(s.lower, s.id); err != nil {
		errs = append(errs, err)
	}
	if removeDir {
		if err := mountutil.RemoveAll(s.dir); err != nil {
			errs = append(errs, err)
		}
	}
	if s.cpus != nil {
		s.cpus.Release(s.id)
	}
	if len(errs) > 0 {
		return fmt.Errorf("linux runtime: destroy %s: %w", s.id, errors.Join(errs...))
	}
	s.c = nil
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
