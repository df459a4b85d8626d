package mcp

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/dockerfile"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
)

// The template tools: build_template (a Dockerfile and its files → a template
// sandboxes start from) and get_template_build (how a build that outlasted
// build_template's wait is going). They use the E2B template build API the
// SDKs' Template.build uses (e2bclient.BuildTemplate: request, file uploads
// by hash, start, status polls), so a build through MCP is what any SDK
// user's build is: the same per-key limits, cache and logs.

// TemplatesBackend is a Backend that can build templates; HTTPBackend is
// one. The tools are offered only by backends that are.
type TemplatesBackend interface {
	// BuildTemplate runs a whole build and returns when it is ready, failed
	// (*e2bclient.BuildError) or ctx ends (the build goes on on the
	// server; ids say which). b.OnLog gets the log as it comes.
	BuildTemplate(ctx context.Context, b e2bclient.TemplateBuild) (e2bclient.TemplateBuildIDs, error)
	// TemplateBuildStatus returns a build's status and its log from
	// logsOffset on.
	TemplateBuildStatus(ctx context.Context, templateID, buildID string, logsOffset int) (e2bclient.TemplateBuildStatus, error)
}

// BuildTemplate implements TemplatesBackend.
func (h *HTTPBackend) BuildTemplate(ctx context.Context, b e2bclient.TemplateBuild) (e2bclient.TemplateBuildIDs, error) {
	return h.c.BuildTemplate(ctx, b)
}

// TemplateBuildStatus implements TemplatesBackend.
func (h *HTTPBackend) TemplateBuildStatus(ctx context.Context, templateID, buildID string, offset int) (e2bclient.TemplateBuildStatus, error) {
	st, err := h.c.GetTemplateBuildStatus(ctx, templateID, buildID, offset)
	return st, classify(err)
}

const (
	defaultBuildWait = 600
	maxBuildWait     = 3600
	// buildLogLines is how many of a build's last log lines a result shows:
	// enough for the failing step's output, not the whole apt-get.
	buildLogLines = 40
	maxLogLine    = 500
	maxBuildFiles = 200
)

// buildPollInterval is the wait between a build's status polls (tests
// shorten it).
var buildPollInterval = time.Second

type buildTemplateIn struct {
	Name       string            `json:"name" jsonschema:"the template's name, optionally with a tag (name:tag); create_sandbox takes it as template; building a name again replaces that template"`
	Dockerfile string            `json:"dockerfile" jsonschema:"the Dockerfile: FROM a template of this server (base, python3, node, ...) or an image (debian:bookworm, ubuntu:24.04), then RUN, COPY, ADD, ENV, ARG, WORKDIR and USER"`
	Files      map[string]string `json:"files,omitempty" jsonschema:"the build context: files COPY and ADD can read, by path relative to the context (app/main.py) → their UTF-8 text"`
	StartCmd   string            `json:"start_cmd,omitempty" jsonschema:"a command every sandbox of the template starts in the background (the Dockerfile's CMD, which is not accepted there)"`
	ReadyCmd   string            `json:"ready_cmd,omitempty" jsonschema:"a command that exits 0 once start_cmd is ready; sandboxes are handed out only then"`
	CPUCount   int               `json:"cpu_count,omitempty" jsonschema:"CPUs of each sandbox of the template (default: the server's)"`
	MemoryMB   int               `json:"memory_mb,omitempty" jsonschema:"memory of each sandbox of the template in MiB (default: the server's)"`
	SkipCache  bool              `json:"skip_cache,omitempty" jsonschema:"rebuild every step instead of reusing cached layers (e.g. to pick up new packages)"`
	Wait       int               `json:"wait,omitempty" jsonschema:"seconds to wait for the build; a longer build goes on and get_template_build follows it"`
}

type buildTemplateOut struct {
	Name       string   `json:"name"`
	TemplateID string   `json:"template_id" jsonschema:"pass it (or the name) to create_sandbox as template"`
	BuildID    string   `json:"build_id" jsonschema:"pass it with template_id to get_template_build"`
	Status     string   `json:"status" jsonschema:"ready, error, building or waiting"`
	Error      string   `json:"error,omitempty" jsonschema:"why the build failed"`
	Logs       []string `json:"logs" jsonschema:"the build log's last lines"`
}

type templateBuildIn struct {
	TemplateID string `json:"template_id" jsonschema:"from build_template"`
	BuildID    string `json:"build_id" jsonschema:"from build_template"`
	LogsOffset int    `json:"logs_offset,omitempty" jsonschema:"log lines to skip (next_logs_offset of the previous call)"`
}

