// Package gvisor is the stronger runtime backend: every sandbox runs on gVisor's
// user-space kernel (the sentry, platform systrap), so the sandbox's system calls
// never reach the host kernel directly. It drives the runsc command line (create,
// start, state, pause, resume, checkpoint, restore, delete); no Go API of gVisor
// is linked in. Checkpoint and restore are described in checkpoint.go.
//
// On the host, a sandbox is:
//
//	<Spec.Dir>/upper, work   overlay upper and work dirs (the sandbox's writes);
//	                         Spec.Upper, when set, replaces <Spec.Dir>/upper and
//	                         survives Destroy (recorded as a bundle annotation)
//	<Spec.Dir>/rootfs        the overlay mount, handed to runsc as the OCI root
//	<Spec.Dir>/bundle        the OCI bundle (config.json)
//	<Spec.Dir>/runsc.log     runsc's own error messages from create or restore
//	<stateRoot>/             runsc --root: one state file per sandbox, the control
//	                         sockets, and runsc's shared "null-netns" pin
//	cgroup <each controller>/airlock/<id>   the sentry's and the gofer's host threads
//
// The root filesystem is the same host overlay as the linux backend's, passed to
// runsc with --overlay2=none: runsc's default would put a private in-memory (or
// rootfs-backed filestore) overlay on top, and the sandbox's writes would then not
// land in <Spec.Dir>/upper, where disk accounting and quotas look for them.
//
// Hardening: the OCI spec carries the same intent as the hardened linux backend:
// the same small capability set, no_new_privs (and no --allow-suid), no core
// dumps, a cgroup per sandbox with its memory, CPU and pids limits. There is no
// seccomp profile in the spec on purpose: the sandbox's processes talk to the
// sentry, which implements the Linux system call surface itself (namespaces,
// mounts, devices inside are the sentry's, not the host's), and runsc confines the
// sentry and the gofer with its own seccomp filters on the host. (runsc could load
// an OCI profile inside with --oci-seccomp, but it answers every denial with
// EPERM, and glibc only falls back from clone3 to clone on ENOSYS, so the linux
// profile would break thread creation.) Masked and read-only paths are left out
// too: runsc ignores them; the sentry's /proc and /sys are synthetic and expose no
// host kernel files, and /proc is mounted read-only as a whole instead.
package gvisor

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/opencontainers/cgroups"
	cgroupsfs "github.com/opencontainers/cgroups/fs"
	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/mountutil"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/usercgroup"
)

// CgroupParent is the cgroup under which every sandbox cgroup is created, the
// same parent as the linux backend's; nothing outside it is ever touched.
const CgroupParent = "/airlock"

// DefaultBinary is where scripts/setup.sh installs runsc.
const DefaultBinary = "/usr/local/bin/runsc"

// cidSuffix is appended to a sandbox id to make its runsc container id. runsc
// resolves ids by prefix and refuses an id that is the prefix of another ("d1"
// with "d10" present is "ambiguous"), even when an exact match exists. Sandbox
// ids are [a-z0-9]+, so with a suffix holding a character outside that set no
// container id can be the prefix of another.
const cidSuffix = "-gv"

// runscTimeout bounds one runsc invocation; create is the slowest, at about
// 0.1 s on an idle machine.
const runscTimeout = 60 * time.Second

var validID = regexp.MustCompile(`^[a-z0-9]+$`)

// Find returns the runsc binary to use: AIRLOCK_RUNSC if set, else runsc on
// PATH, else DefaultBinary. It fails when none is executable.
func Find() (string, error) {
	if p := os.Getenv("AIRLOCK_RUNSC"); p != "" {
		return exec.LookPath(p)
	}
	if p, err := exec.LookPath("runsc"); err == nil {
		return p, nil
	}
	if _, err := exec.LookPath(DefaultBinary); err != nil {
		return "", fmt.Errorf("gvisor runtime: runsc not found on PATH nor at %s (scripts/setup.sh builds it): %w", DefaultBinary, err)
	}
	return DefaultBinary, nil
}

// Runtime is the gVisor backend.
type Runtime struct {
	bin  string
	root string // runsc --root
	log  *slog.Logger
	cpus *runtime.CPUPicker
}

