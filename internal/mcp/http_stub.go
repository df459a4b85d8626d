package mcp

import (
	"context"
	"errors"
	"time"
)

// Temporary: the skeleton commit lets the lead build against the API; the real
// methods replace this file in the next commit.
var errNotYet = errors.New("airlock mcp: HTTP backend not implemented yet")

func (h *HTTPBackend) CreateSandbox(context.Context, CreateSandboxRequest) (SandboxInfo, error) {
	return SandboxInfo{}, errNotYet
}
func (h *HTTPBackend) KillSandbox(context.Context, string) error { return errNotYet }
func (h *HTTPBackend) ListSandboxes(context.Context, ListSandboxesRequest) ([]SandboxInfo, error) {
	return nil, errNotYet
}
func (h *HTTPBackend) SetTimeout(context.Context, string, time.Duration) error { return errNotYet }
func (h *HTTPBackend) GetMetrics(context.Context, string) ([]Metric, error)    { return nil, errNotYet }
func (h *HTTPBackend) RunCode(context.Context, RunCodeRequest) (Execution, error) {
	return Execution{}, errNotYet
}
func (h *HTTPBackend) RunCommand(context.Context, RunCommandRequest) (CommandResult, error) {
	return CommandResult{}, errNotYet
}
func (h *HTTPBackend) ReadFile(context.Context, string, string) ([]byte, error) { return nil, errNotYet }
func (h *HTTPBackend) WriteFile(context.Context, string, string, []byte) error  { return errNotYet }
func (h *HTTPBackend) ListFiles(context.Context, string, string, int) ([]FileEntry, error) {
	return nil, errNotYet
}
