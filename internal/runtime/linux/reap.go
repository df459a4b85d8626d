package linux

import (
	"fmt"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// reapOnExit calls reap once the process pid, our child, has exited, then
// closes done; reap collects the zombie (libcontainer's Process.Wait, or a
// wait4 of the pid). The wait holds no OS thread: a pidfd turns readable
// when its process exits, and Go's poller parks the goroutine on it as on
// a socket. A blocking wait4 or os.Process.Wait (a waitid on the pidfd)
// would pin one thread per sandbox for its whole life: a thousand
// sandboxes, a thousand threads, and Go's limit of 10,000 threads ends the
// server near ten thousand.
//
// reap then runs only once the process is a zombie, so it returns at once.
// Without pidfds (Linux < 5.10) reap waits, blocking, in its own goroutine.
func reapOnExit(pid int, reap func(), done chan<- struct{}) {
	f, rc, err := pollablePidfd(pid)
	if err != nil {
		go func() {
			defer close(done)
			reap()
		}()
		return
	}
	go func() {
		defer close(done)
		defer f.Close()
		// Read's callback says whether the wait is over; false parks the
		// goroutine in the poller until the pidfd is readable (exited).
		_ = rc.Read(func(fd uintptr) bool { return exited(int(fd)) })
		reap()
	}()
}

// pollablePidfd opens a non-blocking pidfd of pid as a file in Go's poller.
func pollablePidfd(pid int) (*os.File, syscall.RawConn, error) {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err != nil {
		return nil, nil, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	f := os.NewFile(uintptr(fd), fmt.Sprintf("pidfd:%d", pid))
	rc, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("pidfd %d: %w", pid, err)
	}
	return f, rc, nil
}

// exited reports whether the process of pidfd has exited (POLLIN, without
// waiting); an error other than EINTR ends the wait too, so that a broken
// pidfd never parks its goroutine for good.
func exited(pidfd int) bool {
	fds := []unix.PollFd{{Fd: int32(pidfd), Events: unix.POLLIN}}
	for {
		n, err := unix.Poll(fds, 0)
		if err == unix.EINTR {
			continue
		}
		return err != nil || n > 0
	}
}
