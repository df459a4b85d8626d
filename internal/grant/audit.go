package grant

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/airlock-sandbox/airlock/internal/store"
)

// AuditLog is where refusals are written (store.DB).
type AuditLog interface {
	AppendAudit(ctx context.Context, entries []store.AuditEntry) error
}

// AuditRefusals returns a Checker.Refused that writes each refusal of a
// known key's grant (the proxy's, the volume content API's) into the audit
// log, as the API does its keys' refusals.
func AuditRefusals(audit AuditLog, log *slog.Logger) func(Refusal) {
	return func(r Refusal) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		detail := r.Reason.Error()
		if errors.Is(r.Reason, ErrForeign) {
			// The answer said no such resource; the entry says no more than
			// that, as for an ID that never existed.
			detail = "not found"
		}
		e := store.AuditEntry{At: time.Now(), KeyID: r.Key.KeyID, KeyName: r.Key.KeyName, TeamID: r.Key.Team,
			Action: r.Action, TargetKind: r.TargetKind, TargetID: r.TargetID, Status: r.Status, Detail: detail}
		if err := audit.AppendAudit(ctx, []store.AuditEntry{e}); err != nil {
			log.Error("audit log: entry not written", "action", r.Action, "err", err)
		}
	}
}
