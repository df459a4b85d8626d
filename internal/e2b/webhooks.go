package e2b

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/airlock-sandbox/airlock/internal/lifecycle"
	"github.com/airlock-sandbox/airlock/internal/store"
	"github.com/airlock-sandbox/airlock/internal/webhook"
)

// WebhookStore keeps the webhooks API keys register and their deliveries
// (store.SQLite). Every method is scoped to an owner: another owner's
// webhook is ErrNotFound.
type WebhookStore interface {
	PutWebhook(ctx context.Context, w store.Webhook) error
	GetWebhook(ctx context.Context, owner, id string) (store.Webhook, error)
	ListWebhooks(ctx context.Context, owner string) ([]store.Webhook, error)
	DeleteWebhook(ctx context.Context, owner, id string) (bool, error)
	ListDeliveries(ctx context.Context, owner, webhookID string, offset, limit int) ([]store.Delivery, error)
}

// Limits of the webhook API.
const (
	MaxWebhooksPerKey    = 100
	maxWebhookName       = 128
	maxWebhookSecret     = 1024
	defaultDeliveryLimit = 50
	maxDeliveryLimit     = 100
)

// webhookBody is a create or update request; nil fields were absent (an
// update changes only the fields it names).
type webhookBody struct {
	Name            *string   `json:"name"`
	URL             *string   `json:"url"`
	Enabled         *bool     `json:"enabled"`
	Events          *[]string `json:"events"`
	SignatureSecret *string   `json:"signatureSecret"`
}

// webhookJSON is a webhook as the API shows it: never its secret.
type webhookJSON struct {
	ID        string    `json:"id"`
	TeamID    string    `json:"teamID"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"createdAt"`
	UpdatedAt time.Time `json:"updatedAt"`
	Enabled   bool      `json:"enabled"`
	URL       string    `json:"url"`
	Events    []string  `json:"events"`
}

type deliveryJSON struct {
	ID             string        `json:"id"`
	WebhookID      string        `json:"webhookId"`
	EventID        string        `json:"eventId"`
	EventType      string        `json:"eventType"`
	SandboxID      string        `json:"sandboxId"`
	Status         string        `json:"status"`
	Attempts       []attemptJSON `json:"attempts"`
	NextAttemptAt  *time.Time    `json:"nextAttemptAt,omitempty"`
	LastError      string        `json:"lastError,omitempty"`
	LastHTTPStatus int           `json:"lastHttpStatus,omitempty"`
	CreatedAt      time.Time     `json:"createdAt"`
	UpdatedAt      time.Time     `json:"updatedAt"`
}

type attemptJSON struct {
	At         time.Time `json:"at"`
	HTTPStatus int       `json:"httpStatus,omitempty"`
	Error      string    `json:"error,omitempty"`
	DurationMs float64   `json:"durationMs"`
}

func (h *Handler) routeWebhooks() {
	h.handle("POST /events/webhooks", h.createWebhook)
	h.handle("GET /events/webhooks", h.listWebhooks)
	h.handle("GET /events/webhooks/{webhookID}", h.getWebhook)
	h.handle("PATCH /events/webhooks/{webhookID}", h.patchWebhook)
	h.handle("DELETE /events/webhooks/{webhookID}", h.deleteWebhook)
	h.handle("GET /events/webhooks/{webhookID}/deliveries", h.listDeliveries)
}

var errNoWebhooks = &apiError{status: http.StatusNotImplemented, message: "webhooks are not available on this server"}