type templateBuildOut struct {
	TemplateID     string   `json:"template_id"`
	BuildID        string   `json:"build_id"`
	Status         string   `json:"status" jsonschema:"ready, error, building or waiting"`
	Error          string   `json:"error,omitempty"`
	Logs           []string `json:"logs" jsonschema:"log lines from logs_offset on (at most the last 40 of them)"`
	NextLogsOffset int      `json:"next_logs_offset" jsonschema:"pass it as logs_offset to read only newer lines"`
}

func registerTemplateTools(s *mcp.Server, b TemplatesBackend) {
	addTool(s, &mcp.Tool{
		Name: "build_template",
		Description: "Build a template from a Dockerfile, so that create_sandbox starts sandboxes with your tools and files already installed (name or name:tag). " +
			"FROM a template of this server (base, python3, node, code-interpreter-v1, or one you built) or an image; RUN, COPY, ADD, ENV, ARG, WORKDIR and USER; " +
			"COPY and ADD read the files you pass in files. Steps are cached: rebuilding after a change reruns only the changed step and those after it. " +
			"Waits for the build (up to wait seconds) with progress notifications from its log; a failed build is an error result with the log's end.",
		InputSchema: schemaFor[buildTemplateIn](func(p map[string]*jsonschema.Schema) {
			p["name"].MinLength = jsonschema.Ptr(1)
			p["dockerfile"].MinLength = jsonschema.Ptr(1)
			p["dockerfile"].Examples = []any{"FROM python3\nRUN pip install requests\nCOPY app.py /home/user/app.py"}
			p["files"].Types, p["files"].Type = nil, "object"
			p["files"].MaxProperties = jsonschema.Ptr(maxBuildFiles)
			p["cpu_count"].Minimum = jsonschema.Ptr(1.0)
			p["memory_mb"].Minimum = jsonschema.Ptr(128.0)
			setDefault(p["wait"], defaultBuildWait)
			p["wait"].Minimum = jsonschema.Ptr(10.0)
			p["wait"].Maximum = jsonschema.Ptr(float64(maxBuildWait))
		}),
		// Building a name again replaces that template; RUN may download
		// anything and FROM an image pulls it from its registry.
		Annotations: annotate("Build a template", hints{destructive: true, openWorld: true}),
	}, func(ctx context.Context, req *mcp.CallToolRequest, in buildTemplateIn) (*mcp.CallToolResult, buildTemplateOut, error) {
		return buildTemplate(ctx, req, b, in)
	})
	addTool(s, &mcp.Tool{
		Name:        "get_template_build",
		Description: "Get the status and log of a template build that build_template stopped waiting for.",
		InputSchema: schemaFor[templateBuildIn](func(p map[string]*jsonschema.Schema) {
			p["template_id"].MinLength = jsonschema.Ptr(1)
			p["build_id"].MinLength = jsonschema.Ptr(1)
			p["logs_offset"].Minimum = jsonschema.Ptr(0.0)
		}),
		Annotations: annotate("Get a template build", hints{readOnly: true}),
	}, func(ctx context.Context, _ *mcp.CallToolRequest, in templateBuildIn) (*mcp.CallToolResult, templateBuildOut, error) {
		st, err := b.TemplateBuildStatus(ctx, in.TemplateID, in.BuildID, in.LogsOffset)
		if err != nil {
			return nil, templateBuildOut{}, fmt.Errorf("template build %s of %s: %w", in.BuildID, in.TemplateID, err)
		}
		out := templateBuildOut{TemplateID: in.TemplateID, BuildID: in.BuildID, Status: st.Status,
			NextLogsOffset: in.LogsOffset + len(st.LogEntries), Logs: []string{}}
		for _, e := range st.LogEntries {
			out.Logs = appendLog(out.Logs, e.Message)
		}
		if st.Reason != nil {
			out.Error = st.Reason.Message
		}
		text := fmt.Sprintf("Build %s of template %s: %s.", in.BuildID, in.TemplateID, st.Status)
		if out.Error != "" {
			text += " " + out.Error
		}
		if len(out.Logs) > 0 {
			text += "\n" + strings.Join(out.Logs, "\n")
		}
		res := textResult("%s", text)
		res.IsError = st.Status == "error"
		return res, out, nil
	})
}

