#!/usr/bin/env bash
# First-run test: what a new user gets from `sudo make run` on a fresh machine.
# `airlock serve` with default flags on an EMPTY data dir (so it builds base before
# the API answers, and python3, node and code-interpreter-v1 in the background),
# then:
#   - a create for a template still building answers 503 with Retry-After and a
#     message naming the build step and how long it has been on it (E2B's error
#     body shape {"code":503,"message":...});
#   - GET /airlock/v1/info names the sandbox URL;
#   - the MCP scenario through the official TypeScript client and the MCP
#     Inspector CLI (firstrun/firstrun.test.mjs);
#   - serve reports when all templates are ready; both times are printed.
#
# usage: tests/sdk/firstrun.sh [path/to/airlock]
# environment:
#   AIRLOCK_FIRSTRUN_DIR   parent of the temporary data dir (default /var/tmp)
#   AIRLOCK_FIRSTRUN_KEEP=1  keep the data dir afterwards (default: removed)
#   AIRLOCK_FIRSTRUN_TIMEOUT seconds for the whole run (default 1500)
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${1:-$here/../../bin/airlock}"
case "$bin" in /*) ;; *) bin="$(pwd)/$bin" ;; esac
timeout_s="${AIRLOCK_FIRSTRUN_TIMEOUT:-1500}"
log() { printf '[firstrun] %s\n' "$*" >&2; }
fail() { log "FAIL: $*"; status=1; exit 1; }

[ -x "$bin" ] || { log "airlock binary not found: $bin (make build)"; exit 2; }
cd "$here" || exit 2
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  log "installing npm dependencies (npm ci)"
  npm ci --no-audit --no-fund >&2 || { log "npm ci failed"; exit 2; }
fi

data_dir="$(mktemp -d "${AIRLOCK_FIRSTRUN_DIR:-/var/tmp}/airlock-firstrun.XXXXXX")"
server_log="$data_dir.serve.log"
read -r api_port sandbox_port < <(node -e '
  const net = require("net"); const a = net.createServer(), b = net.createServer();
  a.listen(0, "127.0.0.1", () => b.listen(0, "127.0.0.1", () => {
    console.log(a.address().port, b.address().port); a.close(); b.close(); }));')
api="http://127.0.0.1:$api_port"
key="e2b_$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')"
server_pid=""
node_pid=""
status=1

cleanup() {
  trap - EXIT INT TERM
  [ -n "$node_pid" ] && kill -TERM "$node_pid" 2>/dev/null && wait "$node_pid" 2>/dev/null
  if [ -n "$server_pid" ] && kill -0 "$server_pid" 2>/dev/null; then
    log "stopping airlock serve (pid $server_pid)"
    kill -TERM "$server_pid"
    for _ in $(seq 1 120); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$server_pid" 2>/dev/null && { log "serve ignored SIGTERM for 60 s; SIGKILL"; kill -KILL "$server_pid"; }
    wait "$server_pid" 2>/dev/null
  fi
  # --kill-on-exit leaves nothing in the host's network state: no nftables
  # table, no veth of this server (names derived from the data dir).
  left=$(nft list tables 2>/dev/null | grep -c " airlock_$net_tag\$")
  if [ -n "$net_tag" ] && [ "$left" -ne 0 ]; then
    log "serve left its nftables table airlock_$net_tag behind"
    status=1
  fi
  if [ -n "$net_tag" ] && ip -br link | grep -q "^a$net_tag"; then
    log "serve left veths a$net_tag* behind:"; ip -br link | grep "^a$net_tag" >&2
    status=1
  fi
  if grep -n 'panic' "$server_log" >&2; then
    log "the server log mentions a panic (above)"
    status=1
  fi
  if [ "$status" -ne 0 ]; then
    log "last 60 lines of the server log ($server_log):"
    tail -n 60 "$server_log" >&2
  fi
  if [ "${AIRLOCK_FIRSTRUN_KEEP:-0}" != 1 ]; then
    # --kill-on-exit unmounted the sandbox image; anything still mounted below
    # the data dir means a leak, and rm must not walk into it.
    if grep -q " $data_dir/" /proc/self/mounts; then
      log "mounts left under $data_dir:"; grep " $data_dir/" /proc/self/mounts >&2
      status=1
    else
      rm -rf "$data_dir"
    fi
  fi
  if [ "$status" -eq 0 ] && [ "${AIRLOCK_FIRSTRUN_KEEP:-0}" != 1 ]; then
    rm -f "$server_log"
    log "passed"
  else
    log "$( [ "$status" -eq 0 ] && echo passed || echo FAILED ) (server log: $server_log)"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'status=130; exit' INT
trap 'status=143; exit' TERM

# Default flags: only what a second server on this machine must change (ports, data
# dir, a fixed key) and --kill-on-exit so nothing outlives the test.
log "serve on an empty data dir $data_dir (api :$api_port, sandboxes :$sandbox_port)"
t0=$(date +%s)
AIRLOCK_API_KEY="$key" "$bin" serve --data-dir "$data_dir" \
  --api-addr "127.0.0.1:$api_port" --sandbox-addr "127.0.0.1:$sandbox_port" --metrics-addr 127.0.0.1:0 --kill-on-exit >"$server_log" 2>&1 &
server_pid=$!
deadline=$((t0 + timeout_s))
# The nftables table and veth prefix this server derives from its data dir, read
# from its log once the network is up (for the leak check at the end).
net_tag=""

until curl -fsS -o /dev/null --max-time 2 "$api/health" 2>/dev/null; do
  kill -0 "$server_pid" 2>/dev/null || { server_pid=""; fail "serve exited before answering"; }
  [ "$(date +%s)" -lt "$deadline" ] || fail "not serving after ${timeout_s}s"
  sleep 1
done
t_serving=$(( $(date +%s) - t0 ))
net_tag=$(grep -o 'nft_table="inet airlock_[0-9a-z]*"' "$server_log" | head -1 | sed 's/.*airlock_\([0-9a-z]*\)"/\1/')
[ -n "$net_tag" ] || fail "serve logged no nftables table"
log "serving after ${t_serving}s"
grep -q "Airlock is serving" "$server_log" || fail "no 'Airlock is serving' banner"
grep -q "Building in the background: python3, node, code-interpreter-v1, mcp-gateway" "$server_log" || fail "serve did not say what builds in the background"

# The info endpoint names the sandbox proxy (airlock mcp asks it instead of guessing).
info=$(curl -fsS "$api/airlock/v1/info") || fail "GET /airlock/v1/info"
[ "$(node -e 'console.log(JSON.parse(process.argv[1]).sandboxUrl)' "$info")" = "http://127.0.0.1:$sandbox_port" ] \
  || fail "info: $info"

# A create while the other built-ins build: 503, Retry-After, a message with the step.
building=()
for tpl in python3 code-interpreter-v1; do
  hdr=$(mktemp); body=$(mktemp)
  code=$(curl -sS -o "$body" -D "$hdr" -w '%{http_code}' -X POST "$api/v2/sandboxes" \
    -H "X-API-KEY: $key" -H 'Content-Type: application/json' -d "{\"templateID\":\"$tpl\",\"timeout\":60}")
  retry=$(awk -F': ' 'tolower($1)=="retry-after" {gsub("\r",""); print $2}' "$hdr")
  log "create $tpl: HTTP $code, Retry-After ${retry:-none}: $(cat "$body")"
  [ "$code" = 503 ] || fail "create $tpl during the background build: HTTP $code, want 503"
  [[ "$retry" =~ ^[1-9][0-9]*$ ]] || fail "create $tpl: Retry-After '$retry'"
  node -e '
    const b = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8")), tpl = process.argv[2];
    if (b.code !== 503) throw new Error(`code ${b.code}`);
    const re = new RegExp(`^template ${tpl} is still being built: .+ \\(for \\d+:\\d\\d`);
    if (!re.test(b.message)) throw new Error(`message ${JSON.stringify(b.message)} does not match ${re}`);
  ' "$body" "$tpl" || fail "create $tpl: body"
  building+=("$tpl")
  rm -f "$hdr" "$body"
done

log "MCP scenario through the official client and the inspector CLI"
AIRLOCK_BIN="$bin" E2B_API_URL="$api" E2B_API_KEY="$key" FIRSTRUN_BUILDING="$(IFS=,; echo "${building[*]}")" \
  node --test --test-reporter=spec --test-timeout=$((timeout_s * 1000)) firstrun/firstrun.test.mjs &
node_pid=$!
wait "$node_pid"
rc=$?
node_pid=""
[ "$rc" -eq 0 ] || fail "MCP scenario (node --test exit $rc)"

until grep -q "All templates are ready" "$server_log"; do
  grep -q "Some templates could not be built" "$server_log" && fail "a background build failed"
  [ "$(date +%s)" -lt "$deadline" ] || fail "templates not all ready after ${timeout_s}s"
  sleep 2
done
t_all=$(( $(date +%s) - t0 ))
grep "All templates are ready" "$server_log" >&2
by_log_serving=$(grep -o 'Airlock is serving ([0-9:]* after start)' "$server_log")
by_log_all=$(grep -o 'ready ([^)]*): [0-9:]* after start' "$server_log")
log "times on an empty data dir: serving after ${t_serving}s, all built-ins ready after ${t_all}s"
log "serve's own words: $by_log_serving; $by_log_all"
status=0
