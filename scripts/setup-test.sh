#!/usr/bin/env bash
# What the test suite needs beyond serving (scripts/setup.sh, which `make test` runs
# first): the host Python packages the code interpreter's backend tests use, Node.js
# and npm for the SDK and MCP client suites, protoc for scripts/gen-proto.sh, and the
# optional gVisor backend (runsc, built from the Go module proxy), which the runtime
# conformance tests cover, and the single-node Kubernetes the Kubernetes backend is
# tested against (scripts/kube-stack.sh build). `make run` does not run this: a server needs none of it.
# Run as root; safe to re-run (it installs only what is missing).
set -euo pipefail
cd "$(dirname "$0")/.."

# gVisor: the go-branch pseudo-version runsc is built from, and where it goes.
RUNSC_VERSION=v0.0.0-20260905035102-160fafc42237
RUNSC=/usr/local/bin/runsc

# The code interpreter's Python backend tests (internal/interp) run Debian's ipykernel,
# matplotlib and pandas on the host's /usr/bin/python3, as code-interpreter-v1 does.
# R's backend tests run Debian's IRkernel (kernelspec "ir"), as code-interpreter-v1 does.
# protobuf-compiler: scripts/gen-proto.sh.
# default-jdk-headless: the java backend's tests compile and run its JShell kernel.
# openssl: the SDK suite's egress tests make a CA and a server certificate with it.
# chromium: the domain tests open a sandbox's page in headless Chromium (npm
# playwright-core drives Debian's build; no browser download).
# postgresql: the store's tests run every test on PostgreSQL too, on a
# throwaway server they start from its binaries (internal/store/pgtest).
PACKAGES=(
	python3-ipykernel python3-matplotlib python3-pandas python3-numpy
	r-base-core r-cran-irkernel
	protobuf-compiler
	default-jdk-headless
	openssl
	chromium
	systemd
	postgresql
)

SETUP_NAME=setup-test
. scripts/lib.sh

need_root "it installs packages"
GO=/usr/local/go/bin/go
[ -x "$GO" ] || GO=$(command -v go) || die "Go not found (run scripts/setup.sh first)"

step "test packages"
install_missing "${PACKAGES[@]}"

step "promtool (Debian's prometheus package; the SDK suite lints the server's metrics with it)"
if command -v promtool >/dev/null 2>&1; then
	promtool --version 2>&1 | head -1
else
	# The package would start a Prometheus server at install: a policy-rc.d
	# that refuses service starts keeps it stopped (unless one is there).
	own_policy=""
	if [ ! -e /usr/sbin/policy-rc.d ]; then
		printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
		chmod 755 /usr/sbin/policy-rc.d
		own_policy=1
	fi
	install_missing prometheus
	[ -n "$own_policy" ] && rm -f /usr/sbin/policy-rc.d
	if command -v systemctl >/dev/null 2>&1; then
		systemctl disable prometheus >/dev/null 2>&1 || true
	fi
	promtool --version 2>&1 | head -1
fi

step "Node.js and npm (for the SDK conformance tests)"
# The SDK tests drive the official npm packages; Debian's nodejs (18) is enough
# when the machine has none.
if command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; then
	echo "node $(node --version), npm $(npm --version)"
else
	export DEBIAN_FRONTEND=noninteractive
	apt-get update
	apt-get install -y --no-install-recommends nodejs npm
	echo "node $(node --version), npm $(npm --version)"
fi

step "gVisor runsc ${RUNSC_VERSION} (the optional \`--runtime gvisor\` backend)"
# Built from the Go module proxy: gVisor publishes no Debian package, and the proxy
# refuses the @go branch query, so the version is a pinned pseudo-version of the go
# branch. The binary goes outside the clone so CI caches it across runs; the version
# stamped in with -X is what `runsc --version` reports, which is how a re-run knows
# the build can be skipped.
have=$("$RUNSC" --version 2>/dev/null | awk 'NR == 1 { print $3 }' || true)
if [ "$have" = "$RUNSC_VERSION" ]; then
	echo "$RUNSC is $have"
else
	echo "building runsc into $RUNSC (3-6 minutes on a cold cache; ${have:-not installed} before)"
	tmpbin=$(mktemp -d)
	log="$tmpbin/build.log"
	n=0
	# go install -v names each package as it is compiled: count them as progress.
	if ! CGO_ENABLED=0 GOBIN="$tmpbin" "$GO" install -v \
		-ldflags "-X gvisor.dev/gvisor/runsc/version.version=$RUNSC_VERSION" \
		"gvisor.dev/gvisor/runsc@$RUNSC_VERSION" 2>&1 | tee "$log" | while read -r _; do
		n=$((n + 1))
		if [ $((n % 50)) -eq 0 ]; then
			echo "  $n packages compiled (${SECONDS}s)"
		fi
	done; then
		tail -n 30 "$log" >&2
		rm -rf "$tmpbin"
		die "runsc build failed (last lines above)"
	fi
	install -m 0755 "$tmpbin/runsc" "$RUNSC"
	rm -rf "$tmpbin"
	echo "installed $("$RUNSC" --version | head -n 1) in ${SECONDS}s"
fi

step "the single-node Kubernetes of the Kubernetes backend's tests (built once into /var/lib/airlock-kube)"
scripts/kube-stack.sh build

step "done"
