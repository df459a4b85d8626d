package doctor

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/airlock-sandbox/airlock/internal/layout"
	"github.com/airlock-sandbox/airlock/internal/runtime/gvisor"
	"github.com/airlock-sandbox/airlock/internal/runtime/linux"
	"github.com/airlock-sandbox/airlock/internal/sandbox"
)

// procRoot and sysRoot are where the checks read the kernel's state (tests
// point them elsewhere).
var (
	procRoot = "/proc"
	sysRoot  = "/sys"
)

func readTrim(path string) (string, error) {
	b, err := os.ReadFile(path)
	return strings.TrimSpace(string(b)), err
}

func checkRoot(*Options) Finding {
	if uid := os.Geteuid(); uid != 0 {
		return fail(fmt.Sprintf("running as uid %d", uid),
			"run as root (sudo): sandboxes need namespaces, cgroups, mounts and nftables that only root can make")
	}
	return ok("running as root")
}

// minKernel is the oldest kernel the linux runtime works on: overlayfs over
// idmapped layers (5.19), which every sandbox's root is.
var minKernel = [2]int{5, 19}

// kernelVersion parses the major and minor of a release string such as
// "6.18.44-fc-v657".
func kernelVersion(release string) (major, minor int, err error) {
	m := regexp.MustCompile(`^(\d+)\.(\d+)`).FindStringSubmatch(release)
	if m == nil {
		return 0, 0, fmt.Errorf("unrecognised kernel release %q", release)
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return major, minor, nil
}

func checkKernel(*Options) Finding {
	var u unix.Utsname
	if err := unix.Uname(&u); err != nil {
		return fail(fmt.Sprintf("uname: %v", err), "")
	}
	rel := unix.ByteSliceToString(u.Release[:])
	major, minor, err := kernelVersion(rel)
	if err != nil {
		return warn(err.Error(), "")
	}
	if major < minKernel[0] || (major == minKernel[0] && minor < minKernel[1]) {
		return fail(fmt.Sprintf("Linux %s: sandboxes' roots are overlays over idmapped layers, which need %d.%d", rel, minKernel[0], minKernel[1]),
			fmt.Sprintf("run a kernel of %d.%d or later", minKernel[0], minKernel[1]))
	}
	return ok("Linux " + rel)
}

// nsFlags are the namespaces every sandbox gets.
const nsFlags = unix.CLONE_NEWUSER | unix.CLONE_NEWNS | unix.CLONE_NEWPID | unix.CLONE_NEWNET |
	unix.CLONE_NEWIPC | unix.CLONE_NEWUTS | unix.CLONE_NEWCGROUP

func checkNamespaces(*Options) Finding {
	if v, err := readTrim(filepath.Join(procRoot, "sys/user/max_user_namespaces")); err == nil && v == "0" {
		return fail("user.max_user_namespaces is 0: no user namespace can be made",
			"sysctl -w user.max_user_namespaces=65536 (and set it in /etc/sysctl.d)")
	}
	bin, err := exec.LookPath("true")
	if err != nil {
		bin = "/bin/true"
	}
	if _, err := os.Stat(bin); err != nil {
		return warn("no `true` program to try a child in new namespaces with", "")
	}
	cmd := exec.Command(bin)
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags:  nsFlags,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	}
	if err := cmd.Run(); err != nil {
		return fail(fmt.Sprintf("a child in new user, mount, pid, network, IPC, UTS and cgroup namespaces failed: %v", err),
			"enable user namespaces (CONFIG_USER_NS; on some distributions kernel.unprivileged_userns_clone or an AppArmor/SELinux policy forbids them)")
	}
	return ok("a child ran in new user, mount, pid, network, IPC, UTS and cgroup namespaces")
}

// filesystems lists the kernel's registered filesystems (/proc/filesystems).
func filesystems() map[string]bool {
	out := map[string]bool{}
	f, err := os.Open(filepath.Join(procRoot, "filesystems"))
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 0 {
			out[fields[len(fields)-1]] = true
		}
	}
	return out
}

