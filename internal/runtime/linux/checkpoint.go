package linux

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/runc/libcontainer"
	"github.com/opencontainers/runc/libcontainer/configs"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Checkpoints go through CRIU, which libcontainer runs as plain `criu` from
// PATH (scripts/setup.sh installs CRIU >= 4.2 there: older ones fail on this
// kernel). What the options below are for:
//
//   - TcpEstablished: connections inside the sandbox's netns (the code
//     interpreter's kernels talk to envd over loopback TCP) are saved and
//     restored in repair mode; the netns is the caller's and outlives the
//     checkpoint, or is a fresh one for a fork, whose loopback is just as good.
//   - FileLocks: flock/fcntl locks held by sandbox processes (pip, sqlite).
//   - LinkRemap: a file open but unlinked (a deleted temp file) is saved
//     by linking it back under a hidden name rather than failing the dump.
//   - EmptyNs net, for a sandbox in the caller's network (netns.go): its
//     namespace's interfaces are the caller's, not the image's; a restore
//     gets a new namespace, into which the network hook moves them.
func criuOpts(imageDir, workDir string, leaveRunning, networked bool) *libcontainer.CriuOpts {
	o := &libcontainer.CriuOpts{
		ImagesDirectory: imageDir,
		WorkDirectory:   workDir,
		LeaveRunning:    leaveRunning,
		TcpEstablished:  true,
		FileLocks:       true,
		LinkRemap:       true,
	}
	if networked {
		o.EmptyNs = unix.CLONE_NEWNET
	}
	return o
}

// criuConfigLabel names, in a container's labels, the CRIU configuration
// file libcontainer hands CRIU (its settings override the RPC's).
const criuConfigLabel = "org.criu.config="

// criuSettings are what criuOpts cannot say through libcontainer:
//
//   - network-lock nftables: while it dumps TCP connections, CRIU drops the
//     sandbox netns's traffic (so a peer's data is not acknowledged after
//     the socket's queues were saved), and lifts that after. Its default,
//     iptables, runs iptables-restore for each; nftables does the same in
//     process, through libnftables.
const criuSettings = "network-lock nftables\n"

// writeCRIUConfig writes criuSettings into the state dir, returning its path.
func writeCRIUConfig(stateRoot string) (string, error) {
	path := filepath.Join(stateRoot, "criu.conf")
	if err := os.WriteFile(path, []byte(criuSettings), 0o644); err != nil {
		return "", fmt.Errorf("linux runtime: criu config: %w", err)
	}
	return path, nil
}

