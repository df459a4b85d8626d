// Package runtime defines what an isolation backend must do for Airlock (the
// Runtime and Sandbox interfaces, Spec, Resources) and holds what every
// backend shares in carrying it out: the OCI spec fields of a Spec
// (ApplyToOCI), the host CPUs a sandbox runs on (CPUPicker) and disk usage
// (diskusage.go). Backends live in sub-packages (runtime/linux, runtime/gvisor)
// and all of them must pass the conformance suite in runtime/runtimetest.
//
// Lifecycle of one sandbox, as the sandbox manager drives it:
//
//	Create  -> the root filesystem is assembled (template lower + private upper),
//	           namespaces and cgroups exist, and Spec.Init is running as the
//	           sandbox's first process. Create returns once the process has been
//	           started; readiness of what it serves is the caller's business.
//	Stats   -> resource usage, any number of times while it runs.
//	Pause / Resume -> freeze and thaw every process (optional for a backend:
//	           ErrNotSupported).
//	Destroy -> ordered teardown: every process is killed (the namespaces they
//	           held go with them) and the cgroup removed, then the mounts
//	           (the overlay and the views bound into it), then the sandbox
//	           directory; a Spec.Upper outside it and a prepared network
//	           namespace (Spec.NetNS, the caller's) stay, though not
//	           necessarily the interfaces the sandbox used (a backend with a
//	           namespace of its own drops them with it; Checkpointer.Release
//	           is what keeps them for a restore). Destroy is idempotent
//	           and must leave nothing behind even if Create failed half-way.
//
// A backend must survive the restart of the process that drives it: Load finds a
// sandbox created by an earlier process (for re-adoption), and List reports every
// sandbox the backend still holds so that orphans can be destroyed.
package runtime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// ErrNotFound is returned by Load for an id the backend does not hold.
var ErrNotFound = errors.New("runtime: sandbox not found")

// ErrNotSupported is returned by optional operations a backend lacks.
var ErrNotSupported = errors.New("runtime: operation not supported")

// ErrBusy is a checkpoint that failed because a process was caught in the
// middle of something the checkpointer cannot save but that ends by itself
// (a netlink reply not yet read, as glibc's getaddrinfo has for a moment; a
// task in uninterruptible sleep, as a write is while a slow disk drains):
// the processes run on as they were, and the same checkpoint a moment
// later, with the sandbox thawed in between, succeeds.
var ErrBusy = errors.New("runtime: a process was in the middle of a kernel exchange; try again")

// Runtime creates and tracks sandboxes.
type Runtime interface {
	// Name identifies the backend ("linux", "gvisor").
	Name() string
	// Create starts a sandbox described by spec.
	Create(ctx context.Context, spec Spec) (Sandbox, error)
	// Load returns a sandbox created earlier, possibly by another process.
	Load(id string) (Sandbox, error)
	// List returns the ids of every sandbox the backend holds, running or not.
	List() ([]string, error)
}

// Sandbox is one isolated environment.
type Sandbox interface {
	ID() string
	// Status reports whether the first process is alive.
	Status() (Status, error)
	// Stats samples resource usage.
	Stats() (Stats, error)
	Pause() error
	Resume() error
	// Destroy tears everything down; see the package doc. Safe to call twice.
	Destroy(ctx context.Context) error
}

// Checkpointer is implemented by a Sandbox whose processes can be saved to
// disk and brought back by the backend's Restorer. The lifecycle of a pause to
// disk is:
//
//	Checkpoint(ImageDir)           -> every process's memory, files, sockets and
//	                                  namespaces are in ImageDir; the processes are
//	                                  gone and the sandbox is stopped, but Spec.Dir
//	                                  (its writable layer) is intact
//	Release                        -> the stopped sandbox's host resources (cgroups,
//	                                  mounts, backend state) are freed, Spec.Dir kept
//	Restorer.Restore(spec, ImageDir) -> the same processes run again, from a Spec
//	                                  whose Dir holds that writable layer
//
// With LeaveRunning the sandbox runs on after Checkpoint (snapshots and forks):
// the caller freezes it (Pause) first when the writable layer must be copied
// in the same instant as the memory, and thaws it (Resume) after.
type Checkpointer interface {
	Checkpoint(ctx context.Context, opts CheckpointOptions) error
	// Release frees what a sandbox holds on the host except Spec.Dir: its
	// processes are killed if any are left, its cgroups, mounts and backend
	// state are removed. A later Create or Restore with the same Spec.Dir
	// finds the writable layer as it was. Destroy after Release removes Dir.
	Release(ctx context.Context) error
}

