package mcp_test

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	airlockmcp "github.com/airlock-sandbox/airlock/internal/mcp"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func createBase(t *testing.T, cs *mcp.ClientSession) string {
	t.Helper()
	res := airlockmcp.Call(t, cs, "create_sandbox", map[string]any{"template": "base", "timeout": 600})
	mustOK(t, res)
	var sb airlockmcp.SandboxOut
	airlockmcp.Structured(t, res, &sb)
	return sb.SandboxID
}

func mustErr(t *testing.T, res *mcp.CallToolResult, want ...string) {
	t.Helper()
	if !res.IsError {
		t.Errorf("not an error result: %s", airlockmcp.Text(res))
		return
	}
	for _, w := range want {
		if !strings.Contains(airlockmcp.Text(res), w) {
			t.Errorf("error result %q does not say %q", airlockmcp.Text(res), w)
		}
	}
}

func stdout(t *testing.T, cs *mcp.ClientSession, id, command string) string {
	t.Helper()
	res := airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": command})
	mustOK(t, res)
	var out airlockmcp.RunCommandOut
	airlockmcp.Structured(t, res, &out)
	return out.Stdout
}

// TestPersistToolsRealServer: pause (tools then say to resume), resume with
// memory (a background process still runs), snapshot, a sandbox from the
// snapshot, fork, and the snapshot deleted by name; each mistake an isError
// result.
func TestPersistToolsRealServer(t *testing.T) {
	cs := realServer(t)
	id := createBase(t, cs)
	mustOK(t, airlockmcp.Call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "state.txt", "content": "v1"}))
	res := airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "sleep 1000", "background": true})
	mustOK(t, res)
	var bg airlockmcp.RunCommandOut
	airlockmcp.Structured(t, res, &bg)

	res = airlockmcp.Call(t, cs, "pause_sandbox", map[string]any{"sandbox_id": id})
	mustOK(t, res)
	var p airlockmcp.PauseOut
	airlockmcp.Structured(t, res, &p)
	if !p.Paused || !p.KeptMemory {
		t.Fatalf("pause: %+v", p)
	}
	// Every tool on a paused sandbox says what to do, the resource too.
	mustErr(t, airlockmcp.Call(t, cs, "run_command", map[string]any{"sandbox_id": id, "command": "true"}), "paused", "resume_sandbox")
	mustErr(t, airlockmcp.Call(t, cs, "read_file", map[string]any{"sandbox_id": id, "path": "state.txt"}), "paused", "resume_sandbox")
	mustErr(t, airlockmcp.Call(t, cs, "run_code", map[string]any{"sandbox_id": id, "code": "1"}), "paused", "resume_sandbox")
	_, err := cs.ReadResource(context.Background(), &mcp.ReadResourceParams{URI: "sandbox://" + id + "/home/user/state.txt"})
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != jsonrpc.CodeInvalidParams || !strings.Contains(we.Message, "resume_sandbox") {
		t.Errorf("resource of a paused sandbox: %v", err)
	}
	mustErr(t, airlockmcp.Call(t, cs, "pause_sandbox", map[string]any{"sandbox_id": id}))

	res = airlockmcp.Call(t, cs, "resume_sandbox", map[string]any{"sandbox_id": id, "timeout": 600})
	mustOK(t, res)
	var r airlockmcp.ResumeOut
	airlockmcp.Structured(t, res, &r)
	if !r.Resumed || r.Sandbox.Status != "running" {
		t.Fatalf("resume: %+v", r)
	}
	if got := stdout(t, cs, id, "cat state.txt; ps -o comm= -p "+jsonNumber(bg.PID)); got != "v1sleep\n" {
		t.Errorf("after resume: %q (the file and the background process)", got)
	}

	name := "mcp-snap-" + strings.ToLower(rand.Text()[:8])
	res = airlockmcp.Call(t, cs, "snapshot_sandbox", map[string]any{"sandbox_id": id, "name": name})
	mustOK(t, res)
	var snap airlockmcp.SnapshotOut
	airlockmcp.Structured(t, res, &snap)
	// A name without a tag gets the default one.
	if snap.SnapshotID == "" || !slices.Contains(snap.Names, name+":default") {
		t.Fatalf("snapshot: %+v", snap)
	}
	res = airlockmcp.Call(t, cs, "list_snapshots", map[string]any{"sandbox_id": id})
	mustOK(t, res)
	var ls airlockmcp.ListSnapshotsOut
	airlockmcp.Structured(t, res, &ls)
	if !slices.ContainsFunc(ls.Snapshots, func(s airlockmcp.SnapshotOut) bool { return s.SnapshotID == snap.SnapshotID }) {
		t.Errorf("list_snapshots: %+v", ls)
	}
	res = airlockmcp.Call(t, cs, "create_sandbox", map[string]any{"template": snap.SnapshotID, "timeout": 300})
	mustOK(t, res)
	var fromSnap airlockmcp.SandboxOut
	airlockmcp.Structured(t, res, &fromSnap)
	if got := stdout(t, cs, fromSnap.SandboxID, "cat state.txt"); got != "v1" {
		t.Errorf("sandbox from the snapshot: %q", got)
	}
	mustOK(t, airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": fromSnap.SandboxID}))

	res = airlockmcp.Call(t, cs, "fork_sandbox", map[string]any{"sandbox_id": id, "count": 2, "timeout": 300})
	mustOK(t, res)
	var fork airlockmcp.ForkOut
	airlockmcp.Structured(t, res, &fork)
	if len(fork.Forks) != 2 || len(fork.Errors) != 0 {
		t.Fatalf("fork: %+v", fork)
	}
	for _, f := range fork.Forks {
		if got := stdout(t, cs, f.SandboxID, "cat state.txt"); got != "v1" {
			t.Errorf("fork %s: %q", f.SandboxID, got)
		}
		mustOK(t, airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": f.SandboxID}))
	}

	mustOK(t, airlockmcp.Call(t, cs, "delete_snapshot", map[string]any{"snapshot_id": name}))
	mustErr(t, airlockmcp.Call(t, cs, "delete_snapshot", map[string]any{"snapshot_id": name}), "no snapshot")
	// A template is never deleted through delete_snapshot.
	mustErr(t, airlockmcp.Call(t, cs, "delete_snapshot", map[string]any{"snapshot_id": "base"}), `no snapshot "base"`)

	mustOK(t, airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id}))
	for _, tool := range []string{"pause_sandbox", "resume_sandbox", "snapshot_sandbox", "fork_sandbox"} {
		mustErr(t, airlockmcp.Call(t, cs, tool, map[string]any{"sandbox_id": id}), id)
	}
}

