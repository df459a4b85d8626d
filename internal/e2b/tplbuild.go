package e2b

// The E2B template build flow (Template.build, buildInBackground and
// getBuildStatus in the SDKs) over Airlock's builder:
//
//	POST /v3/templates                                  name[:tag] → templateID, buildID
//	GET  /templates/{templateID}/files/{hash}           present, or an upload URL
//	PUT  /airlock/v1/template-files/{hash}?token=…      the upload (URL signed, no API key)
//	POST /v2/templates/{templateID}/builds/{buildID}    the steps; the build is queued
//	GET  /templates/{templateID}/builds/{buildID}/status  status + log entries from logsOffset
//	GET  /templates/{templateID}/builds/{buildID}/logs    log entries from cursor
//	DELETE /templates/{templateID}/builds/{buildID}     cancel (Airlock's; E2B's API has none)
//
// Every call acts for the API key's owner: a build, its status and its
// template are another key's business, and answer 404 to everyone else.

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/tplbuild"
)

// TemplateBuilds runs the builds (tplbuild.Service).
type TemplateBuilds interface {
	Request(req tplbuild.Request) (templateID, buildID string, err error)
	FilePresent(owner, templateID, hash string) (bool, error)
	PutFile(owner, hash string, r io.Reader) error
	Start(owner, templateID, buildID string, spec tplbuild.Spec) error
	Status(owner, templateID, buildID string, offset, limit int) (tplbuild.Status, error)
	Cancel(owner, templateID, buildID string) error
	// StatusChanged is closed at the build's next status change; nil when
	// there is none to wait for.
	StatusChanged(owner, templateID, buildID string) <-chan struct{}
	// CancelTemplate cancels owner's unfinished builds of a template and
	// says how many there were.
	CancelTemplate(owner, templateID string) int
	MaxUpload() int64
}

// statusHold bounds how long a build status request waits for a change;
// the log lines of that time come with the answer.
const statusHold = time.Second

// uploadPath is where the SDK PUTs a COPY step's archive. It is outside the
// E2B paths because the SDK sends no API key with it (upstream's is a
// presigned bucket URL), so the URL carries its own signature.
const uploadPath = "/airlock/v1/template-files/"

// templateBuildRequestV3 is the request the server reads, with the deprecated
// alias older SDKs send; the answers are e2bwire's, shared with the client.
type templateBuildRequestV3 struct {
	Name     string   `json:"name"`
	Alias    string   `json:"alias"`
	Tags     []string `json:"tags"`
	CPUCount int      `json:"cpuCount"`
	MemoryMB int      `json:"memoryMB"`
}

func (h *Handler) routeTemplateBuilds() {
	h.handle("POST /v3/templates", h.requestBuild)
	h.handle("GET /templates/{templateID}/files/{hash}", h.fileUploadLink)
	h.mux.Handle("PUT "+uploadPath+"{hash}", h.serveAPI(h.uploadFile))
	h.handle("POST /v2/templates/{templateID}/builds/{buildID}", h.startBuild)
	h.handle("GET /templates/{templateID}/builds/{buildID}/status", h.buildStatus)
	h.handle("GET /templates/{templateID}/builds/{buildID}/logs", h.buildLogs)
	h.handle("DELETE /templates/{templateID}/builds/{buildID}", h.cancelBuild)
}

var errNoBuilds = &apiError{status: http.StatusNotImplemented, message: "Building templates through the E2B API is not enabled on this server; build them with `airlock template build`"}

// buildError maps tplbuild's errors to their wire form.
func buildError(err error) error {
	switch {
	case errors.Is(err, tplbuild.ErrInvalid):
		return &apiError{status: http.StatusBadRequest, message: err.Error(), err: err}
	case errors.Is(err, tplbuild.ErrNotFound):
		return &apiError{status: http.StatusNotFound, message: err.Error(), err: err}
	case errors.Is(err, tplbuild.ErrTooLarge):
		return &apiError{status: http.StatusRequestEntityTooLarge, message: err.Error(), err: err}
	case errors.Is(err, tplbuild.ErrForbidden):
		return &apiError{status: http.StatusForbidden, message: err.Error(), err: err}
	case errors.Is(err, tplbuild.ErrLimit):
		return &apiError{status: http.StatusTooManyRequests, message: err.Error(), err: err}
	case errors.Is(err, tplbuild.ErrFinished):
		return &apiError{status: http.StatusConflict, message: err.Error(), err: err}
	}
	return &apiError{status: http.StatusInternalServerError, message: err.Error(), err: err}
}

