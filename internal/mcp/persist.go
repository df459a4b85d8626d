package mcp

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
)

// The persistence tools: pause_sandbox, resume_sandbox, snapshot_sandbox,
// fork_sandbox, list_snapshots and delete_snapshot, over the API's pause,
// connect, snapshots and fork endpoints (the SDKs' Sandbox.pause/connect/
// createSnapshot/fork). A paused sandbox is kept on disk with its memory, and
// resumes where it was; a snapshot is a sandbox's files and memory kept under
// an id (and names) that create_sandbox starts new sandboxes from; a fork is
// a snapshot and that many sandboxes started from it at once.

// PersistBackend is a Backend that can pause, resume, snapshot and fork
// sandboxes; HTTPBackend is one. The tools are offered only by backends that
// are, so that tests' fakes need not grow these methods.
type PersistBackend interface {
	// PauseSandbox pauses a running sandbox; keepMemory false keeps only
	// its files (its processes end).
	PauseSandbox(ctx context.Context, sandboxID string, keepMemory bool) error
	// ResumeSandbox resumes a paused sandbox (resumed true) or returns a
	// running one as it is; either way it then lives at least timeout.
	ResumeSandbox(ctx context.Context, sandboxID string, timeout time.Duration) (info SandboxInfo, resumed bool, err error)
	// SnapshotSandbox snapshots a running sandbox; an empty name is none.
	SnapshotSandbox(ctx context.Context, sandboxID, name string) (SnapshotInfo, error)
	// ForkSandbox starts count sandboxes from one capture of a running
	// sandbox, each living timeout; each result holds a sandbox or why
	// that one failed.
	ForkSandbox(ctx context.Context, sandboxID string, count int, timeout time.Duration) ([]ForkResult, error)
	// ListSnapshots lists the snapshots (of one sandbox when sandboxID is
	// set).
	ListSnapshots(ctx context.Context, sandboxID string) ([]SnapshotInfo, error)
	// DeleteSnapshot deletes a snapshot by its id or one of its names.
	DeleteSnapshot(ctx context.Context, ref string) error
}

// SnapshotInfo is one snapshot: the id create_sandbox takes as a template,
// and its names.
type SnapshotInfo struct {
	ID    string
	Names []string
}

// ForkResult is one fork: its sandbox, or the error it met.
type ForkResult struct {
	Sandbox SandboxInfo
	Err     string
}

const (
	maxForks         = 20
	defaultForkCount = 1
)

type pauseIn struct {
	SandboxID  string `json:"sandbox_id" jsonschema:"id of a running sandbox"`
	KeepMemory *bool  `json:"keep_memory,omitempty" jsonschema:"keep its memory, so its processes (servers, kernels, shells) resume where they were; false keeps only its files and its processes end"`
}

type pauseOut struct {
	SandboxID  string `json:"sandbox_id"`
	Paused     bool   `json:"paused"`
	KeptMemory bool   `json:"kept_memory" jsonschema:"whether its processes will resume where they were"`
}

type resumeIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of a paused (or running) sandbox"`
	Timeout   int    `json:"timeout,omitempty" jsonschema:"seconds it lives from now once resumed"`
}

type resumeOut struct {
	Resumed bool       `json:"resumed" jsonschema:"true when it was paused and is running again; false when it was running already"`
	Sandbox sandboxOut `json:"sandbox"`
}

type snapshotIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of a running sandbox"`
	Name      string `json:"name,omitempty" jsonschema:"a name to find the snapshot by (and to start sandboxes from); a name already given to another of your snapshots moves to this one, and that older snapshot is deleted"`
}

type snapshotOut struct {
	SnapshotID string   `json:"snapshot_id" jsonschema:"pass this as create_sandbox's template to start a sandbox from the snapshot"`
	Names      []string `json:"names"`
	SandboxID  string   `json:"sandbox_id,omitempty" jsonschema:"the sandbox it was taken of"`
}

type forkIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of a running sandbox to copy"`
	Count     int    `json:"count,omitempty" jsonschema:"how many copies to start"`
	Timeout   int    `json:"timeout,omitempty" jsonschema:"seconds each copy lives"`
}

type forkOut struct {
	SandboxID string       `json:"sandbox_id" jsonschema:"the sandbox that was copied; it keeps running"`
	Forks     []sandboxOut `json:"forks" jsonschema:"the new sandboxes"`
	Errors    []string     `json:"errors,omitempty" jsonschema:"why the copies that failed did"`
}

