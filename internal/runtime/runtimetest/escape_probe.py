# Escape probe: run as root, as the first process of a sandbox, by the
# conformance suite (escape.go). It tries escapes from inside and records what
# happened in /out/escape.json; the suite decides what counts as a failure.
#
# Every attempt is harmless if it unexpectedly succeeds: raw syscalls get
# invalid or no-op arguments and run in a forked child, nothing is ever
# written to /proc or /sys (writability is read from mount flags, or from
# open(O_WRONLY) without a write), and sizes are bounded.
import ctypes
import errno
import json
import os
import platform
import resource
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

NR = {
    "x86_64": dict(
        read=0, bpf=321, perf_event_open=298, keyctl=250, add_key=248, request_key=249,
        kexec_load=246, kexec_file_load=320, init_module=175, finit_module=313,
        delete_module=176, open_by_handle_at=304, name_to_handle_at=303, setns=308,
        unshare=272, clone=56, clone3=435, mount=165, umount2=166, pivot_root=155,
        fsopen=430, open_tree=428, move_mount=429, mount_setattr=442,
        io_uring_setup=425, userfaultfd=323, iopl=172, ioperm=173, swapon=167,
        syslog=103, acct=163, settimeofday=164, clock_settime=227, quotactl=179,
        chroot=161, socket=41,
    ),
    "aarch64": dict(
        read=63, bpf=280, perf_event_open=241, keyctl=219, add_key=217, request_key=218,
        kexec_load=104, kexec_file_load=294, init_module=105, finit_module=273,
        delete_module=106, open_by_handle_at=265, name_to_handle_at=264, setns=268,
        unshare=97, clone=220, clone3=435, mount=40, umount2=39, pivot_root=41,
        fsopen=430, open_tree=428, move_mount=429, mount_setattr=442,
        io_uring_setup=425, userfaultfd=282, swapon=224, syslog=116, acct=89,
        settimeofday=170, clock_settime=112, quotactl=60, chroot=51, socket=198,
    ),
}[platform.machine()]

CLONE_NEWNS, CLONE_NEWUSER, SIGCHLD = 0x00020000, 0x10000000, 17
NULL = None
out = {}


def ename(e):
    return errno.errorcode.get(e, str(e))


def carg(a):
    if a is None:
        return ctypes.c_void_p(None)
    if isinstance(a, bytes):
        return ctypes.c_char_p(a)
    return ctypes.c_long(a)