func (h *Handler) createWebhook(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Webhooks == nil {
		return errNoWebhooks
	}
	var body webhookBody
	if _, err := h.decodeBody(w, r, &body); err != nil {
		return err
	}
	switch {
	case body.URL == nil:
		return badRequest("url is required")
	case body.Events == nil:
		return badRequest("events is required: a list of event types (%s)", strings.Join(lifecycle.Types, ", "))
	case body.SignatureSecret == nil:
		return badRequest("signatureSecret is required: every delivery is signed with it")
	}
	owner := ownerFrom(r.Context())
	now := time.Now().UTC()
	hook := store.Webhook{ID: newWebhookID(), Owner: owner, Enabled: true, CreatedAt: now, UpdatedAt: now}
	if err := h.applyWebhookBody(r.Context(), &hook, body); err != nil {
		return err
	}
	have, err := h.opts.Webhooks.ListWebhooks(r.Context(), owner)
	if err != nil {
		return err
	}
	if len(have) >= MaxWebhooksPerKey {
		return badRequest("an API key may register at most %d webhooks; delete one first", MaxWebhooksPerKey)
	}
	if err := h.opts.Webhooks.PutWebhook(r.Context(), hook); err != nil {
		return err
	}
	noteTarget(r.Context(), "webhook", hook.ID)
	writeJSON(w, http.StatusCreated, toWebhookJSON(hook))
	return nil
}

// applyWebhookBody validates the fields body names and sets them on hook.
func (h *Handler) applyWebhookBody(ctx context.Context, hook *store.Webhook, body webhookBody) error {
	if body.Name != nil {
		name := strings.TrimSpace(*body.Name)
		if utf8.RuneCountInString(name) > maxWebhookName {
			return badRequest("name is longer than %d characters", maxWebhookName)
		}
		if strings.ContainsFunc(name, unicode.IsControl) {
			return badRequest("name must not contain control characters")
		}
		hook.Name = name
	}
	if body.URL != nil {
		u, err := webhook.CheckURL(ctx, strings.TrimSpace(*body.URL), h.opts.WebhookAllowPrivate)
		if err != nil {
			return webhookURLError(err)
		}
		hook.URL = u.String()
	}
	if body.Enabled != nil {
		hook.Enabled = *body.Enabled
	}
	if body.Events != nil {
		events, err := webhookEvents(*body.Events)
		if err != nil {
			return err
		}
		hook.Events = events
	}
	if body.SignatureSecret != nil {
		s := *body.SignatureSecret
		switch {
		case s == "":
			return badRequest("signatureSecret must not be empty")
		case len(s) > maxWebhookSecret:
			return badRequest("signatureSecret is longer than %d bytes", maxWebhookSecret)
		}
		hook.Secret = s
	}
	return nil
}

func webhookURLError(err error) error {
	if errors.Is(err, webhook.ErrURL) {
		return &apiError{status: http.StatusBadRequest, message: err.Error(), err: err}
	}
	return err
}

// webhookEvents checks a subscription: a non-empty list of known event
// types, kept in lifecycle order without repeats.
func webhookEvents(in []string) ([]string, error) {
	if len(in) == 0 {
		return nil, badRequest("events must name at least one event type (%s)", strings.Join(lifecycle.Types, ", "))
	}
	for _, e := range in {
		if !slices.Contains(lifecycle.Types, e) {
			return nil, badRequest("events: unknown event type %q (known: %s)", e, strings.Join(lifecycle.Types, ", "))
		}
	}
	var out []string
	for _, t := range lifecycle.Types {
		if slices.Contains(in, t) {
			out = append(out, t)
		}
	}
	return out, nil
}

