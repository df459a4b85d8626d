package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/store"
)

// Every route needs one scope, read off its pattern by scopeFor: the area
// its path is in, and read for GET, write otherwise. A route whose area is
// unknown panics at registration, so a new route cannot go unguarded.

// areas maps path prefixes (after the method) to the scope area they need.
// Longer prefixes first where they overlap.
var areas = []struct {
	prefix string
	read   apikey.Scope
	write  apikey.Scope
}{
	{"/events/webhooks", apikey.WebhooksRead, apikey.WebhooksWrite},
	{"/events/sandboxes", apikey.SandboxesRead, apikey.SandboxesWrite},
	{"/sandboxes", apikey.SandboxesRead, apikey.SandboxesWrite},
	{"/v2/sandboxes", apikey.SandboxesRead, apikey.SandboxesWrite},
	{"/snapshots", apikey.SandboxesRead, apikey.SandboxesWrite},
	{"/templates", apikey.TemplatesRead, apikey.TemplatesWrite},
	{"/v2/templates", apikey.TemplatesRead, apikey.TemplatesWrite},
	{"/v3/templates", apikey.TemplatesRead, apikey.TemplatesWrite},
	{"/volumes", apikey.VolumesRead, apikey.VolumesWrite},
	{"/secrets", apikey.SecretsRead, apikey.SecretsWrite},
	{"/api-keys", apikey.KeysAdmin, apikey.KeysAdmin},
	{"/airlock/v1/audit", apikey.KeysAdmin, apikey.KeysAdmin},
}

// noScope is the scope of routes any valid key may call (they check what
// they show themselves: GET /teams and a team's own metrics).
const noScope apikey.Scope = ""

// scopeFor is the scope a route pattern ("METHOD /path") needs.
func scopeFor(pattern string) apikey.Scope {
	method, path, _ := strings.Cut(pattern, " ")
	if path == "/teams" || strings.HasPrefix(path, "/teams/") {
		return noScope
	}
	for _, a := range areas {
		if path == a.prefix || strings.HasPrefix(path, a.prefix+"/") {
			if method == http.MethodGet || method == http.MethodHead {
				return a.read
			}
			return a.write
		}
	}
	panic(fmt.Sprintf("e2b: no scope for route %q: add its area to areas", pattern))
}

type principalKey struct{}

func withPrincipal(ctx context.Context, p apikey.Principal) context.Context {
	return context.WithValue(withOwner(ctx, p.Team), principalKey{}, p)
}

// principalFrom is who the request acts as (the zero Principal outside an
// authenticated route).
func principalFrom(ctx context.Context) apikey.Principal {
	p, _ := ctx.Value(principalKey{}).(apikey.Principal)
	return p
}

// identify turns the request's key into a principal: with Options.Identify
// the server's keys and teams; else Options.Authenticate's yes or no, each
// key its own team with every scope.
func (h *Handler) identify(key string) (apikey.Principal, error) {
	if h.opts.Identify != nil {
		return h.opts.Identify(key)
	}
	if h.opts.Authenticate == nil || !h.opts.Authenticate(key) {
		return apikey.Principal{}, apikey.ErrNotFound
	}
	return apikey.Principal{KeyID: OwnerOf(key), KeyName: "key", Team: OwnerOf(key), Scopes: apikey.All, Bootstrap: true}, nil
}

// missingScope answers 403 naming the scope the key lacks.
func missingScope(w http.ResponseWriter, p apikey.Principal, s apikey.Scope) {
	writeError(w, http.StatusForbidden, fmt.Sprintf("This API key (%s) lacks the scope %s", p.KeyName, s))
}

// teamManager is the manager as one team sees it: another team's sandbox
// is not found, by every method that names one, so that each route answers
// for it exactly as for a sandbox that never existed (same status, same
// message, same order of checks). Lists filter by owner themselves.
type teamManager struct {
	Manager
	owner string
}

// sbx is the manager as the request's team sees it.
func (h *Handler) sbx(ctx context.Context) Manager {
	return teamManager{Manager: h.m, owner: ownerFrom(ctx)}
}

// visible returns ErrNotFound for another team's sandbox; other errors are
// left to the call itself, which meets them too.
func (t teamManager) visible(ctx context.Context, id string) error {
	info, err := t.Manager.Get(ctx, id)
	if err == nil && info.Owner != t.owner {
		return fmt.Errorf("sandbox %s: %w", id, sandbox.ErrNotFound)
	}
	if errors.Is(err, sandbox.ErrNotFound) {
		return err
	}
	return nil
}

