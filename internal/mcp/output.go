package mcp

import (
	"fmt"
	"unicode/utf8"
)

// Bounds on what one tool result brings into the model's context. A tool
// result is read whole by the model (and shown to the user); past some tens of
// KiB it only crowds out the conversation, and clients refuse or cut much
// larger ones on their own, without saying where. So every text field a tool
// returns (a command's stdout and stderr, run_code's output and each result's
// text, read_file's content) is bounded here, the same way everywhere, with a
// note in the text itself saying what was cut and how to get the rest.
var (
	// outputHead and outputTail are what is kept of a stream that is too
	// long: its beginning (what started, headers, the command's banner) and,
	// larger, its end (where errors and final results are).
	outputHead = 16 << 10
	outputTail = 48 << 10
	// maxFileText bounds read_file's content (the file's beginning is kept:
	// a file is read from the top).
	maxFileText = 64 << 10
)

// clipSlack lets text already clipped once (its note makes it a little
// longer than head+tail) pass a second clip unchanged.
const clipSlack = 512

// clipOutput bounds a stream's text to its first outputHead and last
// outputTail bytes with a note between them saying how much was cut. Cuts
// fall on UTF-8 boundaries.
func clipOutput(s string) (string, bool) {
	if len(s) <= outputHead+outputTail+clipSlack {
		return s, false
	}
	head := s[:runeStart(s, outputHead)]
	tail := s[runeStart(s, len(s)-outputTail):]
	return head + cutNote(len(s), len(head), len(tail)) + tail, true
}

// runeStart moves i back to the start of the rune it falls in.
func runeStart(s string, i int) int {
	for i > 0 && i < len(s) && !utf8.RuneStart(s[i]) {
		i--
	}
	return i
}

// trimPartialRune drops an incomplete UTF-8 sequence at the end of b, which a
// cut at a byte count leaves, so that cut text stays valid text.
func trimPartialRune(b []byte) []byte {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return b[:i]
			}
			return b
		}
	}
	return b
}

// skipPartialRune drops the continuation bytes a cut leaves at the start of s.
func skipPartialRune(s string) string {
	i := 0
	for i < len(s) && i < utf8.UTFMax && !utf8.RuneStart(s[i]) {
		i++
	}
	return s[i:]
}

// cutNote says, between the kept head and tail, what was left out.
func cutNote(total, head, tail int) string {
	return fmt.Sprintf("\n[... %s cut from the middle of %s of output: showing the first %s and the last %s; "+
		"redirect the output to a file and read parts of it (head, tail, grep) to see the rest ...]\n",
		size(total-head-tail), size(total), size(head), size(tail))
}

// size says a byte count as a person reads it.
func size(n int) string {
	switch {
	case n >= 10<<20:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 10<<10:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d bytes", n)
}

// clipBuffer keeps the first outputHead and the last outputTail bytes written
// to it, and counts the rest, so that a command printing gigabytes costs the
// server a bounded amount of memory and still shows how it ended.
type clipBuffer struct {
	head  []byte
	tail  []byte // a ring of outputTail bytes once full
	next  int    // where the ring's oldest byte is
	total int
}

func (c *clipBuffer) Write(p []byte) {
	c.total += len(p)
	if room := outputHead - len(c.head); room > 0 {
		n := min(room, len(p))
		c.head = append(c.head, p[:n]...)
		p = p[n:]
	}
	if len(p) >= outputTail {
		c.tail = append(c.tail[:0], p[len(p)-outputTail:]...)
		c.next = 0
		return
	}
	for len(p) > 0 {
		if len(c.tail) < outputTail {
			n := min(outputTail-len(c.tail), len(p))
			c.tail = append(c.tail, p[:n]...)
			p = p[n:]
			continue
		}
		n := copy(c.tail[c.next:], p)
		c.next = (c.next + n) % outputTail
		p = p[n:]
	}
}

// String returns what was written, with a note where the middle was cut.
func (c *clipBuffer) String() string {
	tail := append(append([]byte(nil), c.tail[c.next:]...), c.tail[:c.next]...)
	if c.total == len(c.head)+len(tail) {
		return string(c.head) + string(tail)
	}
	// A cut inside a rune at either edge leaves partial bytes: drop them.
	head := string(trimPartialRune(c.head))
	t := skipPartialRune(string(tail))
	return head + cutNote(c.total, len(head), len(t)) + t
}

// truncated reports whether String leaves anything out.
func (c *clipBuffer) truncated() bool { return c.total > len(c.head)+len(c.tail) }
