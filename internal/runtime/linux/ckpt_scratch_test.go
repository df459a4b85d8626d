package linux_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/airlock-sandbox/airlock/internal/envdapi"
	"github.com/airlock-sandbox/airlock/internal/runtime"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

func TestScratchCheckpoint(t *testing.T) {
	testenv.NeedRoot(t)
	if err := linux.CRIUAvailable(); err != nil {
		t.Fatal(err)
	}
	lower := testenv.BaseRootfs(t)
	base := t.TempDir()
	r, err := linux.New(filepath.Join(base, "state"), nil)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(base, "out")
	os.MkdirAll(out, 0o777)
	spec := runtime.Spec{
		ID: "ckpt1", Hostname: "x", Lower: lower, Dir: filepath.Join(base, "sb"),
		Mounts: []runtime.Mount{{Source: out, Target: "/out"}},
		Init: runtime.Process{Args: []string{"/bin/sh", "-c", "exec 0</dev/null 1>/out/log 2>&1; cd /tmp; exec 3>/tmp/held; i=0; while true; do i=$((i+1)); echo $i > /out/count; echo $i >&3; sleep 0.1; done"},
			Env: []string{"PATH=" + envdapi.DefaultPath}, LogPath: filepath.Join(base, "init.log")},
		Resources: runtime.Resources{CPUs: 1, MemoryMB: 256, PidsMax: 256},
	}
	sb, err := r.Create(context.Background(), spec)
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Destroy(context.Background())
	time.Sleep(500 * time.Millisecond)
	b, _ := os.ReadFile(filepath.Join(out, "count"))
	t.Logf("before: %s", b)
	img := filepath.Join(base, "img")
	t0 := time.Now()
	if err := sb.(runtime.Checkpointer).Checkpoint(context.Background(), runtime.CheckpointOptions{ImageDir: img}); err != nil {
		t.Fatal(err)
	}
	t.Logf("checkpoint %v", time.Since(t0))
	if err := sb.(runtime.Checkpointer).Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	b1, _ := os.ReadFile(filepath.Join(out, "count"))
	t0 = time.Now()
	sb2, err := r.Restore(context.Background(), spec, img)
	if err != nil {
		o, _ := exec.Command("ls", "-la", img).CombinedOutput()
		t.Log(string(o))
		t.Fatal(err)
	}
	t.Logf("restore %v", time.Since(t0))
	time.Sleep(500 * time.Millisecond)
	b2, _ := os.ReadFile(filepath.Join(out, "count"))
	t.Logf("at checkpoint %s after restore %s", strings.TrimSpace(string(b1)), b2)
	st, err := sb2.Status()
	t.Logf("status %v %v", st, err)
	for _, c := range []string{"memory", "pids", "freezer", "cpu"} {
		o, _ := exec.Command("sh", "-c", "cd /sys/fs/cgroup/"+c+"/airlock/ckpt1 && find . -name cgroup.procs | while read f; do echo $f: $(cat $f); done").CombinedOutput()
		t.Logf("%s: %s", c, o)
	}
	t0 = time.Now()
	go func() {
		time.Sleep(2 * time.Second)
		o, _ := exec.Command("sh", "-c", "for p in $(cat /sys/fs/cgroup/memory/airlock/ckpt1/cgroup.procs); do grep -E 'State|PPid' /proc/$p/status; done; ps -o pid,ppid,stat,cmd -p $$").CombinedOutput()
		t.Logf("procs: %s (test pid %d)", o, os.Getpid())
		st, err := sb2.Status()
		t.Logf("status during destroy %v %v", st, err)
	}()
	err = sb2.Destroy(context.Background())
	t.Logf("destroy %v %v", time.Since(t0), err)
}
