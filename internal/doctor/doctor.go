// Package doctor looks at the host `airlock serve` would run on and says,
// for each thing it needs, whether it is there and what to do when it is
// not. It changes nothing: every probe reads, or makes something of its own
// (a child in new namespaces, a listener, a file in a temporary directory)
// and removes it before it returns.
//
// A finding is OK, Warn (the server runs, but a feature is missing or
// something is likely to hurt) or Fail (serving would fail, or sandboxes
// would not start). `airlock doctor` exits non-zero when any check fails.
package doctor

import (
	"fmt"
	"io"
	"strings"
)

// Severity is how bad a finding is.
type Severity int

const (
	OK Severity = iota
	Warn
	Fail
)

func (s Severity) mark() string {
	switch s {
	case Warn:
		return "!"
	case Fail:
		return "✖"
	}
	return "✔"
}

// Finding is what one check saw.
type Finding struct {
	Check    string
	Severity Severity
	// Detail says what was seen.
	Detail string
	// Fix says what to do; empty when there is nothing to do.
	Fix string
}

// Options are the serve settings the checks depend on (serve's flags of
// the same names).
type Options struct {
	DataDir     string
	APIAddr     string
	SandboxAddr string
	// MetricsAddr is serve's admin listener ("": none).
	MetricsAddr string
	// TLSListen is checked only with Domain set.
	Domain    string
	TLSListen string
	// Runtime is the default runtime: "linux" or "gvisor".
	Runtime   string
	DiskQuota bool
	Network   bool
	Egress    bool
}

// check is one thing doctor looks at.
type check struct {
	name string
	run  func(*Options) Finding
}

// checks in the order they are reported: what everything else needs
// first.
var checks = []check{
	{"root", checkRoot},
	{"kernel", checkKernel},
	{"namespaces", checkNamespaces},
	{"overlayfs", checkOverlay},
	{"sandbox root", checkRootfs},
	{"cgroups", checkCgroups},
	{"seccomp", checkSeccomp},
	{"nftables", checkNftables},
	{"ip forwarding", checkForwarding},
	{"pid_max", checkPidMax},
	{"disk pool", checkDiskPool},
	{"criu", checkCRIU},
	{"gvisor", checkGVisor},
	{"lxcfs", checkLXCFS},
	{"data dir", checkDataDir},
	{"disk space", checkDiskSpace},
	{"memory", checkMemory},
	{"ports", checkPorts},
	{"clock", checkClock},
}

// Run runs every check.
func Run(o Options) []Finding {
	out := make([]Finding, 0, len(checks))
	for _, c := range checks {
		f := c.run(&o)
		f.Check = c.name
		out = append(out, f)
	}
	return out
}

// Failed reports whether any finding fails.
func Failed(fs []Finding) bool {
	for _, f := range fs {
		if f.Severity == Fail {
			return true
		}
	}
	return false
}

// Write prints findings one per line, each problem with its fix under it,
// and a last line that sums them up.
func Write(w io.Writer, fs []Finding) {
	var warns, fails int
	for _, f := range fs {
		fmt.Fprintf(w, "%s %s: %s\n", f.Severity.mark(), f.Check, f.Detail)
		if f.Fix != "" && f.Severity != OK {
			fmt.Fprintf(w, "    fix: %s\n", f.Fix)
		}
		switch f.Severity {
		case Warn:
			warns++
		case Fail:
			fails++
		}
	}
	switch {
	case fails > 0:
		fmt.Fprintf(w, "\n%s, %s: serving would fail on this host.\n", plural(fails, "problem"), plural(warns, "warning"))
	case warns > 0:
		fmt.Fprintf(w, "\n%s: Airlock can serve on this host, without what they name.\n", plural(warns, "warning"))
	default:
		fmt.Fprintln(w, "\nEverything Airlock needs is here.")
	}
}

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return fmt.Sprintf("%d %ss", n, what)
}

func ok(detail string) Finding { return Finding{Severity: OK, Detail: detail} }

func warn(detail, fix string) Finding { return Finding{Severity: Warn, Detail: detail, Fix: fix} }

func fail(detail, fix string) Finding { return Finding{Severity: Fail, Detail: detail, Fix: fix} }

// firstLine is s's first line, trimmed: what a tool's error says first.
func firstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
