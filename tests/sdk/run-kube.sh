#!/usr/bin/env bash
# SDK conformance suite against the Kubernetes backend: two replicas of
# `airlock serve --backend kubernetes` over one PostgreSQL, driven by the
# unmodified npm `e2b` and `@e2b/code-interpreter` packages. The API the
# tests call is replica A's, the sandbox proxy replica B's, so every
# sandbox is made by one replica and used through the other. Then the
# replica-kill test (kube-replicas.test.mjs), alone: it kills a replica.
#
# usage: tests/sdk/run-kube.sh [path/to/airlock] [test files...]
#
# environment:
#   KUBECONFIG        the cluster's admin kubeconfig (scripts/kube-stack.sh up;
#                     its `kubeconfig` command prints the path)
#   AIRLOCK_DATA_DIR  data dir whose built templates are served (default
#                     /var/lib/airlock-test); the replicas' own state lives in
#                     a temporary directory
#
# The cluster must be up; this script makes a namespace of its own and
# deletes it (with every Pod in it) at the end, and runs PostgreSQL (Debian's
# binaries, as the postgres user) in a temporary directory on loopback.
set -uo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
bin="${1:-$here/../../bin/airlock}"
[ $# -gt 0 ] && shift
data_dir="${AIRLOCK_DATA_DIR:-/var/lib/airlock-test}"
log() { printf '[sdk-kube] %s\n' "$*" >&2; }

case "$bin" in /*) ;; *) bin="$(pwd)/$bin" ;; esac
[ -x "$bin" ] || { log "airlock binary not found: $bin"; exit 2; }
[ -n "${KUBECONFIG:-}" ] || { log "KUBECONFIG must name the cluster's kubeconfig (scripts/kube-stack.sh kubeconfig)"; exit 2; }
kubectl="${KUBECTL:-$(dirname "$KUBECONFIG")/../../bin/kubectl}"
[ -x "$kubectl" ] || kubectl="$(command -v kubectl)"
[ -x "$kubectl" ] || { log "kubectl not found (set KUBECTL)"; exit 2; }
pg_bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n1)"
[ -x "$pg_bin/initdb" ] || { log "PostgreSQL is not installed (Debian package postgresql)"; exit 2; }

cd "$here" || exit 2
if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then
  log "installing npm dependencies (npm ci)"
  npm ci --no-audit --no-fund >&2 || { log "npm ci failed"; exit 2; }
fi

read -r pg_port a_api a_sbx a_reg b_api b_sbx < <(node -e '
  const net = require("net");
  const s = [0, 1, 2, 3, 4, 5].map(() => net.createServer());
  const listen = (i) => i === s.length
    ? (console.log(s.map((x) => x.address().port).join(" ")), s.forEach((x) => x.close()))
    : s[i].listen(0, "127.0.0.1", () => listen(i + 1));
  listen(0);')
[ -n "${b_sbx:-}" ] || { log "could not pick free ports"; exit 2; }

run_id="kube-$(date +%Y%m%d%H%M%S)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')"
namespace="airlock-sdk-$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')"
api_key="e2b_$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')"
other_key="e2b_$(od -An -N20 -tx1 /dev/urandom | tr -d ' \n')"
work="$(mktemp -d "${TMPDIR:-/tmp}/airlock-sdk-kube.XXXXXX")"
chmod 755 "$work"
pids=()
ns_made=0
pg_started=0
agent_started=0
status=1

cleanup() {
  trap - EXIT INT TERM
  for p in "${pids[@]}"; do
    kill -TERM "$p" 2>/dev/null
  done
  for p in "${pids[@]}"; do
    wait "$p" 2>/dev/null
  done
  if [ "$ns_made" = 1 ]; then
    "$kubectl" delete namespace "$namespace" --wait=true --timeout=120s >/dev/null 2>&1 \
      || { log "namespace $namespace not deleted"; [ "$status" -eq 0 ] && status=1; }
  fi
  if [ "$agent_started" = 1 ]; then
    nft delete table inet "$agent_table" 2>/dev/null
  fi
  if [ "$pg_started" = 1 ]; then
    runuser -u postgres -- "$pg_bin/pg_ctl" -D "$work/pg" -m immediate stop >/dev/null 2>&1
  fi
  for r in a b agent; do
    if [ -s "$work/$r.log" ] && grep -qi 'panic' "$work/$r.log"; then
      log "replica $r's log contains a panic:"
      grep -i -A 12 'panic' "$work/$r.log" | head -n 40 >&2
      [ "$status" -eq 0 ] && status=3
    fi
    if [ "$status" -ne 0 ] && [ -s "$work/$r.log" ]; then
      log "last 60 lines of replica $r's log:"
      tail -n 60 "$work/$r.log" >&2
    fi
  done
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'status=130; exit' INT
trap 'status=143; exit' TERM

# --- PostgreSQL, the replicas' shared store
mkdir -p "$work/pg" && chown postgres: "$work/pg"
runuser -u postgres -- "$pg_bin/initdb" -D "$work/pg" -A trust -U postgres >"$work/pg-init.log" 2>&1 \
  || { log "initdb failed: $(tail -5 "$work/pg-init.log")"; exit 2; }
runuser -u postgres -- "$pg_bin/pg_ctl" -D "$work/pg" -l "$work/pg/log" -w \
  -o "-c listen_addresses=127.0.0.1 -p $pg_port -k $work/pg -c fsync=off" start >/dev/null \
  || { log "PostgreSQL did not start: $(tail -5 "$work/pg/log")"; exit 2; }
pg_started=1
runuser -u postgres -- "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" airlock || { log "createdb failed"; exit 2; }
store="postgres://postgres@127.0.0.1:$pg_port/airlock?sslmode=disable"
log "PostgreSQL on 127.0.0.1:$pg_port"

# --- the namespace of this run's sandbox Pods
"$kubectl" create namespace "$namespace" >/dev/null || { log "could not create namespace $namespace"; exit 2; }
ns_made=1

# --- the node agent, enforcing the sandbox Pods' egress policy (the
# replicas run with --pod-network agent, the default: creates wait for it).
# Its table stays when it stops, as in a cluster; cleanup deletes it.
node_name=$("$kubectl" get nodes -o jsonpath='{.items[0].metadata.name}') || { log "no node"; exit 2; }
agent_table=airlock_pods_sdk$$
"$bin" node-agent --kubeconfig "$KUBECONFIG" --kube-namespace "$namespace" --node-name "$node_name" \
  --table "$agent_table" >"$work/agent.log" 2>&1 &
pids+=($!)
agent_started=1

# --- two replicas
# Replica a serves the template images; b names a's registry (made once,
# not twice, on a 2-core machine). b is the one the replica-kill test kills.
# The suites create a dozen sandboxes at once and expect each in well under
# 5 s (their timeouts are checked to ±5 s): base's warm pool covers such a
# burst, since cold gVisor Pods on one loaded 2-core node take seconds;
# Pods request 1% of their vCPUs so that the pools and the live sandboxes
# fit the node's 2 CPUs.
start_replica() { # name api sandbox registry-flags...
  local name=$1 api=$2 sbx=$3
  shift 3
  AIRLOCK_API_KEY="$api_key,$other_key" "$bin" serve --backend kubernetes --kubeconfig "$KUBECONFIG" \
    --kube-namespace "$namespace" --store "$store" --replica-id "$name" \
    --data-dir "$work/$name" --template-data-dir "$data_dir" --templates base,code-interpreter-v1 --warm-pool 2 --warm-pools base=12 --pod-cpu-request 0.01 \
    --webhook-allow-private \
    --api-addr "127.0.0.1:$api" --sandbox-addr "127.0.0.1:$sbx" "$@" \
    >"$work/$name.log" 2>&1 &
  pids+=($!)
  echo $! >"$work/$name.pid"
}
start_replica a "$a_api" "$a_sbx" --registry-addr "127.0.0.1:$a_reg"
start_replica b "$b_api" "$b_sbx" --registry-addr "" --registry-host "127.0.0.1:$a_reg"
for port in "$a_api" "$b_api"; do
  for _ in $(seq 1 120); do
    curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$port/health" 2>/dev/null && break
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null || { log "a replica exited before it was healthy"; status=2; exit; }; done
    sleep 0.5
  done
  curl -fsS -o /dev/null --max-time 2 "http://127.0.0.1:$port/health" || { log "replica on $port not healthy"; status=2; exit; }
done
log "replicas a (api $a_api, proxy $a_sbx) and b (api $b_api, proxy $b_sbx) in namespace $namespace"

export E2B_API_URL="http://127.0.0.1:$a_api"
export E2B_SANDBOX_URL="http://127.0.0.1:$b_sbx"
export E2B_API_KEY="$api_key"
export AIRLOCK_SDK_OTHER_KEY="$other_key"
export AIRLOCK_SDK_RUN_ID="$run_id"
export AIRLOCK_KUBE_NAMESPACE="$namespace"
export KUBECTL="$kubectl"
export AIRLOCK_KUBE_REPLICAS="[{\"name\":\"a\",\"api\":\"http://127.0.0.1:$a_api\",\"sandbox\":\"http://127.0.0.1:$a_sbx\",\"pid\":$(cat "$work/a.pid")},{\"name\":\"b\",\"api\":\"http://127.0.0.1:$b_api\",\"sandbox\":\"http://127.0.0.1:$b_sbx\",\"pid\":$(cat "$work/b.pid")}]"
unset E2B_DEBUG E2B_DOMAIN E2B_ACCESS_TOKEN E2B_VOLUME_API_URL

# The first sandbox of each template waits for its image to be made (503
# with Retry-After meanwhile) and pulled by the node: done once here, not
# inside a test's timeout.
log "warming up: each template's image made and pulled"
node -e '
  const { Sandbox } = require("e2b");
  (async () => {
    for (const t of ["base", "code-interpreter-v1"]) {
      const t0 = Date.now();
      let waited = 0;
      for (;;) {
        try {
          const s = await Sandbox.create(t, { metadata: { suite: process.env.AIRLOCK_SDK_RUN_ID }, requestTimeoutMs: 600000 });
          await s.kill();
          break;
        } catch (e) {
          if (!/not ready for the cluster yet/.test(e.message) || Date.now() - t0 > 900000) throw e;
          waited++;
          await new Promise((r) => setTimeout(r, 5000));
        }
      }
      console.error(`[sdk-kube] ${t}: first sandbox in ${Date.now() - t0} ms (${waited} answers 503 while its image was made)`);
    }
  })().catch((e) => { console.error(e); process.exit(1); });' || { status=1; exit; }

if [ $# -gt 0 ]; then
  files=("$@")
else
  # What the backend serves as one box does (the others need pause,
  # snapshots, volumes, templates built through the API, egress rules,
  # domains or metrics of one box's: README's feature table).
  files=(tests/commands.test.mjs tests/files.test.mjs tests/pty.test.mjs tests/list.test.mjs
    tests/paths.test.mjs tests/errors.test.mjs tests/sandbox.test.mjs tests/code-interpreter.test.mjs
    tests/limits.test.mjs tests/sudo.test.mjs tests/kube.test.mjs)
fi
# One file at a time: the node (2 cores here) runs the replicas, PostgreSQL,
# the warm pools and every sandbox Pod, and two files at once loaded it
# enough for a Jupyter kernel's subprocess output to come after its cell's
# end (a flaky `!pwd` in code-interpreter.test.mjs).
node --test --test-concurrency=1 --test-timeout=180000 --test-reporter=spec "${files[@]}" &
node_pid=$!
wait "$node_pid"
status=$?

if [ $# -eq 0 ] && [ "$status" -eq 0 ]; then
  log "the replica-kill test (alone: it kills a replica)"
  node --test --test-timeout=180000 --test-reporter=spec tests/kube-replicas.test.mjs
  status=$?
  # Its sandboxes are listed through the replica left.
  export E2B_SANDBOX_URL="http://127.0.0.1:$a_sbx"
fi
node leakcheck.mjs || { [ "$status" -eq 0 ] && status=1; }
exit
