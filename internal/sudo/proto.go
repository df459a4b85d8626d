// Package sudo is sudo without setuid. Sandboxes run with no_new_privs, under
// which the kernel ignores the setuid bit, so the real /usr/bin/sudo cannot
// raise anyone to root. Instead the host binds the envd binary over
// /usr/bin/sudo; invoked under that name it is "the shim" (shim.go, RunShim), a
// small unprivileged client. envd (root, already running) serves a unix socket
// inside the sandbox (server.go, Server); the shim hands it its
// stdin/stdout/stderr with SCM_RIGHTS, its argv, env and cwd, and envd starts
// the command as the target user with those very files as its stdio. Nothing
// gains privilege through exec, so no_new_privs is irrelevant.
//
// Policy: the socket is mode 0666, so any process in the sandbox may run any
// command as any user. That is exactly the base template's sudoers policy
// ("user ALL=(ALL:ALL) NOPASSWD: ALL" for the only non-root account), made
// explicit; /etc/sudoers is not consulted. The socket lives in the sandbox's own
// /run (its overlay upper dir), so it is reachable only from inside that
// sandbox's mount namespace and from the host.
//
// Wire format, over a SOCK_STREAM unix connection: frames of a 4-byte big-endian
// length followed by that many bytes of JSON.
//
//	shim → envd  sudoRequest, with exactly 3 fds (the command's stdin, stdout,
//	             stderr) attached to its first byte
//	envd → shim  sudoReply{Pid} once started, or sudoReply{Error}
//	shim → envd  sudoSignal, any number, to forward a signal the shim received
//	envd → shim  sudoReply{Exit} when the command ended (128+n if killed by n)
//
// When the connection drops while the command runs (the shim died or was
// killed), envd kills the command's whole session.
package sudo

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"time"
)

const (
	// SocketEnv overrides the socket path, for the shim (where to connect)
	// and for envd (where to listen, even without the shim installed); tests use
	// it to run both outside a sandbox.
	SocketEnv = "AIRLOCK_SUDO_SOCKET"

	// sudoMaxRequest bounds the first frame: argv plus environment. Linux caps
	// them together at a few MiB (ARG_MAX is a quarter of the stack limit).
	sudoMaxRequest = 4 << 20
	// sudoMaxMessage bounds every later frame (signals, replies).
	sudoMaxMessage = 4 << 10
	// sudoFDs is the number of files the request must carry.
	sudoFDs = 3
	// sudoMaxHandshakes bounds the requests read at once, and with them the
	// memory clients can make envd hold (envd shares the sandbox's memory limit).
	sudoMaxHandshakes = 16
)

// Timeouts are variables so tests can shorten them.
var (
	// sudoHandshakeTimeout bounds how long a client may take to send its
	// request; an idle or slow client cannot hold a goroutine forever.
	sudoHandshakeTimeout = 10 * time.Second
	// sudoWriteTimeout bounds each reply write, so a shim that stops reading
	// cannot wedge envd.
	sudoWriteTimeout = 10 * time.Second
)

// sudoRequest is what the shim asks for. The caller's identity is not part of
// it: envd takes that from the socket's peer credentials.
type sudoRequest struct {
	Command      []string `json:"command,omitempty"` // command and arguments; empty with Login/Shell = interactive shell
	Env          []string `json:"env,omitempty"`     // the shim's environment, KEY=value
	Assign       []string `json:"assign,omitempty"`  // VAR=value given on the command line
	Cwd          string   `json:"cwd,omitempty"`
	Chdir        string   `json:"chdir,omitempty"` // -D
	User         string   `json:"user,omitempty"`  // -u: name or #uid
	Group        string   `json:"group,omitempty"` // -g: name or #gid
	Login        bool     `json:"login,omitempty"` // -i
	Shell        bool     `json:"shell,omitempty"` // -s
	PreserveEnv  bool     `json:"preserveEnv,omitempty"`
	PreserveList []string `json:"preserveList,omitempty"` // --preserve-env=A,B
	SetHome      bool     `json:"setHome,omitempty"`      // -H
	// Ctty is the index (0-2) of the file that is a terminal the shim allocated
	// for this command, to become its controlling terminal; -1 for none.
	Ctty int `json:"ctty"`
}

