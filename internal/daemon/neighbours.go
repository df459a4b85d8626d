package daemon

import (
	"fmt"

	"github.com/airlock-sandbox/airlock/internal/proxy"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
)

// NeighbourConfig bounds what one sandbox can take of what every sandbox on
// the host shares and no cgroup limit of its own covers: the server's work
// on its traffic and the disk pool's device.
type NeighbourConfig struct {
	// ProxyBudget bounds each sandbox's bytes through the sandbox proxy;
	// nil means proxy.DefaultBudget, a zero Rate none.
	ProxyBudget *proxy.Budget
	// DiskThrottle holds the rates of each sandbox's I/O on the disk pool
	// (linux runtime; its device fields are ignored: the pool's are used);
	// nil means linux.DefaultDiskThrottle, zero rates none.
	DiskThrottle *linux.DiskThrottle
}

// throttleDisk gives the linux backend the pool's device and the rates to
// throttle every sandbox's I/O on it with.
func (d *Daemon) throttleDisk() error {
	t := linux.DefaultDiskThrottle
	if d.cfg.Neighbours.DiskThrottle != nil {
		t = *d.cfg.Neighbours.DiskThrottle
	}
	if t.ReadBps == 0 && t.WriteBps == 0 && t.ReadIOPS == 0 && t.WriteIOPS == 0 {
		return nil
	}
	major, minor, err := d.Disk.Device()
	if err != nil {
		return fmt.Errorf("disk throttle: %w", err)
	}
	t.Major, t.Minor = major, minor
	for _, r := range d.Runtimes {
		if lx, ok := r.(*linux.Runtime); ok {
			lx.SetDiskThrottle(t)
		}
	}
	return nil
}
