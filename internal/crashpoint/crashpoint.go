// Package crashpoint lets a crash test kill the server at a named step of a
// multi-step operation (pause, resume, snapshot, fork, kill, a volume's create
// and destroy), to check that what a
// restarted server finds is the old state or the new one, never something in
// between. Timing cannot hit these steps reliably: most last microseconds.
//
// It is inert unless the server was started with AIRLOCK_CRASH_AT=<name>; the
// variable is read once, at start-up, so a request cannot turn it on. The
// crash is a SIGKILL of the server's own process: no deferred function, no
// closer and no buffered write runs, as with kill -9 or a power cut (the
// sandboxes, which are other processes, live on).
package crashpoint

import (
	"os"
	"syscall"
)

// Env names the environment variable that arms one crash point.
const Env = "AIRLOCK_CRASH_AT"

var armed = os.Getenv(Env)

// The crash points, in the order their operation reaches them.
const (
	// PauseCheckpointed: the memory image is written, not yet marked whole.
	PauseCheckpointed = "pause-checkpointed"
	// PauseImageComplete: the image is marked whole; the runtime sandbox
	// is not yet released and the record still says running.
	PauseImageComplete = "pause-image-complete"
	// PauseRecorded: the record says paused; the runtime sandbox is not yet
	// released.
	PauseRecorded = "pause-recorded"
	// PauseReleased: the runtime sandbox is released.
	PauseReleased = "pause-released"
	// ResumeBooted: the sandbox runs again; the record still says paused and
	// a memory image is still on disk.
	ResumeBooted = "resume-booted"
	// CaptureFrozen: a fork's or snapshot's capture has copied the frozen
	// sandbox's files; the sandbox is not yet thawed.
	CaptureFrozen = "capture-frozen"
	// SnapshotCaptured: the snapshot's files are copied, its record not
	// yet written.
	SnapshotCaptured = "snapshot-captured"
	// SnapshotWritten: a named snapshot's record is written (its name
	// moved to it); the files of the snapshot it replaced are not yet
	// removed.
	SnapshotWritten = "snapshot-written"
	// ForkCaptured: the fork's capture is made, no fork started yet.
	ForkCaptured = "fork-captured"
	// StartedFromCapture: a fork (or a sandbox created from a snapshot)
	// runs; its record still says creating.
	StartedFromCapture = "started-from-capture"
	// KillRecorded: a kill's lifecycle event is recorded; its teardown has
	// not begun.
	KillRecorded = "kill-recorded"
	// WebhookEventsRead: the webhook dispatcher has read events from the
	// feed; no delivery of them is stored and the cursor has not moved.
	WebhookEventsRead = "webhook-events-read"
	// WebhookDispatched: the deliveries of those events are stored and the
	// cursor moved past them; none has been attempted.
	WebhookDispatched = "webhook-dispatched"
	// VolumeRecorded: a volume's record is written (state creating); its
	// directory is not made yet.
	VolumeRecorded = "volume-recorded"
	// VolumeMade: the volume's directory is made, whole with its quota;
	// the record still says creating.
	VolumeMade = "volume-made"
	// VolumeDeleting: a destroy has marked the record deleting; the
	// directory is still there.
	VolumeDeleting = "volume-deleting"
	// VolumeRemoved: the destroyed volume's directory is gone; its record
	// is not deleted yet.
	VolumeRemoved = "volume-removed"
)

// Hit kills the process at once when name is the armed crash point.
func Hit(name string) {
	if armed != "" && armed == name {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is delivered before this returns
	}
}
