package linux

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/airlock-sandbox/airlock/internal/runtime"
)

// TestClassifyDump reads CRIU dump logs as a failed dump leaves them (the
// lines are CRIU 4.2's) and checks the error the manager acts on: what ends
// by itself is ErrBusy (thaw, try again), what CRIU cannot save is
// ErrNotSupported, and anything else stays a plain failure.
func TestClassifyDump(t *testing.T) {
	cases := []struct {
		name string
		log  string
		want error
	}{
		{"a task in uninterruptible sleep past CRIU's timeout", `(00.029885) Error (criu/util.c:1534): rlimit: Can't setup RLIMIT_NOFILE for self: Operation not permitted
(10.030826) Error (criu/cr-dump.c:1655): Timeout reached. Try to interrupt: 0
(10.030987) Error (compel/src/lib/infect.c:262): Unseizable non-zombie 4150090 found, state D, err -1/4
(10.038966) Error (criu/cr-dump.c:1975): Dumping FAILED.
`, runtime.ErrBusy},
		{"a netlink reply unread", `(00.100000) Error (criu/sk-netlink.c:74): netlink: The socket has data to read
(00.100100) Error (criu/cr-dump.c:1975): Dumping FAILED.
`, runtime.ErrBusy},
		{"a seccomp listener", `(00.050000) Error (criu/seccomp.c:100): seccomp notify fd is not supported
(00.050100) Error (criu/cr-dump.c:1975): Dumping FAILED.
`, runtime.ErrNotSupported},
		// A stopped task cannot be seized either, but it does not end by
		// itself: trying again would only wait out the timeout again.
		{"an unseizable task that is not in D", `(10.030987) Error (compel/src/lib/infect.c:262): Unseizable non-zombie 77 found, state T, err -1/4
(10.038966) Error (criu/cr-dump.c:1975): Dumping FAILED.
`, nil},
		{"an unknown failure", `(00.010000) Error (criu/files-reg.c:1000): Can't dump file 3
`, nil},
	}
	dumpErr := errors.New("criu failed: type DUMP errno 0")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "dump.log")
			if err := os.WriteFile(log, []byte(c.log), 0o644); err != nil {
				t.Fatal(err)
			}
			got := classifyDump(dumpErr, criuErrors(log))
			if !errors.Is(got, dumpErr) {
				t.Errorf("the dump's own error is lost: %v", got)
			}
			for _, sentinel := range []error{runtime.ErrBusy, runtime.ErrNotSupported} {
				if is := errors.Is(got, sentinel); is != (sentinel == c.want) {
					t.Errorf("errors.Is(%v, %v) = %v", got, sentinel, is)
				}
			}
		})
	}
}
