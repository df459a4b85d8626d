package mcpgateway

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/sys/unix"
)

// The test binary is three programs: the tests; `mcp-gateway` (argv[0], as
// envd dispatches), which the end-to-end tests run as the foreground command
// and which starts the daemon from /proc/self/exe; and, with
// MCPGW_TEST_SERVER set, a small stdio MCP server written with the go-sdk
// that stands in for catalog and custom servers.
func TestMain(m *testing.M) {
	if filepath.Base(os.Args[0]) == "mcp-gateway" {
		os.Exit(Main(os.Args[1:]))
	}
	if kind := os.Getenv("MCPGW_TEST_SERVER"); kind != "" {
		os.Exit(runTestServer(kind))
	}
	// Daemons the end-to-end tests start outlive the command that started
	// them; as their subreaper the test process can wait for them to end.
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "PR_SET_CHILD_SUBREAPER:", err)
		os.Exit(1)
	}
	// Under -race, every exit of a test binary (the command, the stand-in
	// servers) would sleep a second for the race reporter.
	if os.Getenv("GORACE") == "" {
		os.Setenv("GORACE", "atexit_sleep_ms=0")
	}
	os.Exit(m.Run())
}

// Test server kinds:
//   - "failstart": writes a reason to stderr and exits 7 before initialize.
//   - "hang": never answers.
//   - anything else: a server whose tools, prompt and resources are named
//     after nothing but whose texts name the kind.
func runTestServer(kind string) int {
	switch kind {
	case "failstart":
		fmt.Fprintln(os.Stderr, "boom: no API key configured")
		return 7
	case "hang":
		time.Sleep(time.Hour)
		return 0
	}
	// A generation number, counted in a file, names one tool, so a test sees
	// the tool list refreshed after a restart.
	gen := 0
	if f := os.Getenv("MCPGW_TEST_COUNTER"); f != "" {
		b, _ := os.ReadFile(f)
		gen, _ = strconv.Atoi(strings.TrimSpace(string(b)))
		gen++
		_ = os.WriteFile(f, []byte(strconv.Itoa(gen)), 0o600)
	}
	fmt.Fprintf(os.Stderr, "test server %s starting (generation %d)\n", kind, gen)
	s := mcp.NewServer(&mcp.Implementation{Name: "test-" + kind, Version: "1.0.0"}, nil)

	type textIn struct {
		Text string `json:"text" jsonschema:"the text to echo"`
	}
	mcp.AddTool(s, &mcp.Tool{
		Name: "echo", Title: "Echo", Description: "echoes its text (" + kind + ")",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true},
	}, func(_ context.Context, _ *mcp.CallToolRequest, in textIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: kind + ": " + in.Text}}}, nil, nil
	})
	type addIn struct {
		A int `json:"a"`
		B int `json:"b"`
	}
	type addOut struct {
		Sum int `json:"sum" jsonschema:"a+b"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "add", Description: "adds"}, func(_ context.Context, _ *mcp.CallToolRequest, in addIn) (*mcp.CallToolResult, addOut, error) {
		return nil, addOut{Sum: in.A + in.B}, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "rpcerror", Description: "answers a JSON-RPC error"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return nil, nil, &jsonrpc.Error{Code: jsonrpc.CodeInvalidParams, Message: "rpcerror: bad params from " + kind}
	})
	mcp.AddTool(s, &mcp.Tool{Name: "fail", Description: "always fails"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return nil, nil, errors.New("this tool always fails")
	})
	type bigIn struct {
		N int `json:"n"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "big", Description: "returns n bytes"}, func(_ context.Context, _ *mcp.CallToolRequest, in bigIn) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{
			&mcp.TextContent{Text: strings.Repeat("x", in.N)},
			&mcp.TextContent{Text: "tail"},
		}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "progress", Description: "reports progress"}, func(ctx context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, any, error) {
		if tok := req.Params.GetProgressToken(); tok != nil {
			for i := 1; i <= 3; i++ {
				_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{ProgressToken: tok, Progress: float64(i), Total: 3, Message: fmt.Sprintf("step %d", i)})
			}
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: "done"}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "crash", Description: "exits"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		fmt.Fprintln(os.Stderr, "crashing on purpose")
		os.Exit(3)
		return nil, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "pid", Description: "its pid"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strconv.Itoa(os.Getpid())}}}, nil, nil
	})
	type envIn struct {
		Name string `json:"name"`
	}
	mcp.AddTool(s, &mcp.Tool{Name: "env", Description: "an environment variable"}, func(_ context.Context, _ *mcp.CallToolRequest, in envIn) (*mcp.CallToolResult, any, error) {
		v, ok := os.LookupEnv(in.Name)
		if !ok {
			v = "<unset>"
		}
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: v}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: "args", Description: "its arguments and directory"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		wd, _ := os.Getwd()
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strings.Join(os.Args[1:], " ") + "|" + wd}}}, nil, nil
	})
	mcp.AddTool(s, &mcp.Tool{Name: fmt.Sprintf("gen%d", gen), Description: "names the generation"}, func(context.Context, *mcp.CallToolRequest, struct{}) (*mcp.CallToolResult, any, error) {
		return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: strconv.Itoa(gen)}}}, nil, nil
	})

	s.AddPrompt(&mcp.Prompt{Name: "greet", Description: "greets (" + kind + ")", Arguments: []*mcp.PromptArgument{{Name: "name", Required: true}}},
		func(_ context.Context, req *mcp.GetPromptRequest) (*mcp.GetPromptResult, error) {
			return &mcp.GetPromptResult{Messages: []*mcp.PromptMessage{{Role: "user", Content: &mcp.TextContent{Text: kind + " says hi to " + req.Params.Arguments["name"]}}}}, nil
		})
	readme := "test://" + kind + "/readme"
	s.AddResource(&mcp.Resource{URI: readme, Name: "readme", MIMEType: "text/plain"},
		func(context.Context, *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: readme, Text: "readme of " + kind}}}, nil
		})
	s.AddResourceTemplate(&mcp.ResourceTemplate{URITemplate: "test://" + kind + "/items/{id}", Name: "item"},
		func(_ context.Context, req *mcp.ReadResourceRequest) (*mcp.ReadResourceResult, error) {
			id := strings.TrimPrefix(req.Params.URI, "test://"+kind+"/items/")
			if id == "missing" {
				return nil, mcp.ResourceNotFoundError(req.Params.URI)
			}
			return &mcp.ReadResourceResult{Contents: []*mcp.ResourceContents{{URI: req.Params.URI, Text: kind + " item " + id}}}, nil
		})
	if err := s.Run(context.Background(), &mcp.StdioTransport{}); err != nil {
		fmt.Fprintln(os.Stderr, "test server:", err)
		return 1
	}
	return 0
}