func (h *Handler) listWebhooks(w http.ResponseWriter, r *http.Request) error {
	if h.opts.Webhooks == nil {
		return errNoWebhooks
	}
	hooks, err := h.opts.Webhooks.ListWebhooks(r.Context(), ownerFrom(r.Context()))
	if err != nil {
		return err
	}
	out := make([]webhookJSON, 0, len(hooks))
	for _, hk := range hooks {
		out = append(out, toWebhookJSON(hk))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// ownWebhook finds the request's {webhookID} among the key's webhooks.
func (h *Handler) ownWebhook(r *http.Request) (store.Webhook, error) {
	if h.opts.Webhooks == nil {
		return store.Webhook{}, errNoWebhooks
	}
	id := r.PathValue("webhookID")
	if !validWebhookID(id) {
		return store.Webhook{}, badRequest("Invalid webhook ID %q: must be a UUID", id)
	}
	hook, err := h.opts.Webhooks.GetWebhook(r.Context(), ownerFrom(r.Context()), id)
	if errors.Is(err, store.ErrNotFound) {
		return store.Webhook{}, &apiError{status: http.StatusNotFound, message: fmt.Sprintf("webhook %q not found", id), err: err}
	}
	return hook, err
}

func (h *Handler) getWebhook(w http.ResponseWriter, r *http.Request) error {
	hook, err := h.ownWebhook(r)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toWebhookJSON(hook))
	return nil
}

func (h *Handler) patchWebhook(w http.ResponseWriter, r *http.Request) error {
	hook, err := h.ownWebhook(r)
	if err != nil {
		return err
	}
	var body webhookBody
	if _, err := h.decodeBody(w, r, &body); err != nil {
		return err
	}
	if err := h.applyWebhookBody(r.Context(), &hook, body); err != nil {
		return err
	}
	hook.UpdatedAt = time.Now().UTC()
	if err := h.opts.Webhooks.PutWebhook(r.Context(), hook); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, toWebhookJSON(hook))
	return nil
}

func (h *Handler) deleteWebhook(w http.ResponseWriter, r *http.Request) error {
	hook, err := h.ownWebhook(r)
	if err != nil {
		return err
	}
	found, err := h.opts.Webhooks.DeleteWebhook(r.Context(), hook.Owner, hook.ID)
	if err != nil {
		return err
	}
	if !found { // deleted by a concurrent request
		return &apiError{status: http.StatusNotFound, message: fmt.Sprintf("webhook %q not found", hook.ID)}
	}
	w.WriteHeader(http.StatusOK)
	return nil
}

func (h *Handler) listDeliveries(w http.ResponseWriter, r *http.Request) error {
	hook, err := h.ownWebhook(r)
	if err != nil {
		return err
	}
	q := r.URL.Query()
	limit, offset := defaultDeliveryLimit, 0
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxDeliveryLimit {
			return badRequest("limit must be an integer from 1 to %d, got %q", maxDeliveryLimit, v)
		}
		limit = n
	}
	if v := q.Get("offset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return badRequest("offset must be a non-negative integer, got %q", v)
		}
		offset = n
	}
	ds, err := h.opts.Webhooks.ListDeliveries(r.Context(), hook.Owner, hook.ID, offset, limit)
	if err != nil {
		return err
	}
	out := make([]deliveryJSON, 0, len(ds))
	for _, d := range ds {
		j := deliveryJSON{
			ID: d.ID, WebhookID: d.WebhookID, EventID: d.EventID, EventType: d.EventType, SandboxID: d.SandboxID,
			Status: d.Status, Attempts: []attemptJSON{}, LastError: d.LastError, LastHTTPStatus: d.LastHTTP,
			CreatedAt: d.CreatedAt.UTC(), UpdatedAt: d.UpdatedAt.UTC(),
		}
		if d.Status == store.DeliveryPending {
			t := d.NextAttemptAt.UTC()
			j.NextAttemptAt = &t
		}
		for _, a := range d.History {
			j.Attempts = append(j.Attempts, attemptJSON{
				At: a.At.UTC(), HTTPStatus: a.HTTP, Error: a.Error, DurationMs: float64(a.Duration.Microseconds()) / 1000,
			})
		}
		out = append(out, j)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

func toWebhookJSON(w store.Webhook) webhookJSON {
	events := w.Events
	if events == nil {
		events = []string{}
	}
	return webhookJSON{
		ID: w.ID, TeamID: w.Owner, Name: w.Name, CreatedAt: w.CreatedAt.UTC(), UpdatedAt: w.UpdatedAt.UTC(),
		Enabled: w.Enabled, URL: w.URL, Events: events,
	}
}

// newWebhookID is a random (version 4) UUID.
func newWebhookID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on Linux
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

func validWebhookID(id string) bool {
	if len(id) != 36 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F') {
				return false
			}
		}
	}
	return true
}
