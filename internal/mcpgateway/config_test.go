package mcpgateway

import (
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func TestParseConfigErrors(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct {
		name, config string
		want         []string // substrings of the error, in order of lines
	}{
		{"array", `[]`, []string{"config: must be a JSON object whose keys are MCP server names"}},
		{"string", `"memory"`, []string{"config: must be a JSON object"}},
		{"empty", ``, []string{"config: must be a JSON object"}},
		{"invalid JSON", `{"memory": {}`, []string{"config: not valid JSON"}},
		{"unknown name", `{"slack": {}}`, []string{`"slack": unknown MCP server; Airlock's catalog has everything, filesystem, github, memory, sequentialthinking, and custom servers use the key github/<owner>/<repo>`}},
		{"entry not an object", `{"memory": []}`, []string{`"memory": must be an object with no fields ({})`}},
		{"entry null", `{"memory": null}`, []string{`"memory": must be an object`}},
		{"unknown field", `{"memory": {"path": "/x"}}`, []string{`"memory": unknown field "path" with no fields ({})`}},
		{"unknown field with fields", `{"filesystem": {"paths": ["/tmp"], "root": "/"}}`, []string{`"filesystem": unknown field "root"; its fields: paths (an array of strings, required)`}},
		{"paths missing", `{"filesystem": {}}`, []string{`"filesystem": "paths" is required (an array of strings)`}},
		{"paths a string", `{"filesystem": {"paths": "/tmp"}}`, []string{`"filesystem": "paths" must be an array of strings`}},
		{"paths of numbers", `{"filesystem": {"paths": [1]}}`, []string{`"filesystem": "paths" must be an array of strings`}},
		{"paths empty", `{"filesystem": {"paths": []}}`, []string{`"filesystem": "paths" must not be empty`}},
		{"token missing", `{"github": {}}`, []string{`"github": "personalAccessToken" is required (a string)`}},
		{"token a number", `{"github": {"personalAccessToken": 5}}`, []string{`"github": "personalAccessToken" must be a string`}},
		{"not installed", `{"sequentialthinking": {}}`, []string{`"sequentialthinking": not installed in this sandbox's template (no ` + filepath.Join(e.opts.CatalogDir, "node_modules/.bin/mcp-server-sequential-thinking") + `): create the sandbox from the mcp-gateway template, or add it to your template with ` + "`mcp-gateway pull sequentialthinking`"}},
		{"runCmd missing", `{"github/acme/tools": {}}`, []string{`"github/acme/tools": "runCmd" is required (a string)`}},
		{"runCmd not a string", `{"github/acme/tools": {"runCmd": ["node"]}}`, []string{`"github/acme/tools": "runCmd" must be a string`}},
		{"runCmd empty", `{"github/acme/tools": {"runCmd": " "}}`, []string{`"github/acme/tools": "runCmd" must not be empty`}},
		{"installCmd not a string", `{"github/acme/tools": {"runCmd": "x", "installCmd": true}}`, []string{`"github/acme/tools": "installCmd" must be a string`}},
		{"envs values", `{"github/acme/tools": {"runCmd": "x", "envs": {"A": 1}}}`, []string{`"github/acme/tools": "envs" must be an object of strings`}},
		{"envs a list", `{"github/acme/tools": {"runCmd": "x", "envs": ["A=1"]}}`, []string{`"github/acme/tools": "envs" must be an object of strings`}},
		{"envs bad name", `{"github/acme/tools": {"runCmd": "x", "envs": {"A=B": "1"}}}`, []string{`"github/acme/tools": envs: "A=B" is not a valid environment variable`}},
		{"custom unknown field", `{"github/acme/tools": {"runCmd": "x", "cwd": "/"}}`, []string{`"github/acme/tools": unknown field "cwd"; its fields: runCmd (a string, required), installCmd (a string, optional), envs (an object of strings, optional)`}},
		{"no repo", `{"github/acme": {"runCmd": "x"}}`, []string{`"github/acme": a custom server's key must be github/<owner>/<repo>`}},
		{"path traversal", `{"github/acme/..": {"runCmd": "x"}}`, []string{`"github/acme/..": a custom server's key must be github/<owner>/<repo>`}},
		{"nested path", `{"github/acme/a/b": {"runCmd": "x"}}`, []string{`"github/acme/a/b": a custom server's key`}},
		{"bad owner", `{"github/-acme/tools": {"runCmd": "x"}}`, []string{`"github/-acme/tools": a custom server's key`}},
		{"owner with a dot", `{"github/ac.me/tools": {"runCmd": "x"}}`, []string{`"github/ac.me/tools": a custom server's key`}},
		{"several problems, one line each", `{"slack": {}, "filesystem": {"paths": 3}, "memory": {"x": 1}}`, []string{
			`"filesystem": "paths" must be an array of strings`,
			`"memory": unknown field "x"`,
			`"slack": unknown MCP server`,
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseConfig([]byte(tc.config), e.opts)
			if err == nil {
				t.Fatalf("parseConfig(%s) succeeded", tc.config)
			}
			lines := strings.Split(err.Error(), "\n")
			if len(lines) != len(tc.want) {
				t.Fatalf("got %d lines, want %d:\n%v", len(lines), len(tc.want), err)
			}
			for i, w := range tc.want {
				if !strings.Contains(lines[i], w) {
					t.Errorf("line %d:\n got %s\nwant it to contain %s", i, lines[i], w)
				}
			}
		})
	}
}

func TestParseConfigServers(t *testing.T) {
	e := newTestEnv(t)
	specs, err := parseConfig([]byte(`{
		"filesystem": {"paths": ["/home/user", "/tmp"]},
		"memory": {},
		"github": {"personalAccessToken": "ghp_x"},
		"everything": {},
		"github/acme/tools": {"runCmd": "node a.js", "installCmd": "npm ci", "envs": {"B": "2", "A": "1"}},
		"github/other/tools": {"runCmd": "x"},
		"github/acme/my.server": {"runCmd": "x"},
		"github/acme/memory": {"runCmd": "x"}
	}`), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*serverSpec{}
	var prefixes []string
	for _, s := range specs {
		got[s.Key] = s
		prefixes = append(prefixes, s.Prefix)
	}
	if want := []string{"everything", "filesystem", "github", "acme-memory", "my-server", "acme-tools", "other-tools", "memory"}; !slices.Equal(prefixes, want) {
		t.Errorf("prefixes in key order = %v, want %v", prefixes, want)
	}
	bin := filepath.Join(e.opts.CatalogDir, "node_modules", ".bin")
	if s := got["filesystem"]; !slices.Equal(s.Argv, []string{filepath.Join(bin, "mcp-server-filesystem"), "/home/user", "/tmp"}) {
		t.Errorf("filesystem argv = %v", s.Argv)
	}
	if s := got["everything"]; !slices.Equal(s.Argv, []string{filepath.Join(bin, "mcp-server-everything"), "stdio"}) {
		t.Errorf("everything argv = %v", s.Argv)
	}
	if s := got["github"]; !slices.Equal(s.Env, []string{"GITHUB_PERSONAL_ACCESS_TOKEN=ghp_x"}) {
		t.Errorf("github env = %v", s.Env)
	}
	if s := got["memory"]; !slices.Equal(s.Env, []string{"MEMORY_FILE_PATH=" + filepath.Join(e.opts.StateDir, "memory.json")}) {
		t.Errorf("memory env = %v", s.Env)
	}
	s := got["github/acme/tools"]
	if s.Dir != filepath.Join(e.opts.GitHubDir, "acme", "tools") || s.InstallCmd != "npm ci" ||
		!slices.Equal(s.Argv, []string{"/bin/sh", "-c", "node a.js"}) || !slices.Equal(s.Env, []string{"A=1", "B=2"}) {
		t.Errorf("custom spec = %+v", s)
	}

	// Prefixes never collide, whatever the repositories are called.
	specs, err = parseConfig([]byte(`{
		"github/acme/my.server": {"runCmd": "x"}, "github/acme/my-server": {"runCmd": "x"},
		"github/bob/Tools": {"runCmd": "x"}, "github/carl/tools": {"runCmd": "x"},
		"github/dan/Memory": {"runCmd": "x"}, "memory": {}
	}`), e.opts)
	if err != nil {
		t.Fatal(err)
	}
	prefixes = nil
	for _, s := range specs {
		prefixes = append(prefixes, s.Prefix)
	}
	if want := []string{"acme-my-server", "acme-my-server-2", "bob-Tools", "carl-tools", "dan-Memory", "memory"}; !slices.Equal(prefixes, want) {
		t.Errorf("prefixes = %v, want %v", prefixes, want)
	}

	// An empty config is a gateway with no servers.
	if specs, err := parseConfig([]byte(` {} `), e.opts); err != nil || len(specs) != 0 {
		t.Errorf("parseConfig({}) = %v, %v", specs, err)
	}
}

func TestCatalogTable(t *testing.T) {
	seen := map[string]bool{}
	for _, c := range catalog {
		if seen[c.Name] || c.Name == "" || c.Package == "" || c.Bin == "" || c.Launch == nil {
			t.Errorf("catalog entry %+v: duplicate or incomplete", c)
		}
		seen[c.Name] = true
		// Pinned: an exact version, never a range or a tag.
		if c.Version == "" || strings.ContainsAny(c.Version, "^~<>*x |") || c.Version == "latest" {
			t.Errorf("%s: version %q is not exact", c.Name, c.Version)
		}
		if sanitize(c.Name) != c.Name {
			t.Errorf("%s: a catalog key must be a valid tool prefix", c.Name)
		}
	}
}
