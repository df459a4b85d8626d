package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/airlock-sandbox/airlock/internal/bench"
	"github.com/airlock-sandbox/airlock/internal/e2bclient"
	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/mountutil"
)

func benchDensityCmd() *cobra.Command {
	var (
		dataDir, tpl string
		steps        []int
		sample, fill int
		pageSize     int
		cpuProfile   string
		killProfile  string
	)
	cmd := &cobra.Command{
		Use:   "density",
		Short: "Fill one server with idle sandboxes and measure memory, latency and threads at each step",
		Long: `Start an Airlock server in this process and create idle sandboxes of a template
until each step's count is alive; at each step time the last --sample creates,
--sample commands.run('true') in random live sandboxes and --sample first pages of
the sandbox list, and read the host's memory per sandbox (MemTotal - MemAvailable,
against before the first create) and the process's OS threads and goroutines (the
bench client's included). Then every sandbox runs a command, all are killed at
once (32 at a time), and what they left behind is listed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			c := benchConfig(dataDir, []string{tpl}, "linux", slog.LevelWarn, true)
			d, err := startBench(ctx, c)
			if err != nil {
				return err
			}
			defer d.Close()
			mountsBefore := mountutil.MountedUnder(dataDir)
			cli := e2bclient.New(e2bclient.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0]})
			dc := bench.DensityConfig{
				Config: bench.Config{APIURL: d.APIURL, SandboxURL: d.SandboxURL, APIKey: d.APIKeys[0],
					Template: tpl, Progress: os.Stderr},
				Steps: steps, Sample: sample, Fill: fill, ListPageSize: pageSize,
				Threads:    osThreads,
				Goroutines: runtime.NumGoroutine,
				FDs:        openFDs,
				MemCgroups: memCgroups,
				Leftovers: func(ids []string) []string {
					return densityLeftovers(ctx, cli, dataDir, ids, mountsBefore)
				},
			}
			for _, p := range []struct {
				path string
				to   *io.Writer
			}{{cpuProfile, &dc.CPUProfile}, {killProfile, &dc.KillProfile}} {
				if p.path == "" {
					continue
				}
				f, err := os.Create(p.path)
				if err != nil {
					return err
				}
				defer f.Close()
				*p.to = f
			}
			res, err := bench.RunDensity(ctx, dc)
			if err != nil {
				return err
			}
			var fdLimit syscall.Rlimit
			_ = syscall.Getrlimit(syscall.RLIMIT_NOFILE, &fdLimit)
			fmt.Printf("\nAirlock bench density, template %s, %s (latencies in ms; the server's open-file limit %d)\n\n",
				tpl, time.Now().UTC().Format(time.DateOnly), fdLimit.Cur)
			bench.PrintDensity(os.Stdout, res)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&dataDir, "data-dir", layout.DefaultRoot, "data dir (templates are built there if needed)")
	f.StringVar(&tpl, "template", "base", "template of the sandboxes")
	f.IntSliceVar(&steps, "steps", []int{10, 100, 1000, 4000}, "numbers of live sandboxes to measure at, ascending")
	f.IntVar(&sample, "sample", 10, "creates, commands and lists timed at each step")
	f.IntVar(&fill, "fill", 4, "creates at once while filling between steps")
	f.IntVar(&pageSize, "list-page", 10, "entries per timed list page (the same at every step)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the server (in this process) during the last step's timed creates, commands and lists to this file")
	f.StringVar(&killProfile, "kill-cpuprofile", "", "write a CPU profile of the server (in this process) while every sandbox is killed to this file")
	return cmd
}

// osThreads is this process's OS thread count (/proc/self/status).
func osThreads() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Threads:"); ok {
			n, _ := strconv.Atoi(strings.TrimSpace(v))
			return n
		}
	}
	return -1
}

// openFDs is this process's open file descriptors.
func openFDs() int {
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(fds)
}

// memCgroups is the host's number of memory cgroups (/proc/cgroups), dying
// ones included.
func memCgroups() int {
	b, err := os.ReadFile("/proc/cgroups")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "memory" {
			n, _ := strconv.Atoi(f[2])
			return n
		}
	}
	return -1
}

// densityLeftovers lists what killed sandboxes left: records the API still
// lists, mounts under the data dir beyond those before the run (templates'
// idmapped views stay), cgroups and state dirs of the ids.
func densityLeftovers(ctx context.Context, cli *e2bclient.Client, dataDir string, ids []string, mountsBefore []string) []string {
	var out []string
	if listed, err := cli.List(ctx, e2bclient.ListQuery{}); err != nil {
		out = append(out, fmt.Sprintf("list: %v", err))
	} else if len(listed) > 0 {
		out = append(out, fmt.Sprintf("%d records", len(listed)))
	}
	var mounts []string
	for _, m := range mountutil.MountedUnder(dataDir) {
		if !slices.Contains(mountsBefore, m) {
			mounts = append(mounts, m)
		}
	}
	if len(mounts) > 0 {
		out = append(out, fmt.Sprintf("%d mounts (%s)", len(mounts), strings.Join(mounts[:min(len(mounts), 3)], ", ")))
	}
	cgroups, dirs := 0, 0
	for _, id := range ids {
		if m, _ := filepath.Glob(filepath.Join("/sys/fs/cgroup/*/airlock", id)); len(m) > 0 {
			cgroups++
		}
		if _, err := os.Stat(filepath.Join(dataDir, "sandboxes", id)); err == nil {
			dirs++
		}
	}
	if cgroups > 0 {
		out = append(out, fmt.Sprintf("cgroups of %d sandboxes", cgroups))
	}
	if dirs > 0 {
		out = append(out, fmt.Sprintf("%d sandbox dirs", dirs))
	}
	return out
}
