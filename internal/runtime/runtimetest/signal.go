package runtimetest

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// trapper is a first process that records the signals USR1 and USR2 it is
// sent, in order, in /out/signals.
const trapper = `
trap 'echo usr1 >> /out/signals' USR1
trap 'echo usr2 >> /out/signals' USR2
touch /out/ready
while :; do sleep 0.1 & wait $!; done
`

// testSignalInit checks runtime.InitSignaler, through which the manager
// quiesces and wakes envd around a checkpoint: signals reach the first
// process, in the order sent. (What a signal without a handler does to the
// first process differs: the host kernel drops it for a pid namespace's
// init, gVisor's sentry delivers it with its default action. envd, a Go
// program, handles every signal.)
func testSignalInit(t *testing.T, h Harness) {
	r := h.New(t)
	spec, out := newSpec(t, h)
	spec.Init.Args = []string{"/bin/sh", "-c", trapper}
	spec.Init.Stdin = nil
	sb := create(t, r, spec)
	sig, ok := sb.(runtime.InitSignaler)
	if !ok {
		t.Fatalf("%T does not implement runtime.InitSignaler", sb)
	}
	waitFile(t, filepath.Join(out, "ready"))
	for i, s := range []syscall.Signal{syscall.SIGUSR1, syscall.SIGUSR2} {
		if err := sig.SignalInit(s); err != nil {
			t.Fatalf("SignalInit(%v): %v", s, err)
		}
		want := []string{"usr1", "usr1\nusr2"}[i]
		testenv.Eventually(t, 10*time.Second, "the first process to record "+want, func() bool {
			return readOpt(filepath.Join(out, "signals")) == want
		})
	}

}

// readOpt returns a file's content without its trailing newline, or "" if it
// cannot be read.
func readOpt(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}
