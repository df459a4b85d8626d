package mcp

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/airlock-sandbox/airlock/internal/apikey"
)

// Options tunes the server. It exists so serve and `airlock mcp` can grow
// settings without changing NewServer's signature.
type Options struct {
	// Version is reported to clients (initialize's and server/discover's
	// serverInfo).
	Version string
	// Scopes, when not nil, are the key's: the server offers only the
	// tools they allow.
	Scopes []apikey.Scope
}

// instructions tell a client's model, once, how the tools fit together.
const instructions = "Airlock runs isolated Linux sandboxes. Start with run_code (Python and other languages, " +
	"state kept across calls with the sandbox_id it returns) or create_sandbox then run_command, read_file and write_file. " +
	"Kill sandboxes you no longer need with kill_sandbox. pause_sandbox/resume_sandbox keep one for later; " +
	"snapshot_sandbox and fork_sandbox copy one; build_template makes a template from a Dockerfile. " +
	"Sandbox files are also resources: sandbox://{sandbox_id}/{path}."

// NewServer returns an MCP server with every Airlock tool and the sandbox file
// resources registered on b. It speaks every protocol revision the go-sdk
// does, from 2024-11-05 to 2026-07-28: the stateless 2026-07-28 era
// (server/discover, per-request _meta) and the initialize handshake of the
// older ones, chosen by what each client sends.
func NewServer(b Backend, opts Options) *mcp.Server {
	v := opts.Version
	if v == "" {
		v = "dev"
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "airlock", Title: "Airlock sandboxes", Version: v},
		&mcp.ServerOptions{Instructions: instructions, SetCacheable: cacheable})
	registerTools(s, b)
	registerLogsTool(s, b)
	registerResources(s, b)
	s.AddReceivingMiddleware(listSandboxResources(b))
	keepAllowed(s, opts.Scopes)
	return s
}

// SupportedProtocolVersions are the MCP revisions the server speaks, newest
// first.
func SupportedProtocolVersions() []string { return mcp.SupportedProtocolVersions() }