func buildTemplate(ctx context.Context, req *mcp.CallToolRequest, b TemplatesBackend, in buildTemplateIn) (*mcp.CallToolResult, buildTemplateOut, error) {
	build, err := convertDockerfile(in)
	if err != nil {
		return nil, buildTemplateOut{}, err
	}
	p := newProgress(req)
	out := buildTemplateOut{Name: in.Name, Logs: []string{}}
	build.PollInterval = buildPollInterval
	build.OnLog = func(e e2bclient.BuildLogEntry) {
		out.Logs = appendLog(out.Logs, e.Message)
		if e.Message != "" {
			p.notify(ctx, 0, 0, e.Message, true)
		}
	}
	wait := in.Wait
	if wait <= 0 {
		wait = defaultBuildWait
	}
	wctx, cancel := context.WithTimeout(ctx, seconds(wait))
	defer cancel()
	p.step(ctx, "starting the build of template "+in.Name)
	ids, err := b.BuildTemplate(wctx, build)
	out.TemplateID, out.BuildID = ids.TemplateID, ids.BuildID
	var be *e2bclient.BuildError
	switch {
	case err == nil:
		out.Status = "ready"
		p.step(ctx, "template "+in.Name+" is ready")
		return textResult("Built template %s (id %s). Start sandboxes from it with create_sandbox template=%q.%s",
			in.Name, ids.TemplateID, in.Name, logTail(out.Logs)), out, nil
	case errors.As(err, &be):
		out.Status, out.Error = "error", be.Reason.Message
		res := textResult("The build of template %s failed: %s%s", in.Name, be.Reason.Message, logTail(out.Logs))
		res.IsError = true
		return res, out, nil
	case ids.BuildID != "" && ctx.Err() == nil && errors.Is(err, context.DeadlineExceeded):
		// Our wait is over, not the build: say where it is and how to follow it.
		out.Status = "building"
		if st, serr := b.TemplateBuildStatus(context.WithoutCancel(ctx), ids.TemplateID, ids.BuildID, len(out.Logs)); serr == nil {
			out.Status = st.Status
		}
		return textResult("The build of template %s is still %s after %ds; it goes on. Follow it with get_template_build template_id=%q build_id=%q.%s",
			in.Name, out.Status, wait, ids.TemplateID, ids.BuildID, logTail(out.Logs)), out, nil
	}
	return nil, buildTemplateOut{}, fmt.Errorf("build template %s: %w", in.Name, err)
}

// appendLog keeps a log's last buildLogLines lines, each bounded.
func appendLog(lines []string, msg string) []string {
	if len(msg) > maxLogLine {
		msg = msg[:runeStart(msg, maxLogLine)] + "..."
	}
	lines = append(lines, msg)
	if len(lines) > buildLogLines {
		lines = slices.Delete(lines, 0, len(lines)-buildLogLines)
	}
	return lines
}

func logTail(lines []string) string {
	if len(lines) == 0 {
		return ""
	}
	return "\nLast lines of the build log:\n" + strings.Join(lines, "\n")
}

// convertDockerfile turns build_template's input into the SDK's build: the
// Dockerfile parsed by Airlock's own parser (the subset `airlock template
// build` takes, so both say the same about a Dockerfile), each instruction
// one of the SDK's steps, as the SDKs' Template.fromDockerfile makes them.
// FROM a bare name (python3, my-tpl) is a template of this server, anything
// else (debian:bookworm, ghcr.io/o/i) an image, which is how Airlock's
// builder reads FROM. Each COPY or ADD source becomes one COPY step whose
// files are those of in.Files at that path or under it.
func convertDockerfile(in buildTemplateIn) (e2bclient.TemplateBuild, error) {
	files, err := contextFiles(in.Files)
	if err != nil {
		return e2bclient.TemplateBuild{}, err
	}
	df, err := dockerfile.Parse(strings.NewReader(in.Dockerfile))
	if err != nil {
		// The parser's hints name airlock.toml, which an MCP caller has
		// not got: its start and ready commands are this tool's arguments.
		msg := strings.ReplaceAll(err.Error(), "use start_cmd in airlock.toml", "pass it as start_cmd instead")
		msg = strings.ReplaceAll(msg, "use ready_cmd in airlock.toml", "pass it as ready_cmd instead")
		return e2bclient.TemplateBuild{}, fmt.Errorf("%s", msg)
	}
	from, _, err := df.FromRef(nil)
	if err != nil {
		return e2bclient.TemplateBuild{}, err
	}
	b := e2bclient.TemplateBuild{
		Request: e2bclient.TemplateBuildRequest{Name: in.Name, CPUCount: in.CPUCount, MemoryMB: in.MemoryMB},
		Spec:    e2bclient.TemplateSpec{Force: in.SkipCache, StartCmd: in.StartCmd, ReadyCmd: in.ReadyCmd},
		Files:   map[string][]e2bclient.TemplateFile{},
	}
	if strings.ContainsAny(from, ":/@") {
		b.Spec.FromImage = from
	} else {
		b.Spec.FromTemplate = from
	}
	for _, ins := range df.Instructions {
		switch ins.Cmd {
		case "run":
			cmd := ins.Args[0]
			if ins.JSON {
				cmd = shellJoin(ins.Args)
			}
			b.Spec.Steps = append(b.Spec.Steps, e2bclient.TemplateStep{Type: "RUN", Args: []string{cmd}})
		case "env":
			kv := slices.Clone(ins.Args)
			for i := 1; i < len(kv); i += 2 {
				kv[i] = unquote(kv[i])
			}
			b.Spec.Steps = append(b.Spec.Steps, e2bclient.TemplateStep{Type: "ENV", Args: kv})
		case "arg":
			// The SDK has no ARG; one with a default is that variable set
			// for the steps after it (and, unlike Docker, for sandboxes).
			var kv []string
			for _, a := range ins.ArgDecls {
				if a.HasDefault {
					kv = append(kv, a.Name, unquote(a.Default))
				}
			}
			if len(kv) > 0 {
				b.Spec.Steps = append(b.Spec.Steps, e2bclient.TemplateStep{Type: "ENV", Args: kv})
			}
		case "workdir":
			b.Spec.Steps = append(b.Spec.Steps, e2bclient.TemplateStep{Type: "WORKDIR", Args: ins.Args})
		case "user":
			b.Spec.Steps = append(b.Spec.Steps, e2bclient.TemplateStep{Type: "USER", Args: ins.Args})
		case "copy", "add":
			srcs, dest := ins.Args[:len(ins.Args)-1], ins.Args[len(ins.Args)-1]
			owner, mode := ins.Flags["chown"], ins.Flags["chmod"]
			if len(srcs) > 1 && !strings.HasSuffix(dest, "/") {
				// Docker's rule: several sources go into a directory.
				dest += "/"
			}
			for _, src := range srcs {
				matched, err := filesFor(files, src)
				if err != nil {
					return e2bclient.TemplateBuild{}, fmt.Errorf("Dockerfile line %d: %s %s: %w", ins.Line, strings.ToUpper(ins.Cmd), src, err)
				}
				args := []string{src, dest}
				if owner != "" || mode != "" {
					args = append(args, owner)
				}
				if mode != "" {
					args = append(args, mode)
				}
				b.Spec.Steps = append(b.Spec.Steps, e2bclient.TemplateStep{Type: "COPY", Args: args})
				b.Files[src] = matched
			}
		default:
			return e2bclient.TemplateBuild{}, fmt.Errorf("Dockerfile line %d: %s is not supported here", ins.Line, strings.ToUpper(ins.Cmd))
		}
	}
	return b, nil
}

