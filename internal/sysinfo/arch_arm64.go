package sysinfo

import "golang.org/x/sys/unix"

// auditArch is the seccomp_data.arch of native system calls; 32-bit (AArch32)
// calls report another and pass this filter to the container's own profile,
// which allows the native ABI only.
const auditArch = unix.AUDIT_ARCH_AARCH64
