package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/layout"
	airlockmcp "github.com/airlock-sandbox/airlock/internal/mcp"
)

// mcpCmd is `airlock mcp`: the MCP server over stdio for desktop and IDE agents.
// It is a client of a running `airlock serve`, so it needs no root and holds no
// state; stdout carries the protocol, so everything else goes to stderr.
func mcpCmd() *cobra.Command {
	var apiURL, sandboxURL, apiKey, dataDir string
	cmd := &cobra.Command{
		Use:   "mcp",
		Short: "Serve the Airlock MCP tools over stdio (for Claude Desktop, Cursor and other MCP clients)",
		Long: "Serve the Airlock MCP tools (create_sandbox, run_code, run_command, files, pause, snapshot,\n" +
			"fork, build_template, ...) and sandbox files as resources (sandbox://<id>/<path>) over stdio,\n" +
			"to clients of MCP 2026-07-28 (server/discover) and of 2025-11-25 and before (initialize).\n" +
			"It talks to a running `airlock serve` at --url with --api-key. The environment `serve`\n" +
			"prints works as is: E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY, or the AIRLOCK_URL,\n" +
			"AIRLOCK_SANDBOX_URL and AIRLOCK_API_KEY names (which win when both are set). The key defaults\n" +
			"to <data-dir>/api-key. Without a sandbox URL the server is asked for it (" + e2bwire.InfoPath + ").",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			key, err := mcpAPIKey(apiKey, dataDir)
			if err != nil {
				return err
			}
			b := airlockmcp.NewHTTPBackend(e2bclient.Config{APIURL: apiURL, SandboxURL: sandboxURL, APIKey: key})
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			sbx := sandboxURL
			if sbx == "" {
				sbx = "(asked of the server)"
			}
			log.Info("airlock mcp on stdio", "api", apiURL, "sandbox", sbx)
			err = airlockmcp.NewServer(b, airlockmcp.Options{}).Run(ctx, &mcp.StdioTransport{})
			if err != nil && !errors.Is(err, context.Canceled) {
				return fmt.Errorf("mcp server: %w", err)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&apiURL, "url", envOr([]string{"AIRLOCK_URL", "E2B_API_URL"}, "http://127.0.0.1:3000"), "Airlock API URL (env AIRLOCK_URL or E2B_API_URL)")
	f.StringVar(&sandboxURL, "sandbox-url", envOr([]string{"AIRLOCK_SANDBOX_URL", "E2B_SANDBOX_URL"}, ""), "Airlock sandbox proxy URL (env AIRLOCK_SANDBOX_URL or E2B_SANDBOX_URL; default: asked of the server)")
	f.StringVar(&apiKey, "api-key", "", "API key (env AIRLOCK_API_KEY or E2B_API_KEY; default: the key in <data-dir>/api-key)")
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data directory of a local server, to read its api-key file")
	return cmd
}

// envOr returns the first of the named variables that is set, else def.
func envOr(names []string, def string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return def
}

// mcpAPIKey picks the key: the flag, else AIRLOCK_API_KEY (its first key, as
// serve accepts a comma-separated list), else E2B_API_KEY, else the local
// server's key file.
func mcpAPIKey(flag, dataDir string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	for _, env := range []string{"AIRLOCK_API_KEY", "E2B_API_KEY"} {
		for _, k := range strings.Split(os.Getenv(env), ",") {
			if k = strings.TrimSpace(k); k != "" {
				return k, nil
			}
		}
	}
	path := layout.DataDir{Root: dataDir}.APIKey()
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("no API key: pass --api-key or set E2B_API_KEY or AIRLOCK_API_KEY (reading %s: %w)", path, err)
	}
	if k := strings.TrimSpace(string(b)); k != "" {
		return k, nil
	}
	return "", fmt.Errorf("no API key: %s is empty; pass --api-key or set AIRLOCK_API_KEY", path)
}
