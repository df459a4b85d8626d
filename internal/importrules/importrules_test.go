// Package importrules holds the import rules between Airlock's two binaries as
// a test: the host binary (cmd/airlock) never links what runs inside a sandbox
// (envd, the code interpreter and its ZeroMQ and PTY code, the MCP gateway),
// and envd never links what only the host may do (libcontainer, SQLite,
// netlink, the sandbox manager, Airlock's own MCP server). They share only
// the contract in internal/envdapi.
package importrules

import (
	"os/exec"
	"strings"
	"testing"
)

// rules: for each binary, the packages (exact paths, or prefixes ending in
// "/") it must not depend on, and why.
var rules = []struct {
	binary    string
	forbidden map[string]string
}{
	{"github.com/airlock-sandbox/airlock/cmd/airlock", map[string]string{
		"github.com/airlock-sandbox/airlock/internal/envd":       "the agent inside sandboxes; the host talks to it through internal/envdapi",
		"github.com/airlock-sandbox/airlock/internal/envd/":      "the agent inside sandboxes",
		"github.com/airlock-sandbox/airlock/internal/interp":     "the code interpreter runs inside sandboxes",
		"github.com/airlock-sandbox/airlock/internal/interp/":    "the code interpreter runs inside sandboxes",
		"github.com/go-zeromq/":                                  "Jupyter's wire runs inside sandboxes",
		"github.com/creack/pty":                                  "PTYs are envd's",
		"github.com/airlock-sandbox/airlock/internal/mcpgateway": "the MCP gateway runs inside sandboxes (envd invoked as mcp-gateway)",
	}},
	{"github.com/airlock-sandbox/airlock/cmd/envd", map[string]string{
		"github.com/opencontainers/runc/":                     "containers are made by the host",
		"modernc.org/sqlite":                                  "state is the host's",
		"github.com/vishvananda/netlink":                      "the network is set up by the host",
		"github.com/mdlayher/netlink":                         "the network is set up by the host",
		"github.com/airlock-sandbox/airlock/internal/sandbox": "the sandbox manager is the host's",
		"github.com/airlock-sandbox/airlock/internal/store":   "state is the host's",
		"github.com/airlock-sandbox/airlock/internal/daemon":  "the server is the host's",
		"github.com/airlock-sandbox/airlock/internal/mcp":     "Airlock's own MCP server is the host's; the in-sandbox gateway is internal/mcpgateway",
	}},
}

func TestImportRules(t *testing.T) {
	for _, r := range rules {
		// The seccomp tag is how the host binary is built (Makefile); envd
		// ignores it.
		out, err := exec.Command("go", "list", "-tags=seccomp", "-deps", r.binary).CombinedOutput()
		if err != nil {
			t.Fatalf("go list -deps %s: %v\n%s", r.binary, err, out)
		}
		deps := strings.Fields(string(out))
		if len(deps) < 10 {
			t.Fatalf("go list -deps %s listed only %q", r.binary, deps)
		}
		for _, dep := range deps {
			for bad, why := range r.forbidden {
				if dep == bad || (strings.HasSuffix(bad, "/") && strings.HasPrefix(dep, bad)) {
					t.Errorf("%s depends on %s (%s)", r.binary, dep, why)
				}
			}
		}
	}
}
