// Package stepproto is the contract between the template builder's build
// sandbox (internal/buildbox, on the host) and `envd step` (inside it): what
// one build step runs and how it ended. It is its own package so the host side
// needs none of envd.
package stepproto

import (
	"encoding/json"
	"fmt"
	"os"
)

// Spec is what `envd step` reads on stdin: one command of a template build
// (a RUN instruction), run as the build sandbox's first process.
type Spec struct {
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	// User is Docker's USER: name, uid, name:group, uid:gid (or a mix).
	// Empty means root.
	User string `json:"user,omitempty"`
	// ExitFile receives the Result as JSON; default DefaultExitFile.
	ExitFile string `json:"exitFile,omitempty"`
}

// DefaultExitFile is where the result goes unless the spec says otherwise:
// in a directory the host binds into the build sandbox.
const DefaultExitFile = "/run/airlock/step.exit"

// DefaultPath is the PATH a step gets when its environment has none (Docker's).
const DefaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// Result is how a step ended. Exactly one of the three is meaningful: Error
// when the command could not be started at all (unknown user, missing working
// directory or binary), else Signal when a signal killed it, else ExitCode.
type Result struct {
	ExitCode int    `json:"exitCode"`
	Signal   int    `json:"signal,omitempty"`
	Error    string `json:"error,omitempty"`
}

// WriteResult writes res atomically (a reader never sees half of it).
func WriteResult(path string, res Result) error {
	b, err := json.Marshal(res)
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return fmt.Errorf("%s: %w", tmp, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// ReadResult reads what `envd step` wrote.
func ReadResult(path string) (Result, error) {
	var res Result
	b, err := os.ReadFile(path)
	if err != nil {
		return res, fmt.Errorf("step result: %w", err)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return res, fmt.Errorf("step result %s: %w", path, err)
	}
	return res, nil
}
