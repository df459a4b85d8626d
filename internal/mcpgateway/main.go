// Package mcpgateway is the MCP gateway that runs inside a sandbox, as E2B's
// does: `Sandbox.create({mcp: {...}})` in E2B's SDK runs
// `mcp-gateway --config '<json>'` in the sandbox as root, and clients then
// reach the gateway at https://<50005-host>/mcp with the bearer token the
// SDK chose (GATEWAY_ACCESS_TOKEN, kept in /etc/mcp-gateway/.token).
//
// The gateway is a client of every configured MCP server, each a stdio
// process: catalog servers pre-installed with npm (catalog.go) and custom
// servers cloned from GitHub. It serves their tools, prompts and resources
// as one MCP server (streamable HTTP, both protocol eras), restarts a server
// that exits, and cuts oversized tool results.
//
// It is a mode of the envd binary (the host binds envd at
// /usr/local/bin/mcp-gateway; cmd/envd dispatches on argv[0]), so it needs
// nothing from the template but the servers.
package mcpgateway

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
)

// Version is the gateway's version: envd's, the binary it is part of.
const Version = envdapi.Version

// daemonCmd is the hidden subcommand of the detached gateway.
const daemonCmd = "__daemon"

const usage = `usage:
  mcp-gateway --config '<json>'     start the gateway (detached) and wait until it serves
  mcp-gateway pull <name>...         install catalog servers (template builds)
  mcp-gateway --help | --version

--config is E2B's "mcp" option as JSON: keys are servers, e.g.
  {"filesystem": {"paths": ["/home/user"]}, "memory": {},
   "github/<owner>/<repo>": {"runCmd": "node dist/index.js", "installCmd": "npm ci", "envs": {"K": "V"}}}
The catalog: %s.
The gateway serves MCP at http://<host>%s/mcp (Authorization: Bearer $GATEWAY_ACCESS_TOKEN,
also in %s/.token), GET /health without a token; it logs to %s/gateway.log.

flags:
`

// Main is the mcp-gateway command; args exclude argv[0]. It returns the exit
// status.
func Main(args []string) int {
	return run(args, os.Stdout, os.Stderr)
}

func run(args []string, stdout, stderr io.Writer) int {
	var o Options
	fs := flag.NewFlagSet("mcp-gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	o.register(fs)
	config := fs.String("config", "", "the servers, as JSON (E2B's mcp option)")
	version := fs.Bool("version", false, "print the version")
	deadline := fs.Int64("deadline", 0, "internal: the start's deadline, for the daemon (Unix ns)")
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), usage, catalogNames(), DefaultListen, DefaultEtcDir, DefaultLogDir)
		fs.PrintDefaults()
	}
	for _, a := range args {
		if a == "-h" || a == "-help" || a == "--help" {
			// Asked for: to stdout (a parse error prints usage to stderr).
			fs.SetOutput(stdout)
			fs.Usage()
			return 0
		}
	}
	// Flags may come before the subcommand, after it, or both.
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	rest := fs.Args()
	sub := ""
	if len(rest) > 0 {
		sub, rest = rest[0], rest[1:]
		if err := fs.Parse(rest); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return 0
			}
			return 2
		}
		rest = fs.Args()
	}
	switch {
	case *version:
		fmt.Fprintf(stdout, "mcp-gateway %s (Airlock)\n", Version)
		return 0
	case sub == "pull":
		return pull(&o, rest, stdout, stderr)
	case sub == daemonCmd:
		d := time.Now().Add(o.Timeout)
		if *deadline > 0 {
			d = time.Unix(0, *deadline)
		}
		return runDaemon(&o, d)
	case sub == "help":
		fs.SetOutput(stdout)
		fs.Usage()
		return 0
	case sub != "":
		fmt.Fprintf(stderr, "unknown command %q (see mcp-gateway --help)\n", sub)
		return 2
	case len(rest) > 0:
		fmt.Fprintf(stderr, "unexpected arguments %q (see mcp-gateway --help)\n", rest)
		return 2
	}
	return startGateway(&o, *config, stdout, stderr)
}
