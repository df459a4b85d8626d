package mcp

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Limits and defaults the schemas advertise; the SDK validates arguments against
// them and fills in defaults before a handler runs.
const (
	defaultTemplate     = "base"
	interpreterTemplate = "code-interpreter-v1"
	defaultTimeout      = 300
	maxTimeout          = 86400
	maxListDepth        = 10
)

// Languages run_code accepts (the code interpreter's kernels).
var languages = []any{"python", "javascript", "typescript", "bash", "r", "java"}

// --- inputs and outputs -------------------------------------------------------

type createSandboxIn struct {
	Template      string            `json:"template,omitempty" jsonschema:"template to start from: base (Debian with common tools), python3, node, code-interpreter-v1 (run_code kernels), or the name of any template built on this server"`
	Timeout       int               `json:"timeout,omitempty" jsonschema:"seconds until the sandbox is killed automatically; extend later with set_timeout"`
	Metadata      map[string]string `json:"metadata,omitempty" jsonschema:"labels to find the sandbox again with list_sandboxes"`
	Envs          map[string]string `json:"envs,omitempty" jsonschema:"environment variables for every command and kernel in the sandbox"`
	AllowInternet *bool             `json:"allow_internet,omitempty" jsonschema:"whether the sandbox may reach the internet (default: the server's policy, normally allowed)"`
	VolumeMounts  []volumeMount     `json:"volume_mounts,omitempty" jsonschema:"volumes (made with create_volume) to mount into the sandbox; their files outlive it and can be mounted again by later sandboxes"`
}

// volumeMount is one entry of create_sandbox's volume_mounts, and of a
// sandbox's as tools report it.
type volumeMount struct {
	Name string `json:"name" jsonschema:"the volume's name, as create_volume or list_volumes show it"`
	Path string `json:"path" jsonschema:"absolute path in the sandbox to mount the volume at, e.g. /mnt/data"`
}

// sandboxOut is one sandbox as tools report it.
type sandboxOut struct {
	SandboxID string            `json:"sandbox_id" jsonschema:"pass this to the other tools"`
	Template  string            `json:"template"`
	Status    string            `json:"status" jsonschema:"running or paused"`
	Started   string            `json:"started" jsonschema:"RFC 3339 time the sandbox started"`
	Uptime    string            `json:"uptime" jsonschema:"how long ago the sandbox started, e.g. 3m12s"`
	Expires   string            `json:"expires" jsonschema:"RFC 3339 time the sandbox will be killed unless its timeout is extended"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	CPUCount  int               `json:"cpu_count,omitempty"`
	MemoryMB  int               `json:"memory_mb,omitempty"`
	// VolumeMounts are the volumes the server reports mounted in the sandbox.
	VolumeMounts []volumeMount `json:"volume_mounts,omitempty"`
	// Latest metrics sample; absent when none was available.
	CPUPercent    *float64 `json:"cpu_percent,omitempty" jsonschema:"CPU use in percent of the sandbox's CPUs (latest sample)"`
	MemoryUsedMB  *float64 `json:"memory_used_mb,omitempty" jsonschema:"memory in use in MiB (latest sample)"`
	MemoryTotalMB *float64 `json:"memory_total_mb,omitempty" jsonschema:"memory limit in MiB"`
}

type sandboxIDIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of the sandbox, from create_sandbox, run_code or list_sandboxes"`
}

type killOut struct {
	SandboxID string `json:"sandbox_id"`
	Killed    bool   `json:"killed"`
}

