package sandbox

// Lifecycle events (internal/lifecycle): the manager records one at every
// transition, on the operation's path and before the operation returns, so
// that a client that got an answer finds the event. A transition committed
// by a sandbox record (created, updated, paused, resumed) or a snapshot's
// record (checkpointed) writes its event in the same transaction (commit),
// so a kill -9 at any point leaves both or neither; a kill records its
// event before its teardown, which Recover finishes.
//
// An execution is one run of a sandbox's processes: from a create (or a
// fork's or snapshot's start) or a resume, to the pause or kill that ends
// it. Every event carries the id of the execution it belongs to; paused and
// killed describe the execution they ended. A restarted server finds the
// execution of a re-adopted sandbox in its newest created or resumed event.

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/uuid"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// EventLog is where the manager records lifecycle events and, after a
// restart, finds the executions of the sandboxes it re-adopts: the store's
// LifecycleEvents, over the same database as Options.Store.
type EventLog interface {
	lifecycle.Recorder
	lifecycle.Reader
	// RecordWithSandbox records the event of a transition together with
	// the sandbox record that commits it, in one transaction, so that no
	// crash leaves a transition without its event or an event without its
	// transition.
	RecordWithSandbox(ctx context.Context, e lifecycle.Event, rec store.Sandbox) (lifecycle.Event, error)
	// RecordWithSnapshot records a checkpointed event with the snapshot's
	// record, in one transaction (store.Store.PutSnapshot's semantics).
	RecordWithSnapshot(ctx context.Context, e lifecycle.Event, rec store.Snapshot) (_ lifecycle.Event, replaced string, err error)
}

// execution is the current (or, for a paused sandbox, the last) execution
// of a sandbox; entry.mu guards it.
type execution struct {
	id      string
	started time.Time
	// buildID is the template build the sandbox runs (its boot record's).
	buildID string
}

// beginExecution starts a new execution of e (a create or a resume); the
// caller holds e alone or its op lock.
func (m *Manager) beginExecution(e *entry, buildID string) {
	e.mu.Lock()
	e.exec = execution{id: uuid.NewString(), started: time.Now(), buildID: buildID}
	e.mu.Unlock()
}

// record records an event of type typ for e, for the transitions that
// write no sandbox record (kill, whose event comes before its teardown; a
// fork's capture). A failure is logged, not returned: the transition it
// describes has happened, and failing the operation would tell the client
// otherwise.
func (m *Manager) record(ctx context.Context, e *entry, typ string, data lifecycle.EventData) {
	if m.opts.Events == nil {
		return
	}
	ev, err := m.event(e, typ, data)
	if err != nil {
		m.log.Error("lifecycle event", "id", e.id, "type", typ, "err", err)
		return
	}
	// The transition is done: its event is recorded even if the client
	// went away meanwhile.
	if _, err := m.opts.Events.Record(context.WithoutCancel(ctx), ev); err != nil {
		m.log.Error("lifecycle event not recorded", "id", e.id, "type", typ, "err", err)
	}
}

// commit writes rec, e's record after a transition, and the transition's
// event of type typ in one transaction; an error means neither is written
// and the transition did not take. Without an event log it writes rec alone.
func (m *Manager) commit(ctx context.Context, e *entry, rec store.Sandbox, typ string, data lifecycle.EventData) error {
	if m.opts.Events == nil {
		return m.opts.Store.Put(ctx, rec)
	}
	ev, err := m.event(e, typ, data)
	if err != nil {
		return fmt.Errorf("lifecycle event %s of %s: %w", typ, e.id, err)
	}
	_, err = m.opts.Events.RecordWithSandbox(ctx, ev, rec)
	return err
}

// commitSnapshot writes rec, a snapshot of e, with e's checkpointed event
// in one transaction; it returns the snapshot whose name rec took.
func (m *Manager) commitSnapshot(ctx context.Context, e *entry, rec store.Snapshot, data lifecycle.EventData) (replaced string, err error) {
	if m.opts.Events == nil {
		return m.opts.Store.PutSnapshot(ctx, rec)
	}
	ev, err := m.event(e, lifecycle.Checkpointed, data)
	if err != nil {
		return "", fmt.Errorf("lifecycle event %s of %s: %w", lifecycle.Checkpointed, e.id, err)
	}
	_, replaced, err = m.opts.Events.RecordWithSnapshot(ctx, ev, rec)
	return replaced, err
}

