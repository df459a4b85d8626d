package mcpgateway

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestPull(t *testing.T) {
	e := newTestEnv(t)
	args := filepath.Join(e.dir, "npm-args")
	// A stand-in npm: records its arguments, installs the one missing
	// server's executable (no network), or fails when told to.
	e.opts.NPM = filepath.Join(e.dir, "npm")
	e.writeScript(t, e.opts.NPM, `echo "$@" >> '`+args+`'
if [ -n "$NPM_FAIL" ]; then echo "npm error code E404" >&2; echo "npm error 404 Not Found" >&2; exit 1; fi
mkdir -p node_modules/.bin && printf '#!/bin/sh\n' > node_modules/.bin/mcp-server-sequential-thinking && chmod +x node_modules/.bin/mcp-server-sequential-thinking`)

	out, errOut, code := e.gateway(t, "", "pull", "memory", "everything")
	if code != 0 || !strings.Contains(out, "memory: already installed") || !strings.Contains(out, "everything: already installed") {
		t.Errorf("installed: %d %q %q", code, out, errOut)
	}
	if _, err := os.Stat(args); err == nil {
		t.Error("npm ran for servers already installed")
	}

	_, errOut, code = e.gateway(t, "", "pull", "memory", "slack")
	if code != 1 || !strings.Contains(errOut, `"slack": unknown MCP server; Airlock's catalog has everything, filesystem, github, memory, sequentialthinking`) {
		t.Errorf("unknown: %d %q", code, errOut)
	}
	if _, err := os.Stat(args); err == nil {
		t.Error("npm ran for a list with an unknown name")
	}

	_, errOut, code = e.gateway(t, "", "pull")
	if code != 2 || !strings.Contains(errOut, "usage: mcp-gateway pull <name>...") {
		t.Errorf("no names: %d %q", code, errOut)
	}

	t.Setenv("NPM_FAIL", "1")
	_, errOut, code = e.gateway(t, "", "pull", "sequentialthinking")
	if code != 1 || !strings.Contains(errOut, "npm install [@modelcontextprotocol/server-sequential-thinking@2026.8.31] failed (exit status 1); its output ended with:\nnpm error code E404\nnpm error 404 Not Found") {
		t.Errorf("npm failing: %d %q", code, errOut)
	}
	t.Setenv("NPM_FAIL", "")

	out, errOut, code = e.gateway(t, "", "pull", "memory", "sequentialthinking")
	if code != 0 || !strings.Contains(out, "memory: already installed") || !strings.Contains(out, "installed\n") {
		t.Errorf("missing: %d %q %q", code, out, errOut)
	}
	want := "install --prefix " + e.opts.CatalogDir + " --save-exact --no-audit --no-fund @modelcontextprotocol/server-sequential-thinking@2026.8.31"
	if got := strings.Split(strings.TrimSpace(readFile(args)), "\n"); len(got) != 2 || got[1] != want {
		t.Errorf("npm ran with %q, want %q", got, want)
	}
	if !strings.Contains(readFile(filepath.Join(e.opts.CatalogDir, "package.json")), `"private": true`) {
		t.Error("no package.json in the catalog dir")
	}
	// Now the config may use it.
	if _, err := parseConfig([]byte(`{"sequentialthinking": {}}`), e.opts); err != nil {
		t.Errorf("after pull: %v", err)
	}
}