type listSandboxesIn struct {
	State    string            `json:"state,omitempty" jsonschema:"only sandboxes in this state; omit for both"`
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"only sandboxes whose metadata has all these key/value pairs"`
}

type listSandboxesOut struct {
	Sandboxes []sandboxOut `json:"sandboxes"`
}

type runCodeIn struct {
	Code      string `json:"code" jsonschema:"the code to run; the value of the last expression is returned like in a notebook cell"`
	Language  string `json:"language,omitempty" jsonschema:"language of the code"`
	SandboxID string `json:"sandbox_id,omitempty" jsonschema:"sandbox to run in (a code-interpreter-v1 sandbox); omit to create one, then pass the returned id on later calls so variables and imports persist"`
	ContextID string `json:"context_id,omitempty" jsonschema:"an execution context inside the sandbox; omit to use the default context of the language"`
	Timeout   int    `json:"timeout,omitempty" jsonschema:"seconds to let the code run before it is interrupted (state is kept)"`
}

type resultOut struct {
	IsMain  bool     `json:"is_main_result" jsonschema:"true for the value of the last expression, false for display() output and plots"`
	Text    string   `json:"text,omitempty"`
	Formats []string `json:"formats" jsonschema:"the representations the result has (text, html, png, ...); images are returned as image content"`
}

type execErrorOut struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

type runCodeOut struct {
	SandboxID      string        `json:"sandbox_id" jsonschema:"the sandbox the code ran in; reuse it to keep state"`
	CreatedSandbox bool          `json:"created_sandbox" jsonschema:"true when this call created the sandbox; kill it with kill_sandbox when done"`
	Stdout         string        `json:"stdout"`
	Stderr         string        `json:"stderr"`
	Results        []resultOut   `json:"results"`
	Error          *execErrorOut `json:"error,omitempty"`
	Truncated      bool          `json:"truncated,omitempty" jsonschema:"true when output was too long and its middle was cut (the text says where)"`
}

type runCommandIn struct {
	SandboxID  string            `json:"sandbox_id" jsonschema:"id of the sandbox"`
	Command    string            `json:"command" jsonschema:"shell command, run with bash -l -c"`
	Cwd        string            `json:"cwd,omitempty" jsonschema:"working directory (default: the user's home, /home/user)"`
	Envs       map[string]string `json:"envs,omitempty" jsonschema:"extra environment variables for this command"`
	Timeout    int               `json:"timeout,omitempty" jsonschema:"seconds before a foreground command is killed"`
	Background bool              `json:"background,omitempty" jsonschema:"start the command and return its pid at once without waiting (for servers and long jobs)"`
}

type runCommandOut struct {
	PID        uint32 `json:"pid"`
	Background bool   `json:"background"`
	ExitCode   int    `json:"exit_code"`
	Stdout     string `json:"stdout"`
	Stderr     string `json:"stderr"`
	Error      string `json:"error,omitempty"`
	Truncated  bool   `json:"truncated,omitempty" jsonschema:"true when stdout or stderr was too long and its middle was cut (the text says where)"`
}

type readFileIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of the sandbox"`
	Path      string `json:"path" jsonschema:"file path; relative paths are from /home/user"`
}

type readFileOut struct {
	Path      string `json:"path"`
	Size      int    `json:"size" jsonschema:"bytes returned (the whole file unless truncated)"`
	Encoding  string `json:"encoding" jsonschema:"utf8, or base64 when the file is not valid UTF-8 text"`
	Content   string `json:"content"`
	Truncated bool   `json:"truncated,omitempty" jsonschema:"true when the file is longer than what is returned (its beginning)"`
}

type writeFileIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of the sandbox"`
	Path      string `json:"path" jsonschema:"file path; parent directories are created; relative paths are from /home/user"`
	Content   string `json:"content" jsonschema:"the new content of the file (replaces any old content)"`
	Encoding  string `json:"encoding,omitempty" jsonschema:"how content is encoded: utf8 text or base64 for binary data"`
}

type writeFileOut struct {
	Path  string `json:"path"`
	Bytes int    `json:"bytes"`
}

type listFilesIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of the sandbox"`
	Path      string `json:"path,omitempty" jsonschema:"directory to list; relative paths are from /home/user"`
	Depth     int    `json:"depth,omitempty" jsonschema:"how many levels to descend (1: only the directory's own entries)"`
}

type fileOut struct {
	Name        string `json:"name"`
	Path        string `json:"path"`
	Type        string `json:"type" jsonschema:"file, dir or symlink"`
	Size        int64  `json:"size"`
	Permissions string `json:"permissions"`
	Modified    string `json:"modified,omitempty"`
}

type listFilesOut struct {
	Entries []fileOut `json:"entries"`
}

type setTimeoutIn struct {
	SandboxID string `json:"sandbox_id" jsonschema:"id of the sandbox"`
	Timeout   int    `json:"timeout" jsonschema:"seconds from now until the sandbox is killed"`
}

type setTimeoutOut struct {
	SandboxID string `json:"sandbox_id"`
	Expires   string `json:"expires"`
}

type metricOut struct {
	Timestamp   string  `json:"timestamp"`
	CPUCount    int     `json:"cpu_count"`
	CPUPercent  float64 `json:"cpu_percent"`
	MemUsedMB   float64 `json:"memory_used_mb"`
	MemTotalMB  float64 `json:"memory_total_mb"`
	DiskUsedMB  float64 `json:"disk_used_mb"`
	DiskTotalMB float64 `json:"disk_total_mb"`
}

type getMetricsOut struct {
	SandboxID string      `json:"sandbox_id"`
	Metrics   []metricOut `json:"metrics" jsonschema:"samples, oldest first"`
}

// --- schemas ------------------------------------------------------------------

// schemaFor infers T's schema and lets edit add what struct tags cannot say
// (enums, defaults, bounds, examples). A failure is a programming error.
func schemaFor[T any](edit func(props map[string]*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("mcp: schema for %T: %v", *new(T), err))
	}
	tidy(s)
	if edit != nil {
		edit(s.Properties)
	}
	return s
}

