package linux

import (
	"fmt"
	"os"
	"strconv"

	"github.com/opencontainers/runc/libcontainer/exeseal"
	"golang.org/x/sys/unix"
)

// sealedFromEnv names, in a process SealSelf re-executed, the path of the
// binary it was started from: /proc/self/exe is then an anonymous memfd.
const sealedFromEnv = "_AIRLOCK_SEALED_FROM"

// SealSelf re-executes this process from a sealed in-memory copy of its own
// binary, once, at start; a process already running from one returns at once.
//
// Why: libcontainer starts every sandbox's init by executing this binary, and
// so that no sandbox can overwrite the host's binary through /proc/<pid>/exe
// (CVE-2019-5736) it executes a sealed copy. Unless the running binary is such
// a copy already, it makes one per start: through a temporary overlayfs where
// the kernel allows it (here it does not: ELOOP on an overlay root), else by
// copying the whole binary into a memfd. For Airlock's binary that copy was
// about 60 MB and most of a cold create's time. Running from a sealed memfd,
// the server makes the copy once, and every create executes it as it is.
//
// Call it first thing in main, before any goroutine matters (exec replaces
// the process), and only for commands that start sandboxes: the copy costs
// tens of milliseconds and its size in memory. Errors leave the process as it
// was (libcontainer then copies per start, as before).
func SealSelf() error {
	if from := os.Getenv(sealedFromEnv); from != "" {
		// Re-executed already (or the copy did not take: never loop).
		return nil
	}
	if exeseal.IsSelfExeCloned() {
		return nil
	}
	from, err := os.Executable()
	if err != nil {
		return fmt.Errorf("seal self: %w", err)
	}
	self, err := os.Open("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("seal self: %w", err)
	}
	defer self.Close()
	st, err := self.Stat()
	if err != nil {
		return fmt.Errorf("seal self: %w", err)
	}
	sealed, err := exeseal.CloneBinary(self, st.Size(), "/proc/self/exe", os.TempDir())
	if err != nil {
		return fmt.Errorf("seal self: %w", err)
	}
	if !exeseal.IsCloned(sealed) {
		// Not a memfd (a temporary file fallback): libcontainer would not
		// trust it and copy again per start; not worth an exec.
		sealed.Close()
		return nil
	}
	env := append(os.Environ(), sealedFromEnv+"="+from)
	err = unix.Exec("/proc/self/fd/"+strconv.Itoa(int(sealed.Fd())), os.Args, env)
	sealed.Close()
	return fmt.Errorf("seal self: exec the sealed copy: %w", err)
}

// Executable is the path of the binary this process was started from, also
// after SealSelf (where os.Executable names an anonymous memfd).
func Executable() (string, error) {
	if from := os.Getenv(sealedFromEnv); from != "" {
		return from, nil
	}
	return os.Executable()
}
