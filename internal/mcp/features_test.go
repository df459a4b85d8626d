package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/lifecycle"
)

// fullBackend is the fake with every optional part (logs, events, volumes,
// persistence, templates), so that every tool is offered.
type fullBackend struct {
	volumeBackend

	pmu       sync.Mutex
	paused    map[string]bool
	pauses    []bool // keep_memory of each pause
	snaps     []SnapshotInfo
	deleted   []string
	forkErrs  []string // errors of the forks after the first
	builds    []e2bclient.TemplateBuild
	buildLogs []string
	buildErr  error
	buildHold time.Duration // how long a build takes
	status    e2bclient.TemplateBuildStatus
}

func newFullBackend() *fullBackend { return &fullBackend{paused: map[string]bool{}} }

func (f *fullBackend) SandboxLogs(context.Context, string, LogsRequest) ([]LogEntry, error) {
	return []LogEntry{{Timestamp: time.Unix(1, 0), Level: "info", Message: "started"}}, nil
}

func (f *fullBackend) SandboxEvents(context.Context, string, int) ([]lifecycle.Event, error) {
	return nil, nil
}

// known says whether a sandbox id is one the fake has: "nope" is not.
func known(id string) error {
	if id == "nope" {
		return fmt.Errorf("sandbox %q not found (HTTP 404): %w", id, ErrNotFound)
	}
	return nil
}

func (f *fullBackend) PauseSandbox(_ context.Context, id string, keep bool) error {
	if err := known(id); err != nil {
		return err
	}
	f.pmu.Lock()
	defer f.pmu.Unlock()
	if f.paused[id] {
		return fmt.Errorf("sandbox %q is already paused (HTTP 409)", id)
	}
	f.paused[id], f.pauses = true, append(f.pauses, keep)
	return nil
}

func (f *fullBackend) ResumeSandbox(_ context.Context, id string, d time.Duration) (SandboxInfo, bool, error) {
	if err := known(id); err != nil {
		return SandboxInfo{}, false, err
	}
	f.pmu.Lock()
	defer f.pmu.Unlock()
	was := f.paused[id]
	delete(f.paused, id)
	t := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	return SandboxInfo{SandboxID: id, Template: "base", State: "running", StartedAt: t, EndAt: t.Add(d)}, was, nil
}

func (f *fullBackend) SnapshotSandbox(_ context.Context, id, name string) (SnapshotInfo, error) {
	if err := known(id); err != nil {
		return SnapshotInfo{}, err
	}
	f.pmu.Lock()
	defer f.pmu.Unlock()
	if f.paused[id] {
		return SnapshotInfo{}, fmt.Errorf("sandbox %s is paused; resume it with resume_sandbox first: %w", id, ErrPaused)
	}
	s := SnapshotInfo{ID: fmt.Sprintf("snap-%d", len(f.snaps)+1)}
	if name != "" {
		s.Names = []string{name}
	}
	f.snaps = append(f.snaps, s)
	return s, nil
}

func (f *fullBackend) ForkSandbox(_ context.Context, id string, count int, d time.Duration) ([]ForkResult, error) {
	if err := known(id); err != nil {
		return nil, err
	}
	var out []ForkResult
	for i := range count {
		if i > 0 && i-1 < len(f.forkErrs) {
			out = append(out, ForkResult{Err: f.forkErrs[i-1]})
			continue
		}
		out = append(out, ForkResult{Sandbox: SandboxInfo{SandboxID: fmt.Sprintf("%s-fork%d", id, i+1), Template: "base", State: "running"}})
	}
	return out, nil
}

func (f *fullBackend) ListSnapshots(_ context.Context, sandboxID string) ([]SnapshotInfo, error) {
	f.pmu.Lock()
	defer f.pmu.Unlock()
	return slices.Clone(f.snaps), nil
}

func (f *fullBackend) DeleteSnapshot(_ context.Context, ref string) error {
	f.pmu.Lock()
	defer f.pmu.Unlock()
	for i, s := range f.snaps {
		if s.ID == ref || slices.Contains(s.Names, ref) {
			f.snaps = slices.Delete(f.snaps, i, i+1)
			f.deleted = append(f.deleted, ref)
			return nil
		}
	}
	return fmt.Errorf("no snapshot %q among yours: %w", ref, ErrNotFound)
}

func (f *fullBackend) BuildTemplate(ctx context.Context, b e2bclient.TemplateBuild) (e2bclient.TemplateBuildIDs, error) {
	f.pmu.Lock()
	f.builds = append(f.builds, b)
	logs, berr, hold := f.buildLogs, f.buildErr, f.buildHold
	f.pmu.Unlock()
	ids := e2bclient.TemplateBuildIDs{TemplateID: "tpl-1", BuildID: "build-1"}
	for _, l := range logs {
		if b.OnLog != nil {
			b.OnLog(e2bclient.BuildLogEntry{Message: l})
		}
	}
	select {
	case <-ctx.Done():
		return ids, fmt.Errorf("build %s: %w", ids.BuildID, ctx.Err())
	case <-time.After(hold):
	}
	return ids, berr
}

