// Package volumecontent serves a volume's files without a sandbox: upstream's
// volume content API (E2B spec/openapi-volumecontent.yml), GET/PATCH/DELETE
// /volumecontent/{volumeID}/path, GET/POST .../dir, GET/PUT .../file, each
// authorised by the volume's token ("Authorization: Bearer <token>", what the
// SDKs' Volume class sends to E2B_VOLUME_API_URL). It is served on the API
// listener beside /volumes.
//
// Every file operation happens beneath the volume's root through os.Root
// (openat per component, symlinks resolved by Airlock within the root and
// refused when they lead out), after a lexical check of the path
// (cleanPath); the name a write or stat finally acts on is a single
// component used with *at calls on its parent's descriptor. So no path, ".."
// or symlink a client or a sandbox puts in the volume reaches outside it.
//
// Writes stream: the body goes into an unnamed file (O_TMPFILE) in the
// target's directory, which is linked under its name only once whole, so a
// reader never sees half a file and a failed or cancelled upload leaves the
// old state. A full volume (its qgroup quota, EDQUOT) answers 507.
package volumecontent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/apikey"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/grant"
	"github.com/airlock-sandbox/airlock/internal/volume"
)

// Opener finds a volume whose token and owner accept takes and says where
// it lives (volume.Service); volume.ErrToken for an unknown volume.
type Opener interface {
	Open(ctx context.Context, volumeID string, accept func(token, owner string) error) (volume.Volume, error)
}

// Defaults of the entries the API creates when the request names no owner or
// mode: the templates' default user ("user", 1000:1000), so a sandbox's
// default user can change what was uploaded.
const (
	DefaultUID      = 1000
	DefaultGID      = 1000
	DefaultFileMode = 0o644
	DefaultDirMode  = 0o755
	maxDepth        = 10 // upstream's bound on a listing's depth
	maxPatchBody    = 64 << 10
)

// Handler serves the content API.
type Handler struct {
	vols Opener
	log  *slog.Logger
	mux  *http.ServeMux
	// grants checks the per-key grants the API hands out in place of a
	// volume's token (SetGrants); nil: the volume's own token opens it.
	grants *grant.Checker
}

// SetGrants makes the handler take only the grants of live keys of the
// volume's team (internal/grant) that hold volumes:read for reads and
// volumes:write for changes. Call it before serving.
func (h *Handler) SetGrants(c grant.Checker) { h.grants = &c }

// accept is Open's check of the bearer token a request presents; with
// grants, *key is the key its grant names.
func (h *Handler) accept(r *http.Request, presented string, key *apikey.Principal) func(token, owner string) error {
	if h.grants == nil {
		return volume.TokenIs(presented)
	}
	scope := apikey.VolumesWrite
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		scope = apikey.VolumesRead
	}
	return func(token, owner string) error {
		var err error
		*key, err = h.grants.Check(presented, owner, token, scope)
		return err
	}
}

// New returns the handler; mount it at e2bwire.VolumeContentPrefix. A nil
// vols (a server without volumes) answers every request 501.
func New(vols Opener, log *slog.Logger) *Handler {
	if log == nil {
		log = slog.Default()
	}
	h := &Handler{vols: vols, log: log, mux: http.NewServeMux()}
	h.route("GET /volumecontent/{volumeID}/path", h.stat)
	h.route("PATCH /volumecontent/{volumeID}/path", h.patch)
	h.route("DELETE /volumecontent/{volumeID}/path", h.remove)
	h.route("GET /volumecontent/{volumeID}/dir", h.list)
	h.route("POST /volumecontent/{volumeID}/dir", h.mkdir)
	h.route("GET /volumecontent/{volumeID}/file", h.read)
	h.route("PUT /volumecontent/{volumeID}/file", h.write)
	return h
}

// httpError is a failure that knows its status and client-facing message.
type httpError struct {
	status int
	msg    string
	err    error // the cause, for the log
}

func (e *httpError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("%d %s", e.status, e.msg)
	}
	return fmt.Sprintf("%d %s: %v", e.status, e.msg, e.err)
}

func fail(status int, format string, args ...any) *httpError {
	return &httpError{status: status, msg: fmt.Sprintf(format, args...)}
}

// request is what every operation gets: the volume, opened beneath its
// root, and the cleaned path.
type request struct {
	vol  volume.Volume
	root *os.Root
	rel  string // cleanPath's result
	q    map[string][]string
}

func (r *request) shown() string { return display(r.rel) }

type op func(w http.ResponseWriter, r *http.Request, req *request) error

func (h *Handler) route(pattern string, fn op) {
	h.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		if err := h.serve(w, r, fn); err != nil {
			h.writeErr(w, r, err)
		}
	})
}

