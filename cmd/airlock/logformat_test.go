package main

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/coreos/go-systemd/v22/journal"

	"github.com/airlock-sandbox/airlock/internal/journallog"
)

func TestLogFormat(t *testing.T) {
	for _, f := range []string{"text", "json", "auto"} {
		if _, err := logHandler(f, slog.LevelInfo); err != nil {
			t.Errorf("--log-format %s: %v", f, err)
		}
	}
	if _, err := logHandler("xml", slog.LevelInfo); err == nil || !strings.Contains(err.Error(), "--log-format") {
		t.Errorf("--log-format xml: %v", err)
	}
	h, err := logHandler("journal", slog.LevelInfo)
	if journal.Enabled() {
		if _, ok := h.(*journallog.Handler); err != nil || !ok {
			t.Errorf("--log-format journal with the journal up: %T, %v", h, err)
		}
	} else if err == nil || !strings.Contains(err.Error(), "journal") {
		t.Errorf("--log-format journal without the journal: %v", err)
	}
	// Under the test runner stderr is not the journal: auto is text.
	if h, _ := logHandler("auto", slog.LevelInfo); !journallog.Usable() {
		if _, ok := h.(*slog.TextHandler); !ok {
			t.Errorf("--log-format auto off the journal: %T", h)
		}
	}
}