// addTool is mcp.AddTool with both schemas written out by schemaFor, so that
// every tool's output schema is as tidy as its input schema (the SDK would
// infer the output one itself, untidied).
func addTool[In, Out any](s *mcp.Server, t *mcp.Tool, h mcp.ToolHandlerFor[In, Out]) {
	if t.InputSchema == nil {
		t.InputSchema = schemaFor[In](nil)
	}
	if t.OutputSchema == nil {
		t.OutputSchema = schemaFor[Out](nil)
	}
	mcp.AddTool(s, t, h)
}

// tidy writes the ["null", T] types that jsonschema infers for Go slices,
// maps and pointers as plain T. A tool's JSON never holds null there (outputs
// leave such fields out or send them empty; inputs may leave them out), and
// clients that map schemas onto a single-type dialect (OpenAPI's subset, as
// for Gemini) reject or drop a type list: MCP Inspector's --strict flags
// each one.
func tidy(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if len(s.Types) == 2 && slices.Contains(s.Types, "null") {
		s.Type = s.Types[0]
		if s.Type == "null" {
			s.Type = s.Types[1]
		}
		s.Types = nil
	}
	for _, p := range s.Properties {
		tidy(p)
	}
	tidy(s.Items)
	tidy(s.AdditionalProperties)
}

func setDefault(p *jsonschema.Schema, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	p.Default = b
}

func timeoutBounds(p *jsonschema.Schema, withDefault bool) {
	p.Minimum = jsonschema.Ptr(1.0)
	p.Maximum = jsonschema.Ptr(float64(maxTimeout))
	if withDefault {
		setDefault(p, defaultTimeout)
	}
}

// hints are a tool's annotations (MCP's ToolAnnotations): what a client may
// assume about it before calling it, e.g. to call read-only tools without
// asking the user, or to warn before a destructive one. Every field is set on
// every tool, because the spec's defaults are the cautious ones
// (destructive, open world) and would misdescribe most of Airlock's tools.
type hints struct {
	readOnly    bool // changes nothing
	destructive bool // may delete or overwrite something (a sandbox, a file, a snapshot)
	idempotent  bool // a second identical call changes nothing more
	openWorld   bool // reaches beyond this server: the internet, registries
}

func annotate(title string, h hints) *mcp.ToolAnnotations {
	if h.readOnly {
		// Reading is repeatable and removes nothing, whatever the table says.
		h.destructive, h.idempotent = false, true
	}
	return &mcp.ToolAnnotations{
		Title:           title,
		ReadOnlyHint:    h.readOnly,
		DestructiveHint: jsonschema.Ptr(h.destructive),
		IdempotentHint:  h.idempotent,
		OpenWorldHint:   jsonschema.Ptr(h.openWorld),
	}
}

// --- registration -------------------------------------------------------------

type tools struct{ b Backend }