func (f *fullBackend) TemplateBuildStatus(_ context.Context, tid, bid string, offset int) (e2bclient.TemplateBuildStatus, error) {
	if tid != "tpl-1" {
		return e2bclient.TemplateBuildStatus{}, fmt.Errorf("template %q not found: %w", tid, ErrNotFound)
	}
	st := f.status
	if offset < len(st.LogEntries) {
		st.LogEntries = st.LogEntries[offset:]
	} else {
		st.LogEntries = nil
	}
	return st, nil
}

// progressClient connects a client that records progress notifications.
func progressClient(t *testing.T, b Backend, opts *mcp.ClientSessionOptions) (*mcp.ClientSession, func() []*mcp.ProgressNotificationParams) {
	t.Helper()
	var mu sync.Mutex
	var got []*mcp.ProgressNotificationParams
	ctx := context.Background()
	st, ct := mcp.NewInMemoryTransports()
	ss, err := NewServer(b, Options{}).Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ss.Close() })
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			got = append(got, req.Params)
			mu.Unlock()
		},
	}).Connect(ctx, ct, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.Close() })
	return cs, func() []*mcp.ProgressNotificationParams {
		mu.Lock()
		defer mu.Unlock()
		out := slices.Clone(got)
		got = nil
		return out
	}
}

// callWithProgress calls a tool with a progress token and returns the result
// and the messages of the notifications that came with it.
func callWithProgress(t *testing.T, cs *mcp.ClientSession, drain func() []*mcp.ProgressNotificationParams, name string, args map[string]any) (*mcp.CallToolResult, []string) {
	t.Helper()
	drain()
	params := &mcp.CallToolParams{Name: name, Arguments: args}
	params.SetProgressToken("tok-" + name)
	res, err := cs.CallTool(context.Background(), params)
	if err != nil {
		t.Fatalf("%s: protocol error: %v", name, err)
	}
	// Notifications are sent before the result, but the client runs their
	// handler apart from the call: collect until they stop coming.
	var got []*mcp.ProgressNotificationParams
	for quiet, deadline := 0, time.Now().Add(2*time.Second); quiet < 5 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		more := drain()
		if len(more) == 0 {
			quiet++
		} else {
			quiet = 0
		}
		got = append(got, more...)
	}
	var msgs []string
	last := -1.0
	for _, p := range got {
		if p.ProgressToken != "tok-"+name {
			t.Errorf("%s: progress token %v", name, p.ProgressToken)
		}
		if p.Progress <= last {
			t.Errorf("%s: progress %v after %v: must only grow", name, p.Progress, last)
		}
		last = p.Progress
		msgs = append(msgs, p.Message)
	}
	return res, msgs
}

// TestEveryToolAnnotatedWithOutputSchema: every tool a full backend offers has
// a title, every hint set explicitly (the spec's defaults are destructive and
// open world), and an output schema of an object with properties.
func TestEveryToolAnnotatedWithOutputSchema(t *testing.T) {
	cs := connectClient(t, newFullBackend())
	lt, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"create_sandbox", "kill_sandbox", "list_sandboxes", "run_code", "run_command", "read_file", "write_file",
		"list_files", "set_timeout", "get_metrics", "sandbox_logs", "sandbox_events", "create_volume", "list_volumes", "get_volume",
		"delete_volume", "pause_sandbox", "resume_sandbox", "snapshot_sandbox", "fork_sandbox", "list_snapshots", "delete_snapshot",
		"build_template", "get_template_build"}
	var got []string
	tools := map[string]*mcp.Tool{}
	for _, tool := range lt.Tools {
		got = append(got, tool.Name)
		tools[tool.Name] = tool
		a := tool.Annotations
		if a == nil || a.Title == "" || a.DestructiveHint == nil || a.OpenWorldHint == nil {
			t.Errorf("%s: annotations incomplete: %+v", tool.Name, a)
			continue
		}
		if a.ReadOnlyHint && (*a.DestructiveHint || !a.IdempotentHint) {
			t.Errorf("%s: read-only but destructive=%v idempotent=%v", tool.Name, *a.DestructiveHint, a.IdempotentHint)
		}
		in, _ := json.Marshal(tool.InputSchema)
		b, _ := json.Marshal(tool.OutputSchema)
		// A list of types (["null","array"]) is legal but not portable
		// (MCP Inspector's --strict warns of each).
		if bytes.Contains(in, []byte(`"type":[`)) || bytes.Contains(b, []byte(`"type":[`)) {
			t.Errorf("%s: a type list in\n%s\n%s", tool.Name, in, b)
		}
		var schema struct {
			Type       string                     `json:"type"`
			Properties map[string]json.RawMessage `json:"properties"`
		}
		if err := json.Unmarshal(b, &schema); err != nil || schema.Type != "object" || len(schema.Properties) == 0 {
			t.Errorf("%s: output schema %s", tool.Name, b)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("tools:\n got %v\nwant %v", got, want)
	}
	hint := func(name string) (readOnly, destructive, idempotent, openWorld bool) {
		a := tools[name].Annotations
		return a.ReadOnlyHint, *a.DestructiveHint, a.IdempotentHint, *a.OpenWorldHint
	}
	for _, c := range []struct {
		tool                                      string
		readOnly, destructive, idempotent, openWd bool
	}{
		{"list_sandboxes", true, false, true, false},
		{"read_file", true, false, true, false},
		{"kill_sandbox", false, true, true, false},
		{"create_sandbox", false, false, false, false},
		{"run_code", false, true, false, true},
		{"run_command", false, true, false, true},
		{"write_file", false, true, true, false},
		{"pause_sandbox", false, false, true, false},
		{"delete_snapshot", false, true, true, false},
		{"build_template", false, true, false, true},
		{"get_template_build", true, false, true, false},
	} {
		r, d, i, o := hint(c.tool)
		if r != c.readOnly || d != c.destructive || i != c.idempotent || o != c.openWd {
			t.Errorf("%s: readOnly=%v destructive=%v idempotent=%v openWorld=%v, want %+v", c.tool, r, d, i, o, c)
		}
	}
}