// New returns a backend keeping runsc's state under stateRoot, using the runsc
// binary Find reports.
func New(stateRoot string, log *slog.Logger) (*Runtime, error) {
	if log == nil {
		log = slog.Default()
	}
	bin, err := Find()
	if err != nil {
		return nil, err
	}
	root, err := filepath.Abs(stateRoot)
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: %w", err)
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("gvisor runtime: state dir: %w", err)
	}
	return &Runtime{bin: bin, root: root, log: log, cpus: &runtime.CPUPicker{Parent: CgroupParent}}, nil
}

func (r *Runtime) Name() string { return "gvisor" }

// SpendsNetNS is true: runsc strips the addresses of the namespace a sandbox
// joins (runtime.NetNSSpender).
func (r *Runtime) SpendsNetNS() bool { return true }

// flags are the global runsc flags. Every invocation gets the same set: runsc
// reads some of them in commands other than create (start scrapes the network
// according to its own --network, not create's).
func (r *Runtime) flags(network string) []string {
	return []string{
		"--root=" + r.root,
		"--platform=systrap",
		"--network=" + network,
		// envd listens on a unix socket in a directory bound from the host; the
		// host connects to it. "create" lets the sandbox create host sockets in
		// its bind mounts, and nothing more: it cannot connect to host sockets.
		"--host-uds=create",
		"--overlay2=none",
		// The sentry's CPU count (sysconf, /proc/cpuinfo, sysfs, affinity)
		// follows the cgroup's cpuset, which Create sizes to the sandbox's
		// CPUs. runsc's default derives it from the CFS quota instead, but
		// never below 2, so a 1-CPU sandbox would see 2.
		"--cpu-num-from-quota=false",
		// The sentry's cgroup v2 hierarchy inside the sandbox, where envd
		// holds the user's processes to the task limit (TasksMax). Its v1
		// hierarchies would not: v1 pids.max holds only by chance there
		// (internal/usercgroup).
		"--in-sandbox-cgroup=v2",
	}
}

// runsc runs one runsc command that is not create and returns its output; its
// error carries runsc's message.
func (r *Runtime) runsc(ctx context.Context, network string, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, runscTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.bin, append(r.flags(network), args...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		// A save that fails inside the sentry comes back with the sentry's
		// Go stack traces after the line that says why.
		if first, rest, ok := strings.Cut(msg, "\n"); ok && strings.Contains(rest, "goroutine ") {
			msg = strings.TrimSuffix(first, ":")
		}
		return out, fmt.Errorf("runsc %s: %w: %s", args[0], err, msg)
	}
	return out, nil
}

func cid(id string) string { return id + cidSuffix }

// Create assembles the root filesystem and the OCI bundle, then creates and
// starts the sandbox with runsc.
//
// Spec.Dir may already hold the writable layer of an earlier sandbox that was
// Released (a pause that kept the files but not the processes): the sandbox
// then boots afresh on it. A Create that fails removes only what it made: a
// Dir that held a layer before keeps it.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (_ runtime.Sandbox, retErr error) {
	s, fresh, err := r.prepare(spec)
	if err != nil {
		return nil, err
	}
	defer func() {
		if retErr != nil {
			s.undo(context.WithoutCancel(ctx), fresh)
		}
	}()
	bundle, err := s.assemble(spec)
	if err != nil {
		return nil, err
	}
	if spec.NetNS != "" && spec.NetLink != nil {
		// runsc joins NetNS itself: the interfaces go there.
		if err := spec.NetLink(spec.NetNS); err != nil {
			return nil, fmt.Errorf("gvisor runtime: network of %s: %w", spec.ID, err)
		}
	}
	if err := r.launch(ctx, spec, s.dir, spec.Init.Stdin, "create", "--bundle="+bundle, cid(spec.ID)); err != nil {
		return nil, err
	}
	if _, err := r.runsc(ctx, s.network, "start", cid(spec.ID)); err != nil {
		return nil, fmt.Errorf("gvisor runtime: start %s: %w", spec.ID, err)
	}
	return s, nil
}

