package e2b

// The E2B template endpoints (upstream OpenAPI tag "templates"), as far as a
// server that builds its templates itself can honour them:
//
//	GET    /templates                   list (the E2B CLI's `template list`)
//	GET    /v2/templates                list with limit/nextToken pagination
//	GET    /templates/{templateID}      one template with its builds
//	GET    /templates/aliases/{alias}   Template.exists / aliasExists
//	DELETE /templates/{templateID}      Sandbox.deleteSnapshot, `template delete`
//	POST   /templates/tags              Template.assignTags
//	DELETE /templates/tags              Template.removeTags
//	GET    /templates/{templateID}/tags Template.getTags
//
// A template reference is "name[:tag]"; a name alone means the tag
// "default". Template builds (Template.build in the SDKs) are in
// tplbuild.go. The older build requests and visibility answer 501 with a
// JSON body, so a client fails with a message instead of a bare 404.

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
	"github.com/airlock-sandbox/airlock/internal/template"
)

// TemplateCatalog is what the template endpoints need from the template store.
// Every method takes a template id or any of its aliases.
type TemplateCatalog interface {
	// List returns every template a sandbox can be created from.
	List(ctx context.Context) ([]TemplateInfo, error)
	// Get returns one template; unknown names wrap ErrTemplateNotFound.
	Get(ctx context.Context, idOrAlias string) (TemplateInfo, error)
	// Access returns who may use a template, as Get's Owner and Public, and
	// errs as Get does. It is the create path's check: Get also lists the
	// builds, which cost milliseconds that a create should not pay.
	Access(ctx context.Context, idOrAlias string) (TemplateAccess, error)
	// Delete removes a template with all its tags and builds. Errors wrap
	// ErrTemplateNotFound, ErrTemplateInUse (preferably as
	// *TemplateInUseError, so the answer can say how many sandboxes hold it)
	// or ErrTemplateProtected.
	Delete(ctx context.Context, idOrAlias string) error
	// SetPublic changes the visibility of owner's template; another's, or
	// the operator's, wraps ErrTemplateProtected.
	SetPublic(ctx context.Context, idOrAlias, owner string, public bool) error
	// Tags lists a template's tags (idOrAlias has no tag).
	Tags(ctx context.Context, idOrAlias string) ([]TemplateTagInfo, error)
	// AssignTags points tags at the build target ("name[:tag]") names and
	// returns that build's id. Errors wrap ErrTemplateNotFound (an unknown
	// template or tag), ErrTemplateProtected (a built-in) or
	// sandbox.ErrInvalid.
	AssignTags(ctx context.Context, target string, tags []string) (buildID string, err error)
	// RemoveTags removes tags from a template; errors as AssignTags'.
	RemoveTags(ctx context.Context, name string, tags []string) error
}

// TemplateTagInfo is one tag of a template (upstream TemplateTag).
type TemplateTagInfo struct {
	Tag       string
	BuildID   string
	CreatedAt time.Time
}

var (
	// ErrTemplateNotFound is the manager's error, so one template store can
	// serve both the manager and these endpoints.
	ErrTemplateNotFound = sandbox.ErrTemplateNotFound
	// ErrTemplateInUse: sandboxes (running or paused) still use the
	// template's root filesystem. Answered with 409.
	ErrTemplateInUse = errors.New("template in use")
	// ErrTemplateProtected: the template may not be deleted (a built-in).
	// Answered with 403 and the error's own text.
	ErrTemplateProtected = errors.New("template is protected")
)

// TemplateInUseError is ErrTemplateInUse with the count that makes the
// answer actionable ("kill these 3 sandboxes first").
type TemplateInUseError struct {
	Template  string
	Sandboxes int
}

func (e *TemplateInUseError) Error() string {
	noun := "sandboxes"
	if e.Sandboxes == 1 {
		noun = "sandbox"
	}
	return fmt.Sprintf("template %q is used by %d %s (running or paused); kill them first", e.Template, e.Sandboxes, noun)
}

func (e *TemplateInUseError) Is(target error) bool { return target == ErrTemplateInUse }