// CRIUAvailable reports whether checkpoints can work on this host: `criu
// check` passes for the criu on PATH. The error says what is missing.
func CRIUAvailable() error {
	path, err := exec.LookPath("criu")
	if err != nil {
		return errors.New("criu is not on PATH (scripts/setup.sh installs CRIU >= 4.2)")
	}
	out, err := exec.Command(path, "check").CombinedOutput()
	if err != nil {
		return fmt.Errorf("criu check failed: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Checkpoint implements runtime.Checkpointer with CRIU. Without LeaveRunning
// CRIU ends the processes once the image is written; when it fails, it lets
// them run on, so a failed checkpoint leaves the sandbox as it was.
func (s *sandbox) Checkpoint(ctx context.Context, opts runtime.CheckpointOptions) error {
	if s.c == nil {
		return fmt.Errorf("linux runtime: checkpoint: sandbox %s is released", s.id)
	}
	if opts.ImageDir == "" {
		return errors.New("linux runtime: checkpoint: no image directory")
	}
	if pid, ok := s.holdsSeccompListener(); ok {
		// envd answers sysinfo(2) through seccomp user notifications
		// (internal/sysinfo), and CRIU cannot save the listener's fd; envd
		// closes them when the manager quiesces it (envdapi.QuiesceSignal)
		// before a checkpoint. Checked first, so that a sandbox the
		// quiesce did not free says so whatever else stands in the way.
		return fmt.Errorf("linux runtime: checkpoint %s: %w: process %d holds a seccomp notification listener, which CRIU cannot save", s.id, runtime.ErrNotSupported, pid)
	}
	if err := s.CanCheckpoint(); err != nil {
		return err
	}
	if err := os.Mkdir(opts.ImageDir, 0o700); err != nil {
		return fmt.Errorf("linux runtime: checkpoint: %w", err)
	}
	// The dump ends every process: the namespace must outlive them, and a
	// restart of ours, until the release moves its interfaces back.
	if err := s.bindOwnNS(); err != nil {
		return err
	}
	if err := s.c.Checkpoint(criuOpts(opts.ImageDir, "", opts.LeaveRunning, s.parkNetNS != "")); err != nil {
		why := criuErrors(filepath.Join(opts.ImageDir, "dump.log"))
		return fmt.Errorf("linux runtime: checkpoint %s: %w%s", s.id, classifyDump(err, why), why)
	}
	// CRIU restores part of the tree from inside the sandbox's user
	// namespace and opens images there, first as an unmapped uid (before
	// the namespace's maps are written), then as its mapped root: the image
	// must be that root's, its directory searchable by any uid. Nothing in a
	// sandbox can reach the directory (it is outside every sandbox's mount
	// namespace, under the private data dir), and CRIU opens it by fd.
	if err := chownTree(opts.ImageDir, s.hostID); err != nil {
		return fmt.Errorf("linux runtime: checkpoint %s: %w", s.id, err)
	}
	if err := os.Chmod(opts.ImageDir, 0o711); err != nil {
		return fmt.Errorf("linux runtime: checkpoint %s: %w", s.id, err)
	}
	if err := runtime.SyncImage(opts.ImageDir); err != nil {
		return fmt.Errorf("linux runtime: checkpoint %s: %w", s.id, err)
	}
	if !opts.LeaveRunning && s.reaped != nil {
		// CRIU killed the processes; our child, the init, is reaped.
		select {
		case <-s.reaped:
		case <-ctx.Done():
		}
	}
	return nil
}

// CanCheckpoint implements runtime.CheckpointChecker.
func (s *sandbox) CanCheckpoint() error {
	if s.c == nil {
		return fmt.Errorf("linux runtime: checkpoint: sandbox %s is released", s.id)
	}
	if ns := s.c.Config().Namespaces; ns.PathOf(configs.NEWNET) != "" {
		// Only sandboxes started by earlier versions joined the caller's
		// network namespace, which CRIU cannot save (netns.go): CRIU dumps
		// a task only when every namespace it is in belongs to its user
		// namespace (criu/namespaces.c check_user_ns). Checked up front, so
		// the caller learns it without a failed dump.
		return fmt.Errorf("linux runtime: checkpoint %s: %w: the sandbox joined a network namespace made outside its user namespace, which CRIU cannot save", s.id, runtime.ErrNotSupported)
	}
	return nil
}

var _ runtime.CheckpointChecker = (*sandbox)(nil)

// Release implements runtime.Checkpointer.
func (s *sandbox) Release(ctx context.Context) error {
	return s.teardown(ctx, false, true)
}

// Restore implements runtime.Restorer: the sandbox is assembled as Create
// does, then CRIU brings the image's processes back into it instead of
// starting Spec.Init. CRIU's own files go to a work dir in Spec.Dir, so the
// image is only read.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, imageDir string) (runtime.Sandbox, error) {
	if _, err := os.Stat(filepath.Join(imageDir, "inventory.img")); err != nil {
		return nil, fmt.Errorf("linux runtime: restore: %s is not a checkpoint image: %w", imageDir, err)
	}
	// No stdin: the image's processes have their own.
	spec.Init.Stdin = nil
	work := filepath.Join(spec.Dir, ".criu")
	return r.start(ctx, spec, true, func(c *libcontainer.Container, proc *libcontainer.Process) error {
		_ = os.RemoveAll(work)
		err := c.Restore(proc, criuOpts(imageDir, work, false, spec.NetNS != ""))
		if err != nil {
			err = fmt.Errorf("linux runtime: restore %s: %w%s", spec.ID, err, criuErrors(filepath.Join(work, "restore.log")))
		} else {
			_ = os.RemoveAll(work)
		}
		return err
	})
}

// classifyDump wraps err, a failed dump whose CRIU log said why, in the
// runtime error the caller acts on:
//
//   - ErrNotSupported: a seccomp notification listener (one that appeared
//     after Checkpoint's own check), which CRIU cannot save;
//   - ErrBusy: what ends by itself, so that the same dump a moment later,
//     with the sandbox thawed in between, succeeds: a netlink reply not yet
//     read (glibc's getaddrinfo holds one for a moment), or a task CRIU
//     could not seize within its timeout because it sat in uninterruptible
//     sleep (state D: a write throttled while the disk is slow to take the
//     page cache, as on a loaded host).
func classifyDump(err error, why string) error {
	switch {
	case strings.Contains(why, "seccomp notify"):
		return fmt.Errorf("%w: %w", runtime.ErrNotSupported, err)
	case strings.Contains(why, "netlink: The socket has data to read"),
		strings.Contains(why, "Unseizable non-zombie") && strings.Contains(why, "state D"):
		return fmt.Errorf("%w: %w", runtime.ErrBusy, err)
	}
	return err
}

// criuErrors returns the lines of a CRIU log that report errors, so that a
// failed checkpoint or restore says why.
func criuErrors(log string) string {
	f, err := os.Open(log)
	if err != nil {
		return ""
	}
	defer f.Close()
	var lines []string
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if l := sc.Text(); strings.Contains(l, "Error") || strings.Contains(l, "error") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	if len(lines) > 8 {
		lines = lines[len(lines)-8:]
	}
	if len(lines) == 0 {
		return ""
	}
	return " (criu: " + strings.Join(lines, "; ") + ")"
}

// chownTree gives dir and everything in it to uid (and the same gid).
func chownTree(dir string, uid int) error {
	return filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		return os.Lchown(path, uid, uid)
	})
}