// prepare validates spec and returns the handle of the sandbox it describes,
// and whether Spec.Dir was fresh (absent or empty) before, so that a failed
// Create or Restore knows whether Dir is its to remove.
func (r *Runtime) prepare(spec runtime.Spec) (*sandbox, bool, error) {
	if spec.ID == "" || spec.Dir == "" || spec.Lower == "" || len(spec.Init.Args) == 0 {
		return nil, false, errors.New("gvisor runtime: spec needs ID, Dir, Lower and Init.Args")
	}
	if !validID.MatchString(spec.ID) {
		return nil, false, fmt.Errorf("gvisor runtime: sandbox id %q: want [a-z0-9]+", spec.ID)
	}
	if err := runtime.CheckUpper(spec); err != nil {
		return nil, false, fmt.Errorf("gvisor runtime: %w", err)
	}
	// runsc's control socket lives in --root; a unix socket path has 108 bytes.
	if sock := filepath.Join(r.root, "runsc-"+cid(spec.ID)+".sock"); len(sock) >= 108 {
		return nil, false, fmt.Errorf("gvisor runtime: control socket path %s is too long for a unix socket; use a shorter state dir", sock)
	}
	dir, err := filepath.Abs(spec.Dir)
	if err != nil {
		return nil, false, fmt.Errorf("gvisor runtime: %w", err)
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, false, fmt.Errorf("gvisor runtime: %w", err)
	}
	network := "none"
	if spec.NetNS != "" {
		network = "sandbox"
	}
	return &sandbox{rt: r, id: spec.ID, dir: dir, network: network, upper: spec.Upper}, len(entries) == 0, nil
}

// undo tears down a sandbox whose Create or Restore failed: everything, or,
// when Dir held a writable layer before, everything but Dir.
func (s *sandbox) undo(ctx context.Context, fresh bool) {
	if fresh {
		_ = s.Destroy(ctx)
	} else {
		_ = s.Release(ctx)
	}
}

// assemble mounts the root overlay and writes the OCI bundle; it returns the
// bundle directory.
func (s *sandbox) assemble(spec runtime.Spec) (string, error) {
	rootfs, err := mountOverlay(spec.Lower, s.dir, s.upperDir())
	if err != nil {
		return "", err
	}
	bundle := filepath.Join(s.dir, "bundle")
	if err := os.MkdirAll(bundle, 0o700); err != nil {
		return "", fmt.Errorf("gvisor runtime: %w", err)
	}
	cfg, err := json.Marshal(ociSpec(spec, rootfs, s.rt.cpus.Pick(spec.ID, spec.Resources.CPUs)))
	if err != nil {
		return "", fmt.Errorf("gvisor runtime: config: %w", err)
	}
	if err := os.WriteFile(filepath.Join(bundle, "config.json"), cfg, 0o600); err != nil {
		return "", fmt.Errorf("gvisor runtime: config: %w", err)
	}
	return bundle, nil
}

// launch runs the runsc command that brings a sandbox up (create, or restore
// --detach), which forks the sentry and the gofer. The first process gets
// runsc's own stdio: stdin from an unlinked file holding stdin (empty: the
// null device), stdout and stderr appended to Spec.Init.LogPath. Files, not
// pipes, so that the sandbox outlives us.
func (r *Runtime) launch(ctx context.Context, spec runtime.Spec, dir string, stdin []byte, args ...string) error {
	in, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer in.Close()
	if len(stdin) > 0 {
		f, err := os.CreateTemp(dir, ".stdin-*")
		if err != nil {
			return fmt.Errorf("gvisor runtime: stdin: %w", err)
		}
		defer f.Close()
		_ = os.Remove(f.Name())
		if _, err := f.Write(stdin); err != nil {
			return fmt.Errorf("gvisor runtime: stdin: %w", err)
		}
		if _, err := f.Seek(0, 0); err != nil {
			return fmt.Errorf("gvisor runtime: stdin: %w", err)
		}
		in = f
	}
	out, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	if spec.Init.LogPath != "" {
		out.Close()
		out, err = os.OpenFile(spec.Init.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
		if err != nil {
			return fmt.Errorf("gvisor runtime: log: %w", err)
		}
	}
	defer out.Close()
	// runsc's stderr is the sandbox's, so its error messages are taken from
	// --log, where runsc writes them as JSON lines. A Dir reused from an
	// earlier sandbox holds that one's log: start afresh, so that an error
	// reported is this launch's.
	errLog := filepath.Join(dir, "runsc.log")
	if err := os.Remove(errLog); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("gvisor runtime: %w", err)
	}
	network := "none"
	if spec.NetNS != "" {
		network = "sandbox"
	}
	ctx, cancel := context.WithTimeout(ctx, runscTimeout)
	defer cancel()
	argv := append(append(r.flags(network), "--log="+errLog), args...)
	bin := r.bin
	if choom, err := exec.LookPath("choom"); err == nil {
		// See stubOOMScoreAdj: everything runsc forks starts at that score,
		// and runsc lowers the sentry's and the gofer's to the spec's
		// OOMScoreAdj (0) once they run.
		bin, argv = choom, append([]string{"-n", strconv.Itoa(stubOOMScoreAdj), "--", r.bin}, argv...)
	}
	cmd := exec.CommandContext(ctx, bin, argv...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = in, out, out
	// The sandbox and gofer processes runsc forks stay in this session; a new
	// one keeps a terminal's Ctrl-C on the server from reaching them (they are
	// re-adopted after a restart).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("gvisor runtime: %s %s: %w: %s", args[0], spec.ID, err, runscErrors(errLog))
	}
	return nil
}

