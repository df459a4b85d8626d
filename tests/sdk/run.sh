#!/usr/bin/env bash
# SDK conformance suite: drives the unmodified npm `e2b` package against a
# freshly started `airlock serve`.
#
# usage: tests/sdk/run.sh [path/to/airlock] [test files...]
#
#   path/to/airlock   default: ../../bin/airlock relative to this script
#   test files        default: tests/*.test.mjs (relative to this script)
#
# environment:
#   AIRLOCK_DATA_DIR           data dir for the server (default /var/lib/airlock-test)
#   AIRLOCK_SDK_START_TIMEOUT  seconds to wait for /health (default 900: the first
#                              start may build the base template)
#   AIRLOCK_SDK_VERBOSE=1      keep streaming the server log during the tests
#                              (otherwise it is shown until the server is healthy,
#                              then kept in a log file and tailed on failure)
#   AIRLOCK_SDK_CONCURRENCY    test files run in parallel (default 2)
#   AIRLOCK_SDK_REGISTRY=0     do not start the local registry (tests/sdk/registry)
#
# A local OCI registry (tests/sdk/registry, built here with `go build`) stands
# in for Docker Hub: the server gets `--registry-mirror docker.io=<it>`, so
# fromImage('ubuntu:22.04') pulls an image the registry made from the data
# dir's base template (its layer is cached in <data dir>/sdk-registry). Its
# addresses reach the tests as AIRLOCK_SDK_REGISTRY (anonymous) and
# AIRLOCK_SDK_REGISTRY_AUTH (basic auth, user:password in
# AIRLOCK_SDK_REGISTRY_CREDS).
#
# The server also serves --domain airlock.localhost on a third free port (TLS,
# its own CA in <data dir>/tls): AIRLOCK_SDK_DOMAIN=airlock.localhost:<port>
# and NODE_EXTRA_CA_CERTS reach the tests; domain.test.mjs uses them alone.
#
# The run fails (status 3) when the server log contains "panic", even if every
# test passed: the server recovers handler panics, so only its log tells.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${1:-$here/../../bin/airlock}"
[ $# -gt 0 ] && shift
data_dir="${AIRLOCK_DATA_DIR:-/var/lib/airlock-test}"
start_timeout="${AIRLOCK_SDK_START_TIMEOUT:-900}"
concurrency="${AIRLOCK_SDK_CONCURRENCY:-2}"

log() { printf '[sdk-suite] %s\n' "$*" >&2; }

case "$bin" in /*) ;; *) bin="$(pwd)/$bin" ;; esac
if [ ! -x "$bin" ]; then
  log "airlock binary not found or not executable: $bin (build it with: make build)"
  exit 2
fi

cd "$here" || exit 2

# --- dependencies: npm ci when node_modules is missing or older than the lock file
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ] \
  || [ package.json -nt node_modules/.package-lock.json ]; then
  log "installing npm dependencies (npm ci)"
  npm ci --no-audit --no-fund >&2 || { log "npm ci failed"; exit 2; }
fi

# --- four free loopback ports (held open together so they differ): the API,
# the sandbox proxy, the TLS listener of --domain and the metrics listener
read -r api_port sandbox_port tls_port metrics_port < <(node -e '
  const net = require("net");
  const s = [0, 1, 2, 3].map(() => net.createServer());
  const listen = (i) => i === s.length
    ? (console.log(s.map((x) => x.address().port).join(" ")), s.forEach((x) => x.close()))
    : s[i].listen(0, "127.0.0.1", () => listen(i + 1));
  listen(0);')
if [ -z "${api_port:-}" ] || [ -z "${sandbox_port:-}" ] || [ -z "${tls_port:-}" ] || [ -z "${metrics_port:-}" ]; then
  log "could not pick free ports"
  exit 2
fi

api_key="e2b_$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')"
# Test files build in parallel with the one key; the bound is what
# template-access.test.mjs fills with the second key.
builds_per_key=4
# A second key, for what one key must not see or change of another's.
other_key="e2b_$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')"
run_id="sdk-$(date +%Y%m%d%H%M%S)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
mkdir -p "$data_dir"
server_log="$(mktemp "${TMPDIR:-/tmp}/airlock-sdk-serve.XXXXXX.log")"

server_pid=""
registry_pid=""
registry_dir=""
egress_ca_dir=""
tail_pid=""
node_pid=""
status=1

stop_tail() {
  if [ -n "$tail_pid" ]; then
    kill -TERM "$tail_pid" 2>/dev/null
    wait "$tail_pid" 2>/dev/null
    tail_pid=""
  fi
}

cleanup() {
  trap - EXIT INT TERM
  stop_tail
  if [ -n "$node_pid" ] && kill -0 "$node_pid" 2>/dev/null; then
    kill -TERM "$node_pid" 2>/dev/null
    wait "$node_pid" 2>/dev/null
  fi
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    log "stopping airlock serve (pid $server_pid)"
    kill -TERM "$server_pid" 2>/dev/null
    for _ in $(seq 1 60); do
      kill -0 "$server_pid" 2>/dev/null || break
      sleep 0.5
    done
    if kill -0 "$server_pid" 2>/dev/null; then
      log "airlock serve did not exit after SIGTERM within 30 s; sending SIGKILL"
      kill -KILL "$server_pid" 2>/dev/null
    fi
    wait "$server_pid" 2>/dev/null
  fi
  if [ -n "$registry_pid" ] && kill -0 "$registry_pid" 2>/dev/null; then
    kill -TERM "$registry_pid" 2>/dev/null
    wait "$registry_pid" 2>/dev/null
  fi
  # A panic the server recovered from (net/http logs "http: panic serving",
  # x/net/http2 "http2: panic serving") is a bug even when every test passed.
  if [ -n "$server_log" ] && grep -qi 'panic' "$server_log"; then
    log "the server log contains a panic:"
    grep -i -A 12 'panic' "$server_log" | head -n 60 >&2
    [ "$status" -eq 0 ] && status=3
  fi
  if [ "$status" -ne 0 ]; then
    log "last 80 lines of the server log ($server_log):"
    tail -n 80 "$server_log" >&2
    if [ -n "$registry_dir" ] && [ -s "$registry_dir/log" ]; then
      log "local registry log:"
      tail -n 20 "$registry_dir/log" >&2
    fi
  else
    log "server log: $server_log"
  fi
  [ -n "$registry_dir" ] && rm -rf "$registry_dir"
  [ -n "$egress_ca_dir" ] && rm -rf "$egress_ca_dir"
  exit "$status"
}
trap cleanup EXIT
trap 'status=130; exit' INT
trap 'status=143; exit' TERM

# Sandboxes must not outlive the run (the default keeps them for re-adoption).
extra_args=()
if "$bin" serve --help 2>&1 | grep -q -- '--kill-on-exit'; then
  extra_args+=(--kill-on-exit)
fi

# --- the local registry (a Docker Hub mirror for fromImage), before the server
if [ "${AIRLOCK_SDK_REGISTRY:-1}" != 0 ]; then
  registry_dir="$(mktemp -d "${TMPDIR:-/tmp}/airlock-sdk-registry.XXXXXX")"
  if ! (cd "$here/../.." && go build -o "$registry_dir/registry" ./tests/sdk/registry) >&2; then
    log "could not build tests/sdk/registry (set AIRLOCK_SDK_REGISTRY=0 to run without it)"
    status=2
    exit
  fi
  registry_creds="airlock:$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"
  mkfifo "$registry_dir/out"
  "$registry_dir/registry" -data "$data_dir" -auth "$registry_creds" >"$registry_dir/out" 2>"$registry_dir/log" &
  registry_pid=$!
  registry_line=""
  read -r -t 30 registry_line <"$registry_dir/out"
  registry_addr="$(node -e 'try { console.log(JSON.parse(process.argv[1]).addr) } catch {}' "$registry_line")"
  registry_auth_addr="$(node -e 'try { console.log(JSON.parse(process.argv[1]).authAddr) } catch {}' "$registry_line")"
  if [ -z "$registry_addr" ] || [ -z "$registry_auth_addr" ]; then
    log "the local registry did not start: $(cat "$registry_dir/log")"
    status=2
    exit
  fi
  log "local registry pid $registry_pid on $registry_addr (basic auth: $registry_auth_addr)"
  # The basic-auth one is pulled from directly: an operator's registry at a
  # (loopback) address API builds may not otherwise reach.
  extra_args+=(--registry-mirror "docker.io=http://$registry_addr" --allow-registry "$registry_auth_addr")
  export AIRLOCK_SDK_REGISTRY="$registry_addr" AIRLOCK_SDK_REGISTRY_AUTH="$registry_auth_addr" AIRLOCK_SDK_REGISTRY_CREDS="$registry_creds"
fi

# --- a CA of the run's own for egress tests: their HTTPS servers (in network
# namespaces the tests create) get certificates from it, and the server
# trusts it for the hosts whose HTTPS its egress intercepts.
egress_ca_dir="$(mktemp -d "${TMPDIR:-/tmp}/airlock-sdk-egress-ca.XXXXXX")"
if openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj "/CN=airlock sdk egress test CA" -keyout "$egress_ca_dir/ca.key" -out "$egress_ca_dir/ca.crt" >/dev/null 2>&1; then
  extra_args+=(--egress-upstream-ca "$egress_ca_dir/ca.crt")
  export AIRLOCK_SDK_EGRESS_CA_DIR="$egress_ca_dir"
else
  log "openssl could not make the egress test CA; egress tests will skip"
fi

# The domain listener (serve --domain, its own CA in <data dir>/tls): *.localhost
# is loopback (libnss-myhostname; Node's resolver follows nsswitch), so
# domain.test.mjs needs nothing but E2B_DOMAIN=airlock.localhost:<port>.
domain=airlock.localhost
extra_args+=(--domain "$domain" --tls-listen "127.0.0.1:$tls_port")
extra_args+=(--metrics-addr "127.0.0.1:$metrics_port" --metrics-per-sandbox)

# Webhook tests run their receivers on loopback.
log "starting $bin serve --api-addr 127.0.0.1:$api_port --sandbox-addr 127.0.0.1:$sandbox_port --data-dir $data_dir --webhook-allow-private ${extra_args[*]}"
AIRLOCK_API_KEY="$api_key,$other_key" "$bin" serve \
  --api-addr "127.0.0.1:$api_port" \
  --sandbox-addr "127.0.0.1:$sandbox_port" \
  --data-dir "$data_dir" --builds-per-key "$builds_per_key" --webhook-allow-private "${extra_args[@]}" >"$server_log" 2>&1 &
server_pid=$!
log "airlock serve pid $server_pid, log $server_log"

# Show the server output while it starts (template build may take minutes).
tail -n +1 -f "$server_log" >&2 &
tail_pid=$!

deadline=$(( $(date +%s) + start_timeout ))
until curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$api_port/health" 2>/dev/null; do
  if ! kill -0 "$server_pid" 2>/dev/null; then
    wait "$server_pid"; rc=$?
    stop_tail
    log "airlock serve exited (status $rc) before becoming healthy"
    server_pid=""
    status=2
    exit
  fi
  if [ "$(date +%s)" -ge "$deadline" ]; then
    stop_tail
    log "airlock serve not healthy after ${start_timeout}s"
    status=2
    exit
  fi
  sleep 1
done
[ "${AIRLOCK_SDK_VERBOSE:-0}" = 1 ] || stop_tail
log "airlock serve is healthy; running the SDK suite (run id $run_id)"

export E2B_API_URL="http://127.0.0.1:$api_port"
export E2B_SANDBOX_URL="http://127.0.0.1:$sandbox_port"
export E2B_API_KEY="$api_key"
# The volume content API is served on the API listener (serve prints the same).
export E2B_VOLUME_API_URL="http://127.0.0.1:$api_port"
export AIRLOCK_SDK_OTHER_KEY="$other_key"
export AIRLOCK_SDK_BUILDS_PER_KEY="$builds_per_key"
export AIRLOCK_SDK_RUN_ID="$run_id"
export AIRLOCK_DATA_DIR="$data_dir"   # persist tests look at what a pause wrote
export AIRLOCK_BIN="$bin"   # the MCP test spawns `airlock mcp` (stdio)
unset E2B_DEBUG E2B_DOMAIN E2B_ACCESS_TOKEN
# For domain.test.mjs, which drops the URL overrides above and sets
# E2B_DOMAIN from this. The CA is trusted by every file (Node reads
# NODE_EXTRA_CA_CERTS at start; it only adds the server's own domain CA).
export AIRLOCK_SDK_DOMAIN="$domain:$tls_port"
export NODE_EXTRA_CA_CERTS="$data_dir/tls/ca.crt"

if [ $# -gt 0 ]; then
  files=("$@")
else
  files=(tests/*.test.mjs)
fi

# One scrape of the metrics while the suite runs (its sandboxes alive,
# their traffic under way), linted with the one after it.
metrics_during="$(mktemp "${TMPDIR:-/tmp}/airlock-sdk-metrics-during.XXXXXX")"
(sleep "${AIRLOCK_SDK_SCRAPE_AFTER:-45}" && curl -fsS --max-time 10 -o "$metrics_during" "http://127.0.0.1:$metrics_port/metrics") &
scrape_pid=$!

# In the background + wait, so that a signal to this script is handled at once.
node --test --test-concurrency="$concurrency" --test-timeout=120000 --test-reporter=spec "${files[@]}" &
node_pid=$!
wait "$node_pid"
status=$?
node_pid=""
# A suite shorter than the wait has no scrape during it.
scraped_during=1
if kill -0 "$scrape_pid" 2>/dev/null; then
  kill "$scrape_pid" 2>/dev/null
  scraped_during=0
fi
wait "$scrape_pid" 2>/dev/null || scraped_during=0

# Anything of this run still listed is a leak (or a kill the server did not honour).
node leakcheck.mjs || { [ "$status" -eq 0 ] && status=1; }

# The metrics after the whole suite ran against this server must pass
# Prometheus' own lint, and count the suite's creates.
metrics_file="$(mktemp "${TMPDIR:-/tmp}/airlock-sdk-metrics.XXXXXX")"
if ! curl -fsS --max-time 10 -o "$metrics_file" "http://127.0.0.1:$metrics_port/metrics"; then
  log "could not scrape http://127.0.0.1:$metrics_port/metrics"
  [ "$status" -eq 0 ] && status=1
elif ! command -v promtool >/dev/null; then
  log "promtool is not installed (Debian prometheus; scripts/setup-test.sh installs it): metrics not linted"
  [ "${AIRLOCK_TEST_REQUIRE:-0}" = 1 ] && [ "$status" -eq 0 ] && status=1
elif ! promtool check metrics <"$metrics_file" >&2; then
  log "promtool check metrics failed on the scrape ($metrics_file)"
  [ "$status" -eq 0 ] && status=1
elif [ "$scraped_during" = 1 ] && ! promtool check metrics <"$metrics_during" >&2; then
  log "promtool check metrics failed on the scrape taken during the suite ($metrics_during)"
  [ "$status" -eq 0 ] && status=1
elif [ "$scraped_during" = 1 ] && ! grep -Eq '^airlock_sandboxes\{state="[a-z]+",template="[^"]+"\} [1-9]' "$metrics_during"; then
  log "the scrape taken during the suite shows no sandbox ($metrics_during)"
  [ "$status" -eq 0 ] && status=1
elif ! grep -Eq '^airlock_sandbox_operations_total\{operation="create",outcome="ok"\} [1-9]' "$metrics_file"; then
  log "the scrape counts no successful create after the suite ($metrics_file)"
  [ "$status" -eq 0 ] && status=1
else
  if [ "$scraped_during" = 1 ]; then
    log "metrics during the suite ($(grep -c '^airlock_' "$metrics_during") airlock_ samples) and after it ($(grep -c '^airlock_' "$metrics_file")) pass promtool check metrics"
  else
    log "metrics after the suite pass promtool check metrics ($(grep -c '^airlock_' "$metrics_file") airlock_ samples); the suite ended before the scrape during it"
  fi
  rm -f "$metrics_file" "$metrics_during"
fi
exit