// CheckpointChecker is implemented by a Checkpointer that can tell, without
// touching the sandbox, that Checkpoint would refuse it as it is set up (the
// linux runtime: a network namespace CRIU cannot save). The manager asks
// before it quiesces envd for a checkpoint (envdapi.QuiesceSignal), which
// costs the process trees running then their sysinfo view: a quiesce for a
// checkpoint that cannot happen would cost it for nothing.
type CheckpointChecker interface {
	// CanCheckpoint returns nil, or an error wrapping ErrNotSupported that
	// says why Checkpoint cannot save the sandbox.
	CanCheckpoint() error
}

// CheckpointOptions tell Checkpoint where to write and whether the sandbox
// stops.
type CheckpointOptions struct {
	// ImageDir receives the image; it is created (0700) and must be empty.
	ImageDir string
	// LeaveRunning keeps the processes running after the image is written.
	LeaveRunning bool
}

// Restorer is implemented by a Runtime that restores checkpoints.
type Restorer interface {
	// Restore starts a sandbox described by spec from the image a Checkpoint
	// of this backend wrote to imageDir, which it only reads (any number of
	// Restores may use one image, one after another or at once). spec.Dir
	// holds the writable layer as it was at the checkpoint: the same
	// directory, or a copy of it. spec.ID may differ from the checkpointed
	// sandbox's (a fork), and so may spec.NetNS and the mount sources;
	// mount targets, Lower and Init must be the checkpointed sandbox's.
	// spec.Init is not started: the image's processes are.
	Restore(ctx context.Context, spec Spec, imageDir string) (Sandbox, error)
}

// ResourceStatter is implemented by a Sandbox that can sample its resource
// use without Stats.WritableBytes, whose measurement walks the writable
// layer. The manager uses it when it accounts the disk itself (a disk pool's
// quota) and samples every live sandbox.
type ResourceStatter interface {
	// ResourceStats is Stats with WritableBytes left 0.
	ResourceStats() (Stats, error)
}

// EnvdReadier is implemented by a Sandbox that has something to do once envd
// answers and before any user process runs: the manager calls EnvdReady once,
// right after a create. (gVisor marks envd's host stub processes.)
type EnvdReadier interface {
	EnvdReady() error
}

// RootViewer is implemented by a Sandbox whose root filesystem the host can
// read at a path, through the very mount the sandbox runs on (the linux
// runtime's overlay), so that what the host looks up there is cached for the
// sandbox too.
type RootViewer interface {
	// RootPath is the host path of the sandbox's root filesystem.
	RootPath() string
}

// InitSignaler is implemented by a Sandbox whose first process the host can
// send a signal to. The manager quiesces and wakes envd, the first process,
// this way around every checkpoint (envdapi.QuiesceSignal): the host cannot
// reach envd over its socket while envd has closed it.
type InitSignaler interface {
	// SignalInit sends sig to the sandbox's first process (in a restored
	// sandbox, the restored one). What a signal the process has no handler
	// for does differs between backends (the host kernel drops it for a pid
	// namespace's init; gVisor's sentry applies its default action), so a
	// caller sends only signals the first process handles.
	SignalInit(sig syscall.Signal) error
}

// Status of a sandbox's first process.
type Status string

const (
	StatusRunning Status = "running"
	StatusPaused  Status = "paused"
	StatusStopped Status = "stopped"
)

