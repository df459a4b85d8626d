#!/usr/bin/env bash
# Prepares a Debian 12 machine to build and run Airlock: system packages, the Go
# toolchain check, Go modules, and kernel limits. Run as root. Safe to re-run: it only
# installs what is missing, so a second run takes a second or two. It starts nothing
# and builds no templates (`airlock serve` and `airlock template build` do that).
# Only what serving needs is here (`make run`); what the tests need besides
# (host Python packages, Node.js, gVisor's runsc) is scripts/setup-test.sh (`make test`).
set -euo pipefail
cd "$(dirname "$0")/.."

GO_MIN_MAJOR=1
GO_MIN_MINOR=26
PID_MAX=4194304
CRIU_MIN=4.2

# debootstrap: template rootfs builds; runc, libseccomp-dev: the libcontainer runtime
# (cgo, seccomp tag); nftables, iptables, iproute2: sandbox networking; uidmap: user
# namespaces; make, gcc: the build itself; libc6-dev: its static libc, which envd links
# (cmd/envd/pid1.c);
# debian-archive-keyring: debootstrap verifies the mirror's Release file with it;
# btrfs-progs: mkfs.btrfs for the sandbox disk image (per-sandbox disk quotas);
# lxcfs: /proc/meminfo, cpuinfo, stat... inside a sandbox show its own limits (the
# linux runtime starts it when no lxcfs serves /var/lib/lxcfs; internal/lxcfs);
# libnss-myhostname: *.localhost resolves to loopback, so serve --domain
# airlock.localhost (make run's default) needs no DNS set-up.
PACKAGES=(
	debootstrap runc nftables iptables iproute2 libseccomp-dev uidmap
	ca-certificates make gcc libc6-dev debian-archive-keyring btrfs-progs lxcfs libnss-myhostname
)

SETUP_NAME=setup
. scripts/lib.sh

need_root "it installs packages and sets sysctls"

step "system packages"
install_missing "${PACKAGES[@]}"

step "*.localhost resolves to loopback (serve --domain airlock.localhost)"
# The package's postinst adds "myhostname" to nsswitch.conf's hosts line; a
# hand-edited nsswitch.conf may have kept it out.
if getent hosts 8000-check.airlock.localhost >/dev/null; then
	echo "8000-check.airlock.localhost -> $(getent ahostsv4 8000-check.airlock.localhost | awk 'NR==1{print $1}')"
else
	echo "warning: *.localhost names do not resolve; add myhostname to the hosts line of /etc/nsswitch.conf (e.g. 'hosts: files myhostname dns') for serve --domain airlock.localhost" >&2
fi

step "Go toolchain (>= ${GO_MIN_MAJOR}.${GO_MIN_MINOR})"
GO=""
if [ -x /usr/local/go/bin/go ]; then
	GO=/usr/local/go/bin/go
elif command -v go >/dev/null 2>&1; then
	GO=$(command -v go)
fi
if [ -z "$GO" ]; then
	die "Go not found at /usr/local/go/bin/go or on PATH; install Go >= ${GO_MIN_MAJOR}.${GO_MIN_MINOR} from https://go.dev/dl/ into /usr/local/go"
fi
version=$("$GO" env GOVERSION) # e.g. go1.26.8
if [[ ! "$version" =~ ^go([0-9]+)\.([0-9]+) ]]; then
	die "$GO reports an unrecognised version '$version'; need Go >= ${GO_MIN_MAJOR}.${GO_MIN_MINOR}"
fi
major=${BASH_REMATCH[1]}
minor=${BASH_REMATCH[2]}
if [ "$major" -lt "$GO_MIN_MAJOR" ] || { [ "$major" -eq "$GO_MIN_MAJOR" ] && [ "$minor" -lt "$GO_MIN_MINOR" ]; }; then
	die "$GO is $version; need Go >= ${GO_MIN_MAJOR}.${GO_MIN_MINOR} (install it into /usr/local/go)"
fi
echo "$GO ($version)"

step "Go modules"
"$GO" mod download
echo "modules downloaded"

step "kernel.pid_max (>= ${PID_MAX})"
# The default 32768 caps a host at a few thousand sandboxes (each agent runs several
# threads). Not fatal: inside some containers the sysctl is read-only.
current=$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo 0)
if [ "$current" -ge "$PID_MAX" ]; then
	echo "kernel.pid_max is $current"
elif sysctl -q -w kernel.pid_max="$PID_MAX"; then
	echo "kernel.pid_max raised from $current to $PID_MAX"
else
	echo "warning: could not raise kernel.pid_max from $current (sandbox density will be limited)" >&2
fi

step "CRIU >= ${CRIU_MIN} (pause to disk, snapshots and fork on the linux runtime)"
# Debian bookworm's criu 3.17 dies at start on kernels >= 6.13 (vDSO layout) and
# trixie's 4.1 cannot dump a TCP socket on >= 6.16; 4.2 (forky) works. It lives in
# its own side root (/opt/criu-root) so its newer libc never touches the host's, and
# a wrapper named `criu` on PATH runs it with that root's loader (libcontainer execs
# plain `criu`). See ../shared/notes/isolation.md.
criu_ok() {
	command -v criu >/dev/null 2>&1 || return 1
	local v
	v=$(criu --version 2>/dev/null | awk '/^Version:/{print $2}')
	[ -n "$v" ] && [ "$(printf '%s\n%s\n' "$CRIU_MIN" "$v" | sort -V | head -1)" = "$CRIU_MIN" ]
}
if criu_ok; then
	echo "criu $(criu --version | awk '/^Version:/{print $2}') at $(command -v criu)"
else
	mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
	[ -n "$mirror" ] || mirror=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list 2>/dev/null || true)
	[ -n "$mirror" ] || die "cannot find the Debian mirror in /etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list"
	root=/opt/criu-root
	if [ ! -x "$root/usr/bin/apt-get" ]; then
		rm -rf "$root.tmp"
		echo "debootstrap trixie into $root (a minute or two)"
		debootstrap --variant=minbase trixie "$root.tmp" "$mirror"
		mv "$root.tmp" "$root"
	fi
	echo "deb $mirror forky main" >"$root/etc/apt/sources.list.d/forky.list"
	mountpoint -q "$root/proc" || mount -t proc proc "$root/proc"
	# The mirror's forky Release file may be past its Valid-Until.
	chroot "$root" apt-get -o Acquire::Check-Valid-Until=false update
	chroot "$root" env DEBIAN_FRONTEND=noninteractive apt-get -o Acquire::Check-Valid-Until=false install -y --no-install-recommends -t forky criu
	umount "$root/proc"
	cat >/usr/local/sbin/criu <<'WRAP'
#!/bin/sh
# CRIU from Debian forky, run with its own side root's loader and libraries.
R=/opt/criu-root
exec $R/lib64/ld-linux-x86-64.so.2 --library-path $R/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu $R/usr/sbin/criu "$@"
WRAP
	chmod 0755 /usr/local/sbin/criu
	criu_ok || die "criu at /usr/local/sbin/criu is not >= ${CRIU_MIN}: $(criu --version 2>&1 | tr '\n' ' ')"
	echo "criu $(criu --version | awk '/^Version:/{print $2}') installed"
fi
criu check || die "criu check failed: pause to disk cannot work on this kernel"

step "done"
