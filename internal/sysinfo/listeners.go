package sysinfo

import (
	"os"
	"sync"
)

// listenerSet holds every listener descriptor a serve goroutine answers, so
// that CloseListeners can close them all before a checkpoint.
type listenerSet struct {
	mu    sync.Mutex
	files map[*os.File]struct{}
}

var live listenerSet

func (l *listenerSet) add(f *os.File) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.files == nil {
		l.files = map[*os.File]struct{}{}
	}
	l.files[f] = struct{}{}
}

// remove closes f (a second Close of a file CloseListeners closed is
// harmless) and forgets it.
func (l *listenerSet) remove(f *os.File) {
	l.mu.Lock()
	delete(l.files, f)
	l.mu.Unlock()
	_ = f.Close()
}

// CloseListeners closes every sysinfo listener of this process and returns
// how many there were. A checkpoint (CRIU) cannot save a seccomp
// notification descriptor, so envd closes them when the host asks it to
// quiesce (envdapi.QuiesceSignal).
//
// The filters stay on the processes: filters cannot be removed, and a
// listener cannot be obtained again for a filter that exists. From then on the
// kernel answers those trees' sysinfo(2) with ENOSYS (a SECCOMP_RET_USER_NOTIF
// filter without a listener), in this process and, after a restore, in the
// restored one (CRIU restores the filters, not the listeners). Process trees
// started afterwards get a filter and a listener of their own and see the
// sandbox's numbers again. The caller first stops readying spare threads
// (usercgroup.Quiesce): a prepared thread's filter would fork trees whose
// sysinfo fails from their first call.
//
// Each Close returns once the descriptor is really closed: a notification
// being answered finishes first (os.File's Close waits for the netpoller's
// readers of a non-blocking descriptor), so when CloseListeners returns no
// descriptor of a listener is left in the process.
func CloseListeners() int {
	// Taken out of the set here, not only when their serve goroutines
	// notice: a second call must not count them again.
	live.mu.Lock()
	files := make([]*os.File, 0, len(live.files))
	for f := range live.files {
		files = append(files, f)
		delete(live.files, f)
	}
	live.mu.Unlock()
	for _, f := range files {
		_ = f.Close()
	}
	return len(files)
}