// testEnv is a temp dir laid out like a sandbox's gateway paths, with
// catalog stand-ins installed: everything and filesystem and github run the
// "alpha" test server, memory runs "beta"; sequentialthinking is not
// installed.
type testEnv struct {
	dir  string
	exe  string // the test binary
	opts *Options
}

func newTestEnv(t *testing.T) *testEnv {
	t.Helper()
	dir := t.TempDir()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	e := &testEnv{dir: dir, exe: exe}
	e.opts = &Options{
		EtcDir:         filepath.Join(dir, "etc"),
		LogDir:         filepath.Join(dir, "log"),
		StateDir:       filepath.Join(dir, "state"),
		CatalogDir:     filepath.Join(dir, "servers"),
		GitHubDir:      filepath.Join(dir, "github"),
		Listen:         "127.0.0.1:0",
		GitHubURL:      "file://" + filepath.Join(dir, "remote"),
		NPM:            "npm",
		Timeout:        20 * time.Second,
		InitTimeout:    10 * time.Second,
		MaxResultBytes: DefaultMaxResultBytes,
		Exe:            "/proc/self/exe",
	}
	bin := filepath.Join(e.opts.CatalogDir, "node_modules", ".bin")
	if err := os.MkdirAll(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, kind := range map[string]string{
		"mcp-server-everything": "alpha", "mcp-server-filesystem": "alpha",
		"mcp-server-github": "alpha", "mcp-server-memory": "beta",
	} {
		e.writeScript(t, filepath.Join(bin, name), "MCPGW_TEST_SERVER="+kind+" exec '"+exe+"' \"$@\"")
	}
	return e
}

func (e *testEnv) writeScript(t *testing.T, path, body string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// runCmd is a custom server's runCmd that starts a test server.
func (e *testEnv) runCmd(kind string) string {
	return "MCPGW_TEST_SERVER=" + kind + " exec '" + e.exe + "'"
}

// shipRepo makes a custom server's directory, as a template that ships the
// clone does (no clone, no network).
func (e *testEnv) shipRepo(t *testing.T, owner, repo string) string {
	t.Helper()
	dir := filepath.Join(e.opts.GitHubDir, owner, repo)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}
