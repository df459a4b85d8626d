package interp

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"unicode/utf8"
)

// The R backend: Debian's IRkernel (r-cran-irkernel, kernelspec "ir") over the generic
// Jupyter client, which is what E2B runs too, so values, streams, plots and errors come in
// IRkernel's own shapes: a visible value is a display_data (text/plain `[1] "x"` plus html,
// markdown and latex), print() and cat() are stdout, message() and warnings stderr, an error
// is ename "ERROR" with the condition's text as evalue, and a plot is image/png.

func init() {
	Register("r", StartR)
}

// StartR is the "r" Starter. Templates without IRkernel get ErrUnavailable.
func StartR(ctx context.Context, opts Options) (Kernel, error) {
	spec, err := readKernelspec("ir")
	if err != nil {
		return nil, err
	}
	var env []string
	if envValue(opts.Env, "LC_ALL") == "" && envValue(opts.Env, "LC_CTYPE") == "" && envValue(opts.Env, "LANG") == "" {
		// Without a locale R runs in C and prints every non-ASCII character as <U+00E9>;
		// E2B's image sets LANG=C.UTF-8, which glibc always has.
		env = append(env, "LANG=C.UTF-8")
	}
	for k, v := range spec.Env {
		env = append(env, k+"="+v)
	}
	k, err := startJupyter(ctx, opts, "ir", rArgv(spec.Argv), env, jupyterFlavor{
		envCode: rEnvCode,
		// R's system() and cat(file = stderr()) write to the process's fds, which IRkernel
		// leaves alone (under Jupyter they end in the server's log); the contract wants
		// them in the cell's output.
		captureFDs:           true,
		busyHeartbeat:        true,
		interruptOnceStarted: true,
	})
	if err != nil {
		return nil, err
	}
	return k, nil
}

// rMain replaces IRkernel::main(): the same kernel, with its main loop started again after
// an interrupt that escaped it. IRkernel catches SIGINT in its poll and around the cell's
// code, but one that lands in between (the cell has just ended, its reply is being sent)
// would end R ("Execution halted") and the context's state with it. The request it cut
// short is then answered as interrupted (reply "abort", then idle), which is what the
// client waits for; a second answer to a request already answered is ignored by it.
const rMain = `local({
  kernel <- IRkernel:::Kernel$new(connection_file = commandArgs(TRUE)[[1]])
  repeat tryCatch(kernel$run(), interrupt = function(e) {
    req <- kernel$executor$current_request
    if (is.null(req)) return()
    kernel$executor$current_request <- NULL
    kernel$send_response("execute_reply", req, "shell",
      list(status = "abort", execution_count = kernel$executor$execution_count))
    kernel$send_response("status", req, "iopub", list(execution_state = "idle"))
  })
})`

// rArgv is the kernelspec's command with rMain in place of IRkernel::main(); a spec that
// does not call it is left as it is.
func rArgv(argv []string) []string {
	out := append([]string(nil), argv...)
	for i, a := range out {
		if a == "IRkernel::main()" {
			out[i] = rMain
		}
	}
	return out
}

// rEnvStack is the option holding the stack of values an execution's env replaced (NA: was
// unset). An option, not a variable of the user's global environment, so that rm() in a
// cell cannot lose it (the base environment takes no new bindings).
const rEnvStack = "airlock.env_stack"

// rEnvCode is the per-execution env of IRkernel, set with Sys.setenv (as E2B does) by a
// silent execute before the cell and put back by one after it: a variable the execution
// overrode gets its previous value again, one it added is unset.
func rEnvCode(env map[string]string) (string, string, error) {
	keys := make([]string, 0, len(env))
	for k := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") {
			return "", "", fmt.Errorf("invalid env var name %q", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var names, values []string
	for _, k := range keys {
		if strings.ContainsRune(env[k], 0) {
			return "", "", fmt.Errorf("env var %s holds a NUL byte", k)
		}
		names = append(names, rString(k))
		values = append(values, rString(env[k]))
	}
	apply := fmt.Sprintf(`local({
  keys <- c(%s)
  vals <- c(%s)
  prev <- Sys.getenv(keys, unset = NA, names = TRUE)
  options(%s = c(list(prev), getOption(%q)))
  do.call(Sys.setenv, as.list(setNames(vals, keys)))
  invisible()
})`, strings.Join(names, ", "), strings.Join(values, ", "), rEnvStack, rEnvStack)
	restore := fmt.Sprintf(`local({
  stack <- getOption(%q)
  if (length(stack) == 0) return(invisible())
  prev <- stack[[1]]
  options(%s = stack[-1])
  unset <- names(prev)[is.na(prev)]
  if (length(unset) > 0) Sys.unsetenv(unset)
  keep <- prev[!is.na(prev)]
  if (length(keep) > 0) do.call(Sys.setenv, as.list(keep))
  invisible()
})`, rEnvStack, rEnvStack)
	return apply, restore, nil
}

// rString quotes s as an R string literal. Non-ASCII text stays as raw UTF-8 (R keeps the
// bytes whatever its locale, as the env must), and every control character is escaped so a
// value cannot end the literal or the line.
func rString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i]) // a byte of invalid UTF-8, kept as such
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			b.WriteString(s[i : i+size])
		}
		i += size
	}
	b.WriteByte('"')
	return b.String()
}
