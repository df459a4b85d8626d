#!/usr/bin/env bash
# The whole test suite: static checks, Go unit and integration tests (real
# sandboxes, runtime conformance, leak test), then the SDK conformance suite
# with the official npm `e2b` package against a real `airlock serve`.
# Templates are cached in $AIRLOCK_TEST_DATA_DIR (outside the clone), so only
# the first run on a machine pays for debootstrap.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
export AIRLOCK_TEST_DATA_DIR="${AIRLOCK_TEST_DATA_DIR:-/var/lib/airlock-test}"
export AIRLOCK_TEST_REQUIRE=1   # a test that lacks root or a template fails, never skips
export AIRLOCK_ENVD="$PWD/bin/envd"
# Tests that kill the server (kill -9, crash points) start this binary as a child.
export AIRLOCK_BIN="$PWD/bin/airlock"
# The linux runtime compiles only with seccomp support (cgo + libseccomp):
# every go command below (vet, test, fuzz) gets the tag.
export GOFLAGS="$(go env GOFLAGS) -tags=seccomp"

step() { printf '\n==> %s\n' "$*"; }

step "gofmt and go vet"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed:"; echo "$unformatted"; exit 1; fi
go vet ./...

step "dashboard front-end: type-checked, built, and the same as the committed build"
# The binary embeds internal/dashboard/dist, committed so that building Airlock
# needs no Node.js; a change under web/dashboard/src without its build fails here.
(cd web/dashboard && npm ci --no-audit --no-fund && npm run build)
if ! git diff --quiet --exit-code -- internal/dashboard/dist || [ -n "$(git ls-files --others --exclude-standard internal/dashboard/dist)" ]; then
	git status --short -- internal/dashboard/dist
	echo "internal/dashboard/dist differs from a fresh build of web/dashboard: run npm run build there and commit dist"
	exit 1
fi

step "built-in templates (layers cached in $AIRLOCK_TEST_DATA_DIR)"
# The first run on a machine builds them (debootstrap, then apt in build sandboxes,
# several minutes); later runs find every layer in the cache.
for t in base python3 node code-interpreter-v1 mcp-gateway; do
	bin/airlock template build "$t" --data-dir "$AIRLOCK_TEST_DATA_DIR"
done

step "Go tests"
# Fuzz targets run over their seed corpus here; bounded fuzzing is below. The
# Kubernetes packages run in their own step, with the cluster they need.
go test -count=1 -timeout 20m $(go list ./... | grep -v '/internal/kube\|/internal/nodeagent')

step "Kubernetes: a single-node cluster (scripts/kube-stack.sh), its tests and the SDK suite against it, then its teardown"
# The cluster lives only for this step: the kubelet changes kernel settings,
# which `down` puts back, and `down` fails on anything the stack left behind.
trap 'scripts/kube-stack.sh down' EXIT
scripts/kube-stack.sh up
AIRLOCK_KUBECONFIG=$(scripts/kube-stack.sh kubeconfig) AIRLOCK_KUBE_DIR=$(scripts/kube-stack.sh dir) \
	go test -count=1 -timeout 15m ./internal/kube/... ./internal/nodeagent/...
# The SDK conformance suite (npm e2b, @e2b/code-interpreter) against two
# replicas of serve --backend kubernetes over one PostgreSQL, then the
# replica-kill test.
KUBECONFIG=$(scripts/kube-stack.sh kubeconfig) AIRLOCK_DATA_DIR="$AIRLOCK_TEST_DATA_DIR" tests/sdk/run-kube.sh bin/airlock
trap - EXIT
scripts/kube-stack.sh down

step "sandbox proxy tear-down tests under the race detector"
# Real sandboxes killed mid-stream, mid-upload, mid-download and under
# concurrent requests; each test fails on a panic in the proxy's server log.
go test -race -count=1 -timeout 5m -run '^(TestProxy|TestConnectTail)' ./internal/proxy

step "first-run test, started in the background"
# serve with default flags on an EMPTY data dir (a new user's `make run`): a create
# during the background build answers 503 + Retry-After, then the MCP scenario
# through the official client and the inspector CLI (tests/sdk/firstrun.sh). It
# builds every built-in from Debian's mirror (several minutes, mostly download and
# dpkg), so it overlaps the fuzzing below, which is pure CPU in this process with
# no sandboxes, network or timing to disturb; its own timeouts are generous.
firstrun_log=$(mktemp "${TMPDIR:-/tmp}/airlock-firstrun.XXXXXX.log")
tests/sdk/firstrun.sh bin/airlock >"$firstrun_log" 2>&1 &
firstrun_pid=$!
# A step below that fails ends this script: stop the first-run test with it (its
# own trap stops its server and cleans up).
trap 'kill -TERM "$firstrun_pid" 2>/dev/null && wait "$firstrun_pid"' EXIT
echo "pid $firstrun_pid, log $firstrun_log"

step "bounded fuzzing"
# One target per `go test -fuzz` call, bounded by a count of executions, not a
# duration: with a duration, Go < 1.27's fuzz coordinator can report its own
# deadline as a failure ("context deadline exceeded", no crasher; golang/go#75804),
# which a loaded 2-core machine hits. Counts are sized to ~5-10 s each here, so the
# step stays near a minute and a half. FUZZ_SCALE multiplies them.
fuzz() { go test -run '^$' -fuzz "^$1\$" -fuzztime "$(($3 * ${FUZZ_SCALE:-1}))x" "$2"; }
fuzz FuzzCreateBody ./internal/e2b 20000
fuzz FuzzListQuery ./internal/e2b 20000
fuzz FuzzResolvePath ./internal/envd 50000
fuzz FuzzPartFileName ./internal/envd 50000
fuzz FuzzServeMessage ./internal/netpolicy/dnsfilter 50000
fuzz FuzzUpstreamAnswer ./internal/netpolicy/dnsfilter 50000
fuzz FuzzTemplatePath ./internal/e2b 20000
fuzz FuzzParse ./internal/dockerfile 10000
fuzz FuzzExtract ./internal/buildcontext 5000
fuzz FuzzVolumePath ./internal/volumecontent 20000

step "first-run test (waiting for it to finish)"
trap - EXIT
if wait "$firstrun_pid"; then
	grep -E '^\[firstrun\]|^✔|^✖|waited with|All templates are ready' "$firstrun_log"
else
	cat "$firstrun_log"
	echo "first-run test failed (log: $firstrun_log)"
	exit 1
fi

step "SDK conformance (npm e2b against airlock serve)"
AIRLOCK_DATA_DIR="$AIRLOCK_TEST_DATA_DIR" tests/sdk/run.sh bin/airlock
