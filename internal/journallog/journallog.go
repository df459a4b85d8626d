// Package journallog is a slog handler that writes to the systemd journal
// with its native protocol, so that a record's attributes are fields of the
// journal entry (journalctl -u airlock AIRLOCK_SANDBOX=<id>, or -o json),
// not words in a line of text. serve uses it when its stderr is the journal
// (JOURNAL_STREAM), as under `airlock service install`.
package journallog

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"

	"github.com/coreos/go-systemd/v22/journal"
)

// Prefix starts the name of every field made from an attribute.
const Prefix = "AIRLOCK_"

// Handler is a slog.Handler for the journal.
type Handler struct {
	level slog.Leveler
	// attrs are the fields of WithAttrs, already named; group is the
	// prefix WithGroup adds to later attributes' names.
	attrs map[string]string
	group string
	// send writes one entry (journal.Send; tests replace it).
	send func(msg string, p journal.Priority, fields map[string]string) error
	mu   *sync.Mutex // serialises send, shared with derived handlers
}

// New returns a handler for records at level or above.
func New(level slog.Leveler) *Handler {
	return &Handler{level: level, attrs: map[string]string{}, send: journal.Send, mu: &sync.Mutex{}}
}

// Usable reports whether the journal is where stderr goes (JOURNAL_STREAM
// names it) and its socket answers.
func Usable() bool {
	ok, err := journal.StderrIsJournalStream()
	return err == nil && ok && journal.Enabled()
}

func (h *Handler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.level.Level() }

// priority maps a slog level onto syslog's.
func priority(l slog.Level) journal.Priority {
	switch {
	case l >= slog.LevelError:
		return journal.PriErr
	case l >= slog.LevelWarn:
		return journal.PriWarning
	case l >= slog.LevelInfo:
		return journal.PriInfo
	}
	return journal.PriDebug
}

// fieldName makes a journal field name of an attribute's key: upper case
// letters, digits and underscores, after Prefix.
func fieldName(key string) string {
	var b strings.Builder
	b.WriteString(Prefix)
	for _, r := range strings.ToUpper(key) {
		if (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}

// addAttr names a and its group members into fields.
func addAttr(fields map[string]string, group string, a slog.Attr) {
	a.Value = a.Value.Resolve()
	if a.Equal(slog.Attr{}) {
		return
	}
	if a.Value.Kind() == slog.KindGroup {
		g := group
		if a.Key != "" {
			g = group + a.Key + "_"
		}
		for _, m := range a.Value.Group() {
			addAttr(fields, g, m)
		}
		return
	}
	fields[fieldName(group+a.Key)] = a.Value.String()
}

func (h *Handler) Handle(_ context.Context, r slog.Record) error {
	fields := make(map[string]string, len(h.attrs)+r.NumAttrs()+1)
	for k, v := range h.attrs {
		fields[k] = v
	}
	r.Attrs(func(a slog.Attr) bool {
		addAttr(fields, h.group, a)
		return true
	})
	fields["SYSLOG_IDENTIFIER"] = "airlock"
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := h.send(r.Message, priority(r.Level), fields); err != nil {
		return fmt.Errorf("journal: %w", err)
	}
	return nil
}

func (h *Handler) WithAttrs(as []slog.Attr) slog.Handler {
	n := *h
	n.attrs = make(map[string]string, len(h.attrs)+len(as))
	for k, v := range h.attrs {
		n.attrs[k] = v
	}
	for _, a := range as {
		addAttr(n.attrs, h.group, a)
	}
	return &n
}

func (h *Handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	n := *h
	n.group = h.group + name + "_"
	return &n
}
