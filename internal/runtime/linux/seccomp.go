package linux

import (
	goruntime "runtime"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	"golang.org/x/sys/unix"
)

// The seccomp profile is an allowlist: a syscall not named here fails with
// EPERM, as with Docker's default profile (and libcontainer answers ENOSYS for
// syscalls newer than libseccomp knows, so libc falls back). It is at least as
// strict as Docker's: everything Docker grants only with a capability we do not
// give (CAP_SYS_ADMIN, CAP_SYS_MODULE, CAP_SYS_TIME, ...) is simply absent, and
// a few things Docker allows are refused (io_uring, 32-bit compat syscalls,
// vsock, modify_ldt, userfaultfd).
//
// Deliberately absent, by group:
//   - kernel and module control: bpf, perf_event_open, kexec_load,
//     kexec_file_load, init_module, finit_module, delete_module, reboot, swapon,
//     swapoff, syslog, acct, iopl, ioperm, quotactl, quotactl_fd, lookup_dcookie,
//     nfsservctl, _sysctl, vm86, uselib, ustat, sysfs, and personality beyond
//     the harmless values.
//   - mounts and namespaces: mount, umount, umount2, pivot_root, chroot (no
//     CAP_SYS_CHROOT either), fsopen, fsconfig, fsmount, fspick, move_mount,
//     open_tree, open_tree_attr, mount_setattr, unshare, setns; clone with any
//     CLONE_NEW* flag; clone3 answers ENOSYS (its flags live in memory, where
//     seccomp cannot look) so glibc falls back to clone, which is filtered.
//   - keys: keyctl, add_key, request_key (the kernel keyring is not namespaced).
//   - handles into the host: open_by_handle_at, name_to_handle_at, fanotify_*.
//   - clocks: settimeofday, stime, clock_settime, clock_adjtime.
//   - io_uring_setup/enter/register (a large, often-exploited attack surface
//     that also bypasses seccomp for the operations it performs), userfaultfd
//     (a classic exploitation aid), kcmp, pidfd_getfd, process_madvise,
//     modify_ldt, sethostname, setdomainname, vhangup.
//
// ptrace, process_vm_readv and process_vm_writev are allowed, as in Docker on
// kernels >= 4.8: debuggers and strace are useful to agents, seccomp can no
// longer be bypassed through ptrace on these kernels, and without
// CAP_SYS_PTRACE a process can only trace processes of its own uid inside the
// sandbox's pid namespace. Only envd holds CAP_SYS_PTRACE (to answer sysinfo,
// internal/sysinfo); the processes it starts do not, so they cannot trace envd.
//
// sysinfo is allowed here; envd adds a filter of its own to every process tree
// it starts, which traps sysinfo into a listener it serves. seccomp is allowed
// for that (unprivileged under no_new_privs) and for programs that sandbox
// themselves; a filter can only restrict further.
var seccompAllowed = []string{
	// file I/O
	"read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
	"preadv2", "pwritev2", "open", "openat", "openat2", "creat", "close", "close_range",
	"lseek", "dup", "dup2", "dup3", "fcntl", "flock", "fsync", "fdatasync", "sync",
	"syncfs", "sync_file_range", "truncate", "ftruncate", "fallocate", "fadvise64",
	"readahead", "sendfile", "splice", "tee", "vmsplice", "copy_file_range", "ioctl",
	"cachestat",
	// metadata and directories
	"stat", "fstat", "lstat", "newfstatat", "statx", "statfs", "fstatfs", "access",
	"faccessat", "faccessat2", "getdents", "getdents64", "mkdir", "mkdirat", "rmdir",
	"rename", "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat",
	"symlink", "symlinkat", "readlink", "readlinkat", "chdir", "fchdir", "getcwd",
	"chmod", "fchmod", "fchmodat", "fchmodat2", "chown", "fchown", "fchownat", "lchown",
	"umask", "utime", "utimes", "utimensat", "futimesat",
	// mknod creates FIFOs and sockets (mkfifo); device nodes are refused by the
	// missing CAP_MKNOD, the user namespace and the devices cgroup.
	"mknod", "mknodat",
	"getxattr", "lgetxattr", "fgetxattr", "setxattr", "lsetxattr", "fsetxattr",
	"listxattr", "llistxattr", "flistxattr", "removexattr", "lremovexattr",
	"fremovexattr", "getxattrat", "setxattrat", "listxattrat", "removexattrat",
	"inotify_init", "inotify_init1", "inotify_add_watch", "inotify_rm_watch",
	// memory
	"brk", "mmap", "munmap", "mremap", "mprotect", "madvise", "mlock", "mlock2",
	"munlock", "mlockall", "munlockall", "mincore", "msync", "membarrier",
	"memfd_create", "pkey_mprotect", "pkey_alloc", "pkey_free", "get_mempolicy",
	"set_mempolicy", "set_mempolicy_home_node", "mbind", "map_shadow_stack", "mseal",
	// processes and threads (clone is added below with its flag filter)
	"fork", "vfork", "execve", "execveat", "exit", "exit_group", "wait4", "waitid",
	"kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_open",
	"pidfd_send_signal", "getpid", "getppid", "gettid", "getpgid", "setpgid",
	"getpgrp", "getsid", "setsid", "set_tid_address", "set_robust_list",
	"get_robust_list", "futex", "futex_waitv", "futex_wake", "futex_wait",
	"futex_requeue", "rseq", "arch_prctl", "prctl", "capget", "capset", "seccomp",
	"landlock_create_ruleset", "landlock_add_rule", "landlock_restrict_self",
	"ptrace", "process_vm_readv", "process_vm_writev", "uretprobe",
	// identity (envd switches to the sandbox's users; setuid programs are
	// inert under no_new_privs)
	"getuid", "geteuid", "getgid", "getegid", "setuid", "setgid", "setreuid",
	"setregid", "setresuid", "setresgid", "getresuid", "getresgid", "setfsuid",
	"setfsgid", "getgroups", "setgroups",
	// scheduling and limits (bounded by the sandbox's cgroups)
	"sched_yield", "sched_getaffinity", "sched_setaffinity", "sched_getparam",
	"sched_setparam", "sched_getscheduler", "sched_setscheduler",
	"sched_get_priority_max", "sched_get_priority_min", "sched_rr_get_interval",
	"sched_getattr", "sched_setattr", "getpriority", "setpriority", "ioprio_get",
	"ioprio_set", "getrlimit", "setrlimit", "prlimit64", "getrusage", "times",
	"uname", "sysinfo", "getrandom", "getcpu", "lsm_get_self_attr", "lsm_list_modules",
	// time (reading only; adjtimex without CAP_SYS_TIME only reads)
	"clock_gettime", "clock_getres", "clock_nanosleep", "gettimeofday", "time",
	"nanosleep", "adjtimex", "timer_create", "timer_delete", "timer_settime",
	"timer_gettime", "timer_getoverrun", "timerfd_create", "timerfd_settime",
	"timerfd_gettime", "alarm", "getitimer", "setitimer",
	// signals
	"rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending",
	"rt_sigsuspend", "rt_sigtimedwait", "sigaltstack", "signalfd", "signalfd4",
	"pause", "restart_syscall",
	// polling
	"poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1",
	"epoll_ctl", "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2",
	// local IPC (namespaced: the sandbox has its own ipc namespace)
	"pipe", "pipe2", "socketpair", "msgget", "msgsnd", "msgrcv", "msgctl", "semget",
	"semop", "semtimedop", "semctl", "shmget", "shmat", "shmdt", "shmctl", "mq_open",
	"mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr",
	"io_setup", "io_destroy", "io_submit", "io_getevents", "io_pgetevents", "io_cancel",
	// network (the sandbox's own network namespace; socket is filtered below)
	"bind", "listen", "accept", "accept4", "connect", "getsockname", "getpeername",
	"sendto", "recvfrom", "sendmsg", "recvmsg", "sendmmsg", "recvmmsg", "shutdown",
	"setsockopt", "getsockopt",
}