// TestBothProtocolEras: a client of the stateless 2026-07-28 era (which
// connects with server/discover) and one of the 2025-06-18 era (initialize)
// both reach every tool and the resources, over the same server.
func TestBothProtocolEras(t *testing.T) {
	for _, version := range []string{"", "2026-07-28", "2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05"} {
		t.Run("v"+version, func(t *testing.T) {
			f := newFullBackend()
			f.files = map[string][]byte{"/home/user/a.txt": []byte("hello")}
			cs, _ := progressClient(t, f, &mcp.ClientSessionOptions{ProtocolVersion: version})
			want := version
			if want == "" {
				want = "2026-07-28" // the SDK's client asks for the newest
			}
			if got := cs.InitializeResult().ProtocolVersion; got != want {
				t.Errorf("negotiated %s, want %s", got, want)
			}
			if name := cs.InitializeResult().ServerInfo; name == nil || name.Name != "airlock" {
				t.Errorf("server info %+v", name)
			}
			lt, err := cs.ListTools(context.Background(), nil)
			if err != nil || len(lt.Tools) < 20 {
				t.Fatalf("tools/list: %v (%d tools)", err, len(lt.Tools))
			}
			res := call(t, cs, "create_sandbox", map[string]any{"template": "base"})
			if res.IsError {
				t.Fatal(text(res))
			}
			rr, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandbox://sb1/home/user/a.txt"})
			if err != nil || len(rr.Contents) != 1 || rr.Contents[0].Text != "hello" {
				t.Fatalf("resources/read: %v %+v", err, rr)
			}
		})
	}
}

// TestProgressNotifications: run_code and run_command report each chunk of
// output, create_sandbox and run_code's own create their phases.
func TestProgressNotifications(t *testing.T) {
	defer func(d time.Duration) { progressEvery = d }(progressEvery)
	progressEvery = 0
	f := &outputBackend{fakeBackend: &fakeBackend{exec: Execution{Stdout: []string{"a\n", "b\n", "c\n"}}}}
	cs, drain := progressClient(t, f, nil)

	res, msgs := callWithProgress(t, cs, drain, "run_code", map[string]any{"code": "for x in 'abc': print(x)"})
	if res.IsError {
		t.Fatal(text(res))
	}
	want := []string{"creating a sandbox from template code-interpreter-v1", "sandbox sb1 is running", "running the code in sandbox sb1",
		"stdout: a", "stdout: b", "stdout: c", "result: 42"}
	if !slices.Equal(msgs, want) {
		t.Errorf("run_code progress:\n got %q\nwant %q", msgs, want)
	}
	res, msgs = callWithProgress(t, cs, drain, "run_command", map[string]any{"sandbox_id": "sb1", "command": "make"})
	if res.IsError {
		t.Fatal(text(res))
	}
	want = []string{"running the command in sandbox sb1", "stdout: compiling", "stderr: warning: x", "stdout: done"}
	if !slices.Equal(msgs, want) {
		t.Errorf("run_command progress:\n got %q\nwant %q", msgs, want)
	}
	// Without a token: no notifications, and the backend is not asked to report.
	drain()
	f.reporting = 0
	call(t, cs, "run_command", map[string]any{"sandbox_id": "sb1", "command": "make"})
	if got := drain(); len(got) != 0 || f.reporting != 0 {
		t.Errorf("without a progress token: %d notifications, OnOutput set %d times", len(got), f.reporting)
	}

	// Throttled: a burst of output sends one notification.
	progressEvery = time.Hour
	f.fakeBackend.exec = Execution{Stdout: []string{"1\n", "2\n", "3\n"}}
	_, msgs = callWithProgress(t, cs, drain, "run_code", map[string]any{"code": "x", "sandbox_id": "sb1"})
	if !slices.Equal(msgs, []string{"running the code in sandbox sb1", "stdout: 1"}) {
		t.Errorf("throttled: %q", msgs)
	}
}