func registerTools(s *mcp.Server, b Backend) {
	t := &tools{b: b}
	addTool(s, &mcp.Tool{
		Name: "create_sandbox",
		Description: "Create an isolated Linux sandbox (a small machine of its own) and return its sandbox_id. " +
			"Use the id with run_command, run_code, read_file, write_file and list_files. " +
			"For running Python/JS snippets with state kept between calls, prefer run_code, which can create a code-interpreter-v1 sandbox itself. " +
			"To keep files beyond the sandbox's life, mount volumes (create_volume, list_volumes) with volume_mounts. " +
			"The sandbox is killed automatically after timeout seconds; call kill_sandbox as soon as you are done with it. " +
			"Right after a server's first start a template may still be building: the call then waits for it (up to 10 minutes, with progress notifications).",
		InputSchema: schemaFor[createSandboxIn](func(p map[string]*jsonschema.Schema) {
			setDefault(p["template"], defaultTemplate)
			p["template"].Examples = []any{"base", "python3", "node", interpreterTemplate}
			timeoutBounds(p["timeout"], true)
			// A list, not "null or a list" as a Go slice infers.
			p["volume_mounts"].Types, p["volume_mounts"].Type = nil, "array"
			for _, f := range []string{"name", "path"} {
				p["volume_mounts"].Items.Properties[f].MinLength = jsonschema.Ptr(1)
			}
		}),
		Annotations: annotate("Create a sandbox", hints{}),
	}, t.createSandbox)
	addTool(s, &mcp.Tool{
		Name:        "kill_sandbox",
		Description: "Kill a sandbox and delete everything in it. Do this when you no longer need a sandbox you created. The id is invalid afterwards.",
		Annotations: annotate("Kill a sandbox", hints{destructive: true, idempotent: true}),
	}, t.killSandbox)
	addTool(s, &mcp.Tool{
		Name: "list_sandboxes",
		Description: "List the sandboxes on this server with their template, state, how long ago they started, expiry time, and current CPU and memory use. " +
			"Use it to find a sandbox you created earlier (filter by metadata) or to clean up forgotten ones with kill_sandbox.",
		InputSchema: schemaFor[listSandboxesIn](func(p map[string]*jsonschema.Schema) {
			p["state"].Enum = []any{"running", "paused"}
		}),
		Annotations: annotate("List sandboxes", hints{readOnly: true}),
	}, t.listSandboxes)
	addTool(s, &mcp.Tool{
		Name: "run_code",
		Description: "Run code in a stateful code interpreter (like a Jupyter notebook cell) and return stdout, stderr, the value of the last expression, and plots as images. " +
			"Without sandbox_id a new code-interpreter-v1 sandbox is created and its id returned: pass that sandbox_id on later calls so variables, imports and files persist. " +
			"An exception in the code is reported as an error result with its traceback. Call kill_sandbox when finished.",
		InputSchema: schemaFor[runCodeIn](func(p map[string]*jsonschema.Schema) {
			p["language"].Enum = languages
			setDefault(p["language"], "python")
			timeoutBounds(p["timeout"], true)
		}),
		// The code can do anything the sandbox allows: delete its files,
		// reach the internet.
		Annotations: annotate("Run code", hints{destructive: true, openWorld: true}),
	}, t.runCode)
	addTool(s, &mcp.Tool{
		Name: "run_command",
		Description: "Run a shell command (bash -l -c) in a sandbox and return its exit code, stdout and stderr. " +
			"A non-zero exit code is reported as an error result. Set background to start long-running programs (servers, watchers) and get their pid back at once.",
		InputSchema: schemaFor[runCommandIn](func(p map[string]*jsonschema.Schema) {
			timeoutBounds(p["timeout"], true)
		}),
		Annotations: annotate("Run a shell command", hints{destructive: true, openWorld: true}),
	}, t.runCommand)
	addTool(s, &mcp.Tool{
		Name: "read_file",
		Description: "Read a file from a sandbox. Text comes back as UTF-8; other files as base64 (encoding says which). " +
			"Only the first 64 KiB are returned (truncated says so); read longer files in parts with run_command (head, tail, sed -n). " +
			"The same files are MCP resources: sandbox://{sandbox_id}/{path}.",
		Annotations: annotate("Read a file", hints{readOnly: true}),
	}, t.readFile)
	addTool(s, &mcp.Tool{
		Name:        "write_file",
		Description: "Write a file in a sandbox, creating parent directories and replacing any existing content. Use encoding base64 for binary data.",
		InputSchema: schemaFor[writeFileIn](func(p map[string]*jsonschema.Schema) {
			p["encoding"].Enum = []any{"utf8", "base64"}
			setDefault(p["encoding"], "utf8")
		}),
		Annotations: annotate("Write a file", hints{destructive: true, idempotent: true}),
	}, t.writeFile)
	addTool(s, &mcp.Tool{
		Name:        "list_files",
		Description: "List a directory in a sandbox: names, types, sizes, permissions and modification times. Use read_file to read an entry.",
		InputSchema: schemaFor[listFilesIn](func(p map[string]*jsonschema.Schema) {
			setDefault(p["path"], "/home/user")
			setDefault(p["depth"], 1)
			p["depth"].Minimum = jsonschema.Ptr(1.0)
			p["depth"].Maximum = jsonschema.Ptr(float64(maxListDepth))
		}),
		Annotations: annotate("List files", hints{readOnly: true}),
	}, t.listFiles)
	addTool(s, &mcp.Tool{
		Name:        "set_timeout",
		Description: "Change when a sandbox is killed automatically: timeout seconds from now. Use it to keep a sandbox alive for longer work, or to shorten its life.",
		InputSchema: schemaFor[setTimeoutIn](func(p map[string]*jsonschema.Schema) {
			timeoutBounds(p["timeout"], false)
		}),
		Annotations: annotate("Set a sandbox's timeout", hints{idempotent: true}),
	}, t.setTimeout)
	addTool(s, &mcp.Tool{
		Name:        "get_metrics",
		Description: "Get a sandbox's recent CPU, memory and disk use samples (oldest first).",
		Annotations: annotate("Get a sandbox's metrics", hints{readOnly: true}),
	}, t.getMetrics)
	if eb, ok := b.(EventsBackend); ok {
		registerEventsTool(s, eb)
	}
	if vb, ok := b.(VolumesBackend); ok {
		registerVolumeTools(s, vb)
	}
	if pb, ok := b.(PersistBackend); ok {
		registerPersistTools(s, pb)
	}
	if tb, ok := b.(TemplatesBackend); ok {
		registerTemplateTools(s, tb)
	}
}