// requestBuild is POST /v3/templates: 202 with the ids.
func (h *Handler) requestBuild(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Builds == nil {
		return errNoBuilds
	}
	var req templateBuildRequestV3
	if _, err := h.decodeBody(w, r, &req); err != nil {
		return err
	}
	name := req.Name
	if name == "" {
		name = req.Alias // the deprecated field older SDKs send
	}
	if name == "" {
		return badRequest("name is required")
	}
	// "name:tag" is one more entry of tags, as upstream reads it.
	_, tags, err := tplbuild.BuildTags(name, req.Tags)
	if err != nil {
		return buildError(err)
	}
	id, build, err := h.opts.Builds.Request(tplbuild.Request{Name: name, Tags: req.Tags, CPUCount: req.CPUCount, MemoryMB: req.MemoryMB, Owner: ownerFrom(r.Context())})
	if err != nil {
		return buildError(err)
	}
	noteTarget(r.Context(), "template", id)
	writeJSON(w, http.StatusAccepted, e2bwire.TemplateRequestResponseV3{
		TemplateID: id, BuildID: build, Public: false, // a new build is its key's until PATCHed public
		Aliases: []string{id}, Names: []string{id}, Tags: tags,
	})
	return nil
}

// uploadToken signs an owner and a hash, so only URLs this server handed out
// accept uploads, and only into the uploads of the key that asked for them.
func (h *Handler) uploadToken(owner, hash string) string {
	m := hmac.New(sha256.New, h.uploadKey)
	m.Write([]byte(owner + "/" + hash))
	return hex.EncodeToString(m.Sum(nil))
}