// Spec describes a sandbox to create.
type Spec struct {
	// ID is unique among live sandboxes; [a-z0-9]+.
	ID string
	// Hostname inside the sandbox.
	Hostname string
	// Lower is the template's read-only root filesystem directory. It is never
	// written to; it is shared by every sandbox of the template.
	Lower string
	// Dir is a host directory that belongs to this sandbox alone. The backend keeps
	// its writable layer and mount points under it and removes it on Destroy.
	Dir string
	// Mounts are host paths bound into the sandbox (the envd binary, the envd
	// socket directory).
	Mounts []Mount
	// Init is the first process (envd). It runs as root inside the sandbox.
	Init Process
	// Resources are the limits the backend enforces.
	Resources Resources
	// NetNS is the path of a network namespace (a bind-mounted nsfs file) the
	// sandbox joins; the caller owns it and its interfaces. Empty means a new,
	// private namespace with only loopback.
	NetNS string
	// NetLink, with NetNS, puts the sandbox's interfaces into the network
	// namespace at the path it is given. A backend calls it once per Create
	// (never on Restore), before the sandbox's first process runs, with the
	// namespace the sandbox will use: its own, where the backend makes one,
	// or NetNS itself. nil: the interfaces are in NetNS already, and a
	// backend with a namespace of its own moves them there, which waits out
	// an RCU grace period per interface (15-20 ms measured); a veth made in
	// place costs none of that.
	NetLink func(netns string) error
	// Upper, when set, is the directory that receives the sandbox's writes instead of <Dir>/upper, and
	// Destroy leaves it in place: a template build keeps it as a layer. It must be on the filesystem of
	// Dir (overlay's work dir stays in Dir) and must not be inside Dir.
	Upper string
}

// CheckUpper validates Spec.Upper against Spec.Dir for a backend: absolute,
// and not inside Dir (Destroy removes Dir and must leave Upper).
func CheckUpper(spec Spec) error {
	if spec.Upper == "" {
		return nil
	}
	if !filepath.IsAbs(spec.Upper) {
		return fmt.Errorf("runtime: Upper %q must be an absolute path", spec.Upper)
	}
	dir, err := filepath.Abs(spec.Dir)
	if err != nil {
		return fmt.Errorf("runtime: %w", err)
	}
	if rel, err := filepath.Rel(dir, filepath.Clean(spec.Upper)); err == nil && rel != ".." && !strings.HasPrefix(rel, "../") {
		return fmt.Errorf("runtime: Upper %s is inside Dir %s, which Destroy removes", spec.Upper, spec.Dir)
	}
	return nil
}

// OverlayOptions are the mount options of a sandbox's root overlay. Both
// redirect_dir and metacopy are forced off, whatever the kernel's defaults
// (CONFIG_OVERLAY_FS_REDIRECT_DIR / _METACOPY, module parameters): with them on,
// a renamed directory is stored in upper as a redirect xattr pointing into lower,
// and a chmod/chown copies up metadata only, with the data still read from lower.
// An upper dir kept as a template layer (Spec.Upper) is then applied on its own,
// outside overlayfs, so it must be a self-contained diff: every file in it has
// its data, every directory its full contents or lower's at the same path.
func OverlayOptions(lower, upper, work string) string {
	return "lowerdir=" + lower + ",upperdir=" + upper + ",workdir=" + work + ",redirect_dir=off,metacopy=off"
}

// Mount binds a host path into the sandbox.
type Mount struct {
	Source   string
	Target   string
	ReadOnly bool
	// IDMapped says the files under Source carry the ids the sandbox sees
	// (uid 1000 is the sandbox's uid 1000), not the host ids a backend that
	// shifts ids gives them (a volume, shared by sandboxes and written by
	// the host without one): such a backend mounts it through the
	// sandbox's id map, and leaves its owner as it is.
	IDMapped bool
}

// Process is a command to start in the sandbox.
type Process struct {
	Args []string
	Env  []string
	Cwd  string
	// Stdin is written to the process's stdin, which is then closed.
	Stdin []byte
	// LogPath receives the process's stdout and stderr (a host path); empty means
	// discard. A file, not a pipe, so the process outlives its creator.
	LogPath string
}

// Resources are the cgroup limits of a sandbox.
type Resources struct {
	CPUs     float64 // CPU quota in cores
	MemoryMB int64
	PidsMax  int64
}

// Stats is a resource-usage sample.
type Stats struct {
	Time          time.Time
	CPUUsage      time.Duration // cumulative CPU time of all processes
	MemoryUsed    int64         // bytes, without page cache
	MemoryCache   int64         // bytes of page cache
	MemoryLimit   int64         // bytes
	Pids          int64
	WritableBytes int64 // bytes used by the sandbox's private writable layer
	// OOMKills counts processes the kernel killed because the sandbox reached
	// its memory limit, since the sandbox started.
	OOMKills int64
}