// moduleExists reports whether the running kernel has name as a loadable
// module (it loads on first use).
func moduleExists(name string) bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	dir := filepath.Join("/lib/modules", unix.ByteSliceToString(u.Release[:]))
	b, err := os.ReadFile(filepath.Join(dir, "modules.dep"))
	return err == nil && strings.Contains(string(b), "/"+name+".ko")
}

func checkOverlay(*Options) Finding {
	if filesystems()["overlay"] {
		return ok("overlay is registered")
	}
	if moduleExists("overlay") {
		return ok("overlay is a module; it loads at the first sandbox")
	}
	return fail("the kernel has no overlay filesystem", "use a kernel with CONFIG_OVERLAY_FS")
}

func checkRootfs(o *Options) Finding {
	// On the data dir's filesystem: the templates' layers and the sandboxes'
	// writable layers live there.
	parent := existingAncestor(o.DataDir)
	dir, err := os.MkdirTemp(parent, ".airlock-doctor-")
	if err != nil {
		return warn(fmt.Sprintf("could not try a sandbox root in %s: %v", parent, err), "")
	}
	defer os.RemoveAll(dir)
	if err := linux.ProbeRootfs(dir); err != nil {
		return fail("a sandbox root could not be made on "+parent+"'s filesystem: "+err.Error(),
			"use Linux 5.19 or later, and a data dir on a filesystem with idmapped mounts (ext4, xfs, btrfs)")
	}
	return ok("an overlay over an idmapped layer was made, read and written on " + parent + "'s filesystem, as every sandbox's root is")
}

// cgroupControllers are the cgroup v1 hierarchies the linux runtime uses:
// limits (pids, memory, cpu, cpuset, blkio), accounting (cpuacct), device
// rules and freezing (pause).
var cgroupControllers = []string{"pids", "memory", "cpu", "cpuacct", "cpuset", "blkio", "devices", "freezer"}

func checkCgroups(o *Options) Finding {
	root := filepath.Join(sysRoot, "fs/cgroup")
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return fail(fmt.Sprintf("%s: %v", root, err), "mount the cgroup hierarchies (systemd does at boot)")
	}
	if st.Type == unix.CGROUP2_SUPER_MAGIC {
		if o.Runtime == "gvisor" {
			return warn("cgroup v2 only: the linux runtime needs the v1 hierarchies; gVisor sandboxes may run",
				"boot with systemd.unified_cgroup_hierarchy=0 (hybrid) to run linux-runtime sandboxes")
		}
		return fail("cgroup v2 only: the linux runtime puts sandboxes in the cgroup v1 hierarchies ("+strings.Join(cgroupControllers, ", ")+")",
			"boot with systemd.unified_cgroup_hierarchy=0 (the hybrid layout)")
	}
	var missing []string
	for _, c := range cgroupControllers {
		var cs unix.Statfs_t
		if err := unix.Statfs(filepath.Join(root, c), &cs); err != nil || cs.Type != unix.CGROUP_SUPER_MAGIC {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return fail("cgroup v1 hierarchies not mounted: "+strings.Join(missing, ", "),
			"mount them under "+root+" (systemd's hybrid layout does), or enable those controllers in the kernel")
	}
	return ok("cgroup v1 hierarchies " + strings.Join(cgroupControllers, ", "))
}

func checkSeccomp(*Options) Finding {
	acts, err := readTrim(filepath.Join(procRoot, "sys/kernel/seccomp/actions_avail"))
	if err != nil {
		return fail("no seccomp filters in this kernel", "use a kernel with CONFIG_SECCOMP_FILTER")
	}
	have := map[string]bool{}
	for _, a := range strings.Fields(acts) {
		have[a] = true
	}
	if !have["errno"] || !have["kill_process"] {
		return fail("seccomp lacks the errno or kill_process action: "+acts, "use a newer kernel")
	}
	if !have["user_notif"] {
		return warn("seccomp has no user notifications: sandboxes see the host's memory and CPUs in sysinfo(2)", "use Linux 5.0 or later")
	}
	return ok("seccomp filters with " + acts)
}

