package e2b

// Persistence endpoints (docs/E2B-WIRE.md §2.7): fork, snapshots, and the
// snapshot half of DELETE /templates/{templateID}. Pause and the lifecycle
// fields of create live with the other sandbox endpoints (sandboxes.go).

import (
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

const (
	// forkDefaultTimeout is SandboxForkRequest.timeout's schema default.
	forkDefaultTimeout = resumeDefaultTimeout
	// snapshotTag is the one tag Airlock snapshots have: their IDs and
	// names are "<name>:default" (sandbox.Snapshot).
	snapshotTag = "default"
)

// snapshotNameRule is the rule of template names (template.ValidName):
// snapshots share their names with templates, since create's templateID
// takes either. Kept here rather than imported so that the API does not link
// the template builder; TestSnapshotNameRuleIsTemplates keeps the two equal.
var snapshotNameRule = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// fork serves POST /sandboxes/{id}/fork: one checkpoint of a running
// sandbox, then count sandboxes started from it, each reported on its own.
// A non-201 answer means no fork was attempted.
func (h *Handler) fork(w http.ResponseWriter, r *http.Request) error {
	var body e2bwire.ForkRequest
	id, err := h.sandboxRequest(w, r, &body)
	if err != nil {
		return err
	}
	timeout, err := h.timeout(body.Timeout, timeoutRule{field: "timeout", def: forkDefaultTimeout})
	if err != nil {
		return err
	}
	count := int64(1)
	if body.Count != nil {
		count = *body.Count
	}
	// Upstream's wording, with the value that was sent.
	switch {
	case count < 1:
		return badRequest("Count must be at least 1, got %d", count)
	case count > sandbox.MaxForkCount:
		return badRequest("Count cannot be greater than %d, got %d", sandbox.MaxForkCount, count)
	}
	results, err := h.sbx(r.Context()).Fork(r.Context(), id, sandbox.ForkRequest{
		Count: int(count), Timeout: timeout, Owner: ownerFrom(r.Context()),
	})
	if err != nil {
		return managerError(fmt.Errorf("fork sandbox: %w", err), id, "")
	}
	out := make([]e2bwire.SandboxForkResult, 0, len(results))
	for i, res := range results {
		out = append(out, h.forkResultJSON(r, id, i, len(results), res))
	}
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// forkResultJSON is one fork's entry. A failed fork carries the status and
// message its error would have as a whole answer, so the SDKs map it to the
// same error class (they build it from error.code).
func (h *Handler) forkResultJSON(r *http.Request, id string, i, n int, res sandbox.ForkResult) e2bwire.SandboxForkResult {
	err := res.Err
	if err == nil && res.Info.ID == "" {
		err = errors.New("the manager reported neither a sandbox nor an error")
	}
	if err == nil {
		sb := h.sandboxJSON(r, res.Info)
		return e2bwire.SandboxForkResult{Sandbox: &sb}
	}
	ae := managerError(fmt.Errorf("fork %d of %d: %w", i+1, n, err), "", "")
	// The answer is a 201, so writeErr never sees this failure.
	h.log.Warn("e2b api: fork failed", "sandbox", id, "fork", i+1, "of", n, "status", ae.status, "err", err)
	return e2bwire.SandboxForkResult{Error: &e2bwire.Error{Code: ae.status, Message: ae.message}}
}

// createSnapshot serves POST /sandboxes/{id}/snapshots. The sandbox keeps
// running; the snapshot outlives it.
func (h *Handler) createSnapshot(w http.ResponseWriter, r *http.Request) error {
	var body e2bwire.SnapshotRequest
	id, err := h.sandboxRequest(w, r, &body)
	if err != nil {
		return err
	}
	req := sandbox.SnapshotRequest{Owner: ownerFrom(r.Context())}
	if body.Name != nil {
		if req.Name, err = snapshotName(*body.Name); err != nil {
			return err
		}
	}
	snap, err := h.sbx(r.Context()).CreateSnapshot(r.Context(), id, req)
	if err != nil {
		return managerError(fmt.Errorf("snapshot sandbox: %w", err), id, "")
	}
	writeJSON(w, http.StatusCreated, snapshotJSON(snap))
	return nil
}

// snapshotName reads a requested name as upstream does (trimmed, lower-cased,
// "name[:tag]") within what Airlock has: no namespaces, and only the tag
// "default", which is dropped. Refusing another tag beats answering with a
// snapshot that is not under the name the client asked for.
func snapshotName(raw string) (string, error) {
	name, tag, tagged := strings.Cut(strings.ToLower(strings.TrimSpace(raw)), ":")
	switch {
	case strings.Contains(name, "/"):
		return "", badRequest("Invalid snapshot name %q: namespaces are not supported", raw)
	case tagged && tag != snapshotTag:
		return "", badRequest("Invalid snapshot name %q: the only tag Airlock snapshots have is %q", raw, snapshotTag)
	case !snapshotNameRule.MatchString(name):
		return "", badRequest("Invalid snapshot name %q: want 1 to 63 lower-case letters, digits, '.', '_' or '-', starting with a letter or digit", raw)
	}
	return name, nil
}

// listSnapshots serves GET /snapshots: the team's own, newest first, paged
// like GET /v2/sandboxes (§2.5). Names are per team, so the name filter
// too finds the team's snapshot only.
func (h *Handler) listSnapshots(w http.ResponseWriter, r *http.Request) error {
	q := r.URL.Query()
	pq, err := parsePage(q, false, validSnapshotID)
	if err != nil {
		return err
	}
	f := sandbox.SnapshotFilter{Owner: ownerFrom(r.Context())}
	if v := q.Get("sandboxID"); v != "" {
		if !validSandboxID(v) {
			return badRequest("Invalid sandboxID %q: must match ^[a-z0-9]+$", v)
		}
		f.SandboxID = v
	}
	if v := q.Get("name"); v != "" {
		if _, err := snapshotRef(v, "name"); err != nil {
			return err
		}
		f.Name = v
	}
	snaps, err := h.sbx(r.Context()).ListSnapshots(r.Context(), f)
	if err != nil {
		return managerError(fmt.Errorf("list snapshots: %w", err), "", "")
	}
	snaps = page(w, snaps, func(s sandbox.Snapshot) pageKey { return keyOf(s.CreatedAt, s.ID) }, pq)
	out := make([]e2bwire.SnapshotInfo, 0, len(snaps))
	for _, s := range snaps {
		out = append(out, snapshotJSON(s))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func snapshotJSON(s sandbox.Snapshot) e2bwire.SnapshotInfo {
	return e2bwire.SnapshotInfo{SnapshotID: s.ID, Names: nonNil(s.Names)}
}

// snapshotRef validates a reference to a snapshot or template, "<name>[:tag]"
// as upstream writes it (the namespace aside, which Airlock has not), and
// reports whether it has a tag. what names it in messages.
func snapshotRef(ref, what string) (tagged bool, err error) {
	name, tag, tagged := strings.Cut(ref, ":")
	switch {
	case strings.Contains(ref, "/"):
		return false, badRequest("Invalid %s %q: namespaces are not supported", what, ref)
	case !validTemplateRef(name):
		return false, badRequest("Invalid %s %q: want 1 to 128 letters, digits, '.', '_' or '-'", what, ref)
	case tagged && !validTemplateRef(tag):
		return false, badRequest("Invalid %s %q: the tag after ':' must be 1 to 128 letters, digits, '.', '_' or '-'", what, ref)
	}
	return tagged, nil
}

// validSnapshotID accepts the ids a snapshot page token may carry: the
// manager's snapshot IDs, which always have their tag.
func validSnapshotID(id string) bool {
	tagged, err := snapshotRef(id, "snapshot")
	return err == nil && tagged
}

// deleteSnapshotOrTemplate serves DELETE /templates/{templateID}, which the
// SDKs' deleteSnapshot calls with a snapshotID. The snapshot is tried first
// because create resolves a name to a snapshot before a template, so the
// name deletes what it would start; the manager's own lookup decides rather
// than a ListSnapshots first, which could only race with it. A miss falls
// through to the template; a tagged ref is not deleted as a template (a
// template goes with all its tags; one tag is removed with DELETE
// /templates/tags), so its miss is a 404, which deleteSnapshot reads as false.
func (h *Handler) deleteSnapshotOrTemplate(w http.ResponseWriter, r *http.Request) error {
	ref := r.PathValue("templateID")
	tagged, err := snapshotRef(ref, "template")
	if err != nil {
		return err
	}
	err = h.sbx(r.Context()).DeleteSnapshot(r.Context(), ref, ownerFrom(r.Context()))
	switch {
	case err == nil:
		w.WriteHeader(http.StatusNoContent)
		return nil
	// ErrTemplateNotFound counts as a miss too: snapshots are registered
	// where templates are, and a manager may report them in those terms.
	case !errors.Is(err, sandbox.ErrNotFound) && !errors.Is(err, sandbox.ErrTemplateNotFound):
		return managerError(fmt.Errorf("delete snapshot %s: %w", ref, err), "", "")
	case tagged:
		return &apiError{status: http.StatusNotFound, message: fmt.Sprintf("snapshot %q not found", ref), err: err}
	}
	err = h.deleteTemplate(w, r, ref)
	var ae *apiError
	if errors.As(err, &ae) && ae.status == http.StatusNotFound && errors.Is(ae, ErrTemplateNotFound) {
		// Neither: say so, since the client may have meant either.
		return &apiError{status: http.StatusNotFound, message: fmt.Sprintf("snapshot or template %q not found", ref), err: err}
	}
	return err
}
