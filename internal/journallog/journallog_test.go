package journallog

import (
	"errors"
	"log/slog"
	"testing"

	"github.com/coreos/go-systemd/v22/journal"
)

// entry is what one record sent.
type entry struct {
	msg    string
	pri    journal.Priority
	fields map[string]string
}

// capture replaces the journal with a recorder: systemd-journald does not
// run on this machine kind (no systemd as init), so what is checked here is
// what the handler asks go-systemd's journal.Send to write.
func capture(h *Handler) *[]entry {
	var got []entry
	h.send = func(msg string, p journal.Priority, fields map[string]string) error {
		got = append(got, entry{msg, p, fields})
		return nil
	}
	return &got
}

func TestFields(t *testing.T) {
	h := New(slog.LevelDebug)
	got := capture(h)
	log := slog.New(h).With("sandbox", "abc123").WithGroup("req")
	log.Warn("create failed", "template-id", "base", slog.Group("limit", "memory_mb", 512), "err", errors.New("no space"),
		slog.Group("empty"), "owner", valuer("key-1"))
	log.Debug("detail")
	if len(*got) != 2 {
		t.Fatalf("%d entries, want 2", len(*got))
	}
	e := (*got)[0]
	if e.msg != "create failed" || e.pri != journal.PriWarning {
		t.Errorf("entry %q at priority %d", e.msg, e.pri)
	}
	for k, want := range map[string]string{
		"AIRLOCK_SANDBOX":             "abc123",
		"AIRLOCK_REQ_TEMPLATE_ID":     "base",
		"AIRLOCK_REQ_LIMIT_MEMORY_MB": "512",
		"AIRLOCK_REQ_ERR":             "no space",
		"SYSLOG_IDENTIFIER":           "airlock",
	} {
		if e.fields[k] != want {
			t.Errorf("field %s = %q, want %q (fields %v)", k, e.fields[k], want, e.fields)
		}
	}
	if len(e.fields) != 6 {
		t.Errorf("fields %v: want the six above, nothing for the empty group", e.fields)
	}
	if (*got)[1].pri != journal.PriDebug {
		t.Errorf("debug record at priority %d", (*got)[1].pri)
	}
	info := New(slog.LevelInfo)
	got = capture(info)
	slog.New(info).Debug("dropped")
	if len(*got) != 0 {
		t.Error("a debug record passed an info handler")
	}
}

// valuer is a LogValuer: the handler logs what it resolves to.
type valuer string

func (v valuer) LogValue() slog.Value { return slog.StringValue(string(v)) }