// outputBackend reports output chunks through the request's OnOutput, as
// HTTPBackend does while the program runs.
type outputBackend struct {
	*fakeBackend
	reporting int // calls with OnOutput set
}

func (b *outputBackend) RunCode(ctx context.Context, r RunCodeRequest) (Execution, error) {
	ex, err := b.fakeBackend.RunCode(ctx, r)
	if r.OnOutput != nil {
		for _, s := range ex.Stdout {
			r.OnOutput("stdout", s)
		}
		r.OnOutput("result", "42")
	}
	return ex, err
}

func (b *outputBackend) RunCommand(_ context.Context, r RunCommandRequest) (CommandResult, error) {
	if r.OnOutput != nil {
		b.reporting++
		r.OnOutput("stdout", "compiling\n")
		r.OnOutput("stderr", "warning: x\n")
		r.OnOutput("stdout", "\n  done  \n\n")
	}
	return CommandResult{Stdout: "compiling\ndone\n", Stderr: "warning: x\n"}, nil
}

// TestPersistTools: pause, resume, snapshot, fork, list and delete snapshots,
// and each mistake as an isError result that says what to do.
func TestPersistTools(t *testing.T) {
	f := newFullBackend()
	cs, drain := progressClient(t, f, nil)

	res, msgs := callWithProgress(t, cs, drain, "pause_sandbox", map[string]any{"sandbox_id": "sb1"})
	var p pauseOut
	structured(t, res, &p)
	if res.IsError || !p.Paused || !p.KeptMemory || !f.pauses[0] || !slices.Equal(msgs, []string{"pausing sandbox sb1", "paused sandbox sb1"}) {
		t.Errorf("pause: %+v %q %v", p, text(res), msgs)
	}
	res = call(t, cs, "pause_sandbox", map[string]any{"sandbox_id": "sb1"})
	if !res.IsError || !strings.Contains(text(res), "already paused") {
		t.Errorf("pause twice: %q", text(res))
	}
	res = call(t, cs, "snapshot_sandbox", map[string]any{"sandbox_id": "sb1"})
	if !res.IsError || !strings.Contains(text(res), "resume it with resume_sandbox") {
		t.Errorf("snapshot of a paused sandbox: %q", text(res))
	}
	res = call(t, cs, "resume_sandbox", map[string]any{"sandbox_id": "sb1", "timeout": 60})
	var r resumeOut
	structured(t, res, &r)
	if res.IsError || !r.Resumed || r.Sandbox.SandboxID != "sb1" || r.Sandbox.Expires != "2026-01-02T03:05:05Z" {
		t.Errorf("resume: %+v %q", r, text(res))
	}
	res = call(t, cs, "resume_sandbox", map[string]any{"sandbox_id": "sb1"})
	structured(t, res, &r)
	if res.IsError || r.Resumed || !strings.Contains(text(res), "running already") {
		t.Errorf("resume running: %+v %q", r, text(res))
	}
	call(t, cs, "pause_sandbox", map[string]any{"sandbox_id": "sb2", "keep_memory": false})
	if len(f.pauses) != 2 || f.pauses[1] {
		t.Errorf("keep_memory false not passed: %v", f.pauses)
	}

	res = call(t, cs, "snapshot_sandbox", map[string]any{"sandbox_id": "sb3", "name": "checkpoint"})
	var sn snapshotOut
	structured(t, res, &sn)
	if res.IsError || sn.SnapshotID != "snap-1" || !slices.Equal(sn.Names, []string{"checkpoint"}) || sn.SandboxID != "sb3" ||
		!strings.Contains(text(res), `template="snap-1"`) {
		t.Errorf("snapshot: %+v %q", sn, text(res))
	}
	call(t, cs, "snapshot_sandbox", map[string]any{"sandbox_id": "sb3"})
	res = call(t, cs, "list_snapshots", map[string]any{})
	var ls listSnapshotsOut
	structured(t, res, &ls)
	if res.IsError || len(ls.Snapshots) != 2 || ls.Snapshots[1].Names == nil || !regexp.MustCompile(`(?m)^snap-1 +checkpoint$`).MatchString(text(res)) {
		t.Errorf("list_snapshots: %+v %q", ls, text(res))
	}
	res = call(t, cs, "delete_snapshot", map[string]any{"snapshot_id": "checkpoint"})
	if res.IsError || !slices.Equal(f.deleted, []string{"checkpoint"}) {
		t.Errorf("delete_snapshot: %q %v", text(res), f.deleted)
	}
	res = call(t, cs, "delete_snapshot", map[string]any{"snapshot_id": "base"})
	if !res.IsError || !strings.Contains(text(res), `no snapshot "base"`) {
		t.Errorf("delete_snapshot of a template name: %q", text(res))
	}

	f.forkErrs = []string{"the server is out of memory"}
	res = call(t, cs, "fork_sandbox", map[string]any{"sandbox_id": "sb3", "count": 2})
	var fo forkOut
	structured(t, res, &fo)
	if res.IsError || len(fo.Forks) != 1 || fo.Forks[0].SandboxID != "sb3-fork1" || len(fo.Errors) != 1 || !strings.Contains(text(res), "1 copies failed") {
		t.Errorf("fork, one failed: %+v %q", fo, text(res))
	}
	res = call(t, cs, "fork_sandbox", map[string]any{"sandbox_id": "sb3", "count": 21})
	if !res.IsError {
		t.Errorf("fork count above the maximum accepted: %q", text(res))
	}

	// An unknown sandbox is a tool error naming it, for every tool.
	for _, name := range []string{"pause_sandbox", "resume_sandbox", "snapshot_sandbox", "fork_sandbox"} {
		res := call(t, cs, name, map[string]any{"sandbox_id": "nope"})
		if !res.IsError || !strings.Contains(text(res), `"nope" not found`) {
			t.Errorf("%s of an unknown sandbox: isError=%v %q", name, res.IsError, text(res))
		}
	}
}