func checkNftables(o *Options) Finding {
	if !o.Network {
		return ok("not needed: --sandbox-network=false")
	}
	c, err := nftables.New()
	if err == nil {
		_, err = c.ListTablesOfFamily(nftables.TableFamilyINet)
	}
	if err != nil {
		return fail(fmt.Sprintf("nftables over netlink: %v", err),
			"load nf_tables (modprobe nf_tables; CONFIG_NF_TABLES, CONFIG_NFT_FIB, CONFIG_NFT_NAT, CONFIG_NFT_REDIR), or serve with --sandbox-network=false")
	}
	return ok("nftables answers over netlink")
}

func checkForwarding(o *Options) Finding {
	if !o.Network || !o.Egress {
		return ok("not needed: sandbox egress is off")
	}
	v, err := readTrim(filepath.Join(procRoot, "sys/net/ipv4/ip_forward"))
	if err != nil {
		return warn(fmt.Sprintf("net.ipv4.ip_forward: %v", err), "")
	}
	if v != "1" {
		return ok("net.ipv4.ip_forward is " + v + "; serve sets it to 1 when it starts (sandbox egress) and leaves it so")
	}
	return ok("net.ipv4.ip_forward is 1")
}

// wantPidMax is what scripts/setup.sh sets: a sandbox holds about nine
// tasks idle, more while commands run.
const wantPidMax = 4194304

func checkPidMax(*Options) Finding {
	v, err := readTrim(filepath.Join(procRoot, "sys/kernel/pid_max"))
	if err != nil {
		return warn(fmt.Sprintf("kernel.pid_max: %v", err), "")
	}
	n, _ := strconv.Atoi(v)
	if n < wantPidMax {
		return warn(fmt.Sprintf("kernel.pid_max is %d: an idle sandbox holds about 9 tasks, so a few thousand sandboxes use it up", n),
			fmt.Sprintf("sysctl -w kernel.pid_max=%d (scripts/setup.sh does)", wantPidMax))
	}
	return ok("kernel.pid_max is " + v)
}

func checkDiskPool(o *Options) Finding {
	if !o.DiskQuota {
		return ok("not needed: --disk-quota=false (sandbox disks are not limited)")
	}
	if !filesystems()["btrfs"] && !moduleExists("btrfs") {
		return fail("the kernel has no btrfs: the sandbox disk pool is a btrfs image",
			"use a kernel with CONFIG_BTRFS_FS, or serve with --disk-quota=false")
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return fail("no /dev/loop-control: the disk pool's image is attached as a loop device",
			"load the loop module (modprobe loop), or serve with --disk-quota=false")
	}
	img := layout.DataDir{Root: o.DataDir}.SandboxImage()
	if st, err := os.Stat(img); err == nil {
		return ok(fmt.Sprintf("%s (%d GiB apparent)", img, st.Size()>>30))
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		return fail(fmt.Sprintf("%s does not exist yet and mkfs.btrfs, which makes it, is not on PATH", img),
			"install btrfs-progs (apt-get install btrfs-progs; scripts/setup.sh does), or serve with --disk-quota=false")
	}
	return ok(img + " does not exist yet; serve makes it with mkfs.btrfs")
}

// minCRIU is the oldest CRIU that works on current kernels (3.17 fails on
// ≥ 6.13's vDSO, 4.1 on ≥ 6.16's sockets).
var minCRIU = [2]int{4, 2}

// criuVersion parses `criu --version` ("Version: 4.2\n...").
func criuVersion(out string) (major, minor int, err error) {
	m := regexp.MustCompile(`Version:\s*(\d+)\.(\d+)`).FindStringSubmatch(out)
	if m == nil {
		return 0, 0, fmt.Errorf("no version in %q", firstLine(out))
	}
	major, _ = strconv.Atoi(m[1])
	minor, _ = strconv.Atoi(m[2])
	return major, minor, nil
}