func (t teamManager) Get(ctx context.Context, id string) (sandbox.Info, error) {
	info, err := t.Manager.Get(ctx, id)
	if err == nil && info.Owner != t.owner {
		return sandbox.Info{}, fmt.Errorf("sandbox %s: %w", id, sandbox.ErrNotFound)
	}
	return info, err
}

func (t teamManager) Kill(ctx context.Context, id string) error {
	if err := t.visible(ctx, id); err != nil {
		return err
	}
	return t.Manager.Kill(ctx, id)
}

func (t teamManager) SetTimeout(ctx context.Context, id string, d time.Duration) error {
	if err := t.visible(ctx, id); err != nil {
		return err
	}
	return t.Manager.SetTimeout(ctx, id, d)
}

func (t teamManager) Connect(ctx context.Context, id string, timeout time.Duration) (sandbox.Info, bool, error) {
	if err := t.visible(ctx, id); err != nil {
		return sandbox.Info{}, false, err
	}
	return t.Manager.Connect(ctx, id, timeout)
}

func (t teamManager) Pause(ctx context.Context, id string, o sandbox.PauseOptions) error {
	if err := t.visible(ctx, id); err != nil {
		return err
	}
	return t.Manager.Pause(ctx, id, o)
}

func (t teamManager) Fork(ctx context.Context, id string, req sandbox.ForkRequest) ([]sandbox.ForkResult, error) {
	if err := t.visible(ctx, id); err != nil {
		return nil, err
	}
	return t.Manager.Fork(ctx, id, req)
}

func (t teamManager) CreateSnapshot(ctx context.Context, id string, req sandbox.SnapshotRequest) (sandbox.Snapshot, error) {
	if err := t.visible(ctx, id); err != nil {
		return sandbox.Snapshot{}, err
	}
	return t.Manager.CreateSnapshot(ctx, id, req)
}

func (t teamManager) UpdateNetwork(ctx context.Context, id string, u sandbox.NetworkUpdate) error {
	if err := t.visible(ctx, id); err != nil {
		return err
	}
	return t.Manager.UpdateNetwork(ctx, id, u)
}

func (t teamManager) Metrics(ctx context.Context, id string, start, end time.Time) ([]sandbox.Metric, error) {
	if err := t.visible(ctx, id); err != nil {
		return nil, err
	}
	return t.Manager.Metrics(ctx, id, start, end)
}

// errorForKey maps an identify failure to its 401 message.
func errorForKey(err error) string {
	switch {
	case errors.Is(err, apikey.ErrMalformed):
		return "Malformed API key: a key is 8-200 letters, digits, _ and -"
	case errors.Is(err, apikey.ErrRevoked):
		return "Invalid API key: it was revoked"
	}
	return "Invalid API key"
}

// auditNote is where a handler names what a request made (a create's new
// sandbox, a new key), for its audit entry.
type auditNote struct{ kind, id, detail string }

type auditNoteKey struct{}

// noteTarget names what the request acted on, when its path does not.
func noteTarget(ctx context.Context, kind, id string) {
	if n, ok := ctx.Value(auditNoteKey{}).(*auditNote); ok {
		n.kind, n.id = kind, id
	}
}

// pathTargets are the path values that name what a route acts on.
var pathTargets = []struct{ value, kind string }{
	{"sandboxID", "sandbox"}, {"templateID", "template"}, {"buildID", "build"}, {"volumeID", "volume"},
	{"apiKeyID", "key"}, {"webhookID", "webhook"}, {"secretID", "secret"}, {"teamID", "team"},
}

// audit records a request that changes something (any method but GET and
// HEAD), or that was refused for its key, once it is answered: who (key ID
// and name, team), what (the route), to what, and the status. No bodies,
// so no secret values.
func (h *Handler) audit(r *http.Request, p apikey.Principal, pattern string, status int, note *auditNote, detail string) {
	if h.opts.Audit == nil {
		return
	}
	e := store.AuditEntry{At: time.Now(), KeyID: p.KeyID, KeyName: p.KeyName, TeamID: p.Team,
		Action: pattern, Status: status, Detail: detail}
	if note != nil && note.id != "" {
		e.TargetKind, e.TargetID = note.kind, note.id
	}
	for _, t := range pathTargets {
		if v := r.PathValue(t.value); v != "" && e.TargetID == "" {
			e.TargetKind, e.TargetID = t.kind, v
		}
	}
	// The request's own context may be done (the client left); the entry
	// is still written.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	if err := h.opts.Audit.AppendAudit(ctx, []store.AuditEntry{e}); err != nil {
		h.log.Error("audit log: entry not written", "action", pattern, "err", err)
	}
}
