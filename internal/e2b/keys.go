package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/teamstats"
)

// KeyService keeps the teams and API keys (apikey.Service).
type KeyService interface {
	Create(ctx context.Context, r apikey.CreateRequest) (apikey.Created, error)
	List(ctx context.Context, teamID string) ([]store.APIKey, error)
	Get(ctx context.Context, id string) (store.APIKey, error)
	Update(ctx context.Context, id, name string, scopes []apikey.Scope, by *apikey.Principal) (store.APIKey, error)
	Revoke(ctx context.Context, id string) error
	Teams() []store.Team
	TeamByRef(ref string) (store.Team, bool)
	EnsureTeam(ctx context.Context, name string) (store.Team, error)
	Quotas(teamID string) apikey.Quotas
	SetQuotas(ctx context.Context, teamID string, q apikey.Quotas) error
}

// AuditLog keeps the audit log (store.SQLite).
type AuditLog interface {
	AppendAudit(ctx context.Context, entries []store.AuditEntry) error
	Audit(ctx context.Context, f store.AuditFilter) ([]store.AuditEntry, error)
}

var errNoKeys = &apiError{status: http.StatusNotImplemented, message: "This server manages no API keys"}

func (h *Handler) routeKeys() {
	h.handle("GET /api-keys", h.listKeys)
	h.handle("POST /api-keys", h.createKey)
	h.handle("PATCH /api-keys/{apiKeyID}", h.updateKey)
	h.handle("DELETE /api-keys/{apiKeyID}", h.revokeKey)
	h.handle("GET /teams", h.listTeams)
	h.handle("PATCH /teams/{teamID}", h.updateTeam)
	h.handle("GET /teams/{teamID}/metrics", h.teamMetrics)
	h.handle("GET "+e2bwire.AuditPath, h.readAudit)
}

func toKeyJSON(k store.APIKey) e2bwire.TeamAPIKey {
	out := e2bwire.TeamAPIKey{
		ID: k.ID, Name: k.Name, CreatedAt: k.CreatedAt.UTC(), TeamID: k.TeamID,
		Mask:   e2bwire.KeyMask{Prefix: k.Prefix, ValueLength: k.Length, MaskedValuePrefix: k.MaskPrefix, MaskedValueSuffix: k.MaskSuffix},
		Scopes: []string{},
	}
	if scopes, err := apikey.ParseScopes([]string{k.Scopes}); err == nil {
		for _, s := range scopes {
			out.Scopes = append(out.Scopes, string(s))
		}
	}
	if !k.LastUsed.IsZero() {
		t := k.LastUsed.UTC()
		out.LastUsed = &t
	}
	if !k.RevokedAt.IsZero() {
		t := k.RevokedAt.UTC()
		out.RevokedAt = &t
	}
	return out
}

// keyError maps the key service's errors to statuses.
func keyError(err error) error {
	switch {
	case errors.Is(err, apikey.ErrInvalid), errors.Is(err, apikey.ErrMalformed):
		return &apiError{status: http.StatusBadRequest, message: err.Error(), err: err}
	case errors.Is(err, apikey.ErrEscalation):
		return &apiError{status: http.StatusForbidden, message: err.Error(), err: err}
	case errors.Is(err, apikey.ErrNotFound), errors.Is(err, store.ErrNotFound):
		return &apiError{status: http.StatusNotFound, message: err.Error(), err: err}
	case errors.Is(err, store.ErrExists):
		return &apiError{status: http.StatusConflict, message: err.Error(), err: err}
	}
	return err
}

// teamParam resolves the team a key route acts on: the caller's own, or
// the one named (by ID or name) in the query or body.
func (h *Handler) teamParam(ref string, p apikey.Principal) (store.Team, error) {
	if ref == "" {
		t, ok := h.opts.Keys.TeamByRef(p.Team)
		if !ok {
			return store.Team{}, &apiError{status: http.StatusNotFound, message: fmt.Sprintf("team %s not found", p.Team)}
		}
		return t, nil
	}
	t, ok := h.opts.Keys.TeamByRef(ref)
	if !ok {
		return store.Team{}, &apiError{status: http.StatusNotFound, message: fmt.Sprintf("team %q not found", ref)}
	}
	return t, nil
}