// TestBuildTemplate: the Dockerfile becomes the SDK's steps and files; the
// build's log comes as progress; a failure is an error result with the log's
// end; a build longer than the wait is reported as going on.
func TestBuildTemplate(t *testing.T) {
	defer func(d time.Duration) { progressEvery = d }(progressEvery)
	progressEvery = 0
	f := newFullBackend()
	f.buildLogs = []string{"step 1/3: RUN pip install requests", "Successfully installed requests", "step 3/3: COPY app /home/user/app"}
	cs, drain := progressClient(t, f, nil)
	dockerfile := `ARG V=1
FROM python3
ARG GREETING=hi
ENV A=1 B="two words"
RUN pip install requests
RUN ["echo", "it's"]
WORKDIR /home/user
COPY --chown=user app main.txt /home/user/app
USER user
`
	res, msgs := callWithProgress(t, cs, drain, "build_template", map[string]any{
		"name": "my-tpl:v1", "dockerfile": dockerfile,
		"files":     map[string]string{"app/a.py": "print(1)", "app/sub/b.py": "print(2)", "main.txt": "main", "other": "x"},
		"start_cmd": "python3 -m http.server", "ready_cmd": "curl -s localhost:8000", "cpu_count": 2, "memory_mb": 1024,
	})
	var out buildTemplateOut
	structured(t, res, &out)
	if res.IsError || out.Status != "ready" || out.TemplateID != "tpl-1" || out.BuildID != "build-1" || len(out.Logs) != 3 {
		t.Fatalf("build: %+v %q", out, text(res))
	}
	want := []string{"starting the build of template my-tpl:v1", "step 1/3: RUN pip install requests", "Successfully installed requests",
		"step 3/3: COPY app /home/user/app", "template my-tpl:v1 is ready"}
	if !slices.Equal(msgs, want) {
		t.Errorf("progress:\n got %q\nwant %q", msgs, want)
	}
	b := f.builds[0]
	if b.Request.Name != "my-tpl:v1" || b.Request.CPUCount != 2 || b.Request.MemoryMB != 1024 || b.Spec.FromTemplate != "python3" || b.Spec.FromImage != "" ||
		b.Spec.StartCmd != "python3 -m http.server" || b.Spec.ReadyCmd != "curl -s localhost:8000" || b.Spec.Force {
		t.Errorf("build request: %+v spec %+v", b.Request, b.Spec)
	}
	var steps []string
	for _, s := range b.Spec.Steps {
		steps = append(steps, s.Type+" "+strings.Join(s.Args, "|"))
	}
	wantSteps := []string{"ENV GREETING|hi", "ENV A|1|B|two words", "RUN pip install requests", `RUN 'echo' 'it'\''s'`, "WORKDIR /home/user",
		"COPY app|/home/user/app/|user", "COPY main.txt|/home/user/app/|user", "USER user"}
	if !slices.Equal(steps, wantSteps) {
		t.Errorf("steps:\n got %q\nwant %q", steps, wantSteps)
	}
	var names []string
	for _, file := range b.Files["app"] {
		names = append(names, file.Name+"="+string(file.Content))
	}
	if !slices.Equal(names, []string{"app/a.py=print(1)", "app/sub/b.py=print(2)"}) || len(b.Files["main.txt"]) != 1 || b.Files["other"] != nil {
		t.Errorf("files: %v, %v", names, b.Files)
	}

	// FROM an image; skip_cache.
	call(t, cs, "build_template", map[string]any{"name": "img", "dockerfile": "FROM debian:bookworm\nRUN true", "skip_cache": true})
	if b := f.builds[1]; b.Spec.FromImage != "debian:bookworm" || b.Spec.FromTemplate != "" || !b.Spec.Force {
		t.Errorf("FROM an image: %+v", b.Spec)
	}

	// Mistakes in the Dockerfile or files are tool errors that say what to do,
	// and no build is asked for.
	for _, c := range []struct{ dockerfile, want string }{
		{"RUN true", "only ARG may come before FROM"},
		{"# nothing", "empty"},
		{"FROM base\nCMD [\"python3\"]", "pass it as start_cmd instead"},
		{"FROM base\nCOPY missing.txt /x", "no such file in files (it has: a.txt)"},
		{"FROM base\nCOPY ../a.txt /x", "inside the build context"},
		{"FROM base\nCOPY *.txt /x", "wildcards"},
		{"FROM base\nADD https://example.com/x /x", "ADD from a URL"},
	} {
		res := call(t, cs, "build_template", map[string]any{"name": "bad", "dockerfile": c.dockerfile, "files": map[string]string{"a.txt": "a"}})
		if !res.IsError || !strings.Contains(text(res), c.want) {
			t.Errorf("%q: isError=%v %q, want %q", c.dockerfile, res.IsError, text(res), c.want)
		}
	}
	if res := call(t, cs, "build_template", map[string]any{"name": "bad", "dockerfile": "FROM base", "files": map[string]string{"/etc/passwd": "x"}}); !res.IsError {
		t.Error("an absolute path in files accepted")
	}
	if len(f.builds) != 2 {
		t.Errorf("%d builds asked for, want 2", len(f.builds))
	}

	// A failed build: isError with the reason and the log's end.
	f.buildErr = &e2bclient.BuildError{TemplateID: "tpl-1", BuildID: "build-1", Reason: e2bclient.BuildReason{Message: "step 2 failed: exit code 1"}}
	res = call(t, cs, "build_template", map[string]any{"name": "x", "dockerfile": "FROM base\nRUN false"})
	structured(t, res, &out)
	if !res.IsError || out.Status != "error" || !strings.Contains(text(res), "step 2 failed") || !strings.Contains(text(res), "Successfully installed requests") {
		t.Errorf("failed build: %+v %q", out, text(res))
	}

	// Longer than the wait: the build goes on, get_template_build follows it.
	f.buildErr, f.buildHold = nil, time.Hour
	f.status = e2bclient.TemplateBuildStatus{Status: "building", LogEntries: []e2bclient.BuildLogEntry{{Message: "one"}, {Message: "two"}, {Message: "three"}, {Message: "four"}}}
	start := time.Now()
	res = call(t, cs, "build_template", map[string]any{"name": "slow", "dockerfile": "FROM base\nRUN sleep 1000", "wait": 10})
	structured(t, res, &out)
	if res.IsError || out.Status != "building" || !strings.Contains(text(res), `get_template_build template_id="tpl-1" build_id="build-1"`) {
		t.Errorf("wait over: %+v %q", out, text(res))
	}
	if d := time.Since(start); d < 9*time.Second || d > 20*time.Second {
		t.Errorf("waited %s, want about 10s", d)
	}
	res = call(t, cs, "get_template_build", map[string]any{"template_id": "tpl-1", "build_id": "build-1", "logs_offset": 1})
	var st templateBuildOut
	structured(t, res, &st)
	if res.IsError || st.Status != "building" || !slices.Equal(st.Logs, []string{"two", "three", "four"}) || st.NextLogsOffset != 4 {
		t.Errorf("get_template_build: %+v %q", st, text(res))
	}
	if res := call(t, cs, "get_template_build", map[string]any{"template_id": "nope", "build_id": "b"}); !res.IsError || !strings.Contains(text(res), "not found") {
		t.Errorf("unknown build: %q", text(res))
	}
}

