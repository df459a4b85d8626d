package sudo

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/unixuser"
	"golang.org/x/sys/unix"
)

// sudoSecurePath is the PATH every sudo command gets, as Debian's sudoers
// secure_path: the caller's PATH never decides what runs as root.
const sudoSecurePath = envdapi.DefaultPath

// SocketPath says where envd should listen for the sudo shim: the path in
// SocketEnv if set, else envdapi.SudoSocket when the shim is installed, that
// is when /usr/bin/sudo is this very binary (the host binds envd over it). On a
// host, where /usr/bin/sudo is the real one, it is "" and nothing listens.
func SocketPath() string {
	if p := os.Getenv(SocketEnv); p != "" {
		return p
	}
	self, err1 := os.Stat("/proc/self/exe")
	sudo, err2 := os.Stat("/usr/bin/sudo")
	if err1 == nil && err2 == nil && os.SameFile(self, sudo) {
		return envdapi.SudoSocket
	}
	return ""
}

// sudoChild is one command started for a shim.
type sudoChild struct {
	pid int
	mu  sync.Mutex
	// exited is set once the command has been reaped; from then on its pid (and
	// process group id) may belong to someone else and must not be signalled.
	exited bool
}

// signal sends sig to the command's process group (children of a shell get it
// too, as envd does for its own processes), unless the command is gone.
func (c *sudoChild) signal(sig syscall.Signal) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.exited {
		return
	}
	if err := syscall.Kill(-c.pid, sig); errors.Is(err, syscall.ESRCH) {
		_ = syscall.Kill(c.pid, sig)
	}
}

// killSession kills everything in the command's session: its process group and
// the job-control groups an interactive shell (sudo -i) made. A session id
// cannot be reused while any process is still in that session, so the scan is
// safe even after the leader was reaped.
func (c *sudoChild) killSession() {
	c.signal(syscall.SIGKILL)
	sid := c.pid
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if s, err := unix.Getsid(pid); err == nil && s == sid {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// Server runs the commands the shim asks for, as the users it names (looked
// up in Users), each in a cgroup of its own (internal/usercgroup).
type Server struct {
	Users unixuser.UserDB
	Log   *slog.Logger
}

type sudoServer struct {
	srv *Server
	// handshakes has a slot per request being read; accept waits for one.
	handshakes chan struct{}
	mu         sync.Mutex
	// running maps the commands still running, for shutdown.
	running map[*sudoChild]struct{}
}

// Listen binds the sudo socket. Call it before Serve: the socket must
// exist by the time envd answers /health (a client may run sudo at once), and
// Serve changes the process umask while it binds its own socket.
func Listen(path string) (*net.UnixListener, error) {
	if err := mkdirAllSearchable(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("sudo socket dir: %w", err)
	}
	// Also when an earlier envd left it behind with another mode.
	if err := os.Chmod(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("sudo socket dir: %w", err)
	}
	// A socket left by an earlier envd (the upper dir outlives it) would make bind fail.
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("sudo socket: %w", err)
	}
	// 0666: every sandbox user may ask; see the policy in the package comment.
	if err := os.Chmod(path, 0o666); err != nil {
		l.Close()
		return nil, fmt.Errorf("sudo socket: %w", err)
	}
	return l, nil
}

// mkdirAllSearchable creates dir and its missing parents as 0755 whatever the
// umask: every user must reach the socket.
func mkdirAllSearchable(dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("%s is not a directory", dir)
		}
		return nil
	}
	if parent := filepath.Dir(dir); parent != dir {
		if err := mkdirAllSearchable(parent); err != nil {
			return err
		}
	}
	if err := os.Mkdir(dir, 0o755); err != nil && !os.IsExist(err) {
		return err
	}
	return os.Chmod(dir, 0o755)
}

