package mcp

import (
	"net/http"
)

// HTTPConfig says where Airlock's E2B API and sandbox proxy are and which key to use.
type HTTPConfig struct {
	APIURL, SandboxURL, APIKey string
	HTTPClient                 *http.Client
}

// HTTPBackend implements Backend over the E2B REST API (APIURL) and the sandbox proxy
// (SandboxURL): envd's Connect process and filesystem services, /files, and the code
// interpreter on port 49999.
type HTTPBackend struct {
	cfg    HTTPConfig
	client *http.Client
}

// NewHTTPBackend returns a Backend that talks to a running Airlock server.
func NewHTTPBackend(cfg HTTPConfig) Backend {
	c := cfg.HTTPClient
	if c == nil {
		c = http.DefaultClient
	}
	return &HTTPBackend{cfg: cfg, client: c}
}