// listKeys is GET /api-keys: the caller's team's keys, or ?team=<id|name>'s.
func (h *Handler) listKeys(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Keys == nil {
		return errNoKeys
	}
	t, err := h.teamParam(r.URL.Query().Get("team"), principalFrom(r.Context()))
	if err != nil {
		return err
	}
	keys, err := h.opts.Keys.List(r.Context(), t.ID)
	if err != nil {
		return err
	}
	out := make([]e2bwire.TeamAPIKey, 0, len(keys))
	for _, k := range keys {
		out = append(out, toKeyJSON(k))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func parseScopesField(list []string) ([]apikey.Scope, error) {
	if list == nil {
		return nil, nil
	}
	scopes, err := apikey.ParseScopes(list)
	if err != nil {
		return nil, badRequest("Invalid scopes: %v", err)
	}
	return scopes, nil
}

func (h *Handler) createKey(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Keys == nil {
		return errNoKeys
	}
	var body e2bwire.NewTeamAPIKey
	if _, err := h.decodeBody(w, r, &body); err != nil {
		return err
	}
	if body.Name == nil {
		return badRequest("name is required")
	}
	scopes, err := parseScopesField(body.Scopes)
	if err != nil {
		return err
	}
	p := principalFrom(r.Context())
	var team store.Team
	if body.Team == "" {
		team, err = h.teamParam("", p)
	} else if t, ok := h.opts.Keys.TeamByRef(body.Team); ok {
		team = t
	} else {
		team, err = h.opts.Keys.EnsureTeam(r.Context(), body.Team)
	}
	if err != nil {
		return keyError(err)
	}
	c, err := h.opts.Keys.Create(r.Context(), apikey.CreateRequest{TeamID: team.ID, Name: *body.Name, Scopes: scopes, By: &p})
	if err != nil {
		return keyError(err)
	}
	noteTarget(r.Context(), "key", c.Record.ID)
	out := toKeyJSON(c.Record)
	out.Key = c.Key
	writeJSON(w, http.StatusCreated, out)
	return nil
}

func (h *Handler) updateKey(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Keys == nil {
		return errNoKeys
	}
	var body e2bwire.NewTeamAPIKey
	if _, err := h.decodeBody(w, r, &body); err != nil {
		return err
	}
	if body.Name == nil && body.Scopes == nil {
		return badRequest("nothing to change: send name, scopes or both")
	}
	scopes, err := parseScopesField(body.Scopes)
	if err != nil {
		return err
	}
	name := ""
	if body.Name != nil {
		name = *body.Name
	}
	p := principalFrom(r.Context())
	k, err := h.opts.Keys.Update(r.Context(), r.PathValue("apiKeyID"), name, scopes, &p)
	if err != nil {
		return keyError(err)
	}
	writeJSON(w, http.StatusOK, toKeyJSON(k))
	return nil
}

func (h *Handler) revokeKey(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Keys == nil {
		return errNoKeys
	}
	if err := h.opts.Keys.Revoke(r.Context(), r.PathValue("apiKeyID")); err != nil {
		return keyError(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// listTeams is GET /teams: the caller's team; every team for keys:admin.
func (h *Handler) listTeams(w http.ResponseWriter, r *http.Request) error {
	p := principalFrom(r.Context())
	out := []e2bwire.Team{}
	if h.opts.Keys == nil {
		out = append(out, e2bwire.Team{TeamID: p.Team, Name: p.Team, IsDefault: true})
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	for _, t := range h.opts.Keys.Teams() {
		if t.ID == p.Team || p.Has(apikey.KeysAdmin) {
			out = append(out, h.teamJSON(t, p))
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func (h *Handler) teamJSON(t store.Team, p apikey.Principal) e2bwire.Team {
	q := h.opts.Keys.Quotas(t.ID)
	return e2bwire.Team{TeamID: t.ID, Name: t.Name, IsDefault: t.ID == p.Team, Quotas: &e2bwire.TeamQuotas{
		Sandboxes: q.Sandboxes, VCPUs: q.VCPUs, MemoryMB: q.MemoryMB, PausedSandboxes: q.PausedSandboxes,
		PausedDiskMB: q.PausedDiskMB, RequestsPerSecond: q.RequestsPerSecond, Builds: q.Builds, VolumesMB: q.VolumesMB}}
}

// updateTeam is PATCH /teams/{teamID} (an Airlock extension): a team's
// quotas, by keys:admin; another team is 404 to anyone else.
func (h *Handler) updateTeam(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Keys == nil {
		return errNoKeys
	}
	p := principalFrom(r.Context())
	t, ok := h.opts.Keys.TeamByRef(r.PathValue("teamID"))
	if !ok || (t.ID != p.Team && !p.Has(apikey.KeysAdmin)) {
		return &apiError{status: http.StatusNotFound, message: fmt.Sprintf("team %q not found", r.PathValue("teamID"))}
	}
	if !p.Has(apikey.KeysAdmin) {
		return &apiError{status: http.StatusForbidden, message: fmt.Sprintf("This API key (%s) lacks the scope %s", p.KeyName, apikey.KeysAdmin)}
	}
	var body e2bwire.TeamUpdate
	if _, err := h.decodeBody(w, r, &body); err != nil {
		return err
	}
	if body.Quotas == nil {
		return badRequest("nothing to change: send quotas")
	}
	bq := body.Quotas
	q := apikey.Quotas{Sandboxes: bq.Sandboxes, VCPUs: bq.VCPUs, MemoryMB: bq.MemoryMB, PausedSandboxes: bq.PausedSandboxes,
		PausedDiskMB: bq.PausedDiskMB, RequestsPerSecond: bq.RequestsPerSecond, Builds: bq.Builds, VolumesMB: bq.VolumesMB}
	if err := h.opts.Keys.SetQuotas(r.Context(), t.ID, q); err != nil {
		return keyError(err)
	}
	writeJSON(w, http.StatusOK, h.teamJSON(t, p))
	return nil
}

// readAudit is GET /airlock/v1/audit: the newest entries first, of one
// team (?team=) or all, paged with ?before=<seq>.
func (h *Handler) readAudit(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Audit == nil {
		return &apiError{status: http.StatusNotImplemented, message: "This server keeps no audit log"}
	}
	q := r.URL.Query()
	f := store.AuditFilter{Limit: 100}
	if ref := q.Get("team"); ref != "" {
		t, err := h.teamParam(ref, principalFrom(r.Context()))
		if err != nil {
			return err
		}
		f.TeamID = t.ID
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 1000 {
			return badRequest("limit must be an integer from 1 to 1000, got %q", v)
		}
		f.Limit = n
	}
	if v := q.Get("before"); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 1 {
			return badRequest("before must be a positive sequence number, got %q", v)
		}
		f.BeforeSeq = n
	}
	entries, err := h.opts.Audit.Audit(r.Context(), f)
	if err != nil {
		return err
	}
	out := make([]e2bwire.AuditEntry, 0, len(entries))
	for _, e := range entries {
		out = append(out, e2bwire.AuditEntry{Seq: e.Seq, At: e.At.UTC(), KeyID: e.KeyID, KeyName: e.KeyName, TeamID: e.TeamID,
			Action: e.Action, TargetKind: e.TargetKind, TargetID: e.TargetID, Status: e.Status, Detail: e.Detail})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// TeamMetrics keeps each team's concurrent sandboxes and start rate
// (teamstats.Sampler).
type TeamMetrics interface {
	Query(team string, start, end time.Time) []teamstats.Point
}

// teamMetrics is GET /teams/{teamID}/metrics: the team's samples between
// start and end (unix seconds; default the last hour kept). A key reads its
// own team's with sandboxes:read, any team's with keys:admin; another team
// is not found.
func (h *Handler) teamMetrics(w http.ResponseWriter, r *http.Request) error {
	p := principalFrom(r.Context())
	ref := r.PathValue("teamID")
	team := ref
	if h.opts.Keys != nil {
		if t, ok := h.opts.Keys.TeamByRef(ref); ok {
			team = t.ID
		}
	}
	if team != p.Team && !p.Has(apikey.KeysAdmin) {
		return &apiError{status: http.StatusNotFound, message: fmt.Sprintf("team %q not found", ref)}
	}
	if team == p.Team && !p.Has(apikey.SandboxesRead) && !p.Has(apikey.KeysAdmin) {
		return &apiError{status: http.StatusForbidden, message: fmt.Sprintf("This API key (%s) lacks the scope %s", p.KeyName, apikey.SandboxesRead)}
	}
	if h.opts.TeamMetrics == nil {
		return &apiError{status: http.StatusNotImplemented, message: "This server keeps no team metrics"}
	}
	// The same rule as a sandbox's metrics (unixParam): a bound outside
	// what a time holds is clamped, not refused.
	now := time.Now()
	q := r.URL.Query()
	start, err := unixParam(q.Get("start"), "start", now.Add(-teamstats.Keep))
	if err != nil {
		return err
	}
	end, err := unixParam(q.Get("end"), "end", now)
	if err != nil {
		return err
	}
	if end.Before(start) {
		return badRequest("end (%d) is before start (%d)", end.Unix(), start.Unix())
	}
	out := []e2bwire.TeamMetric{}
	for _, pt := range h.opts.TeamMetrics.Query(team, start, end) {
		out = append(out, e2bwire.TeamMetric{Timestamp: pt.At.UTC(), TimestampUnix: pt.At.Unix(),
			ConcurrentSandboxes: pt.Concurrent, SandboxStartRate: pt.StartRate})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}
