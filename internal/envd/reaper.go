package envd

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/usercgroup"
)

// ChildEnv marks the re-executed server process so it does not become a reaper
// again. Its value is irrelevant.
const ChildEnv = "AIRLOCK_ENVD_CHILD"

// RunReaper is what envd does when it is a sandbox's pid 1. Orphans of every
// process in the sandbox are re-parented to pid 1, and something must wait for them
// or they stay zombies forever. Doing that in the server itself would race with
// os/exec, whose Wait must see its own children's exit statuses; so pid 1 re-execs
// envd as its only direct child, passes the config on through a pipe (the access
// token never touches the environment or a file), and does nothing but reap,
// forward termination signals, and exit with the server's status. When pid 1
// exits, the kernel kills the rest of the sandbox, which is the intended teardown.
func RunReaper(config []byte, logger *slog.Logger) int {
	exe := "/proc/self/exe"
	if _, err := os.Stat(exe); err != nil {
		exe = os.Args[0]
	}
	if setupTaskLimit(logger) {
		go guardStorms(logger)
	}
	r, w, err := os.Pipe()
	if err != nil {
		logger.Error("reaper: pipe", "err", err)
		return 1
	}
	// Register before the child exists so no signal falls between the cracks.
	// Only the signals the server handles are forwarded (a graceful stop, and
	// the host's quiesce and wake around a checkpoint: envdapi.QuiesceSignal);
	// pid 1 ignores the rest, as the kernel does for a namespace's init.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, envdapi.QuiesceSignal, envdapi.WakeSignal)
	child, err := os.StartProcess(exe, os.Args, &os.ProcAttr{
		Env:   append(os.Environ(), ChildEnv+"=1"),
		Files: []*os.File{r, os.Stdout, os.Stderr},
	})
	r.Close()
	if err != nil {
		w.Close()
		logger.Error("reaper: starting envd server", "err", err)
		return 1
	}
	go func() {
		_, _ = w.Write(config)
		w.Close()
	}()
	go func() {
		for sig := range sigs {
			_ = child.Signal(sig)
		}
	}()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, 0, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil {
			// ECHILD: nothing left to wait for, which means the server is gone too.
			logger.Error("reaper: wait4", "err", err)
			return 1
		}
		if pid != child.Pid {
			continue
		}
		switch {
		case ws.Exited():
			logger.Info("envd server exited", "status", ws.ExitStatus())
			return ws.ExitStatus()
		case ws.Signaled():
			logger.Info("envd server killed", "signal", ws.Signal().String())
			return 128 + int(ws.Signal())
		}
	}
}

// setupTaskLimit builds the sandbox's cgroups inside a gVisor sandbox, whose
// runtime gives the task limit in usercgroup.TasksMaxEnv (the linux runtime
// builds them on the host), and reports whether they are in place. The
// variable is dropped either way: it is not the user's. A sandbox without the
// limit still works; the failure is logged.
func setupTaskLimit(logger *slog.Logger) bool {
	v, ok := os.LookupEnv(usercgroup.TasksMaxEnv)
	if !ok {
		return false
	}
	os.Unsetenv(usercgroup.TasksMaxEnv)
	n, err := strconv.ParseInt(v, 10, 64)
	if err == nil {
		err = usercgroup.SetupV2(n)
	}
	if err != nil {
		logger.Error("reaper: the sandbox's task limit is not enforced", "err", err)
		return false
	}
	return true
}

// guardStorms kills the users' process trees that keep creating tasks at
// their limit (usercgroup.GuardStorms: inside gVisor nothing gives envd the
// CPU before them), for the life of the sandbox.
func guardStorms(logger *slog.Logger) {
	err := usercgroup.GuardStorms(context.Background(), func(k usercgroup.StormKill) {
		if k.Err != nil {
			logger.Error("reaper: a process tree storms at its task limit and could not be killed",
				"cgroup", "/user/"+k.Leaf, "refused", k.Refused, "within", k.Window, "err", k.Err)
			return
		}
		logger.Warn("reaper: killed a process tree that kept creating tasks at its task limit",
			"cgroup", "/user/"+k.Leaf, "refused", k.Refused, "within", k.Window)
	})
	if err != nil {
		logger.Error("reaper: fork storms are not guarded against", "err", err)
	}
}
