# Neighbour probe, run by the conformance suite (escape.go) as the first
# process of two sandboxes. ROLE=owner plants secrets (its environment holds
# AIRLOCK_FAKE_TOKEN; it writes the token to files, keeps a marker process, a
# SysV shm segment and an abstract unix socket) and checks it can see them
# itself (the control). ROLE=seeker gets the token from /out/needle and looks
# for every one of them. Results go to /out/neighbour.json.
import ctypes
import json
import os
import socket
import time

role = os.environ["ROLE"]
libc = ctypes.CDLL(None, use_errno=True)
SHM_KEY = 0x41495201
IPC_CREAT = 0o1000

if role == "owner":
    token = os.environ["AIRLOCK_FAKE_TOKEN"]
else:
    with open("/out/needle") as f:
        token = f.read().strip()
marker = ("airlock-marker-" + token).encode()
tok = token.encode()
out = {}

if role == "owner":
    for p in ("/tmp/airlock-secret", "/dev/shm/airlock-secret", "/root/airlock-secret"):
        with open(p, "w") as f:
            f.write(token)
    if os.fork() == 0:
        os.execv("/bin/sleep", [marker.decode(), "100000"])
    libc.shmget(SHM_KEY, 4096, IPC_CREAT | 0o666)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(b"\0airlock-" + tok)
    listener.listen(1)
    time.sleep(0.2)


def scan_proc():
    env = cmd = False
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        for name in ("environ", "cmdline"):
            try:
                with open("/proc/%s/%s" % (pid, name), "rb") as f:
                    data = f.read(1 << 16)
            except OSError:
                continue
            if name == "environ" and tok in data:
                env = True
            if name == "cmdline" and marker in data:
                cmd = True
    return env, cmd


env, cmd = scan_proc()
out["proc-environ-token"] = "found" if env else "absent"
out["proc-cmdline-marker"] = "found" if cmd else "absent"

# Files where a sandbox can write; at most 1 MiB read from each, 20000 files.
hits, seen = [], 0
for top in ("/tmp", "/dev/shm", "/root", "/home", "/var/tmp", "/run", "/etc"):
    for dirpath, dirs, files in os.walk(top):
        for name in files:
            seen += 1
            if seen > 20000:
                break
            path = os.path.join(dirpath, name)
            try:
                with open(path, "rb") as f:
                    if tok in f.read(1 << 20):
                        hits.append(path)
            except OSError:
                pass
out["file-token"] = ",".join(sorted(hits)) if hits else "absent"

ctypes.set_errno(0)
out["shm"] = "found" if libc.shmget(SHM_KEY, 0, 0) >= 0 else "absent"
try:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(b"\0airlock-" + tok)
    out["abstract-socket"] = "found"
except OSError:
    out["abstract-socket"] = "absent"

with open("/out/neighbour.json.tmp", "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
os.rename("/out/neighbour.json.tmp", "/out/neighbour.json")
open("/out/done", "w").close()
while True:
    time.sleep(1000)
