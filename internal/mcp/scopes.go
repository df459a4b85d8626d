package mcp

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/apikey"
)

// toolScopes is the scope each tool's calls need of the API; a key is
// shown only the tools it may call. Tools that reach into a sandbox (code,
// commands, files) need sandboxes:write, as the API's envd tokens do.
var toolScopes = map[string]apikey.Scope{
	"list_sandboxes": apikey.SandboxesRead, "get_metrics": apikey.SandboxesRead,
	"sandbox_events": apikey.SandboxesRead, "sandbox_logs": apikey.SandboxesRead,
	"list_snapshots": apikey.SandboxesRead,

	"create_sandbox": apikey.SandboxesWrite, "kill_sandbox": apikey.SandboxesWrite,
	"set_timeout": apikey.SandboxesWrite, "run_code": apikey.SandboxesWrite,
	"run_command": apikey.SandboxesWrite, "read_file": apikey.SandboxesWrite,
	"write_file": apikey.SandboxesWrite, "list_files": apikey.SandboxesWrite,
	"pause_sandbox": apikey.SandboxesWrite, "resume_sandbox": apikey.SandboxesWrite,
	"fork_sandbox": apikey.SandboxesWrite, "snapshot_sandbox": apikey.SandboxesWrite,
	"delete_snapshot": apikey.SandboxesWrite,

	"get_template_build": apikey.TemplatesRead, "build_template": apikey.TemplatesWrite,

	"list_volumes": apikey.VolumesRead, "get_volume": apikey.VolumesRead,
	"create_volume": apikey.VolumesWrite, "delete_volume": apikey.VolumesWrite,
}

// keepAllowed removes the tools scopes do not allow (nil scopes: keep
// every tool). TestToolScopes checks that every tool is in toolScopes.
func keepAllowed(s *mcp.Server, scopes []apikey.Scope) {
	if scopes == nil {
		return
	}
	have := map[apikey.Scope]bool{}
	for _, sc := range scopes {
		have[sc] = true
	}
	var drop []string
	for name, sc := range toolScopes {
		if !have[sc] {
			drop = append(drop, name)
		}
	}
	s.RemoveTools(drop...)
}