// contextFiles checks build_template's files: relative paths inside the
// context, as the build would read them.
func contextFiles(in map[string]string) (map[string]string, error) {
	out := make(map[string]string, len(in))
	for name, content := range in {
		clean := path.Clean(name)
		if name == "" || path.IsAbs(name) || clean == ".." || strings.HasPrefix(clean, "../") || clean == "." {
			return nil, fmt.Errorf("files: %q is not a path inside the build context (write it relative, like app/main.py)", name)
		}
		out[clean] = content
	}
	return out, nil
}

// filesFor returns the context files a COPY source names: the file at src,
// or every file under the directory src ("." is the whole context).
func filesFor(files map[string]string, src string) ([]e2bclient.TemplateFile, error) {
	clean := path.Clean(src)
	if path.IsAbs(src) || clean == ".." || strings.HasPrefix(clean, "../") {
		return nil, errors.New("the source must be a path inside the build context")
	}
	if strings.ContainsAny(clean, "*?[") {
		return nil, errors.New("wildcards are not supported here; name the file or its directory")
	}
	var out []e2bclient.TemplateFile
	for name, content := range files {
		if clean == "." || name == clean || strings.HasPrefix(name, clean+"/") {
			out = append(out, e2bclient.TemplateFile{Name: name, Mode: 0o644, Content: []byte(content)})
		}
	}
	if len(out) == 0 {
		names := make([]string, 0, len(files))
		for n := range files {
			names = append(names, n)
		}
		slices.Sort(names)
		if len(names) == 0 {
			return nil, errors.New("no such file: pass the build context's files in files ({path: content})")
		}
		return nil, fmt.Errorf("no such file in files (it has: %s)", strings.Join(names, ", "))
	}
	slices.SortFunc(out, func(a, b e2bclient.TemplateFile) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// unquote removes the quotes around a whole ENV or ARG value, which the
// Dockerfile parser leaves in: the SDK's ENV step takes the value itself. $VAR
// is left for the server to expand, as it expands an SDK's ENV values.
func unquote(v string) string {
	if len(v) < 2 || v[0] != v[len(v)-1] {
		return v
	}
	switch v[0] {
	case '\'':
		return v[1 : len(v)-1]
	case '"':
		return strings.NewReplacer(`\"`, `"`, `\\`, `\`).Replace(v[1 : len(v)-1])
	}
	return v
}

// shellJoin writes an exec-form RUN as the one command line the SDK's RUN
// step takes, each word single-quoted.
func shellJoin(words []string) string {
	q := make([]string, len(words))
	for i, w := range words {
		q[i] = "'" + strings.ReplaceAll(w, "'", `'\''`) + "'"
	}
	return strings.Join(q, " ")
}
