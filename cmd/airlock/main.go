// Command airlock is the Airlock server and CLI. Every subsystem is wired here,
// in one place: see serve.go for how a server is assembled.
package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

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
		raiseFileLimit()
	}
	root := &cobra.Command{
		Use:           "airlock",
		Short:         "Self-hosted secure sandboxes for AI agents, compatible with the E2B SDKs",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(serveCmd(), templateCmd(), benchCmd(), mcpCmd(), doctorCmd(), serviceCmd(), keysCmd(), auditCmd())
	root.AddCommand(imageCmd(), nodeAgentCmd())
	if err := root.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "airlock:", err)
		os.Exit(1)
	}
}

// raiseFileLimit lifts this process's open-file limit to the kernel's
// ceiling (fs.nr_open) where it may: a live sandbox holds three or four of
// the server's descriptors (its init's pidfd twice, libcontainer's and the
// reaper's; its network namespace; a kept-alive connection to its envd for
// 90 s), so a hard limit of 20,000, as on a host that gives root no
// CAP_SYS_RESOURCE, caps a server near 5,000-6,000 sandboxes (3.2 each
// with 4,000 idle, README). Go already raised the soft limit to
// the hard one; without CAP_SYS_RESOURCE the hard one stays as it is.
func raiseFileLimit() {
	b, err := os.ReadFile("/proc/sys/fs/nr_open")
	if err != nil {
		return
	}
	ceiling, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return
	}
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Max >= ceiling {
		return
	}
	_ = syscall.Setrlimit(syscall.RLIMIT_NOFILE, &syscall.Rlimit{Cur: ceiling, Max: ceiling})
}