// stageDir is where a restore's bind-mount sources are staged (beside the
// root mount point, in the directory made for the mapped root to traverse).
func (s *sandbox) stageDir() string { return s.rootfs + ".src" }

// stageBindSources re-points every bind mount of cfg at a bind of its source
// under dir. CRIU mounts a restored sandbox's binds from inside its user
// namespace (open_tree of the source path), as the sandbox's mapped root,
// which cannot traverse the private directories most sources live in (the
// data dir, a test's temp dir). Create does not need this: libcontainer
// opens the sources from the host. The staged binds are needed only while
// CRIU mounts; unstageBindSources removes them. An idmapped bind (a
// volume's, runtime.Mount.IDMapped) is staged as an idmapped clone of its
// source through idmaps' user namespace: CRIU binds what it is given, so the
// restored mount maps ids as the one checkpointed did.
func stageBindSources(cfg *configs.Config, dir string, idmaps *idmapStore) error {
	if err := os.Mkdir(dir, 0o711); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("linux runtime: restore: %w", err)
	}
	for i, m := range cfg.Mounts {
		if m.Device != "bind" {
			continue
		}
		st, err := os.Stat(m.Source)
		if err != nil {
			return fmt.Errorf("linux runtime: restore: bind source: %w", err)
		}
		target := filepath.Join(dir, strconv.Itoa(i))
		if st.IsDir() {
			err = os.Mkdir(target, 0o711)
		} else {
			err = os.WriteFile(target, nil, 0o600)
		}
		if err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("linux runtime: restore: %w", err)
		}
		if m.IDMapping != nil {
			err = idmaps.mountIDMappedRW(m.Source, target)
		} else {
			err = unix.Mount(m.Source, target, "", unix.MS_BIND|unix.MS_REC, "")
		}
		if err != nil {
			return fmt.Errorf("linux runtime: restore: stage %s: %w", m.Source, err)
		}
		cfg.Mounts[i].Source = target
	}
	return nil
}

// unstageBindSources unmounts and removes what stageBindSources made.
func unstageBindSources(dir string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		_ = unix.Unmount(p, unix.MNT_DETACH)
		_ = os.Remove(p)
	}
	_ = os.Remove(dir)
}

// holdsSeccompListener reports a process of the sandbox holding a seccomp
// user-notification fd, and its host pid.
func (s *sandbox) holdsSeccompListener() (int, bool) {
	pids, err := s.c.Processes()
	if err != nil {
		return 0, false
	}
	for _, pid := range pids {
		dir := fmt.Sprintf("/proc/%d/fd", pid)
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if target, err := os.Readlink(filepath.Join(dir, fd.Name())); err == nil && target == "anon_inode:seccomp notify" {
				return pid, true
			}
		}
	}
	return 0, false
}
