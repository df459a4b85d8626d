package daemon

import (
	"fmt"
	"log/slog"

	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
)

// openRuntimes returns the default backend named name and every backend
// available: linux always, gvisor when runsc is installed (a template may ask
// for it, and Recover must find its sandboxes whatever the default).
func openRuntimes(name string, dir layout.DataDir, log *slog.Logger) (runtime.Runtime, []runtime.Runtime, error) {
	if name == "" {
		name = "linux"
	}
	lx, err := linux.New(dir.Runtime("linux"), log)
	if err != nil {
		return nil, nil, fmt.Errorf("linux runtime: %w", err)
	}
	all := []runtime.Runtime{lx}
	gv, gvErr := gvisor.New(dir.Runtime("gvisor"), log)
	if gvErr == nil {
		all = append(all, gv)
	}
	for _, r := range all {
		if r.Name() == name {
			return r, all, nil
		}
	}
	if name == "gvisor" {
		return nil, nil, fmt.Errorf("--runtime gvisor: %w", gvErr)
	}
	return nil, nil, fmt.Errorf("--runtime %q: want linux or gvisor", name)
}
