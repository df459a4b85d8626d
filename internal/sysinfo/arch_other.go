//go:build !amd64 && !arm64

package sysinfo

import "errors"

// The filter, the handler's struct layout and the system call numbers are
// written for the 64-bit architectures envd is built for; elsewhere nothing
// is trapped and processes see the kernel's sysinfo.
const archSupported = false

type paths struct{}

var procPaths paths

func viewDiffers(paths) bool { return false }

func attach(paths) error {
	return errors.New("sysinfo: no seccomp filter for this architecture")
}