// Build states of the upstream TemplateBuildStatus enum.
const (
	BuildStatusReady    = "ready"
	BuildStatusBuilding = "building"
	BuildStatusWaiting  = "waiting"
	BuildStatusError    = "error"
)

// TemplateInfo is a template as the endpoints show it.
type TemplateInfo struct {
	ID string
	// Aliases are the other names clients may use; shown as both "aliases"
	// and "names" (upstream's namespaced form, which Airlock does not have).
	Aliases []string
	// Owner is the digest (OwnerOf) of the API key that built the template
	// through this API; empty for the operator's templates and built-ins,
	// which every key may use.
	Owner string
	// Public is upstream's visibility flag: every key may use the template,
	// only its owner change it. Templates without an owner report true.
	Public bool
	// BuildID identifies the build sandboxes get now. Upstream clients treat
	// it as opaque, but the schema declares a UUID for TemplateBuild.buildID,
	// so UUID-shaped ids suit strict generated clients best.
	BuildID string
	// BuildStatus is one of the BuildStatus* values; empty means ready.
	BuildStatus string
	CPUCount    int
	MemoryMB    int
	DiskSizeMB  int
	// EnvdVersion empty means Options.EnvdVersion (envd is mounted into every
	// sandbox by the server, so its version is the server's).
	EnvdVersion string
	CreatedAt   time.Time
	UpdatedAt   time.Time
	// BuildCount 0 means 1 when BuildID is set.
	BuildCount int
	// Builds, newest first, for GET /templates/{id}. Nil means one build made
	// of the fields above.
	Builds []TemplateBuildInfo
}

// TemplateBuildInfo is one build of a template.
type TemplateBuildInfo struct {
	ID          string
	Status      string // BuildStatus*; empty means ready
	CreatedAt   time.Time
	UpdatedAt   time.Time
	FinishedAt  time.Time // zero: not finished (omitted on the wire)
	CPUCount    int
	MemoryMB    int
	DiskSizeMB  int
	EnvdVersion string // empty: Options.EnvdVersion
}

// Wire types, named after the upstream schemas (spec/openapi.yml of
// e2b-dev/infra). Every required key is always present.

