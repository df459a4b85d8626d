package envd

// Quiesce and wake: what envd does around a checkpoint of its sandbox
// (envdapi.QuiesceSignal, envdapi.WakeSignal; the protocol is described
// there). A checkpoint cannot save envd's unix sockets (bound in RunDir, a
// directory of the host's: gVisor refuses "bound host socket", and their
// peers are outside the sandbox) nor its sysinfo seccomp listeners (CRIU
// cannot dump a seccomp notification descriptor). Quiesce lets go of all of
// them; Wake makes new ones.

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"

	"github.com/airlock-sandbox/airlock/internal/sysinfo"
	"github.com/airlock-sandbox/airlock/internal/usercgroup"
)

// socketServers serves the unix-socket listeners of Config.Listen and
// Config.InterpListen. They have HTTP servers of their own, apart from the
// TCP listeners' (which a checkpoint saves with the sandbox's network), so
// that closing them closes exactly these listeners and every connection
// accepted on them.
type socketServers struct {
	mu sync.Mutex
	// srv is nil before Serve and while quiesced.
	srv, isrv *http.Server
	// addrs and interpAddrs are the socket paths, kept for Wake.
	addrs, interpAddrs []string
	errc               chan<- error
	started, stopped   bool
}

func isUnix(addr string) bool {
	network, _, err := parseListen(addr)
	return err == nil && network == "unix"
}

func socketPath(addr string) string {
	_, address, _ := parseListen(addr)
	return address
}

// start serves ls and ils (envd's and the interpreter's unix listeners);
// a failure of Serve other than a close goes to errc, as for the others.
func (ss *socketServers) start(s *Server, ls, ils []net.Listener, errc chan<- error) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.errc = errc
	ss.started = true
	for _, l := range ls {
		ss.addrs = append(ss.addrs, l.Addr().String())
	}
	for _, l := range ils {
		ss.interpAddrs = append(ss.interpAddrs, l.Addr().String())
	}
	ss.serveLocked(s, ls, ils)
}

func (ss *socketServers) serveLocked(s *Server, ls, ils []net.Listener) {
	ss.srv, ss.isrv = s.httpServer(), s.interpServer()
	serve := func(srv *http.Server, l net.Listener) {
		// The socket file is removed by closeLocked, after the connections
		// are closed, not by the listener's Close: the host takes the
		// file's absence as the sign that the quiesce is complete.
		if ul, ok := l.(*net.UnixListener); ok {
			ul.SetUnlinkOnClose(false)
		}
		go func() {
			if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
				select {
				case ss.errc <- err:
				default: // Serve has ended with an earlier error
				}
			}
		}()
	}
	for _, l := range ls {
		serve(ss.srv, l)
	}
	for _, l := range ils {
		serve(ss.isrv, l)
	}
}

// closeLocked closes the servers (their listeners and every connection they
// accepted), then removes the socket files.
func (ss *socketServers) closeLocked() {
	if ss.srv != nil {
		ss.srv.Close()
		ss.isrv.Close()
		ss.srv, ss.isrv = nil, nil
	}
	for _, p := range append(append([]string(nil), ss.addrs...), ss.interpAddrs...) {
		_ = os.Remove(p)
	}
}

// stop is Serve's end: envd's socket server finishes its requests (until ctx
// ends), then the sockets go for good.
func (ss *socketServers) stop(ctx context.Context) {
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.stopped = true
	if ss.srv != nil {
		_ = ss.srv.Shutdown(ctx)
	}
	ss.closeLocked()
}

// Quiesce readies envd for a checkpoint of its sandbox: it stops readying
// spare threads and discards the one readied (usercgroup.Quiesce), closes
// every sysinfo seccomp listener (sysinfo.CloseListeners), closes its unix
// listeners and every connection accepted on them, and removes the socket
// files, last: once they are gone, the rest is done. A request being served
// over a socket is cut, as when the host closes its end. The TCP listeners
// inside the sandbox stay. Quiescing twice is quiescing once.
//
// Process trees started before keep their seccomp filter without a listener:
// their sysinfo(2) fails with ENOSYS from now on (see sysinfo.CloseListeners).
// A Start meanwhile waits for Wake.
func (s *Server) Quiesce() error {
	ss := &s.socks
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !ss.started || ss.stopped {
		return errors.New("envd is not serving")
	}
	usercgroup.Quiesce()
	// Before the sockets go (the host's sign to checkpoint): no write of the
	// sandbox log may hold its file open in the image.
	s.sblog.Suspend()
	n := sysinfo.CloseListeners()
	ss.closeLocked()
	s.log.Info("envd quiesced for a checkpoint", "sysinfoListenersClosed", n)
	return nil
}

// Wake undoes Quiesce, in the sandbox that was checkpointed or in one
// restored from its image: envd listens on its unix sockets again and readies
// spare threads (each with a new sysinfo filter and listener). Waking an envd
// that is not quiesced does nothing. If a socket cannot be bound, envd stays
// without it and says so; the host sees envd unhealthy.
func (s *Server) Wake() error {
	ss := &s.socks
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if !ss.started || ss.stopped {
		return errors.New("envd is not serving")
	}
	// The checkpoint is over, whatever follows.
	s.sblog.Resume()
	if ss.srv != nil {
		return nil
	}
	var ls, ils []net.Listener
	closeAll := func() {
		for _, l := range append(ls, ils...) {
			l.Close()
		}
	}
	for _, p := range ss.addrs {
		l, err := relisten(p)
		if err != nil {
			closeAll()
			return fmt.Errorf("wake: %w", err)
		}
		ls = append(ls, l)
	}
	for _, p := range ss.interpAddrs {
		l, err := relisten(p)
		if err != nil {
			closeAll()
			return fmt.Errorf("wake: %w", err)
		}
		ils = append(ils, l)
	}
	usercgroup.Wake()
	ss.serveLocked(s, ls, ils)
	s.log.Info("envd awake after a checkpoint")
	return nil
}

// relisten binds a unix socket again while envd serves. listen's umask
// change is process-wide, which is safe only before anything else runs, so
// the socket is bound with envd's umask and made private right after; in
// between, only root can reach it anyway (RunDir is root's alone, and a
// socket needs write permission to connect to).
func relisten(path string) (net.Listener, error) {
	if fi, err := os.Lstat(path); err == nil && fi.Mode()&os.ModeSocket != 0 {
		_ = os.Remove(path)
	}
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen unix:%s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("chmod socket: %w", err)
	}
	return l, nil
}