// TestResources: sandbox files through resources/read (text, binary, a
// directory, mistakes as JSON-RPC errors that say what is wrong), the
// template in resources/templates/list, running sandboxes in resources/list.
func TestResources(t *testing.T) {
	defer func(n int) { maxResourceBytes = n }(maxResourceBytes)
	maxResourceBytes = 64
	png := []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
	f := newFullBackend()
	f.files = map[string][]byte{
		"/home/user/notes":      []byte("# hi\n"),
		"/home/user/plot.png":   png,
		"/home/user/data.bin":   {0xff, 0xfe, 0x00},
		"/home/user/empty":      {},
		"/home/user/big.txt":    bytes.Repeat([]byte("x"), 65),
		"/home/user/a b/c.json": []byte(`{"a":1}`),
	}
	f.dirs = map[string]bool{"/home/user": true}
	cs := connectClient(t, f)
	ctx := context.Background()

	tl, err := cs.ListResourceTemplates(ctx, nil)
	if err != nil || len(tl.ResourceTemplates) != 1 || tl.ResourceTemplates[0].URITemplate != "sandbox://{sandbox_id}/{+path}" {
		t.Fatalf("templates: %v %+v", err, tl)
	}
	read := func(uri string) (*mcp.ResourceContents, error) {
		t.Helper()
		r, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			return nil, err
		}
		if len(r.Contents) != 1 || r.Contents[0].URI != uri {
			t.Fatalf("%s: contents %+v", uri, r.Contents)
		}
		return r.Contents[0], nil
	}
	for _, c := range []struct {
		uri, mime, text string
		blob            []byte
	}{
		{"sandbox://sb1/home/user/notes", "text/plain; charset=utf-8", "# hi\n", nil},
		{"sandbox://sb1/home/user/plot.png", "image/png", "", png},
		{"sandbox://sb1/home/user/data.bin", "application/octet-stream", "", []byte{0xff, 0xfe, 0x00}},
		{"sandbox://sb1/home/user/empty", "text/plain; charset=utf-8", "", []byte{}},
		{"sandbox://sb1/home/user/a%20b/c.json", "application/json", `{"a":1}`, nil},
		{"sandbox://sb1/home/user/../user/notes", "text/plain; charset=utf-8", "# hi\n", nil},
	} {
		got, err := read(c.uri)
		if err != nil {
			t.Errorf("%s: %v", c.uri, err)
			continue
		}
		if got.MIMEType != c.mime || got.Text != c.text || (c.blob != nil && !bytes.Equal(got.Blob, c.blob)) {
			t.Errorf("%s: mime %q text %q blob %q, want %q %q %q", c.uri, got.MIMEType, got.Text, got.Blob, c.mime, c.text, c.blob)
		}
	}

	// A directory: a JSON listing whose entries have URIs of their own.
	got, err := read("sandbox://sb1/home/user")
	if err != nil {
		t.Fatal(err)
	}
	var dir dirListingOut
	if err := json.Unmarshal([]byte(got.Text), &dir); err != nil || got.MIMEType != "application/json" || dir.Path != "/home/user" || len(dir.Entries) != 2 ||
		dir.Entries[0].URI != "sandbox://sb1/home/user/a.txt" || dir.Entries[1].Type != "dir" {
		t.Errorf("directory: %v %s", err, got.Text)
	}

	// Mistakes are JSON-RPC errors (resources have no isError) that say why.
	for _, c := range []struct {
		uri  string
		code int64
		want string
	}{
		{"sandbox://sb1/home/user/nope.txt", mcp.CodeResourceNotFound, "Resource not found"},
		{"sandbox://sb1/home/user/big.txt", jsonrpc.CodeInvalidParams, "larger than 64 bytes"},
		{"file:///etc/passwd", mcp.CodeResourceNotFound, "Resource not found"},
		{"sandbox://sb1", mcp.CodeResourceNotFound, "Resource not found"},
	} {
		_, err := read(c.uri)
		var we *jsonrpc.Error
		if !errors.As(err, &we) || we.Code != c.code || !strings.Contains(we.Message, c.want) {
			t.Errorf("%s: %v, want code %d %q", c.uri, err, c.code, c.want)
		}
	}
	f.err = fmt.Errorf("sandbox sb1 is paused; resume it with resume_sandbox first: %w", ErrPaused)
	_, err = read("sandbox://sb1/home/user/notes")
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || !strings.Contains(we.Message, "resume_sandbox") {
		t.Errorf("paused: %v", err)
	}
	f.err = nil

	// resources/list: each running sandbox's home directory, readable.
	rl, err := cs.ListResources(ctx, nil)
	if err != nil || len(rl.Resources) != 2 || rl.Resources[0].URI != "sandbox://short/home/user" || rl.Resources[0].MIMEType != "application/json" {
		t.Fatalf("resources/list: %v %+v", err, rl)
	}
}

