// Package interp serves the E2B code-interpreter protocol (POST /execute streaming NDJSON,
// /contexts, /health) inside a sandbox. The core (this file, server.go, context.go) owns the
// HTTP protocol, the contexts and the MIME-bundle → E2B result mapping; language backends
// (python, javascript/typescript, bash, r, java) implement Kernel, register a Starter, and pass the
// conformance suite in interp/kerneltest.
package interp

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
)

// Event is one output of an execution, in the order the kernel produced it.
//
// MIME bundle → E2B result keys is done by the core; kernels emit raw bundles:
// "text/plain", "text/html", "text/markdown", "image/svg+xml", "image/png" (base64 string),
// "image/jpeg" (base64), "application/pdf" (base64), "text/latex", "application/json" (object),
// "application/javascript", "e2b/data" (object), "e2b/chart" (object, E2B chart format).
type Event struct {
	Type         string         // "stdout", "stderr", "result", "error"
	Text         string         // stdout/stderr
	Data         map[string]any // result: the MIME bundle
	IsMainResult bool           // result: the cell's value (execute_result) vs a display
	Error        *ExecError     // error
}

// ExecError is an exception raised by the executed code (or by the kernel's death).
type ExecError struct{ Name, Value, Traceback string }

// A Kernel is one context's language runtime. Executions on one kernel are serialised by the
// core (one at a time).
type Kernel interface {
	// Execute runs code with env applied for this execution only (restored after), calls emit
	// for every output in order, and returns the execution count once the execution is
	// complete. ctx ending means the client went away or timed out: the kernel must interrupt
	// the code (SIGINT semantics, state kept) and return promptly with ctx.Err().
	// A dead kernel returns an error wrapping ErrKernelDied.
	Execute(ctx context.Context, code string, env map[string]string, emit func(Event)) (execCount int, err error)
	// Close stops the kernel and everything it started. It may be called while an
	// Execute is in progress (context deleted or restarted): that Execute then
	// returns promptly with an error wrapping ErrKernelDied.
	Close() error
}

// ErrKernelDied is wrapped by Execute's error when the kernel process went away; the core
// reports it as an error line and restarts the context on its next use.
var ErrKernelDied = errors.New("kernel died")

// Options says how to start a kernel.
type Options struct {
	Language string // normalised: python, javascript, typescript, bash, r, java
	Cwd      string
	UID, GID uint32 // who the kernel runs as (the sandbox's default user unless a context says otherwise)
	Groups   []uint32
	Home     string
	Env      []string // the sandbox's env (KEY=VALUE), already merged by the core
	RunDir   string   // a directory the kernel may write its support files to (driver scripts, connection files)
}

// Starter starts a kernel for opts.Language. ctx bounds the start only (a client
// that gives up while waiting for it); the kernel outlives it until Close. It returns an error wrapping ErrUnavailable when
// the template lacks what it needs (e.g. no node).
type Starter func(ctx context.Context, opts Options) (Kernel, error)

// ErrUnavailable is wrapped by a Starter's error when the sandbox lacks the language's runtime.
var ErrUnavailable = errors.New("language not available in this sandbox")

var (
	registryMu sync.RWMutex
	registry   = map[string]Starter{}
)

// Register makes a backend available for a normalised language name. Backends call it from
// an init function: interp.Register("python", startPython). Registering a language twice
// panics, as it is a programming error.
func Register(language string, start Starter) {
	registryMu.Lock()
	defer registryMu.Unlock()
	if _, dup := registry[language]; dup {
		panic(fmt.Sprintf("interp: language %q registered twice", language))
	}
	registry[language] = start
}

// Lookup returns the registered Starter of a normalised language.
func Lookup(language string) (Starter, bool) {
	registryMu.RLock()
	defer registryMu.RUnlock()
	s, ok := registry[language]
	return s, ok
}

// Languages lists the registered languages, sorted.
func Languages() []string {
	registryMu.RLock()
	defer registryMu.RUnlock()
	out := make([]string, 0, len(registry))
	for l := range registry {
		out = append(out, l)
	}
	sort.Strings(out)
	return out
}
