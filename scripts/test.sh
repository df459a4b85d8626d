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
# The linux runtime compiles only with seccomp support (cgo + libseccomp):
# every go command below (vet, test, fuzz) gets the tag.
export GOFLAGS="$(go env GOFLAGS) -tags=seccomp"

step() { printf '\n==> %s\n' "$*"; }

step "gofmt and go vet"
unformatted=$(gofmt -l $(git ls-files '*.go'))
if [ -n "$unformatted" ]; then echo "gofmt needed:"; echo "$unformatted"; exit 1; fi
go vet ./...

step "built-in templates (layers cached in $AIRLOCK_TEST_DATA_DIR)"
# The first run on a machine builds them (debootstrap, then apt in build sandboxes,
# several minutes); later runs find every layer in the cache.
for t in base python3 node code-interpreter-v1; do
	bin/airlock template build "$t" --data-dir "$AIRLOCK_TEST_DATA_DIR"
done

step "Go tests"
# Fuzz targets run over their seed corpus here; bounded fuzzing is below.
go test -count=1 -timeout 20m ./...

step "sandbox proxy tear-down tests under the race detector"
# Real sandboxes killed mid-stream, mid-upload, mid-download and under
# concurrent requests; each test fails on a panic in the proxy's server log.
go test -race -count=1 -timeout 5m -run '^(TestProxy|TestConnectTail)' ./internal/server

step "bounded fuzzing"
# One target per `go test -fuzz` call; 10 s each keeps the whole step near a minute.
fuzz() { go test -run '^$' -fuzz "^$1\$" -fuzztime "${FUZZTIME:-10s}" "$2"; }
fuzz FuzzCreateBody ./internal/e2b
fuzz FuzzListQuery ./internal/e2b
fuzz FuzzResolvePath ./internal/envd
fuzz FuzzPartFileName ./internal/envd
fuzz FuzzServeMessage ./internal/netpolicy/dnsfilter
fuzz FuzzUpstreamAnswer ./internal/netpolicy/dnsfilter
fuzz FuzzTemplatePath ./internal/e2b
fuzz FuzzParse ./internal/dockerfile
fuzz FuzzExtract ./internal/buildcontext

step "SDK conformance (npm e2b against airlock serve)"
AIRLOCK_DATA_DIR="$AIRLOCK_TEST_DATA_DIR" tests/sdk/run.sh bin/airlock
