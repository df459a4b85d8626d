// Package envdapi is the contract between the host and envd, the agent that
// runs as every sandbox's first process: what the host hands envd at start
// (Config) and on a warm sandbox's claim (InitRequest), the ports and
// in-sandbox paths both sides must agree on, the signature of signed /files
// URLs, the version SDKs see, and the build-step protocol of `envd step`.
//
// The host (internal/sandbox, internal/buildbox, the proxy) imports this
// package, never internal/envd: envd links the code interpreter (ZeroMQ, PTYs),
// which has no business in the host binary. An import-rule test
// (internal/importrules) holds both sides to it.
package envdapi

// Config is what the host hands envd when a sandbox starts. The host writes it as
// one JSON object on envd's stdin (so the access token never touches a file or the
// environment of sandbox processes); envd reads it once, then closes stdin.
type Config struct {
	// SandboxID and TemplateID are exported to every process as E2B_SANDBOX_ID and
	// E2B_TEMPLATE_ID (with E2B_SANDBOX=true), as E2B's envd does.
	SandboxID  string `json:"sandboxID"`
	TemplateID string `json:"templateID"`

	// AccessToken, when not empty, must be presented as X-Access-Token on every
	// request except /health and signed /files requests.
	AccessToken string `json:"accessToken,omitempty"`

	// EnvVars are the sandbox-level environment variables from the create request.
	EnvVars map[string]string `json:"envVars,omitempty"`

	// DefaultUser is used when a request names no user ("user" in E2B templates).
	DefaultUser string `json:"defaultUser,omitempty"`
	// DefaultWorkdir is the cwd for processes that give none; empty means the
	// user's home directory.
	DefaultWorkdir string `json:"defaultWorkdir,omitempty"`

	// Listen is where envd serves HTTP: a list of "unix:/path" or "tcp:host:port".
	// Inside a sandbox the host proxies to the unix socket; tcp 127.0.0.1:49983
	// lets in-sandbox tools reach envd the way they do on E2B.
	Listen []string `json:"listen"`

	// AwaitInit starts envd for the host's warm pool: until one POST /init
	// (body: accessToken, envVars) arrives, envd answers /health and refuses
	// everything else with 503. The host sends /init over the unix socket when a
	// client claims the sandbox; a second /init, or one without AwaitInit, is
	// refused, so nothing inside the sandbox can change its token later. Over
	// the unix socket the process service works before /init too: the host
	// runs the template's start command in the pooled sandbox with it.
	AwaitInit bool `json:"awaitInit,omitempty"`

	// InitKey, with AwaitInit, lets the one POST /init also come over TCP
	// when it carries "Authorization: Bearer <InitKey>": a sandbox Pod's
	// host (a control-plane replica) cannot reach envd's unix socket. The
	// key is in envd's config only, and worthless once /init is done.
	InitKey string `json:"initKey,omitempty"`

	// InterpListen is where envd serves the code interpreter, in the
	// same forms as Listen: the host proxies sandbox port 49999 to the unix
	// socket, and tcp 0.0.0.0:49999 lets in-sandbox code use localhost:49999
	// as on E2B. Empty means no interpreter.
	InterpListen []string `json:"interpListen,omitempty"`

	// Kernels are the languages whose default interpreter contexts start at
	// boot, in the background (after /init for a pooled sandbox, so they see
	// the client's env); the first /execute waits for such a start.
	Kernels []string `json:"kernels,omitempty"`

	// DiskPath is the directory whose filesystem /metrics reports as disk use.
	DiskPath string `json:"diskPath,omitempty"`

	// LogPath, a path inside the sandbox, is where envd sends its stdout and
	// stderr once it has read this config; empty keeps the ones it started
	// with. The host starts envd with its log on a host file, which a
	// checkpoint (CRIU) cannot save: a file of the sandbox's own can be.
	LogPath string `json:"logPath,omitempty"`
}

// LogName is the file in RunDir (HostRunDir on the host) the manager has
// envd log to (Config.LogPath).
const LogName = "envd.log"

// Version is the envd version reported to SDKs. The SDKs gate features on it;
// 0.6.4 or later unlocks everything the current SDKs use.
const Version = "0.6.13"

// InterpPort is the in-sandbox port of the code interpreter.
const InterpPort = 49999

// Port is the in-sandbox port on which the E2B SDKs address envd.
const Port = 49983

// InitRequest is the body of POST /init, which hands a warm-pool envd the
// identity of the sandbox it now serves.
type InitRequest struct {
	AccessToken string            `json:"accessToken,omitempty"`
	EnvVars     map[string]string `json:"envVars,omitempty"`
}
