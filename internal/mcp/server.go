package mcp

import (
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Options tunes the server. Empty for now; it exists so serve and `airlock mcp` can
// grow settings without changing NewServer's signature.
type Options struct {
	// Version is reported to clients in the initialize handshake.
	Version string
}

// NewServer returns an MCP server with every Airlock tool registered on b.
func NewServer(b Backend, opts Options) *mcp.Server {
	v := opts.Version
	if v == "" {
		v = "dev"
	}
	s := mcp.NewServer(&mcp.Implementation{Name: "airlock", Title: "Airlock sandboxes", Version: v}, nil)
	registerTools(s, b)
	registerLogsTool(s, b)
	return s
}
