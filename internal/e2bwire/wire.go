// Package e2bwire holds the shapes of the E2B wire protocol that both sides of
// Airlock use: the control plane's JSON bodies (named after the upstream
// OpenAPI schemas), the code interpreter's /execute request, the header names
// and ports of sandbox traffic, and Airlock's own /airlock/v1/info answer.
// The server (internal/e2b, internal/interp) decodes and writes them, and the
// client (internal/e2bclient) encodes and reads them, so a field renamed on one
// side is renamed on the other. It imports nothing of Airlock's: a client that
// needs the shapes must not pull the server in with them.
package e2bwire

// Headers of the wire protocol. Header names are case-insensitive; these are
// the spellings upstream uses.
const (
	// HeaderAPIKey carries the API key on every control-plane request.
	HeaderAPIKey = "X-API-Key"
	// HeaderNextToken, on a list answer, is the cursor of the next page; it is
	// absent on the last one.
	HeaderNextToken = "X-Next-Token"
	// HeaderAccessToken carries a sandbox's envdAccessToken to envd and to
	// the code interpreter's /execute.
	HeaderAccessToken = "X-Access-Token"
	// HeaderSandboxID and HeaderSandboxPort route a request sent to the
	// sandbox URL (E2B_SANDBOX_URL) to a sandbox and a port inside it.
	HeaderSandboxID   = "E2b-Sandbox-Id"
	HeaderSandboxPort = "E2b-Sandbox-Port"
)

// Ports inside a sandbox that the sandbox proxy routes to.
const (
	// EnvdPort is envd: its Connect services and /files, /health, /envs.
	EnvdPort = 49983
	// InterpreterPort is the code interpreter (/execute, /contexts).
	InterpreterPort = 49999
)

// InfoPath is where an Airlock server says where its sandbox proxy is, so a
// client given only the API URL need not guess the sandbox URL (a guessed port
// would reach whatever listens there). Not part of E2B's API.
const InfoPath = "/airlock/v1/info"

// ServerInfo is the answer at InfoPath.
type ServerInfo struct {
	// SandboxURL is E2B_SANDBOX_URL for a client that reached the API as it did.
	SandboxURL string `json:"sandboxUrl"`
}

// ExecuteRequest is the body of the code interpreter's POST /execute (docs/E2B-WIRE.md §4.1).
// ContextID and Language are pointers because the server must tell "absent"
// from empty (at most one of them may be given); clients leave unset ones nil
// and they are omitted, as the JS SDK does.
type ExecuteRequest struct {
	Code      string            `json:"code"`
	ContextID *string           `json:"context_id,omitempty"`
	Language  *string           `json:"language,omitempty"`
	EnvVars   map[string]string `json:"env_vars,omitempty"`
}
