package interp

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Jupyter messaging protocol 5.3 over ZeroMQ: each message is the frames
// [identities…, "<IDS|MSG>", signature, header, parent_header, metadata, content, buffers…]
// with signature = hex(HMAC-SHA256(key, header‖parent_header‖metadata‖content)).

const jupyterDelim = "<IDS|MSG>"

type jupyterHeader struct {
	MsgID    string `json:"msg_id"`
	Session  string `json:"session"`
	Username string `json:"username"`
	Date     string `json:"date"`
	MsgType  string `json:"msg_type"`
	Version  string `json:"version"`
}

type jupyterMsg struct {
	Header   jupyterHeader
	Parent   jupyterHeader
	Metadata map[string]any
	Content  json.RawMessage
}

type jupyterSigner struct{ key []byte }

func (s jupyterSigner) sign(parts ...[]byte) []byte {
	m := hmac.New(sha256.New, s.key)
	for _, p := range parts {
		m.Write(p)
	}
	out := make([]byte, hex.EncodedLen(m.Size()))
	hex.Encode(out, m.Sum(nil))
	return out
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err)) // never fails on Linux ≥ 3.17
	}
	return hex.EncodeToString(b)
}

// encode builds a signed request; it returns the message and its msg_id.
func (s jupyterSigner) encode(session, msgType string, content any) (zmq4.Msg, string, error) {
	h := jupyterHeader{
		MsgID: randomHex(16), Session: session, Username: "airlock",
		Date: time.Now().UTC().Format(time.RFC3339Nano), MsgType: msgType, Version: "5.3",
	}
	header, err := json.Marshal(h)
	if err != nil {
		return zmq4.Msg{}, "", fmt.Errorf("encode header: %w", err)
	}
	body, err := json.Marshal(content)
	if err != nil {
		return zmq4.Msg{}, "", fmt.Errorf("encode %s content: %w", msgType, err)
	}
	parent, meta := []byte("{}"), []byte("{}")
	sig := s.sign(header, parent, meta, body)
	return zmq4.NewMsgFrom([]byte(jupyterDelim), sig, header, parent, meta, body), h.MsgID, nil
}

var errBadSignature = errors.New("jupyter message signature mismatch")

// decode verifies and parses a received message (identity frames before the delimiter are
// skipped: iopub prefixes a topic).
func (s jupyterSigner) decode(m zmq4.Msg) (*jupyterMsg, error) {
	frames := m.Frames
	i := 0
	for i < len(frames) && string(frames[i]) != jupyterDelim {
		i++
	}
	if len(frames)-i < 6 {
		return nil, fmt.Errorf("jupyter message with %d frames after the delimiter", len(frames)-i)
	}
	sig, header, parent, meta, content := frames[i+1], frames[i+2], frames[i+3], frames[i+4], frames[i+5]
	if !hmac.Equal(sig, s.sign(header, parent, meta, content)) {
		return nil, errBadSignature
	}
	var out jupyterMsg
	if err := json.Unmarshal(header, &out.Header); err != nil {
		return nil, fmt.Errorf("decode header: %w", err)
	}
	if err := json.Unmarshal(parent, &out.Parent); err != nil {
		return nil, fmt.Errorf("decode parent header: %w", err)
	}
	_ = json.Unmarshal(meta, &out.Metadata) // metadata is advisory
	out.Content = content
	return &out, nil
}
