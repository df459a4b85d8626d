package envdapi

// The build-step protocol: between the template builder's build sandbox
// (internal/buildbox, on the host) and `envd step` (inside it, as the build
// sandbox's first process): what one build step runs and how it ended.

import (
	"encoding/json"
	"fmt"
	"os"
)

// StepSpec is what `envd step` reads on stdin: one command of a template build
// (a RUN instruction), run as the build sandbox's first process.
type StepSpec struct {
	Args []string `json:"args"`
	Env  []string `json:"env,omitempty"`
	Cwd  string   `json:"cwd,omitempty"`
	// User is Docker's USER: name, uid, name:group, uid:gid (or a mix).
	// Empty means root.
	User string `json:"user,omitempty"`
	// ExitFile receives the StepResult as JSON; default StepExitFile.
	ExitFile string `json:"exitFile,omitempty"`
}

// StepExitFile is where the result goes unless the spec says otherwise: in
// RunDir, which the host binds into the build sandbox.
const StepExitFile = RunDir + "/" + StepExitName

// StepExitName is StepExitFile's name in the host's side of RunDir.
const StepExitName = "step.exit"

// StepResult is how a step ended. Exactly one of the three is meaningful: Error
// when the command could not be started at all (unknown user, missing working
// directory or binary), else Signal when a signal killed it, else ExitCode.
type StepResult struct {
	ExitCode int    `json:"exitCode"`
	Signal   int    `json:"signal,omitempty"`
	Error    string `json:"error,omitempty"`
}

// WriteStepResult writes res atomically (a reader never sees half of it).
func WriteStepResult(path string, res StepResult) error {
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

// ReadStepResult reads what `envd step` wrote.
func ReadStepResult(path string) (StepResult, error) {
	var res StepResult
	b, err := os.ReadFile(path)
	if err != nil {
		return res, fmt.Errorf("step result: %w", err)
	}
	if err := json.Unmarshal(b, &res); err != nil {
		return res, fmt.Errorf("step result %s: %w", path, err)
	}
	return res, nil
}
