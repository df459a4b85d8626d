package e2b

import (
	"context"
	"fmt"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// startFailManager fails every create the way the real manager does when a
// template's start or ready command fails: a *sandbox.StartError wrapped in
// the manager's context.
type startFailManager struct {
	*fakeManager
	err error
}

func (m startFailManager) Create(context.Context, sandbox.CreateRequest) (sandbox.Info, error) {
	return sandbox.Info{}, m.err
}

// TestCreateTemplateStartErrors checks the wire form of a failed start phase:
// a dead start command is the template's fault (500), a ready command that
// never succeeded is a timeout (504); both carry the StartError's message
// alone, on both create paths.
func TestCreateTemplateStartErrors(t *testing.T) {
	exited := &sandbox.StartError{Template: "web", Message: "template web: start command `false` exited with code 1 before the sandbox was ready; its output: boom"}
	notReady := &sandbox.StartError{Template: "web", NotReady: true, Message: "template web: ready command `curl -sf localhost:8000` did not succeed within 3s (last exit code 7: (none)); start command output: (none)"}
	for _, tt := range []struct {
		err    error
		status int
		msg    string
	}{
		{exited, 500, exited.Message},
		{fmt.Errorf("sandbox abc: %w", exited), 500, exited.Message},
		{notReady, 504, notReady.Message},
		{fmt.Errorf("sandbox abc: %w", notReady), 504, notReady.Message},
	} {
		h := NewHandler(startFailManager{fakeManager: newFakeManager(), err: tt.err}, testOptions())
		checkError(t, request(t, h, "POST", "/v2/sandboxes", `{"templateID":"base"}`), tt.status, tt.msg)
		checkError(t, request(t, h, "POST", "/sandboxes", `{"templateID":"base"}`), tt.status, tt.msg)
	}
}