// event is e's lifecycle event of type typ, carrying data.
func (m *Manager) event(e *entry, typ string, data lifecycle.EventData) (lifecycle.Event, error) {
	e.mu.Lock()
	info, ex := e.info, e.exec
	e.mu.Unlock()
	data.SandboxMetadata = info.Metadata
	if data.SandboxMetadata == nil {
		data.SandboxMetadata = map[string]string{}
	}
	raw, err := json.Marshal(data)
	if err != nil {
		return lifecycle.Event{}, err
	}
	return lifecycle.Event{
		Type:               typ,
		EventData:          raw,
		SandboxBuildID:     ex.buildID,
		SandboxExecutionID: ex.id,
		SandboxID:          e.id,
		SandboxTeamID:      info.Owner,
		SandboxTemplateID:  info.TemplateID,
		Timestamp:          time.Now(),
	}, nil
}

// executionData describes e's current execution as it ends: now, or, for a
// paused sandbox (whose execution ended with the pause), at its pause.
func executionData(e *entry) *lifecycle.Execution {
	e.mu.Lock()
	defer e.mu.Unlock()
	end := time.Now()
	if e.info.State == StatePaused && !e.info.PausedAt.IsZero() {
		end = e.info.PausedAt
	}
	started := e.exec.started
	if started.IsZero() {
		started = e.info.StartedAt
	}
	return &lifecycle.Execution{
		StartedAt:     started.UTC().Format(time.RFC3339),
		VCPUCount:     e.info.CPUCount,
		MemoryMB:      e.info.MemoryMB,
		ExecutionTime: max(end.Sub(started).Milliseconds(), 0),
	}
}

// EgressOf splits a sandbox's egress policy as E2B reports it: allowOut's
// addresses and domains apart; denyOut (CIDRs, and ALL_TRAFFIC for
// allowInternetAccess=false) as denied.
func EgressOf(info Info) *lifecycle.NetworkEgress {
	p := PolicyOf(info)
	out := &lifecycle.NetworkEgress{AllowedCIDRs: []string{}, DeniedCIDRs: []string{}, AllowedDomains: []string{}}
	for _, a := range p.AllowOut {
		if isAddrOrPrefix(a) {
			out.AllowedCIDRs = append(out.AllowedCIDRs, a)
		} else {
			out.AllowedDomains = append(out.AllowedDomains, a)
		}
	}
	out.DeniedCIDRs = append(out.DeniedCIDRs, p.DenyOut...)
	return out
}

func isAddrOrPrefix(s string) bool {
	if _, err := netip.ParsePrefix(s); err == nil {
		return true
	}
	_, err := netip.ParseAddr(s)
	return err == nil
}

// recordKilled records e's end; the caller holds e (its op lock, or alone).
func (m *Manager) recordKilled(ctx context.Context, e *entry, reason string) {
	m.record(ctx, e, lifecycle.Killed, lifecycle.EventData{Execution: executionData(e), KillReason: reason})
}

// recoverExecution finds the execution of a sandbox a previous server left:
// the newest created or resumed event names it. It returns whether the
// sandbox's last event says it was killed already (a kill that a crash
// interrupted after its event was recorded). Without events (none recorded,
// or pruned) it starts a new execution.
func (m *Manager) recoverExecution(ctx context.Context, e *entry, buildID string) (killed bool) {
	if m.opts.Events == nil {
		return false
	}
	e.mu.Lock()
	owner := e.info.Owner
	e.mu.Unlock()
	last, err := m.opts.Events.SandboxEvents(ctx, owner, e.id, lifecycle.Page{Limit: 1})
	if err == nil && len(last) == 1 && last[0].Type == lifecycle.Killed {
		killed = true
	}
	starts, err := m.opts.Events.SandboxEvents(ctx, owner, e.id, lifecycle.Page{Limit: 1, Types: []string{lifecycle.Created, lifecycle.Resumed}})
	if err != nil || len(starts) == 0 {
		if err != nil {
			m.log.Warn("sandbox re-adopted: its last execution could not be read; a new one begins", "id", e.id, "err", err)
		}
		m.beginExecution(e, buildID)
		return killed
	}
	ev := starts[0]
	if buildID == "" {
		buildID = ev.SandboxBuildID
	}
	e.mu.Lock()
	e.exec = execution{id: ev.SandboxExecutionID, started: ev.Timestamp, buildID: buildID}
	e.mu.Unlock()
	return killed
}