// TestOutputBounds: long output keeps its beginning and end with a note
// between, in the text and the structured content, for run_command, run_code
// and read_file alike.
func TestOutputBounds(t *testing.T) {
	long := strings.Repeat("é", 40<<10) + "THE END\n" // 80 KiB of two-byte runes
	f := &fakeBackend{
		cmd:   CommandResult{Stdout: "START\n" + long},
		exec:  Execution{Stdout: []string{"START\n", long}, Results: []Result{{IsMain: true, Formats: map[string]string{"text": "START\n" + long}}}},
		files: map[string][]byte{"/big.txt": []byte("START\n" + long), "/big.bin": bytes.Repeat([]byte{0xff}, 100<<10)},
	}
	cs := connectClient(t, f)
	check := func(what, s string) {
		t.Helper()
		if len(s) > outputHead+outputTail+clipSlack || !strings.HasPrefix(s, "START") || !strings.HasSuffix(s, "THE END\n") ||
			!strings.Contains(s, "cut from the middle of 80 KiB of output") || !utf8Valid(s) {
			t.Errorf("%s: %d bytes, %q...%q", what, len(s), s[:min(len(s), 20)], s[max(0, len(s)-20):])
		}
	}
	res := call(t, cs, "run_command", map[string]any{"sandbox_id": "s", "command": "cat big"})
	var rc runCommandOut
	structured(t, res, &rc)
	check("run_command stdout", rc.Stdout)
	if !rc.Truncated || !strings.Contains(text(res), "cut from the middle") {
		t.Errorf("run_command: truncated=%v", rc.Truncated)
	}
	res = call(t, cs, "run_code", map[string]any{"code": "x", "sandbox_id": "s"})
	var co runCodeOut
	structured(t, res, &co)
	check("run_code stdout", co.Stdout)
	check("run_code result", co.Results[0].Text)
	if !co.Truncated {
		t.Error("run_code: not marked truncated")
	}
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": "s", "path": "/big.txt"})
	var rf readFileOut
	structured(t, res, &rf)
	if !rf.Truncated || rf.Encoding != "utf8" || rf.Size > maxFileText || !strings.HasPrefix(rf.Content, "START") || !utf8Valid(rf.Content) ||
		!strings.Contains(text(res), "only the first") {
		t.Errorf("read_file text: truncated=%v size=%d %q", rf.Truncated, rf.Size, text(res)[max(0, len(text(res))-200):])
	}
	res = call(t, cs, "read_file", map[string]any{"sandbox_id": "s", "path": "/big.bin"})
	structured(t, res, &rf)
	if !rf.Truncated || rf.Encoding != "base64" || len(rf.Content) > maxFileText {
		t.Errorf("read_file binary: truncated=%v %d base64 bytes", rf.Truncated, len(rf.Content))
	}
	// Short output is left alone.
	f.cmd = CommandResult{Stdout: "short\n"}
	res = call(t, cs, "run_command", map[string]any{"sandbox_id": "s", "command": "echo"})
	rc = runCommandOut{}
	structured(t, res, &rc)
	if rc.Stdout != "short\n" || rc.Truncated {
		t.Errorf("short output: %+v", rc)
	}
}