type listSnapshotsIn struct {
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"only the snapshots of this sandbox; omit for all of yours"`
}

type listSnapshotsOut struct {
	Snapshots []snapshotOut `json:"snapshots"`
}

type deleteSnapshotIn struct {
	SnapshotID string `json:"snapshot_id" jsonschema:"the snapshot's id or one of its names"`
}

type deleteSnapshotOut struct {
	SnapshotID string `json:"snapshot_id"`
	Deleted    bool   `json:"deleted"`
}

func registerPersistTools(s *mcp.Server, b PersistBackend) {
	addTool(s, &mcp.Tool{
		Name: "pause_sandbox",
		Description: "Pause a running sandbox: it stops using CPU and memory and is kept on disk, with its memory by default, so that resume_sandbox continues it where it was " +
			"(running servers, kernels and variables included). Tools other than resume_sandbox, kill_sandbox and the listing tools fail on a paused sandbox.",
		InputSchema: schemaFor[pauseIn](func(p map[string]*jsonschema.Schema) {
			setDefault(p["keep_memory"], true)
		}),
		Annotations: annotate("Pause a sandbox", hints{idempotent: true}),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in pauseIn) (*mcp.CallToolResult, pauseOut, error) {
		keep := in.KeepMemory == nil || *in.KeepMemory
		p := newProgress(req)
		p.step(ctx, "pausing sandbox "+in.SandboxID)
		if err := b.PauseSandbox(ctx, in.SandboxID, keep); err != nil {
			return nil, pauseOut{}, fmt.Errorf("pause sandbox %s: %w", in.SandboxID, err)
		}
		p.step(ctx, "paused sandbox "+in.SandboxID)
		how := "with its memory: its processes continue where they were when it is resumed"
		if !keep {
			how = "without its memory: its files are kept, its processes ended"
		}
		return textResult("Paused sandbox %s %s. Continue it with resume_sandbox.", in.SandboxID, how),
			pauseOut{SandboxID: in.SandboxID, Paused: true, KeptMemory: keep}, nil
	})
	addTool(s, &mcp.Tool{
		Name: "resume_sandbox",
		Description: "Resume a paused sandbox (made by pause_sandbox) so the other tools work on it again; a running sandbox is returned as it is. " +
			"Either way it then lives at least timeout seconds.",
		InputSchema: schemaFor[resumeIn](func(p map[string]*jsonschema.Schema) {
			timeoutBounds(p["timeout"], true)
		}),
		Annotations: annotate("Resume a sandbox", hints{idempotent: true}),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in resumeIn) (*mcp.CallToolResult, resumeOut, error) {
		p := newProgress(req)
		p.step(ctx, "resuming sandbox "+in.SandboxID)
		info, resumed, err := b.ResumeSandbox(ctx, in.SandboxID, seconds(in.Timeout))
		if err != nil {
			return nil, resumeOut{}, fmt.Errorf("resume sandbox %s: %w", in.SandboxID, err)
		}
		out := resumeOut{Resumed: resumed, Sandbox: toSandboxOut(info)}
		if !resumed {
			return textResult("Sandbox %s was running already; it now expires at %s.", in.SandboxID, out.Sandbox.Expires), out, nil
		}
		p.step(ctx, "sandbox "+in.SandboxID+" is running")
		return textResult("Resumed sandbox %s; it expires at %s.", in.SandboxID, out.Sandbox.Expires), out, nil
	})
	addTool(s, &mcp.Tool{
		Name: "snapshot_sandbox",
		Description: "Snapshot a running sandbox: its files and memory, kept under an id (and a name if given) after the sandbox is gone. " +
			"Start sandboxes from it with create_sandbox (template = the snapshot id or name); they begin where the sandbox was. " +
			"The sandbox keeps running. For copies right now, fork_sandbox does both steps.",
		InputSchema: schemaFor[snapshotIn](func(p map[string]*jsonschema.Schema) {
			p["name"].MinLength = jsonschema.Ptr(1)
		}),
		// Not destructive by itself, but a name already taken moves to the
		// new snapshot and the older one is deleted.
		Annotations: annotate("Snapshot a sandbox", hints{destructive: true}),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in snapshotIn) (*mcp.CallToolResult, snapshotOut, error) {
		p := newProgress(req)
		p.step(ctx, "snapshotting sandbox "+in.SandboxID)
		snap, err := b.SnapshotSandbox(ctx, in.SandboxID, in.Name)
		if err != nil {
			return nil, snapshotOut{}, fmt.Errorf("snapshot sandbox %s: %w", in.SandboxID, err)
		}
		out := toSnapshotOut(snap)
		out.SandboxID = in.SandboxID
		p.step(ctx, "snapshot "+out.SnapshotID+" taken")
		return textResult("Snapshot %s of sandbox %s%s. Start a sandbox from it with create_sandbox template=%q; delete it with delete_snapshot.",
			out.SnapshotID, in.SandboxID, namesNote(out.Names), out.SnapshotID), out, nil
	})
	addTool(s, &mcp.Tool{
		Name: "fork_sandbox",
		Description: "Copy a running sandbox: start count new sandboxes that begin exactly where it is (files, memory, running processes), " +
			"for trying several things from one state. The original keeps running. Kill the copies with kill_sandbox when done.",
		InputSchema: schemaFor[forkIn](func(p map[string]*jsonschema.Schema) {
			setDefault(p["count"], defaultForkCount)
			p["count"].Minimum = jsonschema.Ptr(1.0)
			p["count"].Maximum = jsonschema.Ptr(float64(maxForks))
			timeoutBounds(p["timeout"], true)
		}),
		Annotations: annotate("Fork a sandbox", hints{}),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in forkIn) (*mcp.CallToolResult, forkOut, error) {
		count := max(in.Count, 1)
		p := newProgress(req)
		p.step(ctx, fmt.Sprintf("forking sandbox %s into %d", in.SandboxID, count))
		rs, err := b.ForkSandbox(ctx, in.SandboxID, count, seconds(in.Timeout))
		if err != nil {
			return nil, forkOut{}, fmt.Errorf("fork sandbox %s: %w", in.SandboxID, err)
		}
		out := forkOut{SandboxID: in.SandboxID, Forks: []sandboxOut{}}
		for _, r := range rs {
			if r.Err != "" {
				out.Errors = append(out.Errors, r.Err)
				continue
			}
			out.Forks = append(out.Forks, toSandboxOut(r.Sandbox))
		}
		if len(out.Forks) == 0 {
			return nil, forkOut{}, fmt.Errorf("fork sandbox %s: no copy started: %s", in.SandboxID, strings.Join(out.Errors, "; "))
		}
		p.step(ctx, fmt.Sprintf("%d copies of sandbox %s are running", len(out.Forks), in.SandboxID))
		ids := make([]string, 0, len(out.Forks))
		for _, f := range out.Forks {
			ids = append(ids, f.SandboxID)
		}
		text := fmt.Sprintf("Forked sandbox %s into %s; kill them with kill_sandbox when done.", in.SandboxID, strings.Join(ids, ", "))
		if len(out.Errors) > 0 {
			text += fmt.Sprintf(" %d copies failed: %s", len(out.Errors), strings.Join(out.Errors, "; "))
		}
		return textResult("%s", text), out, nil
	})
	addTool(s, &mcp.Tool{
		Name:        "list_snapshots",
		Description: "List your snapshots (made by snapshot_sandbox and fork_sandbox) with their ids and names; create_sandbox starts a sandbox from any of them.",
		Annotations: annotate("List snapshots", hints{readOnly: true}),
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in listSnapshotsIn) (*mcp.CallToolResult, listSnapshotsOut, error) {
		snaps, err := b.ListSnapshots(ctx, in.SandboxID)
		if err != nil {
			return nil, listSnapshotsOut{}, fmt.Errorf("list snapshots: %w", err)
		}
		out := listSnapshotsOut{Snapshots: make([]snapshotOut, 0, len(snaps))}
		for _, sn := range snaps {
			out.Snapshots = append(out.Snapshots, toSnapshotOut(sn))
		}
		return textResult("%s", snapshotTable(out.Snapshots)), out, nil
	})
	addTool(s, &mcp.Tool{
		Name:        "delete_snapshot",
		Description: "Delete a snapshot (by id or name) for good. Sandboxes already started from it keep running.",
		InputSchema: schemaFor[deleteSnapshotIn](func(p map[string]*jsonschema.Schema) {
			p["snapshot_id"].MinLength = jsonschema.Ptr(1)
		}),
		Annotations: annotate("Delete a snapshot", hints{destructive: true, idempotent: true}),
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in deleteSnapshotIn) (*mcp.CallToolResult, deleteSnapshotOut, error) {
		if err := b.DeleteSnapshot(ctx, in.SnapshotID); err != nil {
			return nil, deleteSnapshotOut{}, fmt.Errorf("delete snapshot %s: %w", in.SnapshotID, err)
		}
		return textResult("Deleted snapshot %s.", in.SnapshotID), deleteSnapshotOut{SnapshotID: in.SnapshotID, Deleted: true}, nil
	})
}

func toSnapshotOut(s SnapshotInfo) snapshotOut {
	names := s.Names
	if names == nil {
		names = []string{}
	}
	return snapshotOut{SnapshotID: s.ID, Names: names}
}

func namesNote(names []string) string {
	if len(names) == 0 {
		return ""
	}
	return " (named " + strings.Join(names, ", ") + ")"
}

// snapshotTable renders snapshots for a person reading the transcript.
func snapshotTable(ss []snapshotOut) string {
	if len(ss) == 0 {
		return "No snapshots. Take one with snapshot_sandbox."
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SNAPSHOT ID\tNAMES")
	for _, s := range ss {
		fmt.Fprintf(w, "%s\t%s\n", s.SnapshotID, strings.Join(s.Names, ", "))
	}
	_ = w.Flush()
	return strings.TrimRight(b.String(), "\n")
}

// --- HTTPBackend -------------------------------------------------------------------

// PauseSandbox implements PersistBackend through POST /sandboxes/{id}/pause.
// The cached envd token is dropped so that the next tool on the sandbox asks
// the API and says it is paused.
func (h *HTTPBackend) PauseSandbox(ctx context.Context, id string, keepMemory bool) error {
	if err := h.c.Pause(ctx, id, keepMemory); err != nil {
		return classify(err)
	}
	h.forget(id)
	return nil
}

// ResumeSandbox implements PersistBackend through POST
// /sandboxes/{id}/connect, which resumes a paused sandbox (201) or returns a
// running one (200), with the details from a GET.
func (h *HTTPBackend) ResumeSandbox(ctx context.Context, id string, timeout time.Duration) (SandboxInfo, bool, error) {
	sb, resumed, err := h.c.Connect(ctx, id, timeout)
	if err != nil {
		return SandboxInfo{}, false, classify(err)
	}
	h.remember(sb.SandboxID, sb.EnvdAccessToken)
	detail, err := h.c.Get(ctx, id)
	if err != nil {
		return SandboxInfo{}, resumed, fmt.Errorf("sandbox %s resumed, but: %w", id, err)
	}
	return info(detail.ListedSandbox), resumed, nil
}

// SnapshotSandbox implements PersistBackend through POST
// /sandboxes/{id}/snapshots.
func (h *HTTPBackend) SnapshotSandbox(ctx context.Context, id, name string) (SnapshotInfo, error) {
	s, err := h.c.CreateSnapshot(ctx, id, name)
	if err != nil {
		return SnapshotInfo{}, classify(err)
	}
	return SnapshotInfo{ID: s.SnapshotID, Names: s.Names}, nil
}

// ForkSandbox implements PersistBackend through POST /sandboxes/{id}/fork,
// then a GET of each fork for its details (the fork's answer has ids and
// tokens only).
func (h *HTTPBackend) ForkSandbox(ctx context.Context, id string, count int, timeout time.Duration) ([]ForkResult, error) {
	rs, err := h.c.Fork(ctx, id, count, timeout)
	if err != nil {
		return nil, classify(err)
	}
	out := make([]ForkResult, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		switch {
		case r.Error != nil:
			out[i].Err = r.Error.Message
			continue
		case r.Sandbox == nil:
			out[i].Err = "the server answered neither a sandbox nor an error"
			continue
		}
		h.remember(r.Sandbox.SandboxID, r.Sandbox.EnvdAccessToken)
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := h.c.Get(ctx, r.Sandbox.SandboxID)
			if err != nil {
				// It started; say so with what is known rather than lose it.
				out[i].Sandbox = SandboxInfo{SandboxID: r.Sandbox.SandboxID, Template: r.Sandbox.TemplateID, State: e2bwire.StateRunning}
				return
			}
			out[i].Sandbox = info(d.ListedSandbox)
		}()
	}
	wg.Wait()
	return out, nil
}

// ListSnapshots implements PersistBackend through GET /snapshots (the first
// 100).
func (h *HTTPBackend) ListSnapshots(ctx context.Context, sandboxID string) ([]SnapshotInfo, error) {
	ss, err := h.c.ListSnapshots(ctx, sandboxID)
	if err != nil {
		return nil, classify(err)
	}
	out := make([]SnapshotInfo, 0, len(ss))
	for _, s := range ss {
		out = append(out, SnapshotInfo{ID: s.SnapshotID, Names: s.Names})
	}
	return out, nil
}

// DeleteSnapshot implements PersistBackend through DELETE /templates/{id},
// where E2B deletes snapshots. That endpoint deletes templates too, so the
// reference is first looked up among the snapshots (the key's team's, which
// the API's own lookup also keeps to): a tool named delete_snapshot must
// never delete a template someone built.
func (h *HTTPBackend) DeleteSnapshot(ctx context.Context, ref string) error {
	ss, err := h.c.FindSnapshots(ctx, ref)
	if err != nil {
		return classify(err)
	}
	if len(ss) == 0 {
		return &kindError{kind: ErrNotFound, err: fmt.Errorf("no snapshot %q among yours (list_snapshots shows them; templates are not deleted here)", ref)}
	}
	return classify(h.c.DeleteSnapshot(ctx, ref))
}
