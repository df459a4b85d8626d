package doctor

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/testenv"
)

// The rootfs probe starts this binary as its user namespace's holder.
func init() { linux.MaybeInit() }

func TestKernelVersion(t *testing.T) {
	for rel, want := range map[string][2]int{"6.18.44-fc-v657": {6, 18}, "5.19.0": {5, 19}, "4.9.337-1": {4, 9}} {
		major, minor, err := kernelVersion(rel)
		if err != nil || major != want[0] || minor != want[1] {
			t.Errorf("kernelVersion(%q) = %d.%d, %v; want %d.%d", rel, major, minor, err, want[0], want[1])
		}
	}
	if _, _, err := kernelVersion("weird"); err == nil {
		t.Error("kernelVersion accepted a release without a version")
	}
}

func TestCRIUVersion(t *testing.T) {
	major, minor, err := criuVersion("Version: 4.2\nGitID: v4.2\n")
	if err != nil || major != 4 || minor != 2 {
		t.Errorf("criuVersion = %d.%d, %v; want 4.2", major, minor, err)
	}
	if _, _, err := criuVersion("criu: unknown option"); err == nil {
		t.Error("criuVersion accepted output without a version")
	}
}

// freshOptions are serve's defaults on a data dir that does not exist yet
// and ports nothing holds.
func freshOptions(t *testing.T) Options {
	t.Helper()
	return Options{
		DataDir: filepath.Join(t.TempDir(), "data"), APIAddr: "127.0.0.1:0", SandboxAddr: "127.0.0.1:0", MetricsAddr: "127.0.0.1:0",
		Runtime: "linux", DiskQuota: true, Network: true, Egress: true,
	}
}

func find(t *testing.T, fs []Finding, check string) Finding {
	t.Helper()
	for _, f := range fs {
		if f.Check == check {
			return f
		}
	}
	t.Fatalf("no %q finding in %+v", check, fs)
	return Finding{}
}

// The machine the tests run on is set up by scripts/setup.sh, so nothing
// serving needs may fail here.
func TestThisHostServes(t *testing.T) {
	testenv.NeedRoot(t)
	fs := Run(freshOptions(t))
	var out bytes.Buffer
	Write(&out, fs)
	t.Logf("doctor on this host:\n%s", out.String())
	if Failed(fs) {
		t.Errorf("doctor finds a failure on the test host:\n%s", out.String())
	}
	if len(fs) != len(checks) {
		t.Errorf("%d findings for %d checks", len(fs), len(checks))
	}
}

// A tool missing from PATH is found, named, and given its fix; serving would
// fail without mkfs.btrfs on a new data dir, not without CRIU or lxcfs.
func TestMissingBinaryOnPath(t *testing.T) {
	testenv.NeedRoot(t)
	t.Setenv("PATH", t.TempDir())
	fs := Run(freshOptions(t))
	pool := find(t, fs, "disk pool")
	if pool.Severity != Fail || !strings.Contains(pool.Detail, "mkfs.btrfs") || !strings.Contains(pool.Fix, "btrfs-progs") {
		t.Errorf("disk pool without mkfs.btrfs: %+v", pool)
	}
	if !Failed(fs) {
		t.Error("Failed is false with the disk pool failing")
	}
	for _, c := range []string{"criu", "lxcfs"} {
		if f := find(t, fs, c); f.Severity != Warn || !strings.Contains(f.Detail, "not on PATH") || f.Fix == "" {
			t.Errorf("%s missing from PATH: %+v", c, f)
		}
	}
	noQuota := freshOptions(t)
	noQuota.DiskQuota = false
	if f := find(t, Run(noQuota), "disk pool"); f.Severity != OK {
		t.Errorf("disk pool with --disk-quota=false: %+v", f)
	}
}

func TestPortInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	o := freshOptions(t)
	o.SandboxAddr = l.Addr().String()
	f := checkPorts(&o)
	if f.Severity != Fail || !strings.Contains(f.Detail, l.Addr().String()) || !strings.Contains(f.Detail, "--sandbox-addr") {
		t.Errorf("a port in use: %+v", f)
	}
	metricsTaken := freshOptions(t)
	metricsTaken.MetricsAddr = l.Addr().String()
	if f := checkPorts(&metricsTaken); f.Severity != Fail || !strings.Contains(f.Detail, "--metrics-addr") {
		t.Errorf("the metrics port in use: %+v", f)
	}

	// With a server holding the data dir's lock, the port is most likely
	// that server's.
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	lock, err := os.OpenFile(layout.DataDir{Root: o.DataDir}.ServeLock(), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer lock.Close()
	if err := unix.Flock(int(lock.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	// The check's own flock comes from another open file description, so it
	// contends with this one as another process's would.
	if f := checkPorts(&o); f.Severity != Warn || !strings.Contains(f.Detail, "server is running") {
		t.Errorf("a port in use while a server holds the data dir: %+v", f)
	}
	if f := checkDataDir(&o); f.Severity != OK || !strings.Contains(f.Detail, "server is running") {
		t.Errorf("data dir while a server holds it: %+v", f)
	}
}

func TestDataDir(t *testing.T) {
	testenv.NeedRoot(t)
	o := freshOptions(t)
	if f := checkDataDir(&o); f.Severity != OK || !strings.Contains(f.Detail, "does not exist yet") {
		t.Errorf("a data dir to be made: %+v", f)
	}
	if err := os.Mkdir(o.DataDir, 0o755); err != nil {
		t.Fatal(err)
	}
	if f := checkDataDir(&o); f.Severity != OK {
		t.Errorf("a root-owned 0755 data dir: %+v", f)
	}
	if err := os.Chmod(o.DataDir, 0o777); err != nil {
		t.Fatal(err)
	}
	if f := checkDataDir(&o); f.Severity != Fail || !strings.Contains(f.Fix, "chmod go-w") {
		t.Errorf("a world-writable data dir: %+v", f)
	}
	entries, _ := os.ReadDir(o.DataDir)
	if len(entries) != 0 {
		t.Errorf("the check left %d files in the data dir", len(entries))
	}
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	o.DataDir = file
	if f := checkDataDir(&o); f.Severity != Fail || !strings.Contains(f.Detail, "not a directory") {
		t.Errorf("a data dir that is a file: %+v", f)
	}
}

// A state database written "in the future" means the clock went back.
func TestClockWentBack(t *testing.T) {
	o := freshOptions(t)
	if err := os.Mkdir(o.DataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	db := layout.DataDir{Root: o.DataDir}.DB()
	if err := os.WriteFile(db, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(db, future, future); err != nil {
		t.Fatal(err)
	}
	if f := checkClock(&o); f.Severity != Warn || !strings.Contains(f.Detail, "went back") {
		t.Errorf("a state DB from an hour ahead: %+v", f)
	}
	now := time.Now()
	if err := os.Chtimes(db, now, now); err != nil {
		t.Fatal(err)
	}
	if f := checkClock(&o); strings.Contains(f.Detail, "went back") {
		t.Errorf("a state DB written now: %+v", f)
	}
}

func TestWrite(t *testing.T) {
	var out bytes.Buffer
	Write(&out, []Finding{
		{Check: "a", Severity: OK, Detail: "fine", Fix: "never shown"},
		{Check: "b", Severity: Warn, Detail: "meh", Fix: "do b"},
		{Check: "c", Severity: Fail, Detail: "broken", Fix: "do c"},
	})
	want := "✔ a: fine\n! b: meh\n    fix: do b\n✖ c: broken\n    fix: do c\n\n1 problem, 1 warning: serving would fail on this host.\n"
	if out.String() != want {
		t.Errorf("Write:\n%s\nwant:\n%s", out.String(), want)
	}
	out.Reset()
	Write(&out, []Finding{{Check: "a", Severity: OK, Detail: "fine"}})
	if !strings.HasSuffix(out.String(), "Everything Airlock needs is here.\n") {
		t.Errorf("Write of all OK: %q", out.String())
	}
}
