//go:build amd64 || arm64

package sysinfo

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"strconv"
	"sync/atomic"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

const archSupported = true

// seccompData, seccompNotif and seccompNotifResp are struct seccomp_data,
// seccomp_notif and seccomp_notif_resp of the kernel's
// include/uapi/linux/seccomp.h, which golang.org/x/sys/unix (v0.49) does not
// define; its SECCOMP_IOCTL_NOTIF_RECV (0xc0502100) and _SEND (0xc0182101)
// encode their sizes, 80 and 24 bytes.
type seccompData struct {
	Nr                 int32
	Arch               uint32
	InstructionPointer uint64
	Args               [6]uint64
}

type seccompNotif struct {
	ID    uint64
	Pid   uint32
	Flags uint32
	Data  seccompData
}

type seccompNotifResp struct {
	ID    uint64
	Val   int64
	Error int32
	Flags uint32
}

var _ [80 - unsafe.Sizeof(seccompNotif{})]struct{}
var _ [24 - unsafe.Sizeof(seccompNotifResp{})]struct{}

// Offsets of seccomp_data's fields, which the filter loads.
const (
	offNr   = 0
	offArch = 4
)

// program traps native sysinfo and allows everything else: it only adds a
// trap to whatever filters the thread already has (the container's profile
// still decides about every other call, and the most restrictive answer of
// all filters wins). Its answer depends on arch and nr alone, so the kernel's
// per-filter action cache skips running it for every other system call.
var program = []bpf.Instruction{
	bpf.LoadAbsolute{Off: offArch, Size: 4},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: auditArch, SkipTrue: 3},
	bpf.LoadAbsolute{Off: offNr, Size: 4},
	bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.SYS_SYSINFO, SkipTrue: 1},
	bpf.RetConstant{Val: unix.SECCOMP_RET_USER_NOTIF},
	bpf.RetConstant{Val: unix.SECCOMP_RET_ALLOW},
}

// filter is program as the kernel takes it.
var filter = func() []unix.SockFilter {
	raw, err := bpf.Assemble(program)
	if err != nil {
		panic(fmt.Sprintf("sysinfo: filter: %v", err))
	}
	out := make([]unix.SockFilter, len(raw))
	for i, r := range raw {
		out[i] = unix.SockFilter{Code: r.Op, Jt: r.Jt, Jf: r.Jf, K: r.K}
	}
	return out
}()

// attach installs the filter on the calling thread (which must stay locked to
// its goroutine) and serves the new listener from a goroutine until the
// thread and every process forked from it are gone.
func attach(p paths) error {
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	// Without SECCOMP_FILTER_FLAG_TSYNC the filter is the calling thread's
	// alone. The listener comes back close-on-exec.
	fd, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER,
		unix.SECCOMP_FILTER_FLAG_NEW_LISTENER, uintptr(unsafe.Pointer(&prog)))
	runtime.KeepAlive(filter)
	if errno != 0 {
		return fmt.Errorf("sysinfo: install seccomp filter: %w", errno)
	}
	if err := unix.SetNonblock(int(fd), true); err != nil {
		unix.Close(int(fd))
		return fmt.Errorf("sysinfo: listener: %w", err)
	}
	// A non-blocking descriptor given to os.NewFile is registered with the
	// netpoller: waiting for it parks a goroutine, not an OS thread, which
	// matters because envd's threads come out of the sandbox's small
	// reserve of pids.
	f := os.NewFile(fd, "seccomp-sysinfo")
	live.add(f)
	go serve(f, p)
	return nil
}