// --- handlers -----------------------------------------------------------------

func seconds(n int) time.Duration { return time.Duration(n) * time.Second }

func rfc3339(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(time.RFC3339)
}

const mib = 1 << 20

func toSandboxOut(i SandboxInfo) sandboxOut {
	o := sandboxOut{
		SandboxID: i.SandboxID,
		Template:  i.Template,
		Status:    i.State,
		Started:   rfc3339(i.StartedAt),
		Uptime:    uptime(i.StartedAt),
		Expires:   rfc3339(i.EndAt),
		Metadata:  i.Metadata,
		CPUCount:  i.CPUCount,
		MemoryMB:  i.MemoryMB,
	}
	for _, m := range i.VolumeMounts {
		o.VolumeMounts = append(o.VolumeMounts, volumeMount{Name: m.Name, Path: m.Path})
	}
	if i.HasMetrics {
		o.CPUPercent = jsonschema.Ptr(i.CPUPct)
		o.MemoryUsedMB = jsonschema.Ptr(float64(i.MemUsed) / mib)
		o.MemoryTotalMB = jsonschema.Ptr(float64(i.MemTotal) / mib)
	}
	return o
}

// uptime is how long ago t was, to the second, as a person reads it (3m12s).
func uptime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return max(time.Since(t), 0).Round(time.Second).String()
}

func textResult(format string, args ...any) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: fmt.Sprintf(format, args...)}}}
}

// maxTemplateWait is how long a tool waits for a template that is still being
// built (the first start of a server builds the built-ins in the background).
var maxTemplateWait = 10 * time.Minute

// create creates a sandbox, waiting while its template is still being built:
// unlike an SDK call, a tool call can wait, and the agent would only retry. Each
// retry is reported as an MCP progress notification when the client asked for
// progress, so the user sees which build step the wait is on.
func (t *tools) create(ctx context.Context, p *progress, r CreateSandboxRequest) (SandboxInfo, error) {
	start := time.Now()
	p.step(ctx, fmt.Sprintf("creating a sandbox from template %s", r.Template))
	for {
		info, err := t.b.CreateSandbox(ctx, r)
		var nr *NotReadyError
		if !errors.As(err, &nr) {
			if err == nil {
				p.step(ctx, fmt.Sprintf("sandbox %s is running", info.SandboxID))
			}
			return info, err
		}
		waited := time.Since(start)
		if waited >= maxTemplateWait {
			return SandboxInfo{}, fmt.Errorf("gave up after waiting %s: %w", waited.Round(time.Second), err)
		}
		// Progress is the seconds waited out of the most we wait; the message
		// is the server's (which step, for how long).
		p.at(ctx, waited.Seconds(), maxTemplateWait.Seconds(), nr.Message)
		pause := min(max(nr.RetryAfter, time.Second), 30*time.Second, maxTemplateWait-waited)
		select {
		case <-ctx.Done():
			return SandboxInfo{}, fmt.Errorf("%w (while waiting: %s)", ctx.Err(), nr.Message)
		case <-time.After(pause):
		}
	}
}

func (t *tools) createSandbox(ctx context.Context, req *mcp.CallToolRequest, in createSandboxIn) (*mcp.CallToolResult, sandboxOut, error) {
	var mounts []VolumeMount
	for _, m := range in.VolumeMounts {
		mounts = append(mounts, VolumeMount{Name: m.Name, Path: m.Path})
	}
	info, err := t.create(ctx, newProgress(req), CreateSandboxRequest{
		Template:      in.Template,
		Timeout:       seconds(in.Timeout),
		Metadata:      in.Metadata,
		Envs:          in.Envs,
		AllowInternet: in.AllowInternet,
		VolumeMounts:  mounts,
	})
	if err != nil {
		return nil, sandboxOut{}, fmt.Errorf("create sandbox from template %q: %w", in.Template, err)
	}
	out := toSandboxOut(info)
	var vols string
	if len(out.VolumeMounts) > 0 {
		parts := make([]string, 0, len(out.VolumeMounts))
		for _, m := range out.VolumeMounts {
			parts = append(parts, fmt.Sprintf("%s at %s", m.Name, m.Path))
		}
		vols = " Volumes mounted: " + strings.Join(parts, ", ") + "."
	}
	return textResult("Created sandbox %s from template %s (%s). It expires at %s; call kill_sandbox when done.%s",
		out.SandboxID, out.Template, out.Status, out.Expires, vols), out, nil
}

