package runtimetest

import (
	_ "embed"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The escape tests run a probe as root inside a sandbox that tries each escape
// and records what happened; the suite then asserts that every attempt failed
// and that the controls (things that must work) worked, so that a probe that
// silently tests nothing fails too. The probes need python3 in Harness.Lower.

//go:embed escape_probe.py
var escapeProbe string

//go:embed neighbour_probe.py
var neighbourProbe string

// MaxCaps is the largest capability set a backend may give a sandbox's root:
// what envd and package installation need (see runtime/linux.Capabilities for
// why each). CapBnd and CapEff inside the sandbox must be subsets of it.
// CAP_SYS_PTRACE is envd's alone (it answers sysinfo through the callers'
// memory): the processes envd starts lack it (EnvdSysinfo checks that), but
// a probe run as the first process, as here, has it.
var MaxCaps = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_FSETID",
	"CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_NET_BIND_SERVICE",
	"CAP_SYS_PTRACE",
}

// capNames maps capability bit numbers to names (linux/capability.h).
var capNames = []string{
	"CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_DAC_READ_SEARCH", "CAP_FOWNER", "CAP_FSETID",
	"CAP_KILL", "CAP_SETGID", "CAP_SETUID", "CAP_SETPCAP", "CAP_LINUX_IMMUTABLE",
	"CAP_NET_BIND_SERVICE", "CAP_NET_BROADCAST", "CAP_NET_ADMIN", "CAP_NET_RAW",
	"CAP_IPC_LOCK", "CAP_IPC_OWNER", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_SYS_CHROOT",
	"CAP_SYS_PTRACE", "CAP_SYS_PACCT", "CAP_SYS_ADMIN", "CAP_SYS_BOOT", "CAP_SYS_NICE",
	"CAP_SYS_RESOURCE", "CAP_SYS_TIME", "CAP_SYS_TTY_CONFIG", "CAP_MKNOD", "CAP_LEASE",
	"CAP_AUDIT_WRITE", "CAP_AUDIT_CONTROL", "CAP_SETFCAP", "CAP_MAC_OVERRIDE",
	"CAP_MAC_ADMIN", "CAP_SYSLOG", "CAP_WAKE_ALARM", "CAP_BLOCK_SUSPEND", "CAP_AUDIT_READ",
	"CAP_PERFMON", "CAP_BPF", "CAP_CHECKPOINT_RESTORE",
}

// decodeCaps turns a /proc/<pid>/status capability mask into sorted names.
func decodeCaps(t *testing.T, hex string) []string {
	t.Helper()
	mask, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		t.Fatalf("capability mask %q: %v", hex, err)
	}
	var names []string
	for bit := 0; bit < 64; bit++ {
		if mask&(1<<bit) == 0 {
			continue
		}
		if bit < len(capNames) {
			names = append(names, capNames[bit])
		} else {
			names = append(names, fmt.Sprintf("CAP_%d", bit))
		}
	}
	slices.Sort(names)
	return names
}

// guestContained are the probe's calls a guest kernel (gVisor) implements
// itself: a new user namespace, an O_PATH open_tree and reading its own log
// buffer's size all stay inside the guest kernel's objects, so their success
// reaches nothing of the host.
var guestContained = []string{"unshare-user", "clone-newuser", "open_tree", "syslog"}

// denied reports whether a syscall result is a refusal by a confinement layer.
func denied(res string) bool {
	return res == "EPERM" || res == "ENOSYS" || res == "EACCES"
}

