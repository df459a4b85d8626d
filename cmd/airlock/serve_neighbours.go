package main

import (
	"fmt"

	"github.com/spf13/pflag"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/proxy"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
)

// neighbourFlags are serve's bounds on what one sandbox may take of what
// the host's sandboxes share (daemon.NeighbourConfig).
type neighbourFlags struct {
	trafficMB, trafficBurstMB   float64
	diskReadMB, diskWriteMB     float64
	diskReadIOPS, diskWriteIOPS uint64
}

func (n *neighbourFlags) add(f *pflag.FlagSet) {
	f.Float64Var(&n.trafficMB, "sandbox-traffic-rate", float64(proxy.DefaultBudget.Rate)/(1<<20), "MiB/s one sandbox's traffic through the sandbox proxy may sustain, both directions and all its requests together (the proxy's copying is host CPU no sandbox pays for; 0: no limit)")
	f.Float64Var(&n.trafficBurstMB, "sandbox-traffic-burst", float64(proxy.DefaultBudget.Burst)/(1<<20), "MiB a quiet sandbox may move through the proxy at once above --sandbox-traffic-rate")
	d := linux.DefaultDiskThrottle
	f.Float64Var(&n.diskReadMB, "sandbox-disk-read-rate", float64(d.ReadBps)/(1<<20), "MiB/s one sandbox may read from the sandbox disk pool (blkio throttle; linux runtime; 0: no limit)")
	f.Float64Var(&n.diskWriteMB, "sandbox-disk-write-rate", float64(d.WriteBps)/(1<<20), "MiB/s one sandbox may write to the sandbox disk pool itself: direct and synced writes (cgroup v1 cannot charge the kernel's background writeback to a sandbox); 0: no limit")
	f.Uint64Var(&n.diskReadIOPS, "sandbox-disk-read-iops", d.ReadIOPS, "read requests per second one sandbox may make to the sandbox disk pool (0: no limit)")
	f.Uint64Var(&n.diskWriteIOPS, "sandbox-disk-write-iops", d.WriteIOPS, "write requests per second one sandbox may make to the sandbox disk pool (0: no limit)")
}

func (n *neighbourFlags) apply(c *daemon.Config) error {
	if n.trafficMB < 0 || n.trafficBurstMB < 0 || n.diskReadMB < 0 || n.diskWriteMB < 0 {
		return fmt.Errorf("--sandbox-traffic-* and --sandbox-disk-* must not be negative (0: no limit)")
	}
	if n.trafficMB > 0 && n.trafficBurstMB < 1 {
		return fmt.Errorf("--sandbox-traffic-burst must be at least 1 MiB")
	}
	c.Neighbours.ProxyBudget = &proxy.Budget{Rate: int64(n.trafficMB * (1 << 20)), Burst: int64(n.trafficBurstMB * (1 << 20))}
	c.Neighbours.DiskThrottle = &linux.DiskThrottle{
		ReadBps: uint64(n.diskReadMB * (1 << 20)), WriteBps: uint64(n.diskWriteMB * (1 << 20)),
		ReadIOPS: n.diskReadIOPS, WriteIOPS: n.diskWriteIOPS,
	}
	return nil
}