func (t *tools) killSandbox(ctx context.Context, _ *mcp.CallToolRequest, in sandboxIDIn) (*mcp.CallToolResult, killOut, error) {
	if err := t.b.KillSandbox(ctx, in.SandboxID); err != nil {
		return nil, killOut{}, fmt.Errorf("kill sandbox %s: %w", in.SandboxID, err)
	}
	return textResult("Killed sandbox %s.", in.SandboxID), killOut{SandboxID: in.SandboxID, Killed: true}, nil
}

func (t *tools) listSandboxes(ctx context.Context, _ *mcp.CallToolRequest, in listSandboxesIn) (*mcp.CallToolResult, listSandboxesOut, error) {
	infos, err := t.b.ListSandboxes(ctx, ListSandboxesRequest{State: in.State, Metadata: in.Metadata})
	if err != nil {
		return nil, listSandboxesOut{}, fmt.Errorf("list sandboxes: %w", err)
	}
	out := listSandboxesOut{Sandboxes: make([]sandboxOut, 0, len(infos))}
	for _, i := range infos {
		out.Sandboxes = append(out.Sandboxes, toSandboxOut(i))
	}
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: sandboxTable(out.Sandboxes)}}}, out, nil
}

// sandboxTable renders sandboxes as an aligned table for a person reading the
// transcript; programs read the structured content instead.
func sandboxTable(sbs []sandboxOut) string {
	if len(sbs) == 0 {
		return "No sandboxes."
	}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "SANDBOX ID\tTEMPLATE\tSTATUS\tSTARTED\tEXPIRES\tCPU\tMEMORY")
	for _, s := range sbs {
		cpu, mem := "-", "-"
		if s.CPUPercent != nil {
			cpu = fmt.Sprintf("%.1f%%", *s.CPUPercent)
		}
		if s.MemoryUsedMB != nil {
			mem = fmt.Sprintf("%.0f/%.0f MiB", *s.MemoryUsedMB, *s.MemoryTotalMB)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s ago\t%s\t%s\t%s\n", s.SandboxID, s.Template, s.Status, s.Uptime, s.Expires, cpu, mem)
	}
	_ = w.Flush()
	return strings.TrimRight(b.String(), "\n")
}

func (t *tools) runCode(ctx context.Context, req *mcp.CallToolRequest, in runCodeIn) (*mcp.CallToolResult, runCodeOut, error) {
	out := runCodeOut{SandboxID: in.SandboxID, Results: []resultOut{}}
	p := newProgress(req)
	if out.SandboxID == "" {
		info, err := t.create(ctx, p, CreateSandboxRequest{Template: interpreterTemplate, Timeout: seconds(defaultTimeout)})
		if err != nil {
			return nil, runCodeOut{}, fmt.Errorf("create a %s sandbox for run_code: %w", interpreterTemplate, err)
		}
		out.SandboxID, out.CreatedSandbox = info.SandboxID, true
	}
	lang := in.Language
	if in.ContextID != "" {
		// The interpreter takes a context or a language, not both; a context
		// already has its language.
		lang = ""
	}
	rr := RunCodeRequest{
		SandboxID: out.SandboxID, Code: in.Code, Language: lang, ContextID: in.ContextID, Timeout: seconds(in.Timeout),
	}
	if p.enabled() {
		p.step(ctx, "running the code in sandbox "+out.SandboxID)
		rr.OnOutput = func(stream, text string) { p.output(ctx, stream, text) }
	}
	exec, err := t.b.RunCode(ctx, rr)
	if err != nil {
		err = fmt.Errorf("run code in sandbox %s: %w", out.SandboxID, err)
		if out.CreatedSandbox {
			// Still say which sandbox exists now, so it can be reused or killed.
			err = fmt.Errorf("%w (sandbox %s was created for this call)", err, out.SandboxID)
		}
		return nil, runCodeOut{}, err
	}
	var cut1, cut2 bool
	out.Stdout, cut1 = clipOutput(strings.Join(exec.Stdout, ""))
	out.Stderr, cut2 = clipOutput(strings.Join(exec.Stderr, ""))
	out.Truncated = cut1 || cut2

	var text strings.Builder
	if out.CreatedSandbox {
		fmt.Fprintf(&text, "Created sandbox %s (%s); pass sandbox_id %q on later calls to keep state, and kill it when done.\n",
			out.SandboxID, interpreterTemplate, out.SandboxID)
	}
	if out.Stdout != "" {
		fmt.Fprintf(&text, "stdout:\n%s\n", strings.TrimRight(out.Stdout, "\n"))
	}
	if out.Stderr != "" {
		fmt.Fprintf(&text, "stderr:\n%s\n", strings.TrimRight(out.Stderr, "\n"))
	}
	var images []mcp.Content
	for _, r := range exec.Results {
		// Never null: the output schema says it is a list.
		ro := resultOut{IsMain: r.IsMain, Formats: append([]string{}, slices.Sorted(maps.Keys(r.Formats))...)}
		var cut bool
		if ro.Text, cut = clipOutput(r.Formats["text"]); cut {
			out.Truncated = true
		}
		out.Results = append(out.Results, ro)
		for _, f := range []struct{ key, mime string }{{"png", "image/png"}, {"jpeg", "image/jpeg"}} {
			enc, ok := r.Formats[f.key]
			if !ok {
				continue
			}
			// The interpreter sends base64; ImageContent wants the raw bytes
			// (the SDK base64-encodes them on the wire).
			data, err := base64.StdEncoding.DecodeString(enc)
			if err != nil {
				return nil, runCodeOut{}, fmt.Errorf("decode %s result from sandbox %s: %w", f.key, out.SandboxID, err)
			}
			images = append(images, &mcp.ImageContent{Data: data, MIMEType: f.mime})
		}
		switch {
		case r.IsMain && ro.Text != "":
			fmt.Fprintf(&text, "result:\n%s\n", ro.Text)
		case ro.Text != "":
			fmt.Fprintf(&text, "display (%s):\n%s\n", strings.Join(ro.Formats, ", "), ro.Text)
		}
	}
	res := &mcp.CallToolResult{}
	if exec.Error != nil {
		tb, cut := clipOutput(exec.Error.Traceback)
		out.Truncated = out.Truncated || cut
		out.Error = &execErrorOut{Name: exec.Error.Name, Value: exec.Error.Value, Traceback: tb}
		fmt.Fprintf(&text, "error: %s: %s\n%s\n", out.Error.Name, out.Error.Value, out.Error.Traceback)
		res.IsError = true
	}
	if text.Len() == 0 {
		text.WriteString("(no output)")
	}
	res.Content = append([]mcp.Content{&mcp.TextContent{Text: strings.TrimRight(text.String(), "\n")}}, images...)
	return res, out, nil
}

