// Package interp runs code-interpreter kernels. This file is jskernel's copy of
// the contract owned by helper "interp" (issue 5); the lead keeps interp's
// version at merge.
package interp

import (
	"context"
	"errors"
	"sync"
)

// Event is one output of an execution. Kernels emit raw MIME bundles; the
// core maps them to E2B result keys.
type Event struct {
	Type         string         // "stdout", "stderr", "result", "error"
	Text         string         // stdout/stderr
	Data         map[string]any // result: the MIME bundle
	IsMainResult bool           // result: the cell's value (execute_result) vs a display
	Error        *ExecError     // error
}

// ExecError is an error raised by the executed code.
type ExecError struct{ Name, Value, Traceback string }

// A Kernel is one context's language runtime. Executions on one kernel are
// serialised by the core (one at a time).
type Kernel interface {
	Execute(ctx context.Context, code string, env map[string]string, emit func(Event)) (execCount int, err error)
	Close() error
}

// ErrKernelDied is returned by Execute once the kernel's process is gone.
var ErrKernelDied = errors.New("kernel died")

// Options says how to start a kernel.
type Options struct {
	Language string
	Cwd      string
	UID, GID uint32
	Groups   []uint32
	Home     string
	Env      []string
	RunDir   string
}

// Starter starts a kernel for one language.
type Starter func(ctx context.Context, opts Options) (Kernel, error)

// ErrUnavailable is wrapped by a Starter when the template lacks what the language needs.
var ErrUnavailable = errors.New("language not available in this sandbox")

var (
	regMu    sync.RWMutex
	starters = map[string]Starter{}
)

// Register makes a backend available for a language.
func Register(language string, s Starter) {
	regMu.Lock()
	defer regMu.Unlock()
	starters[language] = s
}

// Lookup returns the Starter registered for a language.
func Lookup(language string) (Starter, bool) {
	regMu.RLock()
	defer regMu.RUnlock()
	s, ok := starters[language]
	return s, ok
}