func jsonNumber(n uint32) string { b, _ := json.Marshal(n); return string(b) }

// TestResourcesRealServer: a real sandbox's files through resources/read and
// its home directory in resources/list.
func TestResourcesRealServer(t *testing.T) {
	cs := realServer(t)
	id := createBase(t, cs)
	defer airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id})
	mustOK(t, airlockmcp.Call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/home/user/docs/readme.txt", "content": "héllo"}))
	mustOK(t, airlockmcp.Call(t, cs, "write_file", map[string]any{"sandbox_id": id, "path": "/home/user/docs/blob.bin", "content": "/wCAAQ==", "encoding": "base64"}))
	ctx := context.Background()
	read := func(uri string) *mcp.ResourceContents {
		t.Helper()
		r, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: uri})
		if err != nil {
			t.Fatalf("%s: %v", uri, err)
		}
		return r.Contents[0]
	}
	if c := read("sandbox://" + id + "/home/user/docs/readme.txt"); c.Text != "héllo" || !strings.HasPrefix(c.MIMEType, "text/plain") {
		t.Errorf("text: %+v", c)
	}
	if c := read("sandbox://" + id + "/home/user/docs/blob.bin"); string(c.Blob) != "\xff\x00\x80\x01" || c.Text != "" {
		t.Errorf("blob: %+v", c)
	}
	c := read("sandbox://" + id + "/home/user/docs")
	var dir airlockmcp.DirListingOut
	if err := json.Unmarshal([]byte(c.Text), &dir); err != nil || len(dir.Entries) != 2 || dir.Entries[1].URI != "sandbox://"+id+"/home/user/docs/readme.txt" {
		t.Errorf("directory: %v %s", err, c.Text)
	}
	_, err := cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "sandbox://" + id + "/home/user/nope"})
	var we *jsonrpc.Error
	if !errors.As(err, &we) || we.Code != mcp.CodeResourceNotFound {
		t.Errorf("missing file: %v", err)
	}
	_, err = cs.ReadResource(ctx, &mcp.ReadResourceParams{URI: "sandbox://nosuchsandbox/etc/hostname"})
	if !errors.As(err, &we) || we.Code != mcp.CodeResourceNotFound {
		t.Errorf("unknown sandbox: %v", err)
	}
	rl, err := cs.ListResources(ctx, nil)
	if err != nil || !slices.ContainsFunc(rl.Resources, func(r *mcp.Resource) bool { return r.URI == "sandbox://"+id+"/home/user" }) {
		t.Errorf("resources/list: %v %+v", err, rl)
	}
}