func (t *tools) runCommand(ctx context.Context, req *mcp.CallToolRequest, in runCommandIn) (*mcp.CallToolResult, runCommandOut, error) {
	rr := RunCommandRequest{
		SandboxID: in.SandboxID, Command: in.Command, Cwd: in.Cwd, Envs: in.Envs,
		Timeout: seconds(in.Timeout), Background: in.Background,
	}
	if p := newProgress(req); p.enabled() && !in.Background {
		p.step(ctx, "running the command in sandbox "+in.SandboxID)
		rr.OnOutput = func(stream, text string) { p.output(ctx, stream, text) }
	}
	r, err := t.b.RunCommand(ctx, rr)
	if err != nil {
		return nil, runCommandOut{}, fmt.Errorf("run command in sandbox %s: %w", in.SandboxID, err)
	}
	// The backend bounds what it keeps; bounding again here holds for any
	// backend, and leaves already bounded text as it is.
	stdout, cut1 := clipOutput(r.Stdout)
	stderr, cut2 := clipOutput(r.Stderr)
	out := runCommandOut{PID: r.PID, Background: in.Background, ExitCode: r.ExitCode, Stdout: stdout, Stderr: stderr, Error: r.Error,
		Truncated: r.Truncated || cut1 || cut2}
	if in.Background {
		return textResult("Started in the background with pid %d. Check on it with run_command (for example `ps -p %d` or its log file).", r.PID, r.PID), out, nil
	}
	var text strings.Builder
	fmt.Fprintf(&text, "exit code %d\n", r.ExitCode)
	if r.Error != "" {
		fmt.Fprintf(&text, "error: %s\n", r.Error)
	}
	if out.Stdout != "" {
		fmt.Fprintf(&text, "stdout:\n%s\n", strings.TrimRight(out.Stdout, "\n"))
	}
	if out.Stderr != "" {
		fmt.Fprintf(&text, "stderr:\n%s\n", strings.TrimRight(out.Stderr, "\n"))
	}
	res := textResult("%s", strings.TrimRight(text.String(), "\n"))
	res.IsError = r.ExitCode != 0 || r.Error != ""
	return res, out, nil
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in readFileIn) (*mcp.CallToolResult, readFileOut, error) {
	data, more, err := t.b.ReadFile(ctx, in.SandboxID, in.Path, maxFileText)
	if errors.Is(err, ErrIsDirectory) {
		return nil, readFileOut{}, fmt.Errorf("%s in sandbox %s is a directory; list it with list_files", in.Path, in.SandboxID)
	}
	if err != nil {
		return nil, readFileOut{}, fmt.Errorf("read %s in sandbox %s: %w", in.Path, in.SandboxID, err)
	}
	if more {
		data = trimPartialRune(data)
	}
	out := readFileOut{Path: in.Path, Size: len(data), Encoding: "utf8", Content: string(data), Truncated: more}
	if !utf8.Valid(data) {
		// Base64 is a third longer: bound the bytes so the text stays within
		// what a text file gets.
		if n := maxFileText / 4 * 3; len(data) > n {
			data, more = data[:n], true
		}
		out = readFileOut{Path: in.Path, Size: len(data), Encoding: "base64", Content: base64.StdEncoding.EncodeToString(data), Truncated: more}
	}
	text := out.Content
	if more {
		text += fmt.Sprintf("\n[... truncated: only the first %s of %s are shown; read the rest with run_command (tail -c +%d %q | head -c %d) ...]",
			size(out.Size), in.Path, out.Size+1, in.Path, maxFileText)
	}
	return textResult("%s", text), out, nil
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in writeFileIn) (*mcp.CallToolResult, writeFileOut, error) {
	data := []byte(in.Content)
	if in.Encoding == "base64" {
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, writeFileOut{}, fmt.Errorf("content is not valid base64: %w", err)
		}
	}
	if err := t.b.WriteFile(ctx, in.SandboxID, in.Path, data); err != nil {
		return nil, writeFileOut{}, fmt.Errorf("write %s in sandbox %s: %w", in.Path, in.SandboxID, err)
	}
	return textResult("Wrote %d bytes to %s.", len(data), in.Path), writeFileOut{Path: in.Path, Bytes: len(data)}, nil
}

