package mcpgateway

import (
	"flag"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// Defaults: where E2B's gateway keeps its files (the SDK reads TokenFile as
// root: Sandbox.getMcpToken), and the port the SDK's getMcpUrl() names.
const (
	DefaultEtcDir     = "/etc/mcp-gateway"
	DefaultLogDir     = "/var/log/mcp-gateway"
	DefaultStateDir   = "/var/lib/mcp-gateway"
	DefaultCatalogDir = "/opt/mcp-gateway/servers"
	DefaultGitHubDir  = "/opt/mcp-gateway/github"
	DefaultListen     = ":50005"
	DefaultGitHubURL  = "https://github.com"

	// DefaultTimeout bounds the whole start (clones, installs, every server's
	// first initialize). The SDK runs the command with its default 60 s
	// command timeout; failing a little earlier lets the user see why rather
	// than the SDK's TimeoutError.
	DefaultTimeout = 55 * time.Second
	// DefaultInitTimeout bounds one server's start to its first initialize.
	DefaultInitTimeout = 30 * time.Second
	// DefaultMaxResultBytes bounds the content of one tool result the
	// gateway passes on (text, and binary data by its size); more is cut with
	// a note. Models pay for every byte, and a runaway result (a file read, a
	// directory tree) can exceed what a client or the proxy accepts.
	DefaultMaxResultBytes = 1 << 20
)

// Options are the gateway's paths and bounds. Each has a flag, and the paths
// also an environment variable, so tests (and unusual templates) can move
// them; the daemon is started with the resolved values as flags.
type Options struct {
	EtcDir     string // config.json, .token (both 0600)
	LogDir     string // gateway.log
	StateDir   string // gateway.lock, servers' state (memory.json)
	CatalogDir string // npm prefix of the catalog servers
	GitHubDir  string // clones of custom servers: <owner>/<repo>
	Listen     string // HTTP listen address
	GitHubURL  string // base URL of the clones (tests: a file:// directory)
	NPM        string // npm executable for pull

	Timeout        time.Duration
	InitTimeout    time.Duration
	MaxResultBytes int

	// Exe is the binary the daemon is started from; argv[0] is always
	// "mcp-gateway", so a multi-call binary (envd, a test binary) dispatches
	// to Main.
	Exe string
}

func (o *Options) tokenFile() string  { return filepath.Join(o.EtcDir, ".token") }
func (o *Options) configFile() string { return filepath.Join(o.EtcDir, "config.json") }
func (o *Options) logFile() string    { return filepath.Join(o.LogDir, "gateway.log") }
func (o *Options) lockFile() string   { return filepath.Join(o.StateDir, "gateway.lock") }

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// register adds the options' flags to fs, with defaults from the environment
// (MCP_GATEWAY_*) or the constants above.
func (o *Options) register(fs *flag.FlagSet) {
	fs.StringVar(&o.EtcDir, "etc-dir", envOr("MCP_GATEWAY_ETC_DIR", DefaultEtcDir), "directory of the config and token files")
	fs.StringVar(&o.LogDir, "log-dir", envOr("MCP_GATEWAY_LOG_DIR", DefaultLogDir), "directory of gateway.log")
	fs.StringVar(&o.StateDir, "state-dir", envOr("MCP_GATEWAY_STATE_DIR", DefaultStateDir), "directory of the lock and the servers' state")
	fs.StringVar(&o.CatalogDir, "catalog-dir", envOr("MCP_GATEWAY_CATALOG_DIR", DefaultCatalogDir), "npm prefix the catalog servers are installed in")
	fs.StringVar(&o.GitHubDir, "github-dir", envOr("MCP_GATEWAY_GITHUB_DIR", DefaultGitHubDir), "directory of custom servers' clones (<owner>/<repo>)")
	fs.StringVar(&o.Listen, "listen", envOr("MCP_GATEWAY_LISTEN", DefaultListen), "HTTP listen address")
	fs.StringVar(&o.GitHubURL, "github-url", envOr("MCP_GATEWAY_GITHUB_URL", DefaultGitHubURL), "base URL custom servers are cloned from")
	fs.StringVar(&o.NPM, "npm", envOr("MCP_GATEWAY_NPM", "npm"), "npm executable (pull)")
	fs.DurationVar(&o.Timeout, "timeout", DefaultTimeout, "bound of the whole start")
	fs.DurationVar(&o.InitTimeout, "init-timeout", DefaultInitTimeout, "bound of one server's first initialize")
	fs.IntVar(&o.MaxResultBytes, "max-result-bytes", DefaultMaxResultBytes, "content bytes of one tool result passed on before it is cut")
	fs.StringVar(&o.Exe, "exe", "/proc/self/exe", "binary the daemon is started from")
}

// flags renders the options as the flags register reads, for the daemon.
func (o *Options) flags() []string {
	return []string{
		"--etc-dir=" + o.EtcDir,
		"--log-dir=" + o.LogDir,
		"--state-dir=" + o.StateDir,
		"--catalog-dir=" + o.CatalogDir,
		"--github-dir=" + o.GitHubDir,
		"--listen=" + o.Listen,
		"--github-url=" + o.GitHubURL,
		"--npm=" + o.NPM,
		"--timeout=" + o.Timeout.String(),
		"--init-timeout=" + o.InitTimeout.String(),
		"--max-result-bytes=" + strconv.Itoa(o.MaxResultBytes),
		"--exe=" + o.Exe,
	}
}