type sudoReply struct {
	Pid   int    `json:"pid,omitempty"`
	Exit  *int   `json:"exit,omitempty"`
	Error string `json:"error,omitempty"`
}

type sudoSignal struct {
	Signal int `json:"signal"`
}

func encodeFrame(v any) ([]byte, error) {
	body, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encoding sudo frame: %w", err)
	}
	frame := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(frame, uint32(len(body)))
	copy(frame[4:], body)
	return frame, nil
}

// writeFrame sends one frame, with fds attached to its first byte when given.
func writeFrame(c *net.UnixConn, v any, fds []int) error {
	frame, err := encodeFrame(v)
	if err != nil {
		return err
	}
	if len(fds) > 0 {
		// One sendmsg carries the rights; on a stream socket it may send only
		// part of a large frame, the rest follows as plain data.
		n, _, err := c.WriteMsgUnix(frame, syscall.UnixRights(fds...), nil)
		if err != nil {
			return fmt.Errorf("sending sudo request: %w", err)
		}
		frame = frame[n:]
		if len(frame) == 0 {
			return nil
		}
	}
	if _, err := c.Write(frame); err != nil {
		return fmt.Errorf("sending sudo frame: %w", err)
	}
	return nil
}

var errFrameTooLarge = errors.New("sudo frame too large")

// readFrameBody reads the rest of a frame whose 4-byte header is hdr.
func readFrameBody(r io.Reader, hdr []byte, max int, v any) error {
	n := binary.BigEndian.Uint32(hdr)
	if n > uint32(max) {
		return fmt.Errorf("%w: %d bytes (limit %d)", errFrameTooLarge, n, max)
	}
	// Grow with what arrives rather than trusting the header: a client that
	// announces 4 MiB and sends nothing costs nothing.
	var body bytes.Buffer
	if _, err := io.CopyN(&body, r, int64(n)); err != nil {
		return fmt.Errorf("reading sudo frame: %w", err)
	}
	if err := json.Unmarshal(body.Bytes(), v); err != nil {
		return fmt.Errorf("decoding sudo frame: %w", err)
	}
	return nil
}

func readFrame(r io.Reader, max int, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return fmt.Errorf("reading sudo frame: %w", err)
	}
	return readFrameBody(r, hdr[:], max, v)
}

// readRequest reads the first frame and the fds attached to it. The fds come
// with the recvmsg that returns the frame's first byte, so the header is read
// with room for them. Every fd received is returned (for the caller to close),
// even on error; more than fit in the buffer are closed by the kernel
// (MSG_CTRUNC) and make the request invalid.
func readRequest(c *net.UnixConn, v any) ([]int, error) {
	hdr := make([]byte, 4)
	oob := make([]byte, syscall.CmsgSpace(4*(sudoFDs+1)))
	n, oobn, flags, _, err := c.ReadMsgUnix(hdr, oob)
	if err != nil {
		return nil, fmt.Errorf("reading sudo request: %w", err)
	}
	var fds []int
	if oobn > 0 {
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return nil, fmt.Errorf("parsing sudo request rights: %w", err)
		}
		for _, m := range msgs {
			if got, err := syscall.ParseUnixRights(&m); err == nil {
				fds = append(fds, got...)
			}
		}
	}
	if flags&syscall.MSG_CTRUNC != 0 {
		return fds, errors.New("sudo request carried too many fds")
	}
	if n < len(hdr) {
		if _, err := io.ReadFull(c, hdr[n:]); err != nil {
			return fds, fmt.Errorf("reading sudo request: %w", err)
		}
	}
	if len(fds) != sudoFDs {
		return fds, fmt.Errorf("sudo request carried %d fds, want %d", len(fds), sudoFDs)
	}
	return fds, readFrameBody(c, hdr, sudoMaxRequest, v)
}