// templateJSON is the `Template` schema.
type templateJSON struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int        `json:"cpuCount"`
	MemoryMB      int        `json:"memoryMB"`
	DiskSizeMB    int        `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	CreatedBy     *teamUser  `json:"createdBy"` // always null: no user accounts
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
	BuildCount    int        `json:"buildCount"`
	EnvdVersion   string     `json:"envdVersion"`
	BuildStatus   string     `json:"buildStatus"`
}

// teamUser is the `TeamUser` schema; declared so createdBy has its type.
type teamUser struct {
	ID    string  `json:"id"`
	Email *string `json:"email"`
}

// templateWithBuildsJSON is the `TemplateWithBuilds` schema.
type templateWithBuildsJSON struct {
	TemplateID    string              `json:"templateID"`
	Public        bool                `json:"public"`
	Aliases       []string            `json:"aliases"`
	Names         []string            `json:"names"`
	CreatedAt     time.Time           `json:"createdAt"`
	UpdatedAt     time.Time           `json:"updatedAt"`
	LastSpawnedAt *time.Time          `json:"lastSpawnedAt"`
	SpawnCount    int64               `json:"spawnCount"`
	Builds        []templateBuildJSON `json:"builds"`
}

// templateBuildJSON is the `TemplateBuild` schema.
type templateBuildJSON struct {
	BuildID     string     `json:"buildID"`
	Status      string     `json:"status"`
	CreatedAt   time.Time  `json:"createdAt"`
	UpdatedAt   time.Time  `json:"updatedAt"`
	FinishedAt  *time.Time `json:"finishedAt,omitempty"`
	CPUCount    int        `json:"cpuCount"`
	MemoryMB    int        `json:"memoryMB"`
	DiskSizeMB  int        `json:"diskSizeMB"`
	EnvdVersion string     `json:"envdVersion"`
}

// templateAliasJSON is the `TemplateAliasResponse` schema.
type templateAliasJSON struct {
	TemplateID string `json:"templateID"`
	Public     bool   `json:"public"`
}

// templatePageMax is upstream's limit cap for template and build pages.
const templatePageMax = 100

// routeTemplates registers the template endpoints on h.mux.
func (h *Handler) routeTemplates() {
	h.handle("GET /templates", h.listTemplatesV1)
	h.handle("GET /v2/templates", h.listTemplatesV2)
	h.handle("GET /templates/{templateID}", h.getTemplate)
	h.handle("GET /templates/aliases/{alias}", h.templateAlias)
	h.handle("DELETE /templates/{templateID}", h.deleteSnapshotOrTemplate)

	h.routeTemplateBuilds()
	// The older build flows (v1/v2 requests, v1 start) predate the SDKs'
	// Template.build and are not offered.
	build := notImplemented("This template build API is not supported by Airlock; use an e2b SDK with Template.build (POST /v3/templates), or `airlock template build` on the server")
	for _, p := range []string{
		"POST /v2/templates",
		"POST /templates",
		"POST /templates/{templateID}",
		"POST /templates/{templateID}/builds/{buildID}",
	} {
		h.handle(p, build)
	}
	h.handle("POST /templates/tags", h.assignTemplateTags)
	h.handle("DELETE /templates/tags", h.removeTemplateTags)
	// "GET /templates/{templateID}/tags" would clash with the alias route
	// (both match /templates/aliases/tags and neither is more specific), so
	// the one-segment suffix is matched here and only "tags" answered.
	h.handle("GET /templates/{templateID}/{sub}", func(w http.ResponseWriter, r *http.Request) error {
		if r.PathValue("sub") == "tags" {
			return h.templateTags(w, r)
		}
		return &apiError{status: http.StatusNotFound, message: fmt.Sprintf("no route for %s %s", r.Method, r.URL.Path)}
	})
	h.handle("PATCH /templates/{templateID}", h.patchTemplate)
	h.handle("PATCH /v2/templates/{templateID}", h.patchTemplate)
}

// visibleTo reports whether the API key owner may see and use t.
func (t TemplateInfo) visibleTo(owner string) bool {
	return TemplateAccess{Owner: t.Owner, Public: t.Public}.visibleTo(owner)
}

// TemplateAccess is who may use a template: TemplateInfo's Owner and Public.
type TemplateAccess struct {
	Owner  string
	Public bool
}

func (a TemplateAccess) visibleTo(owner string) bool {
	return a.Owner == "" || a.Public || a.Owner == owner
}

// visibleTemplate is Templates.Get for the request's API key: another key's
// private template answers as if it did not exist.
func (h *Handler) visibleTemplate(ctx context.Context, ref string) (TemplateInfo, error) {
	t, err := h.opts.Templates.Get(ctx, ref)
	if err == nil && !t.visibleTo(ownerFrom(ctx)) {
		err = fmt.Errorf("template %q: %w", ref, ErrTemplateNotFound)
	}
	return t, err
}

// templateUpdate is upstream's TemplateUpdateRequest.
type templateUpdate struct {
	Public *bool `json:"public"`
}

// patchTemplate is PATCH /templates/{id} and /v2/templates/{id}: the owner
// makes its template public (every key may use it) or private again.
func (h *Handler) patchTemplate(w http.ResponseWriter, r *http.Request) error {
	ref, err := templateRef(r, "templateID")
	if err != nil {
		return err
	}
	var body templateUpdate
	present, err := h.decodeBody(w, r, &body)
	if err != nil {
		return err
	}
	if !present || body.Public == nil {
		return badRequest("request body is required: {\"public\": true|false}")
	}
	if h.opts.Templates == nil {
		return errNoTemplates
	}
	t, err := h.visibleTemplate(r.Context(), ref)
	if err != nil {
		return templateError("update template "+ref, err, ref)
	}
	if err := h.opts.Templates.SetPublic(r.Context(), t.ID, ownerFrom(r.Context()), *body.Public); err != nil {
		return templateError("update template "+ref, err, ref)
	}
	writeJSON(w, http.StatusOK, struct {
		Names []string `json:"names"`
	}{nonNil(t.Aliases)})
	return nil
}

func notImplemented(message string) apiHandler {
	return func(http.ResponseWriter, *http.Request) error {
		return &apiError{status: http.StatusNotImplemented, message: message}
	}
}

// errNoTemplates answers every template endpoint when Options.Templates is
// nil. 404 keeps Template.exists and deleteSnapshot answering false.
var errNoTemplates = &apiError{status: http.StatusNotFound, message: "template endpoints are not available: this server has no template store"}

// templateRef validates a {templateID} or {alias} path value,
// "name[:tag]" (upstream's namespace/ Airlock has not, so it is a 400 that
// says so rather than a 404 that would read as "no such template").
func templateRef(r *http.Request, param string) (string, error) {
	return checkTemplateRef(r.PathValue(param), "template")
}

// checkTemplateRef is templateRef for a value from anywhere; what names it
// in messages.
func checkTemplateRef(ref, what string) (string, error) {
	if _, err := snapshotRef(ref, what); err != nil {
		return "", err
	}
	if _, tag, tagged := strings.Cut(ref, ":"); tagged && template.ValidTag(tag) != nil {
		return "", badRequest("Invalid %s %q: the tag after ':' must be 1 to 128 lower-case letters, digits, '.', '_' or '-'", what, ref)
	}
	return ref, nil
}

func validTemplateRef(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, c := range []byte(s) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// templateError maps a Templates error to its wire form. The message is the
// store's own text (it names the template and the reason); op only goes to
// the log. ref is what the request named.
func templateError(op string, err error, ref string) *apiError {
	cause := fmt.Errorf("%s: %w", op, err)
	var inUse *TemplateInUseError
	switch {
	case errors.As(err, &inUse):
		return &apiError{status: http.StatusConflict, message: inUse.Error(), err: cause}
	case errors.Is(err, ErrTemplateInUse):
		return &apiError{status: http.StatusConflict, message: err.Error(), err: cause}
	case errors.Is(err, ErrTemplateProtected):
		return &apiError{status: http.StatusForbidden, message: err.Error(), err: cause}
	}
	if strings.Contains(ref, ":") {
		// The store's message says which tag is missing and which there are.
		ref = ""
	}
	ae := *managerError(err, "", ref) // a copy: the original may be the store's own *apiError
	ae.err = cause
	return &ae
}

// usage is what the live sandboxes say about one template.
type usage struct {
	count int64
	last  time.Time
}

// templateUsage counts the sandboxes alive now (running or paused) per
// template id. The manager keeps no history, so this is what spawnCount and
// lastSpawnedAt report: not all-time use, but a count that is exact for the
// question a user asks before deleting a template.
func (h *Handler) templateUsage(ctx context.Context) (map[string]usage, error) {
	infos, err := h.sbx(ctx).List(ctx, sandbox.ListFilter{Owner: ownerFrom(ctx)})
	if err != nil {
		return nil, fmt.Errorf("list sandboxes: %w", err)
	}
	out := map[string]usage{}
	for _, info := range infos {
		u := out[info.TemplateID]
		u.count++
		if info.StartedAt.After(u.last) {
			u.last = info.StartedAt
		}
		out[info.TemplateID] = u
	}
	return out, nil
}

func (u usage) lastSpawned() *time.Time {
	if u.last.IsZero() {
		return nil
	}
	t := u.last.UTC()
	return &t
}

func (h *Handler) templateJSON(t TemplateInfo, u usage) templateJSON {
	builds := t.BuildCount
	if builds == 0 && t.BuildID != "" {
		builds = 1
	}
	return templateJSON{
		TemplateID:    t.ID,
		BuildID:       t.BuildID,
		CPUCount:      t.CPUCount,
		MemoryMB:      t.MemoryMB,
		DiskSizeMB:    t.DiskSizeMB,
		Public:        t.Public,
		Aliases:       nonNil(t.Aliases),
		Names:         nonNil(t.Aliases),
		CreatedAt:     t.CreatedAt.UTC(),
		UpdatedAt:     t.UpdatedAt.UTC(),
		LastSpawnedAt: u.lastSpawned(),
		SpawnCount:    u.count,
		BuildCount:    builds,
		EnvdVersion:   h.orEnvd(t.EnvdVersion),
		BuildStatus:   orReady(t.BuildStatus),
	}
}

func (h *Handler) orEnvd(v string) string {
	if v == "" {
		return h.opts.EnvdVersion
	}
	return v
}

func orReady(status string) string {
	if status == "" {
		return BuildStatusReady
	}
	return status
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// listedTemplates returns every template in wire form, sorted by id so that
// pages of /v2/templates are stable.
func (h *Handler) listedTemplates(ctx context.Context) ([]templateJSON, error) {
	if h.opts.Templates == nil {
		return nil, errNoTemplates
	}
	ts, err := h.opts.Templates.List(ctx)
	if err != nil {
		return nil, templateError("list templates", err, "")
	}
	used, err := h.templateUsage(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]templateJSON, 0, len(ts))
	owner := ownerFrom(ctx)
	for _, t := range ts {
		if t.visibleTo(owner) {
			out = append(out, h.templateJSON(t, used[t.ID]))
		}
	}
	slices.SortFunc(out, func(a, b templateJSON) int { return strings.Compare(a.TemplateID, b.TemplateID) })
	return out, nil
}

// listTemplatesV1 is GET /templates: the whole list. Its teamID parameter is
// ignored: a server without teams has one team, whichever id the CLI sends.
func (h *Handler) listTemplatesV1(w http.ResponseWriter, r *http.Request) error {
	out, err := h.listedTemplates(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// listTemplatesV2 is GET /v2/templates: the same list in pages of limit
// (default and cap 100, clamped like the sandbox list). The token is the
// last id of the page, so a page survives the deletion of that template.
func (h *Handler) listTemplatesV2(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	limit, err := parseLimit(q.Get("limit"), templatePageMax)
	if err != nil {
		return err
	}
	var after string
	if tok := q.Get("nextToken"); tok != "" {
		if after, err = decodeTemplateToken(tok); err != nil {
			return badRequest("Invalid next token")
		}
	}
	out, err := h.listedTemplates(r.Context())
	if err != nil {
		return err
	}
	if after != "" {
		i, found := slices.BinarySearchFunc(out, after, func(t templateJSON, id string) int { return strings.Compare(t.TemplateID, id) })
		if found {
			i++
		}
		out = out[i:]
	}
	if len(out) > limit {
		out = out[:limit]
		w.Header().Set(headerNextToken, encodeTemplateToken(out[len(out)-1].TemplateID))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// Template and build page tokens are URL-safe base64 of an id, so the client
// sees them as opaque like every other token of the API.
func encodeTemplateToken(id string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(id))
}

func decodeTemplateToken(tok string) (string, error) {
	raw, err := base64.RawURLEncoding.DecodeString(strings.TrimRight(tok, "="))
	if err != nil {
		return "", fmt.Errorf("decode token: %w", err)
	}
	if !validTemplateRef(string(raw)) {
		return "", fmt.Errorf("decode token: invalid id %q", raw)
	}
	return string(raw), nil
}

// getTemplate is GET /templates/{templateID}: TemplateWithBuilds, its builds
// newest first in pages of limit (X-Next-Token when more remain).
func (h *Handler) getTemplate(w http.ResponseWriter, r *http.Request) error {
	ref, err := templateRef(r, "templateID")
	if err != nil {
		return err
	}
	q := r.URL.Query()
	limit, err := parseLimit(q.Get("limit"), templatePageMax)
	if err != nil {
		return err
	}
	var after string
	if tok := q.Get("nextToken"); tok != "" {
		if after, err = decodeTemplateToken(tok); err != nil {
			return badRequest("Invalid next token")
		}
	}
	if h.opts.Templates == nil {
		return errNoTemplates
	}
	t, err := h.visibleTemplate(r.Context(), ref)
	if err != nil {
		return templateError("get template "+ref, err, ref)
	}
	used, err := h.templateUsage(r.Context())
	if err != nil {
		return err
	}

	builds := t.Builds
	if builds == nil && t.BuildID != "" {
		builds = []TemplateBuildInfo{{
			ID: t.BuildID, Status: t.BuildStatus,
			CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt,
			CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
			EnvdVersion: t.EnvdVersion,
		}}
		if orReady(t.BuildStatus) == BuildStatusReady {
			builds[0].FinishedAt = t.CreatedAt
		}
	}
	if after != "" {
		// Builds are few and rarely removed; a token naming one that is gone
		// is refused rather than guessed at.
		i := slices.IndexFunc(builds, func(b TemplateBuildInfo) bool { return b.ID == after })
		if i < 0 {
			return badRequest("Invalid next token")
		}
		builds = builds[i+1:]
	}
	if len(builds) > limit {
		builds = builds[:limit]
		w.Header().Set(headerNextToken, encodeTemplateToken(builds[len(builds)-1].ID))
	}

	u := used[t.ID]
	out := templateWithBuildsJSON{
		TemplateID:    t.ID,
		Public:        t.Public,
		Aliases:       nonNil(t.Aliases),
		Names:         nonNil(t.Aliases),
		CreatedAt:     t.CreatedAt.UTC(),
		UpdatedAt:     t.UpdatedAt.UTC(),
		LastSpawnedAt: u.lastSpawned(),
		SpawnCount:    u.count,
		Builds:        make([]templateBuildJSON, 0, len(builds)),
	}
	for _, b := range builds {
		jb := templateBuildJSON{
			BuildID:     b.ID,
			Status:      orReady(b.Status),
			CreatedAt:   b.CreatedAt.UTC(),
			UpdatedAt:   b.UpdatedAt.UTC(),
			CPUCount:    b.CPUCount,
			MemoryMB:    b.MemoryMB,
			DiskSizeMB:  b.DiskSizeMB,
			EnvdVersion: h.orEnvd(b.EnvdVersion),
		}
		if !b.FinishedAt.IsZero() {
			f := b.FinishedAt.UTC()
			jb.FinishedAt = &f
		}
		out.Builds = append(out.Builds, jb)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// templateAlias is GET /templates/aliases/{alias}, which Template.exists
// reads as: 200 (or 403) exists, 404 does not, anything else throws.
func (h *Handler) templateAlias(w http.ResponseWriter, r *http.Request) error {
	ref, err := templateRef(r, "alias")
	if err != nil {
		return err
	}
	if h.opts.Templates == nil {
		return errNoTemplates
	}
	t, err := h.visibleTemplate(r.Context(), ref)
	if err != nil {
		return templateError("resolve template alias "+ref, err, ref)
	}
	writeJSON(w, http.StatusOK, templateAliasJSON{TemplateID: t.ID, Public: t.Public})
	return nil
}

// deleteTemplate is the template half of DELETE /templates/{templateID}
// (deleteSnapshotOrTemplate, which validated ref): 204, or 404 (which
// Sandbox.deleteSnapshot turns into false), 409 while sandboxes use it, 403
// for a protected template.
func (h *Handler) deleteTemplate(w http.ResponseWriter, r *http.Request, ref string) error {
	if h.opts.Templates == nil {
		return errNoTemplates
	}
	owner := ownerFrom(r.Context())
	// The key's builds of the template stop first: a template deleted while
	// a build runs must not reappear when the build ends.
	cancelled := 0
	if h.opts.Builds != nil && validTemplateRef(ref) {
		cancelled = h.opts.Builds.CancelTemplate(owner, ref)
	}
	t, err := h.visibleTemplate(r.Context(), ref)
	if err != nil && cancelled > 0 && errors.Is(err, ErrTemplateNotFound) {
		w.WriteHeader(http.StatusNoContent) // only its first build existed
		return nil
	}
	if err != nil {
		return templateError("delete template "+ref, err, ref)
	}
	if t.Owner != "" && t.Owner != owner {
		return templateError("delete template "+ref, fmt.Errorf("template %q belongs to another API key: %w", ref, ErrTemplateProtected), ref)
	}
	if err := h.opts.Templates.Delete(r.Context(), t.ID); err != nil {
		return templateError("delete template "+ref, err, ref)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