def in_child(fn):
    """Runs fn in a forked child and returns the string it produced."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            res = fn()
        except OSError as e:
            res = ename(e.errno)
        except Exception as e:  # noqa: BLE001 - reported, never raised
            res = "error: %r" % (e,)
        os.write(w, res.encode()[:200])
        os._exit(0)
    os.close(w)
    res = os.read(r, 256).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return res or "killed"


def raw(name, *args):
    if name not in NR:
        return "absent"

    def call():
        ctypes.set_errno(0)
        ret = libc.syscall(ctypes.c_long(NR[name]), *[carg(a) for a in args])
        if ret == -1:
            return ename(ctypes.get_errno())
        if name == "clone":
            if ret == 0:  # the clone itself: leave at once
                os._exit(0)
            os.waitpid(ret, 0)
        return "ok"

    return in_child(call)


def record(key, fn):
    try:
        out[key] = fn()
    except OSError as e:
        out[key] = ename(e.errno)
    except Exception as e:  # noqa: BLE001
        out[key] = "error: %r" % (e,)


# Control: the errno plumbing works (read(-1) is EBADF, not a denial).
out["sys:control-read"] = raw("read", -1, NULL, 0)

# Syscalls that must be refused. Arguments are invalid or no-ops, so the
# kernel itself would answer EFAULT/EINVAL/ENOENT/... (or do nothing) if the
# call got through; EPERM/ENOSYS means a layer of ours refused it.
ns_fd = os.open("/proc/self/ns/user", os.O_RDONLY)
syscalls = {
    "bpf": ("bpf", 9999, NULL, 0),
    "perf_event_open": ("perf_event_open", NULL, 0, -1, -1, 0),
    "keyctl": ("keyctl", 0x7FFF, 0, 0, 0, 0),
    "add_key": ("add_key", NULL, NULL, NULL, 0, 0),
    "request_key": ("request_key", NULL, NULL, NULL, 0),
    "kexec_load": ("kexec_load", 0, 0, NULL, 0),
    "kexec_file_load": ("kexec_file_load", -1, -1, 0, NULL, 0),
    "init_module": ("init_module", NULL, 0, b""),
    "finit_module": ("finit_module", -1, b"", 0),
    "delete_module": ("delete_module", b"airlock_no_such_module", 0),
    "open_by_handle_at": ("open_by_handle_at", -1, NULL, 0),
    "name_to_handle_at": ("name_to_handle_at", -100, b"/", NULL, NULL, 0),
    # setns into our own user namespace: EINVAL from the kernel, no-op at worst.
    "setns": ("setns", ns_fd, 0),
    "unshare-user": ("unshare", CLONE_NEWUSER),
    "unshare-mount": ("unshare", CLONE_NEWNS),
    "clone-newuser": ("clone", CLONE_NEWUSER | SIGCHLD, 0, NULL, NULL, 0),
    "clone3": ("clone3", NULL, 0),
    "mount-syscall": ("mount", b"none", b"/tmp", b"tmpfs", 0, NULL),
    "umount2": ("umount2", b"/airlock-no-such-mount", 0),
    "pivot_root": ("pivot_root", b"/airlock-no-such-dir", b"/airlock-no-such-dir"),
    "fsopen": ("fsopen", b"tmpfs", 0),
    # open_tree without OPEN_TREE_CLONE only returns an O_PATH fd.
    "open_tree": ("open_tree", -100, b"/", 0),
    "move_mount": ("move_mount", -1, b"", -1, b"", 0),
    "mount_setattr": ("mount_setattr", -1, b"", 0, NULL, 0),
    "io_uring_setup": ("io_uring_setup", 0, NULL),
    # UFFD_USER_MODE_ONLY: what the kernel allows unprivileged users.
    "userfaultfd": ("userfaultfd", 1),
    # iopl(0) and ioperm(0, 0, 0) only lower privileges.
    "iopl": ("iopl", 0),
    "ioperm": ("ioperm", 0, 0, 0),
    "swapon": ("swapon", NULL, 0),
    # SYSLOG_ACTION_SIZE_BUFFER only reads the size.
    "syslog": ("syslog", 10, NULL, 0),
    "acct": ("acct", 1),
    "settimeofday": ("settimeofday", NULL, NULL),
    "clock_settime": ("clock_settime", 0, NULL),
    # Q_GETFMT on a path that does not exist.
    "quotactl": ("quotactl", 0x800004 << 8 | 0, b"/airlock-no-such-dev", 0, NULL),
    "socket-vsock": ("socket", 40, 1, 0),
}
for key, (name, *args) in syscalls.items():
    out["sys:" + key] = raw(name, *args)
os.close(ns_fd)


# Mounting filesystems the ordinary way (all refused without CAP_SYS_ADMIN).
def try_mount(src, fstype, flags=0):
    def fn():
        os.makedirs("/tmp/airlock-mnt", exist_ok=True)
        ctypes.set_errno(0)
        if libc.mount(src, b"/tmp/airlock-mnt", fstype, ctypes.c_ulong(flags), None) != 0:
            return ename(ctypes.get_errno())
        libc.umount2(b"/tmp/airlock-mnt", 2)
        return "ok"
    return in_child(fn)


out["mount:proc"] = try_mount(b"proc", b"proc")
out["mount:sysfs"] = try_mount(b"sysfs", b"sysfs")
out["mount:tmpfs"] = try_mount(b"tmpfs", b"tmpfs")


# Device nodes: a loop block device and /dev/kvm; if creating one worked,
# opening it must still fail (devices cgroup), and so must mounting it.
def mknod_and_open(path, mode, major, minor, mount_it):
    def fn():
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        try:
            os.mknod(path, mode | 0o600, os.makedev(major, minor))
        except OSError as e:
            return "mknod " + ename(e.errno)
        res = "mknod ok"
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            os.close(fd)
            res += ", open ok"
        except OSError as e:
            res += ", open " + ename(e.errno)
        if mount_it:
            os.makedirs("/tmp/airlock-mnt", exist_ok=True)
            ctypes.set_errno(0)
            if libc.mount(path.encode(), b"/tmp/airlock-mnt", b"ext4", ctypes.c_ulong(1), None) != 0:
                res += ", mount " + ename(ctypes.get_errno())
            else:
                libc.umount2(b"/tmp/airlock-mnt", 2)
                res += ", mount ok"
        os.unlink(path)
        return res
    return in_child(fn)


out["mknod:block"] = mknod_and_open("/tmp/airlock-blk", 0o060000, 7, 0, True)
out["mknod:kvm"] = mknod_and_open("/tmp/airlock-kvm", 0o020000, 10, 232, False)


def open_ro(path):
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    os.close(fd)
    return "ok"


record("open:/dev/kvm", lambda: open_ro("/dev/kvm"))


# Writability of kernel interfaces, from mount flags and from open(O_WRONLY)
# without any write. domainname is per UTS namespace, so even a successful
# open of it could not matter to the host.
def ro(path):
    if not os.path.exists(path):
        return "missing"
    return "ro" if os.statvfs(path).f_flag & os.ST_RDONLY else "rw"


for p in ["/proc/sys", "/proc/sys/kernel", "/proc/sysrq-trigger", "/proc/irq", "/proc/bus", "/sys", "/sys/kernel"]:
    record("ro:" + p, lambda p=p: ro(p))


def open_w(path):
    fd = os.open(path, os.O_WRONLY)
    os.close(fd)
    return "ok"


for p in ["/proc/sys/kernel/domainname", "/sys/kernel/mm/transparent_hugepage/enabled", "/sys/power/state"]:
    if os.path.exists(p):
        record("open-w:" + p, lambda p=p: open_w(p))


# Masked paths: present but empty, or absent.
def read16(path):
    if not os.path.exists(path):
        return "missing"
    with open(path, "rb") as f:
        return "%d bytes" % len(f.read(16))


for p in ["/proc/kcore", "/proc/keys", "/proc/timer_list", "/proc/sched_debug", "/proc/interrupts"]:
    record("read:" + p, lambda p=p: read16(p))


def count(path):
    if not os.path.exists(path):
        return "missing"
    return "%d entries" % len(os.listdir(path))


record("ls:/sys/firmware", lambda: count("/sys/firmware"))

# Identity and confinement of this process.
with open("/proc/self/status") as f:
    for line in f:
        k, _, v = line.partition(":")
        if k in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "Seccomp", "NoNewPrivs", "Uid", "Gid"):
            out["status:" + k] = v.strip()
for name, res in (("nofile", resource.RLIMIT_NOFILE), ("core", resource.RLIMIT_CORE)):
    out["rlimit:" + name] = "%d %d" % resource.getrlimit(res)
for m in ("uid_map", "gid_map"):
    with open("/proc/self/" + m) as f:
        out[m] = " | ".join(" ".join(line.split()) for line in f if line.strip())

# /dev: every entry with its kind (and numbers for devices).
for name in sorted(os.listdir("/dev")):
    st = os.lstat("/dev/" + name)
    if os.path.islink("/dev/" + name):
        kind = "link"
    elif st.st_mode & 0o170000 == 0o060000:
        kind = "block %d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
    elif st.st_mode & 0o170000 == 0o020000:
        kind = "char %d:%d" % (os.major(st.st_rdev), os.minor(st.st_rdev))
    elif os.path.isdir("/dev/" + name):
        kind = "dir"
    else:
        kind = "file"
    out["dev:" + name] = kind


# Processes: the host's marker process must be invisible; our own marker
# child must be visible (the control that shows the scan works).
def cmdlines():
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open("/proc/%s/cmdline" % pid, "rb") as f:
                    found.append(f.read(4096))
            except OSError:
                pass
    return found


child = os.fork()
if child == 0:
    os.execv("/bin/sleep", ["airlock-self-marker", "1000"])
time.sleep(0.2)
host_marker, self_marker = os.environ["HOST_MARKER"].encode(), b"airlock-self-marker"
lines = cmdlines()
out["proc:host-marker"] = "visible" if any(host_marker in c for c in lines) else "hidden"
out["proc:self-marker"] = "visible" if any(self_marker in c for c in lines) else "hidden"
os.kill(child, 9)
os.waitpid(child, 0)

# A host file: directly, and after the classic chroot escape (chroot into a
# subdirectory, chdir .. many times, chroot "."), if chroot is allowed at all.
host_file = os.environ["HOST_FILE"]
out["file:host-marker"] = "visible" if os.path.exists(host_file) else "hidden"


def chroot_escape():
    os.makedirs("/tmp/airlock-jail", exist_ok=True)
    os.chroot("/tmp/airlock-jail")
    for _ in range(64):
        os.chdir("..")
    os.chroot(".")
    return "escaped" if os.path.exists(host_file) else "chrooted, host file hidden"


out["chroot"] = in_child(chroot_escape)

with open("/out/escape.json.tmp", "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
os.rename("/out/escape.json.tmp", "/out/escape.json")
open("/out/done", "w").close()
while True:
    time.sleep(1000)
