package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/airlock-sandbox/airlock/internal/e2bwire"
	"github.com/airlock-sandbox/airlock/internal/secret"
)

// SecretService keeps the secrets API keys create (secret.Service). Every
// method is scoped to an owner: another owner's secret is
// secret.ErrNotFound. Nothing it returns carries a value.
type SecretService interface {
	Create(ctx context.Context, owner, name, value string, metadata map[string]string) (secret.Secret, error)
	Update(ctx context.Context, owner, ref, value string, metadata map[string]string) (secret.Secret, error)
	Get(ctx context.Context, owner, ref string) (secret.Secret, error)
	List(ctx context.Context, owner, after string, limit int) ([]secret.Secret, error)
	Destroy(ctx context.Context, owner, ref string) error
}

// secretPageMax is the spec's paginationLimit: default and maximum 100.
const secretPageMax = 100

func (h *Handler) routeSecrets() {
	h.handle("GET /secrets", h.listSecrets)
	h.handle("POST /secrets", h.createSecret)
	h.handle("GET /secrets/{secretID}", h.getSecret)
	h.handle("POST /secrets/{secretID}", h.updateSecret)
	h.handle("DELETE /secrets/{secretID}", h.deleteSecret)
}

var errNoSecrets = &apiError{status: http.StatusNotImplemented, message: "secrets are not available on this server"}

// decodeSecretBody is decodeBody for bodies that hold a secret's value: a
// decoder's message can quote bytes of the body (a syntax error names the
// character it stopped at), so it is replaced by one that says where and
// what kind of error, and the cause is dropped from what is logged too.
func (h *Handler) decodeSecretBody(w http.ResponseWriter, r *http.Request, v any) (bool, error) {
	present, err := h.decodeBody(w, r, v)
	var ae *apiError
	if err == nil || !errors.As(err, &ae) || ae.status != http.StatusBadRequest {
		return present, err
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	msg := "malformed JSON body"
	switch {
	case errors.As(ae.err, &syn):
		msg = fmt.Sprintf("malformed JSON body: syntax error at byte %d", syn.Offset)
	case errors.As(ae.err, &typ) && typ.Field != "":
		// The kind of the value found (string, number, ...), never the value.
		msg = fmt.Sprintf("malformed JSON body: field %q must be %s, got %s", typ.Field, jsonKind(typ.Type), typ.Value)
	case errors.As(ae.err, &typ):
		msg = fmt.Sprintf("malformed JSON body: expected %s, got %s", jsonKind(typ.Type), typ.Value)
	}
	return false, badRequest("%s", msg)
}

func (h *Handler) createSecret(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Secrets == nil {
		return errNoSecrets
	}
	var body e2bwire.NewSecret
	present, err := h.decodeSecretBody(w, r, &body)
	if err != nil {
		return err
	}
	switch {
	case !present:
		return badRequest("a JSON body is required: {\"name\": ..., \"value\": ..., \"metadata\": {...}}")
	case body.Name == "":
		return badRequest("name is required: the secret's name (letters, digits, '_' and '-')")
	case body.Value == nil:
		return badRequest("value is required: the secret's value")
	}
	sec, err := h.opts.Secrets.Create(r.Context(), ownerFrom(r.Context()), body.Name, *body.Value, body.Metadata)
	if err != nil {
		return secretError(err, "")
	}
	noteTarget(r.Context(), "secret", sec.ID)
	writeJSON(w, http.StatusCreated, toWireSecret(sec))
	return nil
}

// listSecrets is GET /secrets: the key's secrets in name order, in pages of
// limit (default and cap 100, clamped like the other lists). The token is
// the page's last name, so a page survives that secret's deletion.
func (h *Handler) listSecrets(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Secrets == nil {
		return errNoSecrets
	}
	q := r.URL.Query()
	limit, err := parseLimit(q.Get("limit"), secretPageMax)
	if err != nil {
		return err
	}
	var after string
	if tok := q.Get("nextToken"); tok != "" {
		if after, err = decodeSecretToken(tok); err != nil {
			return badRequest("Invalid next token")
		}
	}
	secs, err := h.opts.Secrets.List(r.Context(), ownerFrom(r.Context()), after, limit+1)
	if err != nil {
		return secretError(err, "")
	}
	if len(secs) > limit {
		secs = secs[:limit]
		w.Header().Set(headerNextToken, encodeTemplateToken(secs[len(secs)-1].Name))
	}
	out := make([]e2bwire.Secret, 0, len(secs))
	for _, s := range secs {
		out = append(out, toWireSecret(s))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// decodeSecretToken reads a list token: URL-safe base64 of a canonical name.
func decodeSecretToken(tok string) (string, error) {
	name, err := decodeTemplateToken(tok)
	if err != nil {
		return "", err
	}
	if secret.ValidName(name) != nil || name != secret.CanonicalName(name) {
		return "", fmt.Errorf("decode token: invalid name %q", name)
	}
	return name, nil
}

func (h *Handler) getSecret(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Secrets == nil {
		return errNoSecrets
	}
	ref := r.PathValue("secretID")
	sec, err := h.opts.Secrets.Get(r.Context(), ownerFrom(r.Context()), ref)
	if err != nil {
		return secretError(err, ref)
	}
	writeJSON(w, http.StatusOK, toWireSecret(sec))
	return nil
}

// updateSecret is POST /secrets/{secretID}: the value's new version;
// metadata, when sent, replaces the secret's.
func (h *Handler) updateSecret(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Secrets == nil {
		return errNoSecrets
	}
	ref := r.PathValue("secretID")
	var body e2bwire.SecretUpdate
	present, err := h.decodeSecretBody(w, r, &body)
	if err != nil {
		return err
	}
	if !present || body.Value == nil {
		return badRequest("value is required: the secret's new value")
	}
	sec, err := h.opts.Secrets.Update(r.Context(), ownerFrom(r.Context()), ref, *body.Value, body.Metadata)
	if err != nil {
		return secretError(err, ref)
	}
	writeJSON(w, http.StatusOK, toWireSecret(sec))
	return nil
}

func (h *Handler) deleteSecret(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Secrets == nil {
		return errNoSecrets
	}
	ref := r.PathValue("secretID")
	if err := h.opts.Secrets.Destroy(r.Context(), ownerFrom(r.Context()), ref); err != nil {
		return secretError(err, ref)
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func toWireSecret(s secret.Secret) e2bwire.Secret {
	md := s.Metadata
	if md == nil {
		md = map[string]string{}
	}
	return e2bwire.Secret{
		SecretID: s.ID, Name: s.Name, CurrentVersion: s.Version, Metadata: md,
		CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt,
	}
}

// secretError maps the secret service's errors to statuses: a taken name is
// 409 (the spec's Conflict), a used-up per-key allowance 429 as volumes'.
func secretError(err error, ref string) error {
	for _, m := range []struct {
		err    error
		status int
	}{
		{secret.ErrInvalid, http.StatusBadRequest},
		{secret.ErrExists, http.StatusConflict},
		{secret.ErrLimit, http.StatusTooManyRequests},
		{secret.ErrNotFound, http.StatusNotFound},
	} {
		if !errors.Is(err, m.err) {
			continue
		}
		if m.status == http.StatusNotFound && ref != "" {
			return &apiError{status: m.status, message: fmt.Sprintf("secret %q not found", ref), err: err}
		}
		// The service's detail without the sentinel's generic prefix.
		return &apiError{status: m.status, message: strings.TrimPrefix(err.Error(), m.err.Error()+": "), err: err}
	}
	return managerError(err, "", "")
}