// TestBuildTemplateRealServer: a Dockerfile with a COPY from files, through
// the server's template build API, with its log as progress; sandboxes of
// the new template have what it installed. A failing step is an error result.
func TestBuildTemplateRealServer(t *testing.T) {
	var mu sync.Mutex
	var progress []string
	d := daemontest.Start(t, nil)
	c := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, &mcp.ClientOptions{
		ProgressNotificationHandler: func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			progress = append(progress, r.Params.Message)
			mu.Unlock()
		},
	})
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{Endpoint: d.APIURL + "/mcp", HTTPClient: daemontest.BearerClient(daemontest.Key)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()

	name := "mcp-tpl-" + strings.ToLower(rand.Text()[:8])
	params := &mcp.CallToolParams{Name: "build_template", Arguments: map[string]any{
		"name":       name,
		"dockerfile": "FROM base\nCOPY hello.txt /home/user/hello.txt\nRUN echo built-$(id -un) > /home/user/built.txt\nENV GREETING=\"hi there\"\n",
		"files":      map[string]string{"hello.txt": "hello from files"},
		"wait":       900,
	}}
	params.SetProgressToken("build")
	res, err := cs.CallTool(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	mustOK(t, res)
	var out airlockmcp.BuildTemplateOut
	airlockmcp.Structured(t, res, &out)
	if out.Status != "ready" || out.TemplateID == "" || len(out.Logs) == 0 {
		t.Fatalf("build: %+v", out)
	}
	// The client runs its notification handler apart from the call.
	var got []string
	testenv.Eventually(t, 5*time.Second, "the build's last progress", func() bool {
		mu.Lock()
		got = slices.Clone(progress)
		mu.Unlock()
		return len(got) > 0 && got[len(got)-1] == "template "+name+" is ready"
	})
	if len(got) < 3 || got[0] != "starting the build of template "+name || got[len(got)-1] != "template "+name+" is ready" {
		t.Errorf("progress: %q", got)
	}

	res = airlockmcp.Call(t, cs, "create_sandbox", map[string]any{"template": name, "timeout": 300})
	mustOK(t, res)
	var sb airlockmcp.SandboxOut
	airlockmcp.Structured(t, res, &sb)
	defer airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": sb.SandboxID})
	if got := stdout(t, cs, sb.SandboxID, "cat /home/user/hello.txt; echo; cat /home/user/built.txt; echo $GREETING"); got != "hello from files\nbuilt-user\nhi there\n" &&
		got != "hello from files\nbuilt-root\nhi there\n" {
		t.Errorf("sandbox of the built template: %q", got)
	}

	res = airlockmcp.Call(t, cs, "build_template", map[string]any{"name": name + "-bad", "dockerfile": "FROM base\nRUN echo about to fail; exit 3\n"})
	mustErr(t, res, "failed", "about to fail")
}

// TestErasRealServer: against a real server, a go-sdk client negotiates
// 2026-07-28 on /mcp without a session, one of 2025-06-18 gets a session,
// and `airlock mcp` (AIRLOCK_BIN) serves both eras over stdio.
func TestErasRealServer(t *testing.T) {
	d := daemontest.Start(t, nil)
	ctx := context.Background()
	connect := func(t *testing.T, tr mcp.Transport, version string) *mcp.ClientSession {
		t.Helper()
		cs, err := mcp.NewClient(&mcp.Implementation{Name: "test", Version: "0"}, nil).Connect(ctx, tr, &mcp.ClientSessionOptions{ProtocolVersion: version})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cs.Close() })
		want := version
		if want == "" {
			want = "2026-07-28"
		}
		if got := cs.InitializeResult().ProtocolVersion; got != want {
			t.Errorf("negotiated %s, want %s", got, want)
		}
		res := airlockmcp.Call(t, cs, "list_sandboxes", map[string]any{})
		mustOK(t, res)
		return cs
	}
	httpTransport := func() mcp.Transport {
		return &mcp.StreamableClientTransport{Endpoint: d.APIURL + "/mcp", HTTPClient: daemontest.BearerClient(daemontest.Key)}
	}
	t.Run("http 2026-07-28", func(t *testing.T) {
		if cs := connect(t, httpTransport(), ""); cs.ID() != "" {
			t.Errorf("session id %q on a stateless connection", cs.ID())
		}
	})
	t.Run("http 2025-06-18", func(t *testing.T) {
		if cs := connect(t, httpTransport(), "2025-06-18"); cs.ID() == "" {
			t.Error("no session id on a 2025-06-18 connection")
		}
	})
	t.Run("http unknown version in the header", func(t *testing.T) {
		req, _ := http.NewRequest(http.MethodPost, d.APIURL+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Accept", "application/json, text/event-stream")
		req.Header.Set("Mcp-Protocol-Version", "2031-01-01")
		resp, err := daemontest.BearerClient(daemontest.Key).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var body struct {
			Error struct {
				Code int64 `json:"code"`
				Data struct {
					Supported []string `json:"supported"`
				} `json:"data"`
			} `json:"error"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != 400 || body.Error.Code != mcp.CodeUnsupportedProtocolVersion ||
			!slices.Contains(body.Error.Data.Supported, "2025-06-18") {
			t.Errorf("%d %+v %v", resp.StatusCode, body, err)
		}
	})
	bin := os.Getenv("AIRLOCK_BIN")
	for _, version := range []string{"", "2025-06-18"} {
		t.Run("stdio "+version, func(t *testing.T) {
			if bin == "" {
				t.Skip("AIRLOCK_BIN is not set (make build; export AIRLOCK_BIN=$PWD/bin/airlock)")
			}
			cmd := exec.Command(bin, "mcp", "--url", d.APIURL, "--api-key", daemontest.Key)
			cmd.Stderr = os.Stderr
			cs := connect(t, &mcp.CommandTransport{Command: cmd}, version)
			id := createBase(t, cs)
			if got := stdout(t, cs, id, "echo over stdio"); got != "over stdio\n" {
				t.Errorf("run_command: %q", got)
			}
			mustOK(t, airlockmcp.Call(t, cs, "kill_sandbox", map[string]any{"sandbox_id": id}))
		})
	}
}