// fileUploadLink is GET /templates/{templateID}/files/{hash}: 201 with
// present, or with a URL on this listener (the host the client reached).
func (h *Handler) fileUploadLink(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Builds == nil {
		return errNoBuilds
	}
	hash, owner := r.PathValue("hash"), ownerFrom(r.Context())
	present, err := h.opts.Builds.FilePresent(owner, r.PathValue("templateID"), hash)
	if err != nil {
		return buildError(err)
	}
	out := e2bwire.TemplateBuildFileUpload{Present: present}
	if !present {
		scheme := "http"
		if r.TLS != nil {
			scheme = "https"
		}
		out.URL = (&url.URL{Scheme: scheme, Host: r.Host, Path: uploadPath + hash, RawQuery: url.Values{"owner": {owner}, "token": {h.uploadToken(owner, hash)}}.Encode()}).String()
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// uploadFile is the PUT to the URL fileUploadLink gave.
func (h *Handler) uploadFile(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Builds == nil {
		return errNoBuilds
	}
	hash := r.PathValue("hash")
	owner := r.URL.Query().Get("owner")
	if !hmac.Equal([]byte(r.URL.Query().Get("token")), []byte(h.uploadToken(owner, hash))) {
		return &apiError{status: http.StatusForbidden, message: "invalid upload token: ask GET /templates/{templateID}/files/{hash} for an upload URL"}
	}
	max := h.opts.Builds.MaxUpload()
	if r.ContentLength > max {
		return &apiError{status: http.StatusRequestEntityTooLarge, message: fmt.Sprintf("upload is larger than %d bytes", max)}
	}
	if err := h.opts.Builds.PutFile(owner, hash, r.Body); err != nil {
		return buildError(err)
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

// startBuild is POST /v2/templates/{templateID}/builds/{buildID}: 202 once
// the steps are checked and the build is queued.
func (h *Handler) startBuild(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Builds == nil {
		return errNoBuilds
	}
	var spec tplbuild.Spec
	if _, err := h.decodeBody(w, r, &spec); err != nil {
		return err
	}
	if err := h.opts.Builds.Start(ownerFrom(r.Context()), r.PathValue("templateID"), r.PathValue("buildID"), spec); err != nil {
		return buildError(err)
	}
	w.WriteHeader(http.StatusAccepted)
	return nil
}

func wireEntries(in []tplbuild.LogEntry) []e2bwire.BuildLogEntry {
	out := make([]e2bwire.BuildLogEntry, 0, len(in))
	for _, e := range in {
		out = append(out, e2bwire.BuildLogEntry{Timestamp: e.Timestamp, Message: e.Message, Level: e.Level, Step: e.Step})
	}
	return out
}

// intParam reads a non-negative integer query parameter.
func intParam(r *http.Request, name string, def, max int) (int, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 {
		return 0, badRequest("Invalid %s %q: a non-negative integer is expected", name, v)
	}
	if max > 0 && n > max {
		n = max
	}
	return n, nil
}

// buildStatus is GET …/builds/{buildID}/status: the state and up to limit
// (default and cap 100) log entries from logsOffset.
func (h *Handler) buildStatus(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Builds == nil {
		return errNoBuilds
	}
	offset, err := intParam(r, "logsOffset", 0, 0)
	if err != nil {
		return err
	}
	limit, err := intParam(r, "limit", 100, 100)
	if err != nil {
		return err
	}
	owner, tpl, id := ownerFrom(r.Context()), r.PathValue("templateID"), r.PathValue("buildID")
	// Held until the build is over, for at most statusHold: the SDK polls
	// every 200 ms, and an answer "building" just before the build ends
	// would cost it a whole interval. Log lines keep arriving meanwhile and
	// come with the answer.
	holdUntil := time.Now().Add(statusHold)
	for ch := h.opts.Builds.StatusChanged(owner, tpl, id); ch != nil; ch = h.opts.Builds.StatusChanged(owner, tpl, id) {
		t := time.NewTimer(time.Until(holdUntil))
		select {
		case <-ch:
			t.Stop()
			continue // waiting → building: hold on until it is over
		case <-t.C:
		case <-r.Context().Done():
			t.Stop()
		}
		break
	}
	st, err := h.opts.Builds.Status(owner, tpl, id, offset, limit)
	if err != nil {
		return buildError(err)
	}
	out := e2bwire.TemplateBuildInfo{
		Logs: []string{}, LogEntries: wireEntries(st.Entries),
		TemplateID: st.TemplateID, BuildID: st.BuildID, Status: st.Status,
	}
	for _, e := range st.Entries {
		out.Logs = append(out.Logs, e.Message)
	}
	if st.Reason != nil {
		out.Reason = &e2bwire.BuildStatusReason{Message: st.Reason.Message, Step: st.Reason.Step, LogEntries: []e2bwire.BuildLogEntry{}}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// buildLogs is GET …/builds/{buildID}/logs: entries from cursor (an index
// into the build's log), up to limit.
func (h *Handler) buildLogs(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Builds == nil {
		return errNoBuilds
	}
	cursor, err := intParam(r, "cursor", 0, 0)
	if err != nil {
		return err
	}
	limit, err := intParam(r, "limit", 100, 100)
	if err != nil {
		return err
	}
	st, err := h.opts.Builds.Status(ownerFrom(r.Context()), r.PathValue("templateID"), r.PathValue("buildID"), cursor, limit)
	if err != nil {
		return buildError(err)
	}
	writeJSON(w, http.StatusOK, e2bwire.TemplateBuildLogsResponse{Logs: wireEntries(st.Entries)})
	return nil
}

// cancelBuild is DELETE /templates/{templateID}/builds/{buildID}: 204 once
// the build is told to stop (its status turns to error with the reason),
// 409 when it is over already.
func (h *Handler) cancelBuild(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Builds == nil {
		return errNoBuilds
	}
	if err := h.opts.Builds.Cancel(ownerFrom(r.Context()), r.PathValue("templateID"), r.PathValue("buildID")); err != nil {
		return buildError(err)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
