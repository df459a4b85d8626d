package gvisor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// Checkpoint and restore are runsc's own (runsc checkpoint, runsc restore):
// the sentry serializes its whole kernel into the image directory (every
// task with its memory, file descriptions, sockets and namespaces, and the
// sentry's own in-memory filesystems such as /tmp and /dev/shm). The root
// filesystem is not in the image: the sandbox's writes are in its upper
// directory under Spec.Dir, and the restored sentry reopens its files there by
// path. So an image and a copy of Dir taken in the same instant are one
// sandbox, and a restore may put it under another id, Dir and netns:
//
//	Checkpoint       runsc pause, runsc checkpoint --leave-running, then the
//	                 sentry is killed (see Checkpoint for why not plain
//	                 runsc checkpoint); runsc's state stays "paused", Status
//	                 says stopped
//	Release          as Destroy, but Dir stays (upper, work, bundle)
//	Restore          mount the overlay on Dir again, write a bundle for the
//	                 new Spec (new rootfs path, mount sources, netns, cgroup,
//	                 hostname), runsc restore --detach from the image
//
// runsc compares the restoring bundle with the checkpointed one and refuses a
// restore whose process arguments, mount targets or namespaces differ; mount
// sources, the netns path, the cgroup, the hostname, the environment and the
// limits may change.
//
// Networking: with Spec.NetNS, gVisor's netstack restores its sockets (a
// listening TCP socket answers again, with the same state) but takes the
// interfaces, addresses and routes anew from the namespace it is restored
// into. runsc strips the addresses from a namespace's interfaces when a
// sandbox takes it over and never gives them back, so a namespace a gVisor
// sandbox has used must be rebuilt (or readdressed) before the next Create or
// Restore joins it.
//
// Not restorable: a unix socket listening in a directory bound from the host
// (--host-uds=create, as envd's socket is) makes the checkpoint fail ("Cannot
// save endpoint with bound host socket"); the sandbox runs on. Connections
// that the host made to such a socket do not, once the listener is closed,
// but after a restore they have no peer.

// imageStateFile is the file of a runsc image that holds the kernel's state;
// its presence tells a gVisor image from another backend's.
const imageStateFile = "checkpoint.img"

// stopTimeout bounds the wait for a checkpointed sandbox's sentry to exit.
const stopTimeout = 30 * time.Second

// Checkpoint implements runtime.Checkpointer.
//
// runsc checkpoint without --leave-running kills the sandbox whether or not
// the save succeeded, so it is never used: the sandbox is paused, saved with
// --leave-running (a paused kernel stays paused after the save), the image
// synced to disk, and only then killed; a failed save resumes it instead. The
// pause also keeps the sandbox's processes from writing to the writable layer
// after their memory was saved. With LeaveRunning the sandbox is left as the
// caller had it, paused or running.
func (s *sandbox) Checkpoint(ctx context.Context, opts runtime.CheckpointOptions) (retErr error) {
	if opts.ImageDir == "" {
		return fmt.Errorf("gvisor runtime: checkpoint %s: no ImageDir", s.id)
	}
	img, err := filepath.Abs(opts.ImageDir)
	if err != nil {
		return fmt.Errorf("gvisor runtime: checkpoint %s: %w", s.id, err)
	}
	st, err := s.rt.state(s.id)
	if err != nil {
		return fmt.Errorf("gvisor runtime: checkpoint %s: %w", s.id, err)
	}
	if st.Status != "running" && st.Status != "created" && st.Status != "paused" {
		return fmt.Errorf("gvisor runtime: checkpoint %s: sandbox is %s", s.id, st.Status)
	}
	created, err := makeImageDir(img)
	if err != nil {
		return fmt.Errorf("gvisor runtime: checkpoint %s: %w", s.id, err)
	}
	defer func() {
		if retErr != nil {
			clearImageDir(img, created)
		}
	}()
	pausedHere := false
	if !opts.LeaveRunning && st.Status != "paused" {
		if err := s.Pause(); err != nil {
			return fmt.Errorf("gvisor runtime: checkpoint %s: %w", s.id, err)
		}
		pausedHere = true
	}
	_, err = s.rt.runsc(ctx, s.network, "checkpoint", "--leave-running", "--image-path="+img, cid(s.id))
	if err == nil {
		err = runtime.SyncImage(img)
	}
	if err != nil {
		if strings.Contains(err.Error(), "bound host socket") {
			// A unix socket listening in a directory bound from the host
			// (envd's, in <Dir>/run) is state gVisor cannot save: the
			// sandbox cannot be checkpointed as it is, which is not a fault.
			err = fmt.Errorf("%w: %w", runtime.ErrNotSupported, err)
		}
		err = fmt.Errorf("gvisor runtime: checkpoint %s: %w", s.id, err)
		if pausedHere {
			err = errors.Join(err, s.Resume())
		}
		return err
	}
	if opts.LeaveRunning {
		return nil
	}
	return s.stop(st.Pid)
}