func (t *tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in listFilesIn) (*mcp.CallToolResult, listFilesOut, error) {
	entries, err := t.b.ListFiles(ctx, in.SandboxID, in.Path, in.Depth)
	if err != nil {
		return nil, listFilesOut{}, fmt.Errorf("list %s in sandbox %s: %w", in.Path, in.SandboxID, err)
	}
	out := listFilesOut{Entries: make([]fileOut, 0, len(entries))}
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "PERMISSIONS\tSIZE\tMODIFIED\tPATH")
	for _, e := range entries {
		f := fileOut{Name: e.Name, Path: e.Path, Type: e.Type, Size: e.Size, Permissions: e.Permissions, Modified: rfc3339(e.Modified)}
		out.Entries = append(out.Entries, f)
		p := f.Path
		if f.Type == "dir" {
			p += "/"
		}
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", f.Permissions, f.Size, f.Modified, p)
	}
	_ = w.Flush()
	text := strings.TrimRight(b.String(), "\n")
	if len(entries) == 0 {
		text = in.Path + " is empty."
	}
	return textResult("%s", text), out, nil
}

func (t *tools) setTimeout(ctx context.Context, _ *mcp.CallToolRequest, in setTimeoutIn) (*mcp.CallToolResult, setTimeoutOut, error) {
	d := seconds(in.Timeout)
	if err := t.b.SetTimeout(ctx, in.SandboxID, d); err != nil {
		return nil, setTimeoutOut{}, fmt.Errorf("set the timeout of sandbox %s: %w", in.SandboxID, err)
	}
	out := setTimeoutOut{SandboxID: in.SandboxID, Expires: rfc3339(time.Now().Add(d))}
	return textResult("Sandbox %s now expires at %s.", in.SandboxID, out.Expires), out, nil
}

func (t *tools) getMetrics(ctx context.Context, _ *mcp.CallToolRequest, in sandboxIDIn) (*mcp.CallToolResult, getMetricsOut, error) {
	ms, err := t.b.GetMetrics(ctx, in.SandboxID)
	if err != nil {
		return nil, getMetricsOut{}, fmt.Errorf("get metrics of sandbox %s: %w", in.SandboxID, err)
	}
	out := getMetricsOut{SandboxID: in.SandboxID, Metrics: make([]metricOut, 0, len(ms))}
	for _, m := range ms {
		out.Metrics = append(out.Metrics, metricOut{
			Timestamp: rfc3339(m.Timestamp), CPUCount: m.CPUCount, CPUPercent: m.CPUPct,
			MemUsedMB: float64(m.MemUsed) / mib, MemTotalMB: float64(m.MemTotal) / mib,
			DiskUsedMB: float64(m.DiskUsed) / mib, DiskTotalMB: float64(m.DiskTotal) / mib,
		})
	}
	if len(ms) == 0 {
		return textResult("No metrics yet for sandbox %s; try again in a few seconds.", in.SandboxID), out, nil
	}
	l := out.Metrics[len(out.Metrics)-1]
	return textResult("Sandbox %s at %s: CPU %.1f%% of %d CPUs, memory %.0f/%.0f MiB, disk %.0f/%.0f MiB (%d samples in structured content).",
		in.SandboxID, l.Timestamp, l.CPUPercent, l.CPUCount, l.MemUsedMB, l.MemTotalMB, l.DiskUsedMB, l.DiskTotalMB, len(ms)), out, nil
}
