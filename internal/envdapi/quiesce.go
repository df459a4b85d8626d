package envdapi

import (
	"syscall"
	"time"
)

// Quiesce and wake: the protocol between the host and envd around every
// checkpoint of a sandbox (a pause with memory, and the capture a fork or a
// snapshot takes with the sandbox left running).
//
// A checkpoint cannot save two things envd holds: its unix sockets in RunDir
// (a directory of the host's: gVisor refuses a socket bound there, and the
// connections on them have their peer outside the sandbox), and the seccomp
// notification listeners through which it answers sysinfo(2) on the linux
// runtime (CRIU cannot dump such a descriptor). So, before the checkpoint:
//
//  1. The host closes its own connections to the sockets and sends envd's
//     first process (the sandbox's pid 1, which passes it on to the server)
//     QuiesceSignal.
//  2. envd stops readying the spare thread user processes are forked from and
//     discards the one readied (its seccomp filter's listener cannot be
//     obtained again), closes every sysinfo listener, closes its unix
//     listeners and every connection accepted on them, and removes the socket
//     files, last. Its TCP listeners inside the sandbox stay.
//  3. The host waits, with a bound (QuiesceTimeout), until no socket file is
//     left in RunDir. The runtime's checkpoint checks on its own that nothing
//     it cannot save is left (a seccomp listener: linux; a host-bound socket:
//     gVisor) and reports ErrNotSupported if something is.
//
// After the checkpoint — in the sandbox itself when it runs on (a capture, or
// a checkpoint that failed or timed out), and in the sandbox restored from the
// image — the host sends WakeSignal to the first process: envd binds its
// sockets again and readies spare threads with new listeners; the host waits
// for /health over the socket. A signal is the transport because the host
// cannot reach a closed socket. Both are idempotent: a second quiesce, or a
// wake of an envd that is awake, does nothing.
//
// What it costs: a process tree that was running before the quiesce keeps its
// seccomp filter, now without a listener, and the kernel answers its
// sysinfo(2) with ENOSYS, in the sandbox that ran on and in a restored one
// alike (CRIU restores the filters). Trees started after the wake see the
// sandbox's numbers again. Only the linux runtime traps sysinfo (gVisor's
// sentry answers it itself), so on gVisor nothing changes for the processes.
const (
	QuiesceSignal = syscall.SIGUSR1
	WakeSignal    = syscall.SIGUSR2
)

// QuiesceTimeout bounds the host's wait for envd to quiesce; past it, the
// host wakes envd and goes on as when the runtime cannot checkpoint the
// sandbox: a pause freezes it in place, a capture keeps its files only.
const QuiesceTimeout = 5 * time.Second