// stop kills a checkpointed sandbox's sentry (runsc state's pid), which is
// paused, so that nothing of the sandbox runs after its image was taken, and
// waits until it has exited; Status then says stopped. The gofer exits with the
// sentry; Release deletes runsc's state. Once the SIGKILL is sent the sandbox
// is gone whatever the caller's context says, so the wait ignores it.
func (s *sandbox) stop(sentry int) error {
	if sentryAlive(sentry, cid(s.id)) {
		if err := unix.Kill(sentry, unix.SIGKILL); err != nil && !errors.Is(err, unix.ESRCH) {
			return fmt.Errorf("gvisor runtime: stop %s after checkpoint: %w", s.id, err)
		}
	}
	deadline := time.Now().Add(stopTimeout)
	for delay := time.Millisecond; sentryAlive(sentry, cid(s.id)); delay = min(2*delay, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			return fmt.Errorf("gvisor runtime: the sentry of %s (pid %d) lives %v after SIGKILL", s.id, sentry, stopTimeout)
		}
		time.Sleep(delay)
	}
	return nil
}

// makeImageDir creates a checkpoint's image directory, 0700 because the image
// holds the sandbox's memory, or accepts an existing empty one; it reports
// whether it created it. Its parent must exist.
func makeImageDir(dir string) (bool, error) {
	err := os.Mkdir(dir, 0o700)
	if err == nil {
		return true, nil
	}
	if !errors.Is(err, os.ErrExist) {
		return false, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return false, err
	}
	if len(entries) > 0 {
		return false, fmt.Errorf("image dir %s is not empty", dir)
	}
	return false, nil
}

// clearImageDir removes what a failed checkpoint wrote: the directory if it
// made it, else its contents.
func clearImageDir(dir string, created bool) {
	if created {
		_ = os.RemoveAll(dir)
		return
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}

// Release implements runtime.Checkpointer: everything Destroy removes except
// Spec.Dir, which keeps the writable layer (and Spec.Upper, as ever).
func (s *sandbox) Release(ctx context.Context) error {
	if errs := s.release(ctx); len(errs) > 0 {
		return fmt.Errorf("gvisor runtime: release %s: %w", s.id, errors.Join(errs...))
	}
	return nil
}

// Restore implements runtime.Restorer. The image is only read (runsc opens its
// files read-only), so any number of restores may share it. A restore that
// fails undoes what it made and leaves spec.Dir: the writable layer in it is
// the caller's.
func (r *Runtime) Restore(ctx context.Context, spec runtime.Spec, imageDir string) (_ runtime.Sandbox, retErr error) {
	s, fresh, err := r.prepare(spec)
	if err != nil {
		return nil, err
	}
	img, err := filepath.Abs(imageDir)
	if err != nil {
		return nil, fmt.Errorf("gvisor runtime: restore %s: %w", spec.ID, err)
	}
	if _, err := os.Stat(filepath.Join(img, imageStateFile)); err != nil {
		return nil, fmt.Errorf("gvisor runtime: restore %s: no gVisor checkpoint image in %s: %w", spec.ID, img, err)
	}
	if fresh && spec.Upper == "" {
		return nil, fmt.Errorf("gvisor runtime: restore %s: %s holds no writable layer", spec.ID, s.dir)
	}
	// runsc restore into an id it still holds would restore that container
	// in place of creating a new one.
	if r.exists(spec.ID) {
		return nil, fmt.Errorf("gvisor runtime: restore %s: the sandbox exists (Release it first)", spec.ID)
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
	if err := r.launch(ctx, spec, s.dir, nil, "restore", "--image-path="+img, "--bundle="+bundle, "--detach", cid(spec.ID)); err != nil {
		return nil, err
	}
	return s, nil
}

var (
	_ runtime.Checkpointer = (*sandbox)(nil)
	_ runtime.Restorer     = (*Runtime)(nil)
)

// SignalInit implements runtime.InitSignaler: runsc kill without --all
// signals the container's init process inside the sentry.
func (s *sandbox) SignalInit(sig syscall.Signal) error {
	if _, err := s.rt.runsc(context.Background(), s.network, "kill", cid(s.id), strconv.Itoa(int(sig))); err != nil {
		return fmt.Errorf("gvisor runtime: signal %s: %w", s.id, err)
	}
	return nil
}

var _ runtime.InitSignaler = (*sandbox)(nil)
