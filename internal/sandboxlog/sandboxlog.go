// Package sandboxlog is the log of what happened inside a sandbox (processes
// started and ended, a template's start command output, envd's own errors)
// as envd writes it and the host reads it back for the logs endpoints.
//
// envd appends one JSON object per line to FileName in its run directory
// (bound from the host's <sandbox dir>/run), so the host reads it without
// envd being up, and it lives as long as the sandbox's directory: across a
// pause, a resume and a server restart. The file is inside the sandbox's
// disk quota and written by a process the sandbox's root can tamper with, so
// the host treats every line as the sandbox's word: Read bounds what it
// reads, drops what does not parse, clamps sizes and marks each entry's
// origin, which a line cannot choose.
//
// It imports nothing of Airlock's: envd and the host both link it.
package sandboxlog

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"
)

// FileName is the log in envd's run directory; RotatedName the previous
// one, kept once the current one reaches MaxFileBytes.
const (
	FileName    = "sandbox-log.jsonl"
	RotatedName = FileName + ".1"
)

// Bounds. A sandbox keeps at most two files of MaxFileBytes, and the host
// never reads more than that of them whatever the sandbox did to the files.
const (
	MaxFileBytes    = 512 << 10
	MaxMessageBytes = 4 << 10
	MaxFields       = 16
	MaxFieldBytes   = 1 << 10
	// maxLineBytes is the longest line Read accepts.
	maxLineBytes = 16 << 10
	// maxPending bounds what a suspended writer holds in memory.
	maxPending = 64 << 10
)

// Levels, lowest first.
const (
	Debug = "debug"
	Info  = "info"
	Warn  = "warn"
	Error = "error"
)

// Rank orders levels; ok is false for anything but the four.
func Rank(level string) (rank int, ok bool) {
	switch level {
	case Debug:
		return 0, true
	case Info:
		return 1, true
	case Warn:
		return 2, true
	case Error:
		return 3, true
	}
	return 0, false
}

// Origins: who wrote an entry. The host sets it; a line cannot.
const (
	OriginSandbox = "sandbox"
	OriginHost    = "host"
)

// Entry is one line of a sandbox's log.
type Entry struct {
	Time    time.Time         `json:"time"`
	Level   string            `json:"level"`
	Logger  string            `json:"logger"`
	Message string            `json:"message"`
	Fields  map[string]string `json:"fields,omitempty"`
	// Origin is not in the file: Read sets it.
	Origin string `json:"-"`
}

// Clamp bounds e's sizes and makes its level one of the four (info when it
// is not), so whatever reaches the store or the wire is bounded.
func Clamp(e Entry) Entry {
	if _, ok := Rank(e.Level); !ok {
		e.Level = Info
	}
	e.Logger = truncate(e.Logger, 64)
	e.Message = truncate(e.Message, MaxMessageBytes)
	if len(e.Fields) > 0 {
		keys := make([]string, 0, len(e.Fields))
		for k := range e.Fields {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make(map[string]string, min(len(keys), MaxFields))
		for _, k := range keys[:min(len(keys), MaxFields)] {
			out[truncate(k, 64)] = truncate(e.Fields[k], MaxFieldBytes)
		}
		e.Fields = out
	}
	return e
}

// truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n - len("…")
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

// Writer appends entries to a log file, rotating it at MaxFileBytes. Each
// write opens, appends and closes, so no descriptor of the file is held
// between entries. Suspend holds entries in memory (a checkpoint must not
// find the file open); Resume writes them.
type Writer struct {
	path string
	max  int64

	mu        sync.Mutex
	suspended bool
	pending   []byte
	dropped   int
}

// NewWriter returns a writer of the log at path.
func NewWriter(path string) *Writer { return &Writer{path: path, max: MaxFileBytes} }

// Write appends e (clamped; the time set when zero). Errors are dropped: a
// log that cannot be written must not stop what it describes.
func (w *Writer) Write(e Entry) {
	if w == nil {
		return
	}
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	line, err := json.Marshal(Clamp(e))
	if err != nil {
		return
	}
	line = append(line, '\n')
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.suspended {
		if len(w.pending)+len(line) > maxPending {
			w.dropped++
			return
		}
		w.pending = append(w.pending, line...)
		return
	}
	_ = w.appendLocked(line)
}

func (w *Writer) appendLocked(b []byte) error {
	f, err := os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	st, err := f.Stat()
	if err == nil && st.Size() > 0 && st.Size()+int64(len(b)) > w.max {
		f.Close()
		if err := os.Rename(w.path, w.path+".1"); err != nil {
			return err
		}
		if f, err = os.OpenFile(w.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600); err != nil {
			return err
		}
	}
	_, err = f.Write(b)
	return errors.Join(err, f.Close())
}

// Suspend makes writes wait in memory (up to 64 KiB) until Resume.
func (w *Writer) Suspend() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.suspended = true
	w.mu.Unlock()
}

