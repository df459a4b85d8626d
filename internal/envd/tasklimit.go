package envd

import (
	"context"
	"log/slog"
	"os"
	"strconv"

	"github.com/airlock-sandbox/airlock/internal/usercgroup"
)

// StartTaskLimit builds the sandbox's cgroups inside a gVisor sandbox, whose
// runtime gives the task limit in usercgroup.TasksMaxEnv (the linux runtime
// builds them on the host), and then guards them against fork storms for the
// life of the sandbox. It does nothing without the variable, which is dropped
// either way: it is not the user's. A sandbox without the limit still works;
// the failure is logged.
func StartTaskLimit(logger *slog.Logger) {
	v, ok := os.LookupEnv(usercgroup.TasksMaxEnv)
	if !ok {
		return
	}
	os.Unsetenv(usercgroup.TasksMaxEnv)
	n, err := strconv.ParseInt(v, 10, 64)
	if err == nil {
		err = usercgroup.SetupV2(n)
	}
	if err != nil {
		logger.Error("envd: the sandbox's task limit is not enforced", "err", err)
		return
	}
	go guardStorms(logger)
}

// guardStorms kills the users' process trees that keep creating tasks at
// their limit (usercgroup.GuardStorms: inside gVisor nothing gives envd the
// CPU before them), for the life of the sandbox.
func guardStorms(logger *slog.Logger) {
	err := usercgroup.GuardStorms(context.Background(), func(k usercgroup.StormKill) {
		if k.Err != nil {
			logger.Error("envd: a process tree storms at its task limit and could not be killed",
				"cgroup", "/user/"+k.Leaf, "refused", k.Refused, "within", k.Window, "err", k.Err)
			return
		}
		logger.Warn("envd: killed a process tree that kept creating tasks at its task limit",
			"cgroup", "/user/"+k.Leaf, "refused", k.Refused, "within", k.Window)
	})
	if err != nil {
		logger.Error("envd: fork storms are not guarded against", "err", err)
	}
}
