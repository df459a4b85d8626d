// Package templates carries the definitions of Airlock's built-in templates inside the
// binary, so one airlock executable can build them on any host without the source tree.
// Each built-in lives in <name>/template.json; internal/template parses and builds them.
package templates

import "embed"

// FS holds <name>/template.json for every built-in template.
//
//go:embed */template.json
var FS embed.FS
