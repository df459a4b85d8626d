package sysinfo

import "golang.org/x/sys/unix"

// auditArch is the seccomp_data.arch of native system calls. The filter traps
// only those: the 32-bit compat entry (int 0x80) reports AUDIT_ARCH_I386 and
// passes this filter untouched, to be refused by the container's own profile,
// which allows the native ABI only (internal/runtime/linux/seccomp.go); x32
// system calls report AUDIT_ARCH_X86_64 with bit 30 set in nr, so they do not
// match SYS_SYSINFO either (and this kernel has no x32 ABI).
const auditArch = unix.AUDIT_ARCH_X86_64
