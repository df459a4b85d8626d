package mcpgateway

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
)

// pull is `mcp-gateway pull <name>...`, which E2B's Template().addMcpServer
// runs as root while a template builds: each catalog server that is not yet
// installed under the catalog dir is installed with npm, at the exact version
// the catalog pins; one already installed is left alone; an unknown name
// fails before anything is installed.
func pull(o *Options, names []string, stdout, stderr io.Writer) int {
	if len(names) == 0 {
		fmt.Fprintf(stderr, "usage: mcp-gateway pull <name>...; the catalog has %s\n", catalogNames())
		return 2
	}
	var servers []*catalogServer
	for _, n := range names {
		c := lookupCatalog(n)
		if c == nil {
			fmt.Fprintf(stderr, "%q: unknown MCP server; Airlock's catalog has %s (custom servers, github/<owner>/<repo>, are cloned when the gateway starts)\n", n, catalogNames())
			return 1
		}
		servers = append(servers, c)
	}
	var missing []string
	for _, c := range servers {
		if _, err := os.Stat(c.binPath(o)); err == nil {
			fmt.Fprintf(stdout, "%s: already installed (%s)\n", c.Name, c.binPath(o))
			continue
		}
		missing = append(missing, c.Package+"@"+c.Version)
	}
	if len(missing) == 0 {
		return 0
	}
	if err := ensurePackageJSON(o.CatalogDir); err != nil {
		fmt.Fprintf(stderr, "preparing %s: %v\n", o.CatalogDir, err)
		return 1
	}
	// One npm run for all of them: one dependency resolution.
	args := append([]string{"install", "--prefix", o.CatalogDir, "--save-exact", "--no-audit", "--no-fund"}, missing...)
	cmd := exec.Command(o.NPM, args...)
	cmd.Dir = o.CatalogDir
	fmt.Fprintf(stdout, "installing %v into %s\n", missing, o.CatalogDir)
	out, err := runStep(context.Background(), cmd, slog.New(slog.NewTextHandler(io.Discard, nil)), "npm")
	if err != nil {
		fmt.Fprintf(stderr, "npm install %v failed (%v)%s\n", missing, err, out.suffixFor("its output"))
		return 1
	}
	for _, c := range servers {
		if _, err := os.Stat(c.binPath(o)); err != nil {
			fmt.Fprintf(stderr, "%s: npm install succeeded but %s is missing\n", c.Name, c.binPath(o))
			return 1
		}
	}
	fmt.Fprintln(stdout, "installed")
	return 0
}

// ensurePackageJSON makes the catalog dir an npm project (the template ships
// one; a template built from another base gets a minimal one).
func ensurePackageJSON(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	p := filepath.Join(dir, "package.json")
	if _, err := os.Stat(p); err == nil {
		return nil
	}
	return os.WriteFile(p, []byte("{\n  \"name\": \"mcp-gateway-servers\",\n  \"private\": true\n}\n"), 0o644)
}