// serve answers the listener's notifications until it hangs up or
// CloseListeners closes it.
func serve(f *os.File, p paths) {
	defer live.remove(f)
	rc, err := f.SyscallConn()
	if err != nil {
		return
	}
	for {
		hup := false
		err := rc.Read(func(fd uintptr) bool {
			// Go's netpoller is edge-triggered: drain everything pending,
			// then wait for the next edge.
			for {
				pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
				n, err := unix.Poll(pfd, 0)
				switch {
				case errors.Is(err, unix.EINTR):
					continue
				case err != nil:
					hup = true
					return true
				case n == 0:
					return false
				case pfd[0].Revents&unix.POLLIN != 0:
					if err := handle(int(fd), p); err != nil {
						// Cannot happen (a bad buffer); stop rather
						// than spin on a notification never received.
						warnOnce(err)
						hup = true
						return true
					}
				case pfd[0].Revents&(unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0:
					// The filter has no task left: nothing can notify again.
					hup = true
					return true
				default:
					return false
				}
			}
		})
		if err != nil || hup {
			return
		}
	}
}

// work bounds how many notifications are answered at once across all
// listeners: reading the view and /proc/<pid>/mem block in the kernel, and
// each blocked call holds an OS thread, which envd must not multiply under a
// flood of sysinfo calls from many process trees. Notifications beyond it
// wait as parked goroutines.
var work = make(chan struct{}, 2)

// handle receives one notification (poll said one is pending, so RECV does
// not block) and answers it.
func handle(fd int, p paths) error {
	var req seccompNotif // RECV refuses a buffer that is not zeroed
	if err := ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_RECV, unsafe.Pointer(&req)); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil // the caller was killed between the wake-up and the receive
		}
		return fmt.Errorf("sysinfo: receive a notification: %w", err)
	}
	work <- struct{}{}
	resp, send := answer(fd, &req, p)
	<-work
	if send {
		// ENOENT: the caller was killed meanwhile; nobody waits for this.
		_ = ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_SEND, unsafe.Pointer(&resp))
	}
	return nil
}

// answer writes the sandbox's struct sysinfo into the caller and says what the
// call returns. send is false when the notification is no longer valid (the
// caller died, and its pid may already name another process).
func answer(fd int, req *seccompNotif, p paths) (resp seccompNotifResp, send bool) {
	resp.ID = req.ID
	cont := func(why error) (seccompNotifResp, bool) {
		// The real system call runs: the host's numbers, never a hang.
		warnOnce(why)
		resp.Flags = unix.SECCOMP_USER_NOTIF_FLAG_CONTINUE
		return resp, true
	}
	if req.Data.Nr != unix.SYS_SYSINFO || req.Data.Arch != auditArch {
		return cont(fmt.Errorf("sysinfo: unexpected notification for system call %d (arch %#x)", req.Data.Nr, req.Data.Arch))
	}
	si, err := readView(p)
	if err != nil {
		return cont(err)
	}
	mem, err := unix.Open("/proc/"+strconv.FormatUint(uint64(req.Pid), 10)+"/mem", unix.O_WRONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return cont(fmt.Errorf("sysinfo: open the caller's memory: %w", err))
	}
	defer unix.Close(mem)
	// The open pinned the memory of whatever process had that pid; it is the
	// caller's only if the caller is still waiting in this notification now.
	id := req.ID
	if ioctl(fd, unix.SECCOMP_IOCTL_NOTIF_ID_VALID, unsafe.Pointer(&id)) != nil {
		return resp, false
	}
	// The kernel's copy_to_user fails for an unmapped or kernel address;
	// the same address makes this write fail (a negative offset, EIO). One
	// difference: /proc/<pid>/mem writes even read-only private pages, where
	// the kernel would answer EFAULT; only the caller's own memory, at its
	// own request.
	buf := bytesOf(si)
	if addr := req.Data.Args[0]; addr > 1<<63-1 {
		resp.Error = -int32(unix.EFAULT)
	} else if n, err := unix.Pwrite(mem, buf, int64(addr)); err != nil || n != len(buf) {
		resp.Error = -int32(unix.EFAULT)
	}
	return resp, true
}

func ioctl(fd int, req uint, arg unsafe.Pointer) error {
	for {
		_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(req), uintptr(arg))
		switch errno {
		case 0:
			return nil
		case unix.EINTR:
			continue
		default:
			return errno
		}
	}
}

var warned atomic.Bool

// warnOnce logs the first reason a call fell back to the kernel's sysinfo
// (the rest would repeat it, possibly once per call).
func warnOnce(err error) {
	if warned.CompareAndSwap(false, true) {
		slog.Warn("sysinfo: answering with the kernel's numbers", "err", err)
	}
}
