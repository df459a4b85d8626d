// Package lifecycle is the contract of sandbox lifecycle events: what the
// manager records at each transition, what the events API pages through,
// and what webhooks deliver. The wire shape is E2B's v1 lifecycle event
// (docs: "lifecycle-events-api", "lifecycle-events-webhooks").
//
// Lifecycle of an event: the sandbox manager builds an Event at a
// transition and hands it to a Recorder (the store), which gives it an ID
// and a sequence number and keeps it for the retention period. Readers page
// a sandbox's or an owner's events (the events API); the webhook dispatcher
// reads every event after the last sequence number it has handled (After),
// woken by Notify, and turns each into deliveries of the webhooks that
// subscribe to its type.
package lifecycle

import (
	"context"
	"encoding/json"
	"time"
)

// Version is the payload version E2B documents.
const Version = "v1"

// Event types.
const (
	Created      = "sandbox.lifecycle.created"
	Updated      = "sandbox.lifecycle.updated"
	Paused       = "sandbox.lifecycle.paused"
	Resumed      = "sandbox.lifecycle.resumed"
	Checkpointed = "sandbox.lifecycle.checkpointed"
	Killed       = "sandbox.lifecycle.killed"
)

// Types are every event type, in lifecycle order.
var Types = []string{Created, Updated, Paused, Resumed, Checkpointed, Killed}

// Event is one lifecycle event, in E2B's v1 wire shape.
type Event struct {
	Version            string          `json:"version"`
	ID                 string          `json:"id"`
	Type               string          `json:"type"`
	EventData          json.RawMessage `json:"eventData,omitempty"`
	SandboxBuildID     string          `json:"sandboxBuildId"`
	SandboxExecutionID string          `json:"sandboxExecutionId"`
	SandboxID          string          `json:"sandboxId"`
	// SandboxTeamID is the owner: the API key's digest (e2b.OwnerOf);
	// scoping every read and delivery.
	SandboxTeamID     string    `json:"sandboxTeamId"`
	SandboxTemplateID string    `json:"sandboxTemplateId"`
	Timestamp         time.Time `json:"timestamp"`

	// Seq orders every event of the store; not on the wire.
	Seq int64 `json:"-"`
}

// Page selects events: newest first unless OrderAsc, from Offset, at most
// Limit (1..MaxLimit); of the Types given only (none: every type).
type Page struct {
	Offset   int
	Limit    int
	OrderAsc bool
	// Types filters by event type (E2B's repeated "types" parameter).
	Types []string
}

// MaxLimit bounds Page.Limit, as E2B's API does.
const MaxLimit = 100

// EventData is the eventData of Airlock's events: E2B's keys, each present
// only on the events E2B documents it for.
type EventData struct {
	// SandboxMetadata is the sandbox's metadata, on every event.
	SandboxMetadata map[string]string `json:"sandbox_metadata"`
	// SetTimeout is the new end of life (RFC 3339), on an update of the
	// timeout.
	SetTimeout string `json:"set_timeout,omitempty"`
	// NetworkEgress is the new egress policy, on an update of the network.
	NetworkEgress *NetworkEgress `json:"network_egress,omitempty"`
	// Execution is the execution that ended, on paused and killed.
	Execution *Execution `json:"execution,omitempty"`
	// KillReason says why a sandbox was killed (the KillReason* values).
	KillReason string `json:"kill_reason,omitempty"`
	// KillDetail says in words what ended a sandbox that was not killed
	// by a request or its timeout, when more is known than the reason
	// (Airlock's): for a sandbox Pod, what Kubernetes said.
	KillDetail string `json:"kill_detail,omitempty"`
	// SnapshotID names the snapshot a checkpoint made (Airlock's; absent
	// for a fork's checkpoint).
	SnapshotID string `json:"snapshot_id,omitempty"`
	// ForkCount is how many sandboxes a fork's checkpoint was asked to
	// start (Airlock's).
	ForkCount int `json:"fork_count,omitempty"`
}

// NetworkEgress is a sandbox's egress policy, split as E2B reports it.
type NetworkEgress struct {
	AllowedCIDRs   []string `json:"allowed_cidrs"`
	DeniedCIDRs    []string `json:"denied_cidrs"`
	AllowedDomains []string `json:"allowed_domains"`
}

// Execution describes one execution of a sandbox: from a create or a
// resume to the pause or kill that ended it.
type Execution struct {
	StartedAt string `json:"started_at"` // RFC 3339, UTC
	VCPUCount int    `json:"vcpu_count"`
	MemoryMB  int    `json:"memory_mb"`
	// ExecutionTime is how long it ran, in milliseconds.
	ExecutionTime int64 `json:"execution_time"`
}

// Kill reasons (EventData.KillReason).
const (
	// KillRequest: a client asked (DELETE /sandboxes/{id}, the SDKs' kill).
	KillRequest = "request"
	// KillTimeout: the sandbox reached its end of life.
	KillTimeout = "timeout"
	// KillOrphaned: the sandbox did not survive a restart of the server
	// (its processes were gone when the server came back).
	KillOrphaned = "orphaned"
	// KillOOM: the sandbox's init (envd) was killed for lack of memory.
	KillOOM = "oom"
	// KillExited: the sandbox's init (envd) ended on its own.
	KillExited = "init_exited"
	// KillPauseFailed: a pause's checkpoint failed and the sandbox did not
	// survive it.
	KillPauseFailed = "pause_failed"
	// KillResumeFailed: the sandbox, frozen for a checkpoint (a snapshot's,
	// a fork's, or a pause's that failed), could not be thawed after it, and
	// was killed rather than left frozen (E2B's name for the same end).
	KillResumeFailed = "resume_failed"
	// KillPausedRetention: the sandbox stayed paused past the retention
	// period (serve --paused-retention).
	KillPausedRetention = "paused_retention_expired"
	// KillPodLost: a sandbox Pod ended other than by Airlock (deleted
	// behind its back, evicted, its node lost); KillDetail says how.
	KillPodLost = "pod_lost"
	// KillShutdown: the server stopped with --kill-on-exit.
	KillShutdown = "shutdown"
)

// Recorder keeps events. Record fills ID, Seq (and Version and Timestamp
// when empty) and must not block on anything but the store: sandbox
// operations call it on their path.
type Recorder interface {
	Record(ctx context.Context, e Event) (Event, error)
}

// Reader pages the events of an owner (all its sandboxes) or of one of its
// sandboxes.
type Reader interface {
	OwnerEvents(ctx context.Context, owner string, p Page) ([]Event, error)
	SandboxEvents(ctx context.Context, owner, sandboxID string, p Page) ([]Event, error)
}

// Feed is what the webhook dispatcher reads: every event with Seq > after,
// oldest first, at most limit; Notify is signalled (without blocking, a
// buffered channel of one) after each Record.
type Feed interface {
	After(ctx context.Context, after int64, limit int) ([]Event, error)
	Notify() <-chan struct{}
}