// Resume writes what waited since Suspend.
func (w *Writer) Resume() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.suspended = false
	if len(w.pending) > 0 {
		_ = w.appendLocked(w.pending)
		w.pending = nil
	}
	if w.dropped > 0 {
		line, _ := json.Marshal(Entry{Time: time.Now(), Level: Warn, Logger: "envd", Message: fmt.Sprintf("%d log entries written during a checkpoint were dropped", w.dropped)})
		_ = w.appendLocked(append(line, '\n'))
		w.dropped = 0
	}
}

// Read returns the entries of the log files in dir (the rotated one first),
// oldest first as written, each clamped and marked OriginSandbox. It reads
// at most MaxFileBytes of each (the end of a longer one), refuses anything
// but a regular file (a symlink the sandbox put there would otherwise make
// the host read a file of its own) and skips lines that do not parse. A
// missing file is no error; a refused one does not keep the other from
// being read.
func Read(dir string) ([]Entry, error) {
	var (
		out  []Entry
		errs []error
	)
	for _, name := range []string{RotatedName, FileName} {
		b, err := readTail(dir+"/"+name, MaxFileBytes)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, fmt.Errorf("sandbox log %s: %w", name, err))
			}
			continue
		}
		out = append(out, parse(b)...)
	}
	return out, errors.Join(errs...)
}

func readTail(path string, max int64) ([]byte, error) {
	// O_NONBLOCK: a FIFO in the file's place must not hang the host.
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, syscall.ELOOP) {
			return nil, fmt.Errorf("%s is a symlink, not the log envd writes", path)
		}
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	skipFirst := false
	if st.Size() > max {
		if _, err := f.Seek(st.Size()-max, io.SeekStart); err != nil {
			return nil, err
		}
		skipFirst = true
	}
	b, err := io.ReadAll(io.LimitReader(f, max))
	if err != nil {
		return nil, err
	}
	if skipFirst {
		// The first line was cut by the seek.
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			b = b[i+1:]
		} else {
			b = nil
		}
	}
	return b, nil
}

func parse(b []byte) []Entry {
	var out []Entry
	for len(b) > 0 {
		line := b
		if i := bytes.IndexByte(b, '\n'); i >= 0 {
			line, b = b[:i], b[i+1:]
		} else {
			b = nil
		}
		if len(line) == 0 || len(line) > maxLineBytes {
			continue
		}
		var e Entry
		if err := json.Unmarshal(line, &e); err != nil || e.Time.IsZero() {
			continue
		}
		e = Clamp(e)
		// The wire puts origin and logger beside the fields; a field of
		// either name would only confuse a reader.
		delete(e.Fields, "origin")
		delete(e.Fields, "logger")
		e.Origin = OriginSandbox
		switch {
		case e.Logger == "":
			e.Logger = "envd"
		case e.Logger != "envd" && !strings.HasPrefix(e.Logger, "envd."):
			e.Logger = "envd." + e.Logger
		}
		out = append(out, e)
	}
	return out
}

// LevelHeader, on a process Start request to envd, sets the level of that
// process's entries (the host runs a template's ready command again and
// again, and logs its attempts at debug).
const LevelHeader = "Airlock-Log-Level"
