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

# debootstrap: template rootfs builds; runc, libseccomp-dev: the libcontainer runtime
# (cgo, seccomp tag); nftables, iptables, iproute2: sandbox networking; uidmap: user
# namespaces; make, gcc: the build itself;
# debian-archive-keyring: debootstrap verifies the mirror's Release file with it;
# btrfs-progs: mkfs.btrfs for the sandbox disk image (per-sandbox disk quotas);
# lxcfs: /proc/meminfo, cpuinfo, stat... inside a sandbox show its own limits (the
# linux runtime starts it when no lxcfs serves /var/lib/lxcfs; internal/lxcfs).
PACKAGES=(
	debootstrap runc nftables iptables iproute2 libseccomp-dev uidmap
	ca-certificates make gcc debian-archive-keyring btrfs-progs lxcfs
)

SETUP_NAME=setup
. scripts/lib.sh

need_root "it installs packages and sets sysctls"

step "system packages"
install_missing "${PACKAGES[@]}"

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

step "done"
