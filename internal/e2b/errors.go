package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// statusClientClosedRequest is nginx's convention for "the client went away".
// Nobody reads the response, but logging it as 499 instead of 500 keeps a
// cancelled SDK call from looking like a server fault.
const statusClientClosedRequest = 499

// apiError is a failure that already knows how it must look on the wire. The
// SDKs branch on body.code (kill → false on 404, pause → false on 409), so
// every error path funnels through this one type to keep code == HTTP status.
type apiError struct {
	status  int
	message string
	err     error // cause, for logs and errors.Is; never shown to the client unless it is the message
	// retryAfter, when set, goes out as the Retry-After header.
	retryAfter time.Duration
}

// retryable is an error that passes when the client waits: a template that is
// still being built (template.BuildingError) says how long to wait.
type retryable interface {
	error
	RetryAfter() time.Duration
}

func (e *apiError) Error() string {
	if e.err != nil {
		return fmt.Sprintf("%d %s: %v", e.status, e.message, e.err)
	}
	return fmt.Sprintf("%d %s", e.status, e.message)
}

func (e *apiError) Unwrap() error { return e.err }

func badRequest(format string, args ...any) *apiError {
	return &apiError{status: http.StatusBadRequest, message: fmt.Sprintf(format, args...)}
}

// writeJSON marshals before writing the status line, so a value that cannot
// be encoded still yields a well-formed 500 body instead of a truncated 200.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		status = http.StatusInternalServerError
		b, _ = json.Marshal(e2bwire.Error{Code: status, Message: fmt.Sprintf("encoding response: %v", err)})
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	// The status line is out; a failed write can only be a broken connection,
	// which the client notices on its own.
	_, _ = w.Write(append(b, '\n'))
}

func writeError(w http.ResponseWriter, status int, message string) {
	writeJSON(w, status, e2bwire.Error{Code: status, Message: message})
}

// managerError translates a Manager error into its wire form. sandboxID and
// template name what the request was about (either may be empty), so a 404 can
// say which thing was missing rather than repeating the manager's generic text.
func managerError(err error, sandboxID, template string) *apiError {
	var ae *apiError
	var ra retryable
	switch {
	case errors.As(err, &ae):
		return ae
	case errors.As(err, &ra):
		// The message is the template's own (which step, for how long), not
		// the wrapping: a person reads it while waiting.
		return &apiError{status: http.StatusServiceUnavailable, message: ra.Error(), err: err, retryAfter: ra.RetryAfter()}
	case errors.Is(err, sandbox.ErrTemplateNotFound):
		// Upstream answers an unknown template with 404 "template '<x>' not found".
		if template == "" {
			return &apiError{status: http.StatusNotFound, message: err.Error(), err: err}
		}
		return &apiError{status: http.StatusNotFound, message: fmt.Sprintf("template %q not found", template), err: err}
	case errors.Is(err, sandbox.ErrNotFound):
		if sandboxID == "" {
			return &apiError{status: http.StatusNotFound, message: err.Error(), err: err}
		}
		return &apiError{status: http.StatusNotFound, message: fmt.Sprintf("sandbox %q not found", sandboxID), err: err}
	case errors.Is(err, sandbox.ErrInvalid):
		return &apiError{status: http.StatusBadRequest, message: err.Error(), err: err}
	case errors.Is(err, sandbox.ErrNotSupported):
		return &apiError{status: http.StatusNotImplemented, message: err.Error(), err: err}
	case errors.Is(err, sandbox.ErrStorageLimit):
		// A quota on disk: 507, as a volume's size is answered.
		return &apiError{status: http.StatusInsufficientStorage, message: err.Error(), err: err}
	case errors.Is(err, sandbox.ErrLimit):
		// Upstream answers a used-up concurrency quota with 429 as well.
		return &apiError{status: http.StatusTooManyRequests, message: err.Error(), err: err}
	case errors.Is(err, sandbox.ErrConflict):
		return &apiError{status: http.StatusConflict, message: err.Error(), err: err}
	case errors.Is(err, sandbox.ErrTemplateNotReady):
		// The sandbox started, but the service its template starts did not
		// pass its ready command in time: a gateway timeout in the plain
		// sense (an upstream, not Airlock, was too slow), which a retry may
		// not repeat. 503 would read as "server busy" (ServiceBusyError).
		return &apiError{status: http.StatusGatewayTimeout, message: startMessage(err), err: err}
	case errors.Is(err, sandbox.ErrTemplateStart):
		// The template's start command died: the template is broken, not the
		// request, so a 4xx would mislead; the message says what happened.
		return &apiError{status: http.StatusInternalServerError, message: startMessage(err), err: err}
	case errors.Is(err, context.Canceled):
		return &apiError{status: statusClientClosedRequest, message: "request cancelled", err: err}
	case errors.Is(err, context.DeadlineExceeded):
		return &apiError{status: http.StatusGatewayTimeout, message: err.Error(), err: err}
	default:
		return &apiError{status: http.StatusInternalServerError, message: err.Error(), err: err}
	}
}

// startMessage is the client-facing text of a template start failure: the
// StartError's own message (template, command, exit code, output), without
// whatever context wrapped it on the way up.
func startMessage(err error) string {
	var se *sandbox.StartError
	if errors.As(err, &se) {
		return se.Error()
	}
	return err.Error()
}