// runscErrors returns the messages runsc wrote to its --log file.
func runscErrors(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no runsc log: " + err.Error() + ")"
	}
	var msgs []string
	for _, line := range bytes.Split(b, []byte("\n")) {
		var e struct {
			Msg string `json:"msg"`
		}
		if json.Unmarshal(line, &e) == nil && e.Msg != "" {
			msgs = append(msgs, e.Msg)
		}
	}
	return strings.Join(msgs, "; ")
}

// mountOverlay mounts the template (read-only lower) under a writable upper
// at dir/rootfs, as the linux backend does; the work dir is in dir.
func mountOverlay(lower, dir, upper string) (string, error) {
	work, rootfs := filepath.Join(dir, "work"), filepath.Join(dir, "rootfs")
	for _, d := range []string{upper, work, rootfs} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", fmt.Errorf("gvisor runtime: %w", err)
		}
	}
	if err := unix.Mount("overlay", rootfs, "overlay", 0, runtime.OverlayOptions(lower, upper, work)); err != nil {
		return "", fmt.Errorf("gvisor runtime: mount overlay on %s: %w", rootfs, err)
	}
	return rootfs, nil
}

// Capabilities is the capability set of a sandbox's root (bounding, permitted
// and effective; nothing inheritable or ambient), the same as the hardened
// linux backend's and for the same reasons: what envd and package installation
// need (chown, file access across users, switching users, signalling, ports
// below 1024). Capabilities in gVisor are the sentry's, checked by the sentry.
// Without CAP_SYS_PTRACE, which the linux backend gives envd only to answer
// sysinfo(2) itself: here the sentry answers it with the sandbox's memory.
var Capabilities = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
	"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_NET_BIND_SERVICE",
}