const criuFix = "run scripts/setup.sh, which builds CRIU 4.2 from source (Debian's 3.17 and 4.1 fail on kernels of 6.13 and 6.16 on)"

func checkCRIU(*Options) Finding {
	path, err := exec.LookPath("criu")
	if err != nil {
		return warn("criu is not on PATH: pause with memory, memory snapshots and fork are refused (pause keeps the disk only)", criuFix)
	}
	out, err := exec.Command(path, "--version").CombinedOutput()
	if err != nil {
		return warn(fmt.Sprintf("%s --version: %v", path, err), criuFix)
	}
	major, minor, err := criuVersion(string(out))
	if err != nil {
		return warn(fmt.Sprintf("%s: %v", path, err), criuFix)
	}
	if major < minCRIU[0] || (major == minCRIU[0] && minor < minCRIU[1]) {
		return warn(fmt.Sprintf("%s is CRIU %d.%d: it fails on this kernel generation, so pauses with memory fail", path, major, minor), criuFix)
	}
	if err := linux.CRIUAvailable(); err != nil {
		return warn(firstLine(err.Error()), "see `criu check --all` for what the kernel lacks")
	}
	return ok(fmt.Sprintf("%s is CRIU %d.%d and `criu check` passes", path, major, minor))
}

func checkGVisor(o *Options) Finding {
	path, err := gvisor.Find()
	if err != nil {
		if o.Runtime == "gvisor" {
			return fail(fmt.Sprintf("--runtime gvisor, but runsc is not found: %v", err), "install gVisor's runsc (scripts/setup.sh does)")
		}
		return warn("runsc not found: templates that ask for the gvisor runtime fail to start", "install gVisor's runsc (scripts/setup.sh does)")
	}
	return ok("runsc at " + path)
}

func checkLXCFS(*Options) Finding {
	path, err := exec.LookPath("lxcfs")
	if err != nil {
		return warn("lxcfs is not on PATH: sandboxes see the host's CPUs and memory in /proc, not their limits",
			"apt-get install lxcfs (scripts/setup.sh does)")
	}
	return ok("lxcfs at " + path)
}

// existingAncestor is dir or its nearest ancestor that exists.
func existingAncestor(dir string) string {
	for {
		if _, err := os.Stat(dir); err == nil || dir == "/" || dir == "." {
			return dir
		}
		dir = filepath.Dir(dir)
	}
}

// serving reports whether a server holds the data dir's lock.
func serving(dataDir string) bool {
	f, err := os.Open(layout.DataDir{Root: dataDir}.ServeLock())
	if err != nil {
		return false
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return errors.Is(err, unix.EWOULDBLOCK)
	}
	_ = unix.Flock(int(f.Fd()), unix.LOCK_UN)
	return false
}

func checkDataDir(o *Options) Finding {
	dir := o.DataDir
	st, err := os.Stat(dir)
	if errors.Is(err, os.ErrNotExist) {
		parent := existingAncestor(dir)
		if err := unix.Access(parent, unix.W_OK); err != nil {
			return fail(fmt.Sprintf("%s does not exist and %s is not writable", dir, parent), "create it, or pass a different --data-dir")
		}
		return ok(dir + " does not exist yet; serve creates it")
	}
	if err != nil {
		return fail(fmt.Sprintf("%s: %v", dir, err), "")
	}
	if !st.IsDir() {
		return fail(dir+" is not a directory", "pass a different --data-dir")
	}
	if mode := st.Mode().Perm(); mode&0o022 != 0 {
		return fail(fmt.Sprintf("%s is writable by group or others (mode %04o): they could replace templates, keys and state", dir, mode),
			"chmod go-w "+dir)
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok && sys.Uid != 0 {
		return warn(fmt.Sprintf("%s belongs to uid %d, not root: that user can change templates, keys and state", dir, sys.Uid), "chown root "+dir)
	}
	f, err := os.CreateTemp(dir, ".doctor-*")
	if err != nil {
		return fail(fmt.Sprintf("cannot write in %s: %v", dir, err), "make it writable by root, or pass a different --data-dir")
	}
	f.Close()
	os.Remove(f.Name())
	if serving(dir) {
		return ok(dir + " (a server is running on it now)")
	}
	return ok(dir)
}

func checkDiskSpace(o *Options) Finding {
	dir := existingAncestor(o.DataDir)
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return warn(fmt.Sprintf("%s: %v", dir, err), "")
	}
	free := int64(st.Bavail) * st.Bsize
	detail := fmt.Sprintf("%.1f GiB free at %s", float64(free)/(1<<30), dir)
	switch {
	case free < 2<<30:
		return fail(detail+": the built-in templates alone take about 2 GiB", "free space there, or pass a --data-dir on a larger filesystem")
	case free < 10<<30:
		return warn(detail+": templates and sandbox disks fill that quickly", "free space there, or pass a --data-dir on a larger filesystem")
	}
	return ok(detail)
}