func utf8Valid(s string) bool { return utf8.ValidString(s) }

// TestClipBuffer: what a command printed is kept as its head and tail, with
// the count of what was cut, however it was written.
func TestClipBuffer(t *testing.T) {
	defer func(h, tl int) { outputHead, outputTail = h, tl }(outputHead, outputTail)
	outputHead, outputTail = 8, 12
	for _, chunk := range []int{1, 3, 7, 100} {
		var c clipBuffer
		var all strings.Builder
		for i := 0; i < 50; i++ {
			s := fmt.Sprintf("%02d", i)
			all.WriteString(s)
		}
		src := all.String()
		for i := 0; i < len(src); i += chunk {
			c.Write([]byte(src[i:min(i+chunk, len(src))]))
		}
		got := c.String()
		if !strings.HasPrefix(got, src[:8]) || !strings.HasSuffix(got, src[len(src)-12:]) || !strings.Contains(got, "80 bytes cut from the middle of 100 bytes") || !c.truncated() {
			t.Errorf("chunks of %d: %q", chunk, got)
		}
	}
	var c clipBuffer
	c.Write([]byte("short"))
	if c.String() != "short" || c.truncated() {
		t.Errorf("short: %q", c.String())
	}
	// A cut inside a rune drops its partial bytes.
	c = clipBuffer{}
	c.Write([]byte("x" + strings.Repeat("é", 30)))
	if got := c.String(); !utf8Valid(got) {
		t.Errorf("runes cut: %q", got)
	}
}