// nsCloneFlags are the clone flags that create namespaces. A new user namespace
// would give the sandbox's processes a full capability set over whatever that
// namespace owns, the way most container escapes start.
const nsCloneFlags = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
	unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP | unix.CLONE_NEWTIME

// seccompProfile returns the default profile for this host's architecture.
//
// Only the native ABI is listed: a syscall made through another ABI (the
// 32-bit x86 compat entry, x32) kills the thread instead of running. Compat
// syscalls are a rich source of kernel bugs, and 32-bit binaries are not
// something a sandbox of ours needs; it also closes the socketcall(2) path
// around the socket family filter.
func seccompProfile() *specs.LinuxSeccomp {
	eperm, enosys := uint(unix.EPERM), uint(unix.ENOSYS)
	p := &specs.LinuxSeccomp{
		DefaultAction:   specs.ActErrno,
		DefaultErrnoRet: &eperm,
		Architectures:   nativeArch(),
		Syscalls: []specs.LinuxSyscall{
			{Names: seccompAllowed, Action: specs.ActAllow},
			// clone: flags are the first argument on amd64 and arm64.
			{Names: []string{"clone"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{
				{Index: 0, Value: nsCloneFlags, ValueTwo: 0, Op: specs.OpMaskedEqual},
			}},
			{Names: []string{"clone3"}, Action: specs.ActErrno, ErrnoRet: &enosys},
			// AF_VSOCK reaches the hypervisor of a VM host (this machine kind is
			// a Firecracker guest), not anything in the sandbox's netns.
			{Names: []string{"socket"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{
				{Index: 0, Value: unix.AF_VSOCK, Op: specs.OpNotEqual},
			}},
			// personality: only PER_LINUX, PER_LINUX32, UNAME26, the last two
			// combined, and the query 0xffffffff (Docker's set); the rest
			// (READ_IMPLIES_EXEC, ADDR_NO_RANDOMIZE, ...) weaken the process.
			{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0x0, Op: specs.OpEqualTo}}},
			{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0x0008, Op: specs.OpEqualTo}}},
			{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0x20000, Op: specs.OpEqualTo}}},
			{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0x20008, Op: specs.OpEqualTo}}},
			{Names: []string{"personality"}, Action: specs.ActAllow, Args: []specs.LinuxSeccompArg{{Index: 0, Value: 0xffffffff, Op: specs.OpEqualTo}}},
		},
	}
	return p
}

func nativeArch() []specs.Arch {
	switch goruntime.GOARCH {
	case "amd64":
		return []specs.Arch{specs.ArchX86_64}
	case "arm64":
		return []specs.Arch{specs.ArchAARCH64}
	default:
		// Unknown to us: let libseccomp use the native arch only.
		return nil
	}
}
