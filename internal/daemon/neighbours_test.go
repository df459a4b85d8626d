package daemon_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/daemon"
	"github.com/airlock-sandbox/airlock/internal/daemon/daemontest"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// TestNeighbourBounds: a server on the disk pool throttles its sandboxes'
// I/O on the pool's loop device at the configured rates (the default ones
// when none are given).
func TestNeighbourBounds(t *testing.T) {
	if _, err := os.Stat("/sys/fs/cgroup/blkio"); err != nil {
		t.Skip("no cgroup v1 blkio controller on this host")
	}
	custom := &linux.DiskThrottle{ReadBps: 3 << 20, WriteBps: 2 << 20, ReadIOPS: 300, WriteIOPS: 200}
	for _, tc := range []struct {
		name string
		set  *linux.DiskThrottle
		want linux.DiskThrottle
	}{
		{"default", nil, linux.DefaultDiskThrottle},
		{"flags", custom, *custom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := daemontest.Start(t, func(c *daemon.Config) {
				c.DiskQuota, c.DiskImageMB = true, 512
				c.Neighbours.DiskThrottle = tc.set
			})
			major, minor, err := d.Disk.Device()
			if err != nil {
				t.Fatal(err)
			}
			info, err := d.Manager.Create(context.Background(), sandbox.CreateRequest{Template: "base", Timeout: time.Minute})
			if err != nil {
				t.Fatal(err)
			}
			dir := filepath.Join("/sys/fs/cgroup/blkio", linux.CgroupParent, info.ID)
			for file, rate := range map[string]uint64{
				"blkio.throttle.read_bps_device":   tc.want.ReadBps,
				"blkio.throttle.write_bps_device":  tc.want.WriteBps,
				"blkio.throttle.read_iops_device":  tc.want.ReadIOPS,
				"blkio.throttle.write_iops_device": tc.want.WriteIOPS,
			} {
				b, err := os.ReadFile(filepath.Join(dir, file))
				if err != nil {
					t.Fatal(err)
				}
				if got, want := strings.TrimSpace(string(b)), fmt.Sprintf("%d:%d %d", major, minor, rate); got != want {
					t.Errorf("%s = %q, want %q (the pool's device)", file, got, want)
				}
			}
		})
	}
}
