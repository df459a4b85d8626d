package mcpgateway

import (
	"path/filepath"
	"slices"
	"strings"
)

// catalogServer is one MCP server of the catalog: a stdio server published on
// npm, which the mcp-gateway template pre-installs under Options.CatalogDir
// (and `mcp-gateway pull` installs into a template being built). The config
// key is E2B's name for it (the SDK's McpServer type), so the same
// `Sandbox.create({mcp: {...}})` works on both.
type catalogServer struct {
	// Name is the key in the config object.
	Name string
	// Package and Version are what `mcp-gateway pull` installs, pinned to an
	// exact version so that two templates built from the same steps run the
	// same server.
	Package string
	Version string
	// Bin is the executable the package puts in node_modules/.bin.
	Bin string
	// Fields are the keys of the server's entry, as E2B's type names them.
	Fields []field
	// Launch turns the entry's checked values into the arguments after Bin
	// and the variables added to the server's environment.
	Launch func(v values, o *Options) (args, env []string)
}

// catalog is every server Airlock's gateway knows by name. Adding one is one
// entry here (and its package in the mcp-gateway template's package.json).
var catalog = []catalogServer{
	{
		Name: "everything", Package: "@modelcontextprotocol/server-everything", Version: "2026.8.31",
		Bin: "mcp-server-everything",
		// The launcher's first argument picks the transport (stdio is also its
		// default; naming it keeps working if the default changes).
		Launch: func(values, *Options) ([]string, []string) { return []string{"stdio"}, nil },
	},
	{
		Name: "filesystem", Package: "@modelcontextprotocol/server-filesystem", Version: "2026.8.31",
		Bin:    "mcp-server-filesystem",
		Fields: []field{{Name: "paths", Kind: kindStringList, Required: true}},
		Launch: func(v values, _ *Options) ([]string, []string) { return v.strings("paths"), nil },
	},
	{
		Name: "github", Package: "@modelcontextprotocol/server-github", Version: "2025.4.8",
		Bin:    "mcp-server-github",
		Fields: []field{{Name: "personalAccessToken", Kind: kindString, Required: true}},
		Launch: func(v values, _ *Options) ([]string, []string) {
			return nil, []string{"GITHUB_PERSONAL_ACCESS_TOKEN=" + v.string("personalAccessToken")}
		},
	},
	{
		Name: "memory", Package: "@modelcontextprotocol/server-memory", Version: "2026.8.31",
		Bin: "mcp-server-memory",
		// Its knowledge graph lives on disk under the state dir, so it
		// outlives a restart of the server (and pause/resume of the sandbox).
		Launch: func(_ values, o *Options) ([]string, []string) {
			return nil, []string{"MEMORY_FILE_PATH=" + filepath.Join(o.StateDir, "memory.json")}
		},
	},
	{
		Name: "sequentialthinking", Package: "@modelcontextprotocol/server-sequential-thinking", Version: "2026.8.31",
		Bin:    "mcp-server-sequential-thinking",
		Launch: func(values, *Options) ([]string, []string) { return nil, nil },
	},
}

// customFields are the keys of a custom server's entry (`github/<owner>/<repo>`).
var customFields = []field{
	{Name: "runCmd", Kind: kindString, Required: true},
	{Name: "installCmd", Kind: kindString},
	{Name: "envs", Kind: kindStringMap},
}

// lookupCatalog finds a catalog server by its config key.
func lookupCatalog(name string) *catalogServer {
	for i := range catalog {
		if catalog[i].Name == name {
			return &catalog[i]
		}
	}
	return nil
}

// catalogNames lists the catalog's keys, sorted, for error messages and help.
func catalogNames() string {
	names := make([]string, 0, len(catalog))
	for _, c := range catalog {
		names = append(names, c.Name)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

// binPath is where the catalog server's executable is once installed.
func (c *catalogServer) binPath(o *Options) string {
	return filepath.Join(o.CatalogDir, "node_modules", ".bin", c.Bin)
}
