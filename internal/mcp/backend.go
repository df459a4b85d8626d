// Package mcp is Airlock's MCP server: typed tools for agents (create_sandbox, run_code,
// run_command, files, metrics, ...) built on the official go-sdk. The tools call a Backend;
// HTTPBackend implements it with internal/e2bclient, Airlock's client of its own E2B wire
// protocol, so the stdio server (`airlock mcp`) and serve's /mcp endpoint behave exactly
// like any E2B SDK client.
package mcp

import (
	"context"
	"errors"
	"time"
)

// Errors a Backend returns for mistakes the tools and resources explain to
// the caller in their own way (a resource that is not found, a directory read
// as a file). Backends wrap them with %w around their own message.
var (
	ErrNotFound    = errors.New("not found")
	ErrIsDirectory = errors.New("is a directory")
	ErrPaused      = errors.New("sandbox is paused")
)

// Backend is what the tools need, one method per tool need. Errors are shown to the
// model as isError tool results, so they should read well on their own.
type Backend interface {
	CreateSandbox(ctx context.Context, req CreateSandboxRequest) (SandboxInfo, error)
	KillSandbox(ctx context.Context, sandboxID string) error
	// ListSandboxes returns the sandboxes with their latest CPU and memory sample
	// where one is available.
	ListSandboxes(ctx context.Context, req ListSandboxesRequest) ([]SandboxInfo, error)
	SetTimeout(ctx context.Context, sandboxID string, timeout time.Duration) error
	GetMetrics(ctx context.Context, sandboxID string) ([]Metric, error)
	RunCode(ctx context.Context, req RunCodeRequest) (Execution, error)
	RunCommand(ctx context.Context, req RunCommandRequest) (CommandResult, error)
	// ReadFile returns at most limit bytes of a file from its start; more
	// says the file is longer. Reading a directory is an ErrIsDirectory.
	ReadFile(ctx context.Context, sandboxID, path string, limit int) (data []byte, more bool, err error)
	WriteFile(ctx context.Context, sandboxID, path string, data []byte) error
	ListFiles(ctx context.Context, sandboxID, path string, depth int) ([]FileEntry, error)
}

// CreateSandboxRequest asks for a new sandbox.
type CreateSandboxRequest struct {
	Template      string
	Timeout       time.Duration
	Metadata      map[string]string
	Envs          map[string]string
	AllowInternet *bool
	// VolumeMounts mount the API key's volumes (by name) into the sandbox.
	VolumeMounts []VolumeMount
}

// VolumeMount is a volume (by name) and the absolute path in the sandbox it
// is mounted at.
type VolumeMount struct {
	Name string
	Path string
}

// SandboxInfo describes one sandbox. CPUPct and MemUsed/MemTotal are the latest metrics
// sample; HasMetrics says whether there was one.
type SandboxInfo struct {
	SandboxID  string
	Template   string
	State      string
	StartedAt  time.Time
	EndAt      time.Time
	Metadata   map[string]string
	CPUCount   int
	MemoryMB   int
	HasMetrics bool
	CPUPct     float64
	MemUsed    int64
	MemTotal   int64

	// VolumeMounts are the volumes the server reports mounted.
	VolumeMounts []VolumeMount
}

// ListSandboxesRequest filters the list: State is "running" or "paused" (empty: both),
// Metadata must all match. NoMetrics skips each sandbox's metrics sample
// (one more request per running sandbox) when only ids are needed.
type ListSandboxesRequest struct {
	State     string
	Metadata  map[string]string
	NoMetrics bool
}

// Metric is one sample of a sandbox's resource use.
type Metric struct {
	Timestamp time.Time
	CPUCount  int
	CPUPct    float64
	MemUsed   int64
	MemTotal  int64
	DiskUsed  int64
	DiskTotal int64
}

// RunCodeRequest runs code in the sandbox's code interpreter.
type RunCodeRequest struct {
	SandboxID string
	Code      string
	Language  string
	ContextID string
	Timeout   time.Duration
	// OnOutput, when set, is called with each chunk of output as it
	// arrives: stream is "stdout", "stderr" or "result" (text is then the
	// result's formats). The tools turn it into progress notifications.
	OnOutput func(stream, text string)
}

// Execution is what the code interpreter produced.
type Execution struct {
	Stdout  []string
	Stderr  []string
	Results []Result
	Error   *ExecutionError
}

// Result is one MIME bundle (an execute_result or display_data). Binary formats (png,
// jpeg) hold base64 text exactly as the interpreter sent them.
type Result struct {
	IsMain  bool
	Formats map[string]string
}

// ExecutionError is an exception raised by the user's code.
type ExecutionError struct {
	Name      string
	Value     string
	Traceback string
}

// RunCommandRequest runs a shell command in a sandbox.
type RunCommandRequest struct {
	SandboxID  string
	Command    string
	Cwd        string
	Envs       map[string]string
	Timeout    time.Duration
	Background bool
	// OnOutput, when set, is called with each chunk of a foreground
	// command's output ("stdout" or "stderr") as it arrives.
	OnOutput func(stream, text string)
}

// CommandResult is a finished command's output, or a background command's pid.
// Stdout and Stderr are bounded (clipOutput's note marks a cut); Truncated
// says one of them was.
type CommandResult struct {
	PID       uint32
	Stdout    string
	Stderr    string
	ExitCode  int
	Error     string
	Truncated bool
}

// FileEntry is one entry of a directory listing.
type FileEntry struct {
	Name        string
	Path        string
	Type        string // "file", "dir" or "symlink"
	Size        int64
	Permissions string
	Modified    time.Time
}
