package proxy

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

func envelope(flags byte, payload string) []byte {
	b := binary.BigEndian.AppendUint32([]byte{flags}, uint32(len(payload)))
	return append(b, payload...)
}

// TestConnectTail: a Connect stream whose upstream fails between messages ends
// with an end-of-stream error message; one cut inside a message, or after the
// upstream's own end-of-stream message, keeps its error; a clean end is left
// alone.
func TestConnectTail(t *testing.T) {
	cut := errors.New("unexpected EOF")
	msgs := append(envelope(0, `{"event":1}`), envelope(0, `{"event":2}`)...)
	read := func(up io.Reader) ([]byte, error) {
		// One byte at a time: the framing must be followed across reads.
		return io.ReadAll(&connectTail{body: io.NopCloser(iotest.OneByteReader(up)), id: "sbx"})
	}
	got, err := read(io.MultiReader(bytes.NewReader(msgs), iotest.ErrReader(cut)))
	if err != nil || !bytes.HasPrefix(got, msgs) {
		t.Fatalf("cut between messages: %q, %v", got, err)
	}
	tail := got[len(msgs):]
	if tail[0] != connectEndStream || int(binary.BigEndian.Uint32(tail[1:5])) != len(tail)-5 ||
		!strings.Contains(string(tail[5:]), `"code":"unavailable"`) || !strings.Contains(string(tail[5:]), "sandbox sbx stopped answering") {
		t.Fatalf("end-of-stream message: %q", tail)
	}

	if _, err := read(io.MultiReader(bytes.NewReader(msgs[:len(msgs)-3]), iotest.ErrReader(cut))); err != cut {
		t.Fatalf("cut inside a message: %v, want the upstream's error", err)
	}
	ended := append(append([]byte{}, msgs...), envelope(connectEndStream, `{}`)...)
	if _, err := read(io.MultiReader(bytes.NewReader(ended), iotest.ErrReader(cut))); err != cut {
		t.Fatalf("cut after the end-of-stream message: %v, want the upstream's error", err)
	}
	if got, err := read(bytes.NewReader(ended)); err != nil || !bytes.Equal(got, ended) {
		t.Fatalf("clean end: %q, %v", got, err)
	}
}
