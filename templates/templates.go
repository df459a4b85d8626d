// Package templates carries the definitions of Airlock's built-in templates inside the
// binary, so one airlock executable can build them on any host without the source tree.
// Each built-in is a directory <name>/ with a Dockerfile, an airlock.toml and any files
// its COPY steps read; internal/template builds them with the same builder as users'
// templates.
package templates

import "embed"

// FS holds every built-in template's directory.
//
//go:embed base python3 node code-interpreter-v1 mcp-gateway
var FS embed.FS