// Serve serves the shim on l (from Listen) until ctx ends, then
// closes it and kills the commands it started (a stopping envd means a
// stopping sandbox).
func (s *Server) Serve(ctx context.Context, l *net.UnixListener) error {
	defer l.Close()
	ss := &sudoServer{srv: s, running: map[*sudoChild]struct{}{}, handshakes: make(chan struct{}, sudoMaxHandshakes)}
	stop := context.AfterFunc(ctx, func() { l.Close() })
	defer stop()
	s.Log.Info("sudo shim socket ready", "path", l.Addr().String())
	for {
		select {
		case ss.handshakes <- struct{}{}:
		case <-ctx.Done():
			ss.killAll()
			return nil
		}
		c, err := l.AcceptUnix()
		if err != nil {
			if ctx.Err() != nil {
				ss.killAll()
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() || errors.Is(err, syscall.EMFILE) || errors.Is(err, syscall.ENFILE) {
				// Out of fds: back off rather than spin or give up for good.
				<-ss.handshakes
				time.Sleep(50 * time.Millisecond)
				continue
			}
			ss.killAll()
			return fmt.Errorf("sudo socket accept: %w", err)
		}
		go ss.handle(c)
	}
}

func (ss *sudoServer) killAll() {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	for c := range ss.running {
		c.killSession()
	}
}

// handle serves one shim connection. A bad client ends its own connection and
// nothing else: panics are contained and every wait is bounded.
func (ss *sudoServer) handle(c *net.UnixConn) {
	log := ss.srv.Log
	handshake := true
	endHandshake := func() {
		if handshake {
			handshake = false
			<-ss.handshakes
		}
	}
	defer endHandshake()
	defer c.Close()
	defer func() {
		if v := recover(); v != nil {
			log.Error("sudo handler panicked", "panic", v, "stack", string(debug.Stack()))
		}
	}()
	cred, err := peerCred(c)
	if err != nil {
		log.Warn("sudo: peer credentials", "err", err)
		return
	}
	_ = c.SetReadDeadline(time.Now().Add(sudoHandshakeTimeout))
	var req sudoRequest
	fds, err := readRequest(c, &req)
	defer func() {
		for _, fd := range fds {
			_ = syscall.Close(fd)
		}
	}()
	if err != nil {
		log.Debug("sudo: bad request", "err", err, "uid", cred.Uid, "pid", cred.Pid)
		ss.reply(c, sudoReply{Error: "invalid request: " + err.Error()})
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	endHandshake()

	pl, err := ss.srv.sudoPlan(&req, cred)
	if err != nil {
		ss.reply(c, sudoReply{Error: err.Error()})
		return
	}
	child, err := pl.start(fds, req.Ctty)
	// The command holds its own copies now.
	for _, fd := range fds {
		_ = syscall.Close(fd)
	}
	fds = nil
	if err != nil {
		ss.reply(c, sudoReply{Error: err.Error()})
		return
	}
	// Arguments stay out of the log: they may hold secrets.
	log.Debug("sudo", "caller_uid", cred.Uid, "user", pl.user.Name, "path", pl.path, "pid", child.pid)
	ss.mu.Lock()
	ss.running[child] = struct{}{}
	ss.mu.Unlock()
	defer func() {
		ss.mu.Lock()
		delete(ss.running, child)
		ss.mu.Unlock()
	}()

	proc, err := os.FindProcess(child.pid)
	if err != nil {
		// Cannot happen on Linux (FindProcess always succeeds); kill to be safe.
		child.killSession()
		ss.reply(c, sudoReply{Error: fmt.Sprintf("tracking command: %v", err)})
		return
	}
	if !ss.reply(c, sudoReply{Pid: child.pid}) {
		child.killSession()
	}

	// Forward signals until the shim goes away. A shim that disappears while
	// the command runs was killed (or crashed): its command dies with it.
	go func() {
		defer func() {
			if v := recover(); v != nil {
				log.Error("sudo signal reader panicked", "panic", v)
			}
		}()
		for {
			var m sudoSignal
			if err := readFrame(c, sudoMaxMessage, &m); err != nil {
				child.mu.Lock()
				exited := child.exited
				child.mu.Unlock()
				if !exited {
					log.Info("sudo: shim went away; killing its command", "pid", child.pid)
					child.killSession()
				}
				return
			}
			if m.Signal > 0 && m.Signal < 65 {
				child.signal(syscall.Signal(m.Signal))
			}
		}
	}()

	st, err := proc.Wait()
	child.mu.Lock()
	child.exited = true
	child.mu.Unlock()
	code := 1
	if err == nil {
		if ws, ok := st.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		} else {
			code = st.ExitCode()
		}
	} else {
		log.Warn("sudo: waiting for command", "pid", child.pid, "err", err)
	}
	ss.reply(c, sudoReply{Exit: &code})
}

// reply writes one frame with a bounded wait; false if the shim is gone.
func (ss *sudoServer) reply(c *net.UnixConn, r sudoReply) bool {
	_ = c.SetWriteDeadline(time.Now().Add(sudoWriteTimeout))
	return writeFrame(c, r, nil) == nil
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, fmt.Errorf("peer credentials: %w", err)
	}
	if credErr != nil {
		return nil, fmt.Errorf("peer credentials: %w", credErr)
	}
	return cred, nil
}