func checkMemory(*Options) Finding {
	avail, err := sandbox.HostMeminfo("MemAvailable")
	if err != nil {
		return warn(err.Error(), "")
	}
	total, _ := sandbox.HostMeminfo("MemTotal")
	detail := fmt.Sprintf("%.1f GiB available of %.1f GiB", float64(avail)/(1<<30), float64(total)/(1<<30))
	switch {
	case avail < 512<<20:
		return fail(detail+": a template build alone needs more", "free memory, or add some")
	case avail < 2<<30:
		return warn(detail+": an idle sandbox takes about 5 MiB, a busy one up to its memory limit (512 MiB by default)", "free memory, or add some")
	}
	return ok(detail)
}

func checkPorts(o *Options) Finding {
	type port struct{ flag, addr string }
	ports := []port{{"--api-addr", o.APIAddr}, {"--sandbox-addr", o.SandboxAddr}, {"--metrics-addr", o.MetricsAddr}}
	if o.Domain != "" {
		ports = append(ports, port{"--tls-listen", o.TLSListen})
	}
	var free []string
	for _, p := range ports {
		if p.addr == "" {
			continue
		}
		l, err := net.Listen("tcp", p.addr)
		if err == nil {
			l.Close()
			free = append(free, p.addr)
			continue
		}
		if errors.Is(err, unix.EADDRINUSE) {
			if serving(o.DataDir) {
				return warn(fmt.Sprintf("%s (%s) is in use; a server is running on this data dir and likely holds it", p.addr, p.flag),
					"stop that server before starting another, or pass a different "+p.flag)
			}
			return fail(fmt.Sprintf("%s (%s) is in use by another process", p.addr, p.flag),
				"stop it (ss -ltnp shows which), or pass a different "+p.flag)
		}
		return fail(fmt.Sprintf("cannot listen on %s (%s): %v", p.addr, p.flag, err), "pass a different "+p.flag)
	}
	return ok("free: " + strings.Join(free, ", "))
}

// clockSlack is how far in the future a file of the data dir may be before
// the clock is said to have gone back.
const clockSlack = 2 * time.Minute

func checkClock(o *Options) Finding {
	now := time.Now()
	db := layout.DataDir{Root: o.DataDir}.DB()
	for _, p := range []string{db, db + "-wal"} {
		if st, err := os.Stat(p); err == nil && st.ModTime().After(now.Add(clockSlack)) {
			return warn(fmt.Sprintf("the clock went back: %s was written at %s, %s from now", p,
				st.ModTime().UTC().Format(time.RFC3339), st.ModTime().Sub(now).Round(time.Second)),
				"set the clock right (timedatectl set-ntp true): sandbox timeouts, paused-sandbox retention and certificates go by it")
		}
	}
	var tx unix.Timex
	state, err := unix.Adjtimex(&tx)
	if err == nil && (state == unix.TIME_ERROR || tx.Status&unix.STA_UNSYNC != 0) {
		return warn("the clock is not synchronised (NTP)",
			"timedatectl set-ntp true, or run chrony or ntpd: sandbox timeouts and certificates go by the clock")
	}
	return ok("synchronised; nothing in the data dir is from the future")
}
