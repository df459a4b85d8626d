// Command airlock is the Airlock server and CLI. Every subsystem is wired here,
// in one place: see serve.go for how a server is assembled.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
)

// The runtime re-executes this binary as the first process of each sandbox
// ("airlock init"); that must happen before anything else runs.
func init() { linux.MaybeInit() }

// startsSandboxes are the commands that start sandboxes in this process.
var startsSandboxes = map[string]bool{"serve": true, "bench": true, "template": true}

func main() {
	if len(os.Args) > 1 && startsSandboxes[os.Args[1]] {
		// Every sandbox start executes this binary; see SealSelf for why it
		// should be a sealed copy made once rather than once per start.
		if err := linux.SealSelf(); err != nil {
			fmt.Fprintln(os.Stderr, "airlock: warning:", err)
		}
	}
	root := &cobra.Command{
		Use:           "airlock",
		Short:         "Self-hosted secure sandboxes for AI agents, compatible with the E2B SDKs",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), templateCmd(), benchCmd(), mcpCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "airlock:", err)
		os.Exit(1)
	}
}