func (h *Handler) serve(w http.ResponseWriter, r *http.Request, fn op) error {
	if h.vols == nil {
		return fail(http.StatusNotImplemented, "volumes are not available on this server: they live on the disk pool (serve --disk-quota, the default)")
	}
	token, ok := bearer(r)
	if !ok {
		return fail(http.StatusUnauthorized, "missing volume token: send \"Authorization: Bearer <token>\" with the token GET /volumes/{volumeID} returns")
	}
	id := r.PathValue("volumeID")
	var key apikey.Principal
	v, err := h.vols.Open(r.Context(), id, h.accept(r, token, &key))
	var se *grant.ScopeError
	var refused *httpError
	switch {
	case errors.As(err, &se):
		refused = fail(http.StatusForbidden, "%s", se.Error())
	case errors.Is(err, grant.ErrRevoked):
		refused = fail(http.StatusUnauthorized, "%s", err.Error())
	case errors.Is(err, volume.ErrToken), errors.Is(err, grant.ErrInvalid), errors.Is(err, grant.ErrForeign):
		// Another team's volume answers as one that does not exist, and
		// that as a wrong token: 404 is a missing path to the SDKs.
		refused = fail(http.StatusForbidden, "this token does not open volume %q", id)
	}
	if refused != nil {
		if h.grants != nil {
			h.grants.Report(grant.Refusal{Key: key, Action: "volume content " + r.Method + " " + r.URL.Path,
				TargetKind: "volume", TargetID: id, Status: refused.status, Reason: err})
		}
		return refused
	}
	if err != nil {
		return &httpError{status: http.StatusInternalServerError, msg: "opening the volume failed", err: err}
	}
	q := r.URL.Query()
	raw, given := q["path"]
	if !given || len(raw) != 1 {
		return fail(http.StatusBadRequest, "the query parameter path is required, once")
	}
	rel, err := cleanPath(raw[0])
	if err != nil {
		return fail(http.StatusBadRequest, "path %q: %v", raw[0], err)
	}
	root, err := os.OpenRoot(v.Path)
	if err != nil {
		return &httpError{status: http.StatusInternalServerError, msg: fmt.Sprintf("volume %s has no storage on this server", v.ID), err: err}
	}
	defer root.Close()
	return fn(w, r, &request{vol: v, root: root, rel: rel, q: q})
}

func bearer(r *http.Request) (string, bool) {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	token = strings.TrimSpace(token)
	return token, ok && strings.EqualFold(scheme, "Bearer") && token != ""
}

// ServeHTTP answers unknown routes and panics with the same JSON error body
// as everything else.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	defer func() {
		if v := recover(); v != nil {
			if v == http.ErrAbortHandler {
				panic(v)
			}
			h.log.Error("volume content handler panicked", "method", r.Method, "path", r.URL.Path, "panic", v, "stack", string(debug.Stack()))
			writeError(w, http.StatusInternalServerError, fmt.Sprintf("internal error: %v", v))
		}
	}()
	if _, pattern := h.mux.Handler(r); pattern == "" {
		writeError(w, http.StatusNotFound, fmt.Sprintf("no route for %s %s (the volume content API has /volumecontent/{volumeID}/path, /dir and /file)", r.Method, r.URL.Path))
		return
	}
	h.mux.ServeHTTP(w, r)
}

func (h *Handler) writeErr(w http.ResponseWriter, r *http.Request, err error) {
	var he *httpError
	if !errors.As(err, &he) {
		he = &httpError{status: http.StatusInternalServerError, msg: err.Error(), err: err}
	}
	// 507 is a full volume and 501 a server without volumes: the client's
	// to handle, not a server fault.
	if he.status >= 500 && he.status != http.StatusInsufficientStorage && he.status != http.StatusNotImplemented {
		h.log.Error("volume content request failed", "method", r.Method, "path", r.URL.Path, "status", he.status, "err", err)
	} else {
		h.log.Debug("volume content request rejected", "method", r.Method, "path", r.URL.Path, "status", he.status, "err", err)
	}
	writeError(w, he.status, he.msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(e2bwire.VolumeContentError{Code: strconv.Itoa(status), Message: fmt.Sprintf("encoding response: %v", err)})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, e2bwire.VolumeContentError{Code: strconv.Itoa(status), Message: msg})
}

// owner reads the uid, gid and mode query parameters of a create, with the
// defaults for those absent.
func owner(q map[string][]string, defMode uint32) (uid, gid int, mode os.FileMode, err error) {
	u, err := uintParam(q, "uid", DefaultUID, 1<<32-1)
	if err != nil {
		return 0, 0, 0, err
	}
	g, err := uintParam(q, "gid", DefaultGID, 1<<32-1)
	if err != nil {
		return 0, 0, 0, err
	}
	m, err := uintParam(q, "mode", uint64(defMode), 0o7777)
	if err != nil {
		return 0, 0, 0, err
	}
	return int(u), int(g), unixMode(uint32(m)), nil
}

func uintParam(q map[string][]string, name string, def, maxVal uint64) (uint64, error) {
	vs := q[name]
	if len(vs) == 0 || vs[0] == "" {
		return def, nil
	}
	v, err := strconv.ParseUint(vs[0], 10, 64)
	if err != nil || v > maxVal {
		return 0, fail(http.StatusBadRequest, "%s must be a whole number from 0 to %d, not %q", name, maxVal, vs[0])
	}
	return v, nil
}

func boolParam(q map[string][]string, name string) (bool, error) {
	vs := q[name]
	if len(vs) == 0 || vs[0] == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(vs[0])
	if err != nil {
		return false, fail(http.StatusBadRequest, "%s must be true or false, not %q", name, vs[0])
	}
	return b, nil
}

// discard drains what is left of a request body the handler will not read
// (bounded), so the connection can be reused.
func discard(r *http.Request) { _, _ = io.CopyN(io.Discard, r.Body, 64<<10) }
