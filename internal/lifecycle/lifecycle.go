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
// Limit (1..100).
type Page struct {
	Offset   int
	Limit    int
	OrderAsc bool
}

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
