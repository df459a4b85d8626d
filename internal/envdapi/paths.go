package envdapi

// Inside a sandbox (and a build sandbox), where things are. The host binds
// envd's binary and RunDir in; the rest are made by envd.
const (
	// BinaryPath is where the host binds the envd binary (read-only).
	BinaryPath = "/usr/local/bin/envd"
	// MCPGatewayPath is where the host binds the envd binary a second time:
	// run under that name, envd is the MCP gateway (internal/mcpgateway)
	// that E2B's SDKs start with `mcp-gateway --config ...`.
	MCPGatewayPath = "/usr/local/bin/mcp-gateway"
	// RunDir is a directory the host binds in from the sandbox's own state
	// directory (its "run" subdirectory): envd's unix sockets, which the host
	// dials from outside, and a build step's result.
	RunDir = "/run/airlock"
	// HostRunDir is RunDir's name inside the sandbox's state directory on the
	// host.
	HostRunDir = "run"
	// SocketName and InterpSocketName are envd's and the code interpreter's
	// unix sockets in RunDir; the host reaches envd only through them.
	SocketName       = "envd.sock"
	InterpSocketName = "interp.sock"
	// Socket and InterpSocket are those sockets' in-sandbox paths.
	Socket       = RunDir + "/" + SocketName
	InterpSocket = RunDir + "/" + InterpSocketName
	// SudoSocket is where envd listens for its sudo shim (in the sandbox
	// only, never bound from the host).
	SudoSocket = "/run/envd/sudo.sock"
	// DefaultPath is the PATH of processes whose environment gives none
	// (Debian's and Docker's default).
	DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