// ociSpec is the runtime-spec document runsc creates the sandbox from; cpuset,
// when set, the host CPUs its cgroup may use (runtime.CPUPicker).
func ociSpec(spec runtime.Spec, rootfs, cpuset string) *specs.Spec {
	cwd := spec.Init.Cwd
	if cwd == "" {
		cwd = "/"
	}
	s := &specs.Spec{
		Version:  specs.Version,
		Root:     &specs.Root{Path: rootfs},
		Hostname: spec.Hostname,
		Process: &specs.Process{
			Args: spec.Init.Args,
			Env:  spec.Init.Env,
			Cwd:  cwd,
			// No setuid binary can raise privileges (and runsc runs without
			// --allow-suid, so the sentry ignores setuid bits anyway); sudo goes
			// through envd, as in the linux backend.
			NoNewPrivileges: true,
			// runsc writes it to the sentry and the gofer after start; see
			// stubOOMScoreAdj.
			OOMScoreAdj: &sentryOOMScoreAdj,
			Capabilities: &specs.LinuxCapabilities{
				Bounding: Capabilities, Permitted: Capabilities, Effective: Capabilities,
			},
			Rlimits: []specs.POSIXRlimit{
				// As in the linux backend: the usual soft limit, raisable to 65536;
				// no core dumps (they would land in the writable layer).
				{Type: "RLIMIT_NOFILE", Soft: 1024, Hard: 65536},
				{Type: "RLIMIT_CORE", Soft: 0, Hard: 0},
			},
		},
		Mounts: []specs.Mount{
			// Read-only: runsc ignores the OCI readonlyPaths (/proc/sys and the
			// like), so the whole of the sentry's /proc is; nothing in a sandbox
			// needs to write it, and /proc/sys is the sentry's state.
			{Destination: "/proc", Type: "proc", Source: "proc", Options: []string{"ro", "nosuid", "noexec", "nodev"}},
			{Destination: "/dev", Type: "tmpfs", Source: "tmpfs", Options: []string{"nosuid", "strictatime", "mode=755", "size=65536k"}},
			{Destination: "/dev/pts", Type: "devpts", Source: "devpts", Options: []string{"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}},
			{Destination: "/dev/shm", Type: "tmpfs", Source: "shm", Options: []string{"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}},
			{Destination: "/sys", Type: "sysfs", Source: "sysfs", Options: []string{"nosuid", "noexec", "nodev", "ro"}},
			// The sentry's cgroup v2 hierarchy (--in-sandbox-cgroup=v2 makes a
			// "cgroup" mount one). The init starts in a cgroup named after the
			// runsc container id, which the cgroup namespace shows as "/";
			// envd builds its task limit in it (usercgroup.SetupV2). Its
			// memory.max is not enforced; tools that size themselves from
			// memory (node) read the limit from /proc/meminfo, which the sentry
			// sizes to the memory limit.
			{Destination: "/sys/fs/cgroup", Type: "cgroup", Source: "cgroup", Options: []string{"nosuid", "noexec", "nodev"}},
		},
		Linux: &specs.Linux{
			Namespaces: []specs.LinuxNamespace{
				{Type: specs.PIDNamespace},
				{Type: specs.NetworkNamespace, Path: spec.NetNS},
				{Type: specs.IPCNamespace},
				{Type: specs.UTSNamespace},
				{Type: specs.MountNamespace},
				{Type: specs.CgroupNamespace},
			},
			CgroupsPath: CgroupParent + "/" + spec.ID,
			Resources:   &specs.LinuxResources{},
		},
	}
	runtime.ApplyToOCI(s, spec)
	if n := TasksMax(spec.Resources); n > 0 {
		s.Process.Env = append(s.Process.Env[:len(s.Process.Env):len(s.Process.Env)], usercgroup.TasksMaxEnv+"="+strconv.FormatInt(n, 10))
	}
	if cpuset != "" {
		if s.Linux.Resources.CPU == nil {
			s.Linux.Resources.CPU = &specs.LinuxCPU{}
		}
		s.Linux.Resources.CPU.Cpus = cpuset
	}
	if spec.Upper != "" {
		s.Annotations = map[string]string{upperAnnotation: spec.Upper}
	}
	return s
}

// TasksMax is the number of tasks (processes and threads) a sandbox may hold,
// enforced inside by envd in the sentry's cgroup v2 hierarchy
// (usercgroup.SetupV2): the host pids limit's count at most, and never more
// than the sandbox's memory can pay for. Every task of a gVisor sandbox costs
// the host memory beside the sandbox's own pages (systrap stub processes and
// threads, measured about 330 KB a task), charged to the sandbox's host memory
// cgroup; unbounded, a fork bomb fills that cgroup within seconds (issue 11).
// At one task per tasksMiB of memory, the tasks' host cost stays a sixth of
// the memory limit. 0 means no limit.
//
// Holding a tree at the limit is not the whole story inside gVisor: a tree
// that keeps creating tasks there (an os.fork() loop, a fork bomb) makes the
// sentry, which serves all tasks first come first served, answer envd's
// system calls tens of milliseconds late each (echo ok took 1-5 s), so envd's
// pid 1 kills such a tree (usercgroup.GuardStorms).
func TasksMax(res runtime.Resources) int64 {
	n := res.PidsMax
	if res.MemoryMB > 0 {
		byMem := max(res.MemoryMB/tasksMiB, minTasks)
		if n <= 0 || byMem < n {
			n = byMem
		}
	}
	return max(n, 0)
}

const (
	tasksMiB = 4
	// minTasks is the task limit of the smallest sandboxes: room for envd
	// (a few dozen threads) and a shell with its pipeline.
	minTasks = 128
)

// stubOOMScoreAdj is the host oom_score_adj of the sandbox's systrap stub
// processes (one per address space of the sandbox, holding its pages mapped),
// and sentryOOMScoreAdj the sentry's and the gofer's. When the sandbox's host
// memory cgroup is full, the host's OOM killer must pick a stub, never the
// sentry: a killed stub costs one process of the sandbox (the sentry kills
// the process whose address space it was, as a kernel OOM kill would), a
// killed sentry the whole sandbox, and the sentry, mapping all of the
// sandbox's memory, is otherwise the largest process of the cgroup. runsc is
// started at the stub score (choom), and every process it forks inherits it;
// runsc then lowers the sentry and the gofer to the spec's score, which needs
// no CAP_SYS_RESOURCE (this machine kind's root lacks it) because the raised
// score was never set as a minimum. Measured: a fork bomb that used to kill
// the sandbox within 5 s leaves the sentry running (the host OOM killer takes
// stubs). Not a full guarantee: the sentry's RSS counts the sandbox's memory
// plus the runsc binary's pages, which are charged elsewhere, so near a full
// cgroup its badness can pass a stub's (measured: with a 224-task os.fork()
// loop the OOM killer took the sentry). Hence TasksMax keeps the tasks' host
// cost well inside the limit.
const stubOOMScoreAdj = 1000

var sentryOOMScoreAdj = 0

// startTime returns a process's start time in clock ticks since boot
// (/proc/<pid>/stat, field 22).
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return 0, err
	}
	// The command name (field 2) may hold spaces; fields count from its ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// envdStubOOMScoreAdj is the host oom_score_adj of envd's stubs: the stubs
// that exist when envd first answers, before any user process has run (envd's
// pid 1 and server, and the odd stub systrap keeps for reuse). The host OOM
// killer then takes any user process's stub (1000) before envd's, and envd's
// before the sentry (0). Measured: an os.fork() loop held at the task limit
// (python processes copy their pages on write) filled the 512 MiB host memory
// cgroup, and with every stub at 1000 the OOM killer took envd's server; the
// sentry ran on with envd gone.
const envdStubOOMScoreAdj = 500

// userStubNice is the host nice value of the stubs that run user processes.
const userStubNice = 10

// EnvdReady implements runtime.EnvdReadier: envd's stubs get
// envdStubOOMScoreAdj. Lowering a score the process raised itself needs no
// CAP_SYS_RESOURCE (see stubOOMScoreAdj).
func (s *sandbox) EnvdReady() error {
	m, err := s.cgroup()
	if err != nil {
		return err
	}
	pids, err := cgroups.GetPids(m.Path("memory"))
	if err != nil {
		return fmt.Errorf("gvisor runtime: stubs of %s: %w", s.id, err)
	}
	// The first stub is systrap's stub initializer, from which every later
	// stub is cloned (and inherits its score): it keeps stubOOMScoreAdj.
	var stubs []int
	first, firstStart := -1, uint64(0)
	for _, pid := range pids {
		b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "oom_score_adj"))
		if err != nil || strings.TrimSpace(string(b)) != strconv.Itoa(stubOOMScoreAdj) {
			continue // gone, or the sentry or the gofer
		}
		start, err := startTime(pid)
		if err != nil {
			continue
		}
		stubs = append(stubs, pid)
		if first < 0 || start < firstStart {
			first, firstStart = pid, start
		}
	}
	var errs []error
	// The stubs cloned from now on run the user's code: at a higher nice,
	// the host scheduler gives the sentry and envd's stubs the sandbox's CPU
	// first (raising one's nice needs no privilege).
	if first >= 0 {
		if err := unix.Setpriority(unix.PRIO_PROCESS, first, userStubNice); err != nil {
			errs = append(errs, fmt.Errorf("nice of the stub initializer: %w", err))
		}
	}
	for _, pid := range stubs {
		if pid == first {
			continue
		}
		f := filepath.Join("/proc", strconv.Itoa(pid), "oom_score_adj")
		if err := os.WriteFile(f, []byte(strconv.Itoa(envdStubOOMScoreAdj)), 0); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("gvisor runtime: envd's stubs of %s: %w", s.id, err)
	}
	return nil
}

// upperAnnotation records Spec.Upper in the bundle, so that a Destroy after a
// restart (through Load) still knows where the writable layer is.
const upperAnnotation = "airlock.upper"

// Load re-attaches to a sandbox created earlier, by this or a previous process.
func (r *Runtime) Load(id string) (runtime.Sandbox, error) {
	if !validID.MatchString(id) || !r.exists(id) {
		return nil, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	st, err := r.state(id)
	if err != nil {
		return nil, err
	}
	network, upper := "none", ""
	var spec specs.Spec
	if b, err := os.ReadFile(filepath.Join(st.Bundle, "config.json")); err == nil && json.Unmarshal(b, &spec) == nil && spec.Linux != nil {
		for _, ns := range spec.Linux.Namespaces {
			if ns.Type == specs.NetworkNamespace && ns.Path != "" {
				network = "sandbox"
			}
		}
		upper = spec.Annotations[upperAnnotation]
	}
	return &sandbox{rt: r, id: id, dir: filepath.Dir(st.Bundle), network: network, upper: upper}, nil
}

// stateFiles returns the container ids runsc holds state for. Its state files
// are named <sandbox id>_sandbox:<container id>.state.
func (r *Runtime) stateFiles() ([]string, error) {
	entries, err := os.ReadDir(r.root)
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: list: %w", err)
	}
	var cids []string
	for _, e := range entries {
		name, ok := strings.CutSuffix(e.Name(), ".state")
		if !ok {
			continue
		}
		if _, c, ok := strings.Cut(name, "_sandbox:"); ok {
			cids = append(cids, c)
		}
	}
	return cids, nil
}

func (r *Runtime) exists(id string) bool {
	matches, _ := filepath.Glob(filepath.Join(r.root, "*_sandbox:"+cid(id)+".state"))
	return len(matches) > 0
}

// List returns the ids of all sandboxes runsc holds state for.
func (r *Runtime) List() ([]string, error) {
	cids, err := r.stateFiles()
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range cids {
		if id, ok := strings.CutSuffix(c, cidSuffix); ok && validID.MatchString(id) {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// ociState is what `runsc state` prints.
type ociState struct {
	Status string `json:"status"`
	Pid    int    `json:"pid"`
	Bundle string `json:"bundle"`
}

func (r *Runtime) state(id string) (ociState, error) {
	out, err := r.runsc(context.Background(), "none", "state", cid(id))
	if err != nil {
		if !r.exists(id) {
			return ociState{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
		}
		return ociState{}, fmt.Errorf("gvisor runtime: state of %s: %w", id, err)
	}
	var st ociState
	if err := json.Unmarshal(out, &st); err != nil {
		return ociState{}, fmt.Errorf("gvisor runtime: state of %s: %w", id, err)
	}
	return st, nil
}

type sandbox struct {
	rt      *Runtime
	id, dir string
	network string
	upper   string // Spec.Upper; "" means <dir>/upper
}

func (s *sandbox) ID() string { return s.id }

// upperDir is where the sandbox's writes land.
func (s *sandbox) upperDir() string {
	if s.upper != "" {
		return s.upper
	}
	return filepath.Join(s.dir, "upper")
}

func (s *sandbox) Status() (runtime.Status, error) {
	st, err := s.rt.state(s.id)
	if err != nil {
		return "", err
	}
	switch st.Status {
	case "created", "running":
		return runtime.StatusRunning, nil
	case "paused":
		// runsc checks that the sentry lives only for a created or running
		// sandbox; a paused one whose sentry died (killed after its
		// checkpoint, or by the host's OOM killer) stays "paused" in its state.
		if !sentryAlive(st.Pid, cid(s.id)) {
			return runtime.StatusStopped, nil
		}
		return runtime.StatusPaused, nil
	default:
		return runtime.StatusStopped, nil
	}
}

// sentryAlive reports whether pid is the running sentry of the runsc
// container cid: its command line is runsc-sandbox's, ending with cid (an
// exited process, even one not yet reaped, has none).
func sentryAlive(pid int, cid string) bool {
	if pid <= 0 {
		return false
	}
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	args := strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00")
	return len(args) > 1 && args[0] == "runsc-sandbox" && args[len(args)-1] == cid
}

// cgroup returns a manager for the sandbox's cgroup (only read and removed;
// runsc creates it and applies the limits).
func (s *sandbox) cgroup() (*cgroupsfs.Manager, error) {
	m, err := cgroupsfs.NewManager(&cgroups.Cgroup{Path: CgroupParent + "/" + s.id, Resources: &cgroups.Resources{}}, nil)
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: cgroup of %s: %w", s.id, err)
	}
	return m, nil
}

// Stats reads the sandbox's host cgroup: the memory and CPU the sentry and the
// gofer use on the host, which is what the sandbox costs (the sentry's own
// accounting, `runsc events --stats`, leaves its overhead out and costs a runsc
// exec per sample). Pids counts host threads of the sentry and gofer, not the
// processes inside.
func (s *sandbox) Stats() (runtime.Stats, error) {
	m, err := s.cgroup()
	if err != nil {
		return runtime.Stats{}, err
	}
	st, err := m.GetStats()
	if err != nil {
		return runtime.Stats{}, fmt.Errorf("gvisor runtime: stats: %w", err)
	}
	out := runtime.Stats{Time: time.Now()}
	out.CPUUsage = time.Duration(st.CpuStats.CpuUsage.TotalUsage)
	mem := st.MemoryStats
	out.MemoryCache = int64(mem.Cache)
	out.MemoryUsed = int64(mem.Usage.Usage) - int64(mem.Cache)
	if out.MemoryUsed < 0 {
		out.MemoryUsed = int64(mem.Usage.Usage)
	}
	out.MemoryLimit = int64(mem.Usage.Limit)
	out.Pids = int64(st.PidsStats.Current)
	out.OOMKills = oomKills(m.Path("memory"))
	out.WritableBytes = runtime.DiskUsage(s.upperDir())
	return out, nil
}

// oomKills reads the kernel's OOM kill counter of a v1 memory cgroup.
func oomKills(dir string) int64 {
	b, err := os.ReadFile(filepath.Join(dir, "memory.oom_control"))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	return 0
}

// Pause stops every task in the sentry (runsc pause); the host threads stay in
// the cgroup, not frozen, but run nothing of the sandbox's.
func (s *sandbox) Pause() error {
	if _, err := s.rt.runsc(context.Background(), s.network, "pause", cid(s.id)); err != nil {
		return fmt.Errorf("gvisor runtime: pause %s: %w", s.id, err)
	}
	return nil
}

func (s *sandbox) Resume() error {
	if _, err := s.rt.runsc(context.Background(), s.network, "resume", cid(s.id)); err != nil {
		return fmt.Errorf("gvisor runtime: resume %s: %w", s.id, err)
	}
	return nil
}

// Destroy tears down in order: what Release frees (the sandbox, anything left
// in its cgroup, the cgroup, the overlay mount, runsc's null-netns pin once no
// sandbox is left), then the sandbox directory.
func (s *sandbox) Destroy(ctx context.Context) error {
	errs := s.release(ctx)
	if err := mountutil.RemoveAll(s.dir); err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return fmt.Errorf("gvisor runtime: destroy %s: %w", s.id, errors.Join(errs...))
	}
	return nil
}

// release frees everything the sandbox holds on the host but its directory:
// runsc delete --force kills the sentry and the gofer, paused or not, and
// removes runsc's state and the cgroup; then anything left in the cgroup, the
// cgroup, the overlay mount, and runsc's null-netns pin once no sandbox is
// left.
func (s *sandbox) release(ctx context.Context) []error {
	var errs []error
	if s.rt.exists(s.id) {
		if _, err := s.rt.runsc(ctx, s.network, "delete", "--force", cid(s.id)); err != nil && s.rt.exists(s.id) {
			errs = append(errs, err)
		}
	}
	if err := s.removeCgroup(ctx); err != nil {
		errs = append(errs, err)
	}
	if err := mountutil.Unmount(filepath.Join(s.dir, "rootfs")); err != nil {
		errs = append(errs, err)
	}
	s.rt.releaseNullNetNS()
	s.rt.cpus.Release(s.id)
	return errs
}

// removeCgroup kills whatever is still in the sandbox's cgroup (after a failed
// delete, or a runsc that died half-way) and removes the cgroup. Every pid in
// it is the sandbox's: the cgroup is /airlock/<id>.
func (s *sandbox) removeCgroup(ctx context.Context) error {
	m, err := s.cgroup()
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		pids, _ := cgroups.GetAllPids(m.Path("memory"))
		if len(pids) == 0 || time.Now().After(deadline) {
			break
		}
		for _, pid := range pids {
			_ = unix.Kill(pid, unix.SIGKILL)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
	if err := m.Destroy(); err != nil {
		return fmt.Errorf("remove cgroup: %w", err)
	}
	return nil
}

// releaseNullNetNS unmounts runsc's <root>/null-netns once no sandbox is left.
// runsc bind-mounts an empty network namespace there for its gofers to share
// and never removes it; the mount would outlive us and, copied into later
// mount namespaces, break CRIU dumps. A create racing with this only loses the
// shared pin (runsc then makes a new one), never its sandbox.
func (r *Runtime) releaseNullNetNS() {
	if cids, err := r.stateFiles(); err != nil || len(cids) > 0 {
		return
	}
	path := filepath.Join(r.root, "null-netns")
	for unix.Unmount(path, unix.MNT_DETACH) == nil {
	}
	_ = os.Remove(path)
}