// runProbe runs script as the first process of a new sandbox, with needle (if
// any) in its /out/needle, and returns the JSON report it leaves in /out/result.
func runProbe(t *testing.T, h Harness, script, result, needle string, env ...string) map[string]string {
	t.Helper()
	if _, err := os.Stat(filepath.Join(h.Lower, "usr/bin/python3")); err != nil {
		t.Fatalf("the escape tests need python3 in the template (%s): %v", h.Lower, err)
	}
	r := h.New(t)
	spec, out := newSpec(t, h)
	spec.Init.Args = []string{"/usr/bin/python3", "-c", script}
	spec.Init.Env = append(spec.Init.Env, env...)
	spec.Init.Stdin = nil
	if needle != "" {
		if err := os.WriteFile(filepath.Join(out, "needle"), []byte(needle), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	create(t, r, spec)
	waitFile(t, filepath.Join(out, "done"))
	return readReport(t, filepath.Join(out, result))
}

func readReport(t *testing.T, path string) map[string]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return m
}

func testEscape(t *testing.T, h Harness) {
	// A host process and a host file the sandbox must not see.
	marker := fmt.Sprintf("airlock-host-marker-%d", time.Now().UnixNano())
	hostProc := exec.Command("/bin/sh", "-c", "sleep 600", marker)
	if err := hostProc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = hostProc.Process.Kill(); _ = hostProc.Wait() })
	hostFile := filepath.Join(t.TempDir(), "host-marker")
	if err := os.WriteFile(hostFile, []byte("host"), 0o644); err != nil {
		t.Fatal(err)
	}

	rep := runProbe(t, h, escapeProbe, "escape.json", "", "HOST_MARKER="+marker, "HOST_FILE="+hostFile)
	get := func(k string) string {
		v, ok := rep[k]
		if !ok {
			t.Errorf("probe did not report %s", k)
		}
		return v
	}

	// Controls: the probe's machinery works, so denials below mean something.
	if v := get("sys:control-read"); v != "EBADF" {
		t.Errorf("control read(-1) = %s, want EBADF (the probe cannot tell denials apart)", v)
	}
	if v := get("proc:self-marker"); v != "visible" {
		t.Errorf("control: the probe cannot see its own marker process (%s)", v)
	}

	for k, v := range rep {
		name, ok := strings.CutPrefix(k, "sys:")
		if !ok || name == "control-read" || v == "absent" {
			continue
		}
		switch {
		case denied(v):
		case h.GuestKernel && v != "ok":
			// The guest kernel does not implement it (ENODEV, ENOTSUP,
			// EAFNOSUPPORT...): it failed without reaching the host kernel.
		case h.GuestKernel && slices.Contains(guestContained, name):
		default:
			t.Errorf("syscall %s from inside: %s, want it refused (EPERM/ENOSYS)", name, v)
		}
	}
	if v := get("sys:clone3"); v != "ENOSYS" && !h.GuestKernel {
		t.Errorf("clone3 = %s, want ENOSYS so that libc falls back to the filtered clone", v)
	}
	for _, k := range []string{"mount:proc", "mount:sysfs", "mount:tmpfs"} {
		if v := get(k); !denied(v) {
			t.Errorf("%s from inside: %s, want refused", k, v)
		}
	}
	for _, k := range []string{"mknod:block", "mknod:kvm"} {
		v := get(k)
		if v == "mknod EPERM" || v == "mknod EACCES" {
			continue
		}
		if strings.Contains(v, "open ok") || strings.Contains(v, "mount ok") || !strings.HasPrefix(v, "mknod ok") {
			t.Errorf("%s: %s; the device must not be creatable or, if created, usable", k, v)
		}
	}
	if v := get("open:/dev/kvm"); v != "ENOENT" && !denied(v) {
		t.Errorf("open /dev/kvm: %s", v)
	}

	// /proc and /sys: read-only where the kernel's state lives; masked where
	// it leaks host information.
	for _, p := range []string{"/proc/sys", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/sys"} {
		if v := get("ro:" + p); v != "ro" && v != "missing" {
			t.Errorf("%s is mounted %s inside the sandbox, want read-only", p, v)
		}
	}
	for k, v := range rep {
		if p, ok := strings.CutPrefix(k, "open-w:"); ok && v == "ok" {
			t.Errorf("opening %s for writing succeeded", p)
		}
	}
	for _, p := range []string{"/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/interrupts"} {
		if v := get("read:" + p); v != "0 bytes" && v != "missing" && !denied(v) {
			t.Errorf("%s is readable inside (%s); it must be masked", p, v)
		}
	}
	if v := get("ls:/sys/firmware"); v != "0 entries" && v != "missing" && !denied(v) {
		t.Errorf("/sys/firmware has %s; it must be masked", v)
	}

	// Privileges of the sandbox's root.
	for _, k := range []string{"CapEff", "CapBnd", "CapPrm"} {
		got := decodeCaps(t, get("status:"+k))
		for _, c := range got {
			if !slices.Contains(MaxCaps, c) {
				t.Errorf("%s has %s, which is not in the allowed set %v", k, c, MaxCaps)
			}
		}
		if h.Caps != nil {
			want := slices.Sorted(slices.Values(h.Caps))
			if !slices.Equal(got, want) {
				t.Errorf("%s = %v, want %v", k, got, want)
			}
		}
	}
	for _, k := range []string{"CapInh", "CapAmb"} {
		if got := decodeCaps(t, get("status:"+k)); len(got) > 0 {
			t.Errorf("%s = %v, want none", k, got)
		}
	}
	// rlimits (soft hard): see runtime/linux's rlimits for why.
	// The hard NOFILE limit may be lower than 65536 where the host's is.
	var soft, hard int
	if _, err := fmt.Sscanf(get("rlimit:nofile"), "%d %d", &soft, &hard); err != nil || soft != 1024 || hard < soft || hard > 65536 {
		t.Errorf("RLIMIT_NOFILE = %q, want soft 1024 and a hard limit of at most 65536", rep["rlimit:nofile"])
	}
	if v := get("rlimit:core"); v != "0 0" {
		t.Errorf("RLIMIT_CORE = %s, want 0 0 (no core dumps, not even re-enabled)", v)
	}
	if v := get("status:Seccomp"); v != "2" && !h.GuestKernel {
		t.Errorf("Seccomp: %s, want 2 (a filter is loaded)", v)
	}
	if v := get("status:NoNewPrivs"); v != "1" {
		t.Errorf("NoNewPrivs: %s, want 1", v)
	}
	if uid := strings.Fields(get("status:Uid")); len(uid) == 0 || uid[0] != "0" {
		t.Errorf("the probe runs as uid %v, want root inside (the escapes are tried as root)", uid)
	}
	if h.UIDMap != "" {
		if v := get("uid_map"); v != h.UIDMap {
			t.Errorf("uid_map = %q, want %q (root inside must be an unprivileged host uid)", v, h.UIDMap)
		}
		if v := get("gid_map"); v != h.UIDMap {
			t.Errorf("gid_map = %q, want %q", v, h.UIDMap)
		}
	} else {
		t.Logf("uid_map inside: %q (backend declares no host id mapping)", rep["uid_map"])
	}

	// /dev: only the basic character devices, links and the usual mounts.
	allowedDev := map[string]string{
		"null": "char 1:3", "zero": "char 1:5", "full": "char 1:7", "random": "char 1:8",
		"urandom": "char 1:9", "tty": "char 5:0",
	}
	for k, v := range rep {
		name, ok := strings.CutPrefix(k, "dev:")
		if !ok {
			continue
		}
		switch {
		case allowedDev[name] != "":
			if v != allowedDev[name] {
				t.Errorf("/dev/%s is %s, want %s", name, v, allowedDev[name])
			}
		case name == "ptmx" && (v == "link" || v == "char 5:2"):
		case slices.Contains([]string{"pts", "shm", "mqueue"}, name) && v == "dir":
		case slices.Contains([]string{"fd", "stdin", "stdout", "stderr", "core"}, name) && v == "link":
		case h.GuestKernel && (name == "fuse" && v == "char 10:229" || slices.Contains([]string{"net", "char"}, name) && v == "dir"):
			// gVisor always adds these; they are the sentry's own emulations
			// (FUSE served in the sentry, an empty tun dir), not host devices.
		default:
			t.Errorf("unexpected /dev/%s (%s) inside the sandbox", name, v)
		}
	}

	// The host stays out of sight, also after the classic chroot escape.
	if v := get("proc:host-marker"); v != "hidden" {
		t.Errorf("a host process (%s) is visible inside the sandbox", marker)
	}
	if v := get("file:host-marker"); v != "hidden" {
		t.Errorf("a host file (%s) is visible inside the sandbox", hostFile)
	}
	if v := get("chroot"); v == "escaped" || (v != "chrooted, host file hidden" && !denied(v)) {
		t.Errorf("chroot escape: %s", v)
	}
	if t.Failed() || testing.Verbose() {
		b, _ := json.MarshalIndent(rep, "", " ")
		t.Logf("probe report:\n%s", b)
	}
}

// testNeighbours starts an owner sandbox holding a secret in its environment,
// files, a process, SysV shm and an abstract socket, and a seeker sandbox that
// must find none of them, while the owner finds all of its own.
func testNeighbours(t *testing.T, h Harness) {
	token := fmt.Sprintf("airlock-fake-token-%d", time.Now().UnixNano())
	owner := runProbe(t, h, neighbourProbe, "neighbour.json", "", "ROLE=owner", "AIRLOCK_FAKE_TOKEN="+token)
	for k, v := range owner {
		if v == "absent" {
			t.Errorf("control: the owner sandbox cannot find its own %s", k)
		}
	}
	// The owner keeps running (its secrets live) while the seeker looks.
	seeker := runProbe(t, h, neighbourProbe, "neighbour.json", token, "ROLE=seeker")
	t.Logf("owner saw %v; seeker saw %v", owner, seeker)
	for k := range owner {
		if v, ok := seeker[k]; !ok || v != "absent" {
			t.Errorf("a second sandbox sees the first one's %s: %q", k, v)
		}
	}
}
