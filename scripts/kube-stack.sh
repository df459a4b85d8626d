#!/usr/bin/env bash
# The single-node Kubernetes that Airlock's Kubernetes backend is tested
# against (issue 24): one pinned release of each part, built from the Go
# module proxy and Debian's packages, run as plain processes on this
# machine, and torn down completely.
#
#   scripts/kube-stack.sh build    build what is missing into $AIRLOCK_KUBE_DIR/bin
#   scripts/kube-stack.sh up       build, then start etcd, containerd, the control
#                                  plane and the kubelet; wait for the node to be Ready
#   scripts/kube-stack.sh down     stop everything `up` started, remove its Pods,
#                                  mounts, network, cgroups, and restore the sysctls
#                                  the kubelet changed
#   scripts/kube-stack.sh env      print the KUBECONFIG line for a shell
#   scripts/kube-stack.sh kubeconfig, dir   print the admin kubeconfig's path, the stack's dir
#
# Parts: etcd 3.6, kube-apiserver, kube-controller-manager, kube-scheduler and
# kubelet of Kubernetes $K8S_VERSION (k8s.io/kubernetes with its ./staging
# modules taken at their published versions), containerd 2.x with its runc
# shim, Debian's runc and CNI plugins, gVisor's containerd shim (runsc, the
# same go-branch version scripts/setup-test.sh installs) for a RuntimeClass
# "gvisor". Binaries are cached in $AIRLOCK_KUBE_DIR (default
# /var/lib/airlock-kube), outside the clone, so a CI cache or a second run
# skips the build (one stamp per part and version).
#
# What this machine kind needs (../shared/notes/isolation.md): root lacks
# CAP_SYS_RESOURCE, so containerd restricts oom_score_adj to its own
# (restrict_oom_score_adj) and gVisor's shim, which sets -999 on itself and
# dies on the refusal, is built with that one value changed to 0; the
# kubelet runs with failCgroupV1: false. Everything stays on loopback and on
# a bridge of its own (Pods 172.29.0.0/24, no masquerade, no default
# route: Pods reach no other host than the node and the netpolicytest
# stand-in internet, POD_ROUTES); its cgroups are under airlock-kube in each hierarchy.
set -euo pipefail
cd "$(dirname "$0")/.."

K8S_VERSION=v1.34.4
K8S_STAGING=v0.34.4
ETCD_VERSION=v3.6.16
CONTAINERD_VERSION=v2.4.2
RUNSC_VERSION=$(sed -n 's/^RUNSC_VERSION=//p' scripts/setup-test.sh)
RUNSC=/usr/local/bin/runsc

KUBE_DIR=${AIRLOCK_KUBE_DIR:-/var/lib/airlock-kube}
BIN=$KUBE_DIR/bin
SRC=$KUBE_DIR/src
RUN=$KUBE_DIR/run
PKI=$RUN/pki
LOGS=$RUN/log
PIDS=$RUN/pid
CGROUP_NAME=airlock-kube
NODE=airlock-node
APISERVER_PORT=16443
ETCD_PORT=12379
POD_CIDR=172.29.0.0/24
POD_GATEWAY=172.29.0.1
SERVICE_CIDR=172.29.16.0/24
SERVICE_IP=172.29.16.1
BRIDGE=akube0
# Pods have no default route: they reach the node, each other and, through
# the node, only the stand-in internet of internal/netpolicy/netpolicytest
# (its documentation ranges and private test hosts, /32 each), which the
# node agent's egress test puts in a network namespace of its own. Nothing
# else is routed, so no Pod's packet leaves the machine.
POD_ROUTES='[{"dst": "198.51.100.0/24"}, {"dst": "203.0.113.10/32"}, {"dst": "203.0.113.20/32"}, {"dst": "203.0.113.53/32"},
		              {"dst": "169.254.77.77/32"}, {"dst": "192.168.250.2/32"}, {"dst": "10.251.0.2/32"}, {"dst": "172.29.250.2/32"},
		              {"dst": "100.66.250.2/32"}, {"dst": "240.77.0.2/32"}]'
# The kernel settings the kubelet sets (protectKernelDefaults: false), put
# back by `down`.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

SETUP_NAME=kube-stack

# cgroup_dirs: the stack's cgroup (the kubelet's cgroupRoot) in each
# hierarchy: every cgroup v1 one, or the one cgroup2 tree.
cgroup_dirs() {
	awk -v name="$CGROUP_NAME" '$3 == "cgroup" { print $2 "/" name } $3 == "cgroup2" && $2 == "/sys/fs/cgroup" { print $2 "/" name }' /proc/mounts
}

make_cgroups() {
	local d
	for d in $(cgroup_dirs); do
		mkdir -p "$d"
		# A new cpuset cgroup has no CPUs or memory nodes to run on until
		# given its parent's.
		if [ -e "$d/cpuset.cpus" ] && [ -z "$(cat "$d/cpuset.cpus")" ]; then
			cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
			cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
		fi
	done
}

# remove_cgroups: each of the stack's cgroups, deepest first, once the
# processes still in it are killed.
remove_cgroups() {
	local top d pid
	for top in $(cgroup_dirs); do
		[ -d "$top" ] || continue
		find "$top" -depth -type d | while read -r d; do
			if [ -s "$d/cgroup.procs" ]; then
				while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done <"$d/cgroup.procs"
				sleep 0.2
			fi
			rmdir "$d" 2>/dev/null || true
		done
	done
}
. scripts/lib.sh

GO=/usr/local/go/bin/go
[ -x "$GO" ] || GO=$(command -v go) || die "Go not found (run scripts/setup.sh first)"
export PATH=$BIN:$PATH
export KUBECONFIG=$PKI/admin.kubeconfig

# progress_build LOG CMD...: run a `go build -v`, one line per 50 packages.
progress_build() {
	local log=$1 n=0
	shift
	if ! "$@" 2>&1 | tee "$log" | while read -r _; do
		n=$((n + 1))
		if [ $((n % 50)) -eq 0 ]; then echo "  $n packages compiled (${SECONDS}s)"; fi
	done; then
		tail -n 30 "$log" >&2
		die "build failed (last lines above; all of it in $log)"
	fi
}

stamped() { [ -e "$BIN/.stamp-$1" ]; }
stamp() { rm -f "$BIN/.stamp-$1-"*; : >"$BIN/.stamp-$1"; }

build_kube() {
	local id="kube-$K8S_VERSION"
	if stamped "$id"; then echo "Kubernetes $K8S_VERSION: built"; return; fi
	echo "building Kubernetes $K8S_VERSION (apiserver, controller-manager, scheduler, kubelet, kubectl): 10-20 minutes on a cold cache"
	local dir=$SRC/kube
	mkdir -p "$dir"
	# A module of our own that requires k8s.io/kubernetes and takes each of
	# its ./staging modules at the published version of the same release.
	local upstream
	upstream=$("$GO" mod download -json "k8s.io/kubernetes@$K8S_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
	[ -n "$upstream" ] || die "k8s.io/kubernetes@$K8S_VERSION: no go.mod from the module proxy"
	{
		echo "module airlock.local/kubestack"
		echo
		echo "go 1.24"
		echo
		echo "require k8s.io/kubernetes $K8S_VERSION"
		echo
		echo "replace ("
		sed -n 's|^\t\(k8s.io/[a-z0-9-]*\) => ./staging/src/k8s.io/.*$|\t\1 => \1 '"$K8S_STAGING"'|p' "$upstream"
		echo ")"
	} >"$dir/go.mod"
	local minor=${K8S_VERSION#v1.}
	minor=${minor%%.*}
	local ld="-s -w"
	for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ld="$ld -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
	done
	(cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 progress_build "$dir/build.log" "$GO" build -v -trimpath -ldflags "$ld" -o "$BIN/" \
		k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
		k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubectl)
	stamp "$id"
	echo "built Kubernetes $K8S_VERSION in ${SECONDS}s"
}

build_etcd() {
	local id="etcd-$ETCD_VERSION"
	if stamped "$id"; then echo "etcd $ETCD_VERSION: built"; return; fi
	echo "building etcd $ETCD_VERSION"
	local dir=$SRC/etcd
	mkdir -p "$dir"
	# etcd's server module points its sibling modules at ../; ours takes
	# them at the same published version.
	cat >"$dir/go.mod" <<-EOF
		module airlock.local/etcdstack

		go 1.24

		require (
			go.etcd.io/etcd/server/v3 $ETCD_VERSION
			go.etcd.io/etcd/api/v3 $ETCD_VERSION
			go.etcd.io/etcd/client/pkg/v3 $ETCD_VERSION
			go.etcd.io/etcd/client/v3 $ETCD_VERSION
			go.etcd.io/etcd/pkg/v3 $ETCD_VERSION
		)
	EOF
	(cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 progress_build "$dir/build.log" "$GO" build -v -trimpath -ldflags "-s -w" -o "$BIN/etcd" go.etcd.io/etcd/server/v3)
	stamp "$id"
}

build_containerd() {
	local id="containerd-$CONTAINERD_VERSION"
	if stamped "$id"; then echo "containerd $CONTAINERD_VERSION: built"; return; fi
	echo "building containerd $CONTAINERD_VERSION (containerd, its runc shim, ctr)"
	local dir=$SRC/containerd
	mkdir -p "$dir"
	cat >"$dir/go.mod" <<-EOF
		module airlock.local/containerdstack

		go 1.24

		require github.com/containerd/containerd/v2 $CONTAINERD_VERSION
	EOF
	# No btrfs, devmapper or zfs snapshotters: overlayfs is the one used,
	# and btrfs's would need its C headers.
	(cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 progress_build "$dir/build.log" "$GO" build -v -trimpath \
		-tags "no_btrfs no_devmapper no_zfs" -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" -o "$BIN/" \
		github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
		github.com/containerd/containerd/v2/cmd/ctr)
	stamp "$id"
}

build_gvisor_shim() {
	local id="runsc-shim-$RUNSC_VERSION"
	if stamped "$id"; then echo "gVisor's containerd shim $RUNSC_VERSION: built"; return; fi
	echo "building gVisor's containerd shim $RUNSC_VERSION"
	local dir=$SRC/gvisor-shim mod
	mod=$("$GO" mod download -json "gvisor.dev/gvisor@$RUNSC_VERSION" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
	[ -n "$mod" ] || die "gvisor.dev/gvisor@$RUNSC_VERSION: not in the module proxy"
	rm -rf "$dir"
	mkdir -p "$dir"
	cp -r "$mod" "$dir/gvisor"
	chmod -R u+w "$dir/gvisor"
	# The one change this machine kind needs: the shim sets oom_score_adj
	# -999 on itself, which root without CAP_SYS_RESOURCE may not, and
	# fails the Pod on the refusal; 0 is a raise, always allowed.
	local mgr=$dir/gvisor/pkg/shim/v1/manager.go
	grep -q 'oomScoreMax = -999' "$mgr" || die "gVisor's shim no longer sets oom_score_adj -999 where expected ($mgr): look again"
	sed -i 's/oomScoreMax = -999/oomScoreMax = 0/' "$mgr"
	cat >"$dir/go.mod" <<-EOF
		module airlock.local/gvisorshim

		go 1.24

		require gvisor.dev/gvisor $RUNSC_VERSION

		replace gvisor.dev/gvisor => ./gvisor
	EOF
	(cd "$dir" && GOFLAGS=-mod=mod CGO_ENABLED=0 progress_build "$dir/build.log" "$GO" build -v -trimpath -ldflags "-s -w" \
		-o "$BIN/containerd-shim-runsc-v1" gvisor.dev/gvisor/shim)
	stamp "$id"
}

# pause_image writes the Pod sandbox image (a static pause binary in an OCI
# image) as an OCI archive ctr can import: the cluster reaches no registry.
pause_image() {
	local out=$1 work
	work=$(mktemp -d)
	cat >"$work/pause.c" <<-'EOF'
		#include <signal.h>
		#include <unistd.h>
		static void done(int sig) { (void)sig; _exit(0); }
		int main(void) {
			signal(SIGINT, done);
			signal(SIGTERM, done);
			for (;;) pause();
		}
	EOF
	mkdir -p "$work/rootfs" "$work/blobs/sha256"
	gcc -static -O2 -o "$work/rootfs/pause" "$work/pause.c"
	tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 -C "$work/rootfs" -cf "$work/layer.tar" pause
	local layer diffid config cfgdigest manifest mdigest size
	diffid=$(sha256sum "$work/layer.tar" | cut -d' ' -f1)
	gzip -n -9 <"$work/layer.tar" >"$work/layer.tar.gz"
	layer=$(sha256sum "$work/layer.tar.gz" | cut -d' ' -f1)
	size=$(stat -c %s "$work/layer.tar.gz")
	mv "$work/layer.tar.gz" "$work/blobs/sha256/$layer"
	config='{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/pause"]},"rootfs":{"type":"layers","diff_ids":["sha256:'$diffid'"]}}'
	printf '%s' "$config" >"$work/config.json"
	cfgdigest=$(sha256sum "$work/config.json" | cut -d' ' -f1)
	mv "$work/config.json" "$work/blobs/sha256/$cfgdigest"
	manifest='{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:'$cfgdigest'","size":'${#config}'},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:'$layer'","size":'$size'}]}'
	printf '%s' "$manifest" >"$work/manifest.json"
	mdigest=$(sha256sum "$work/manifest.json" | cut -d' ' -f1)
	mv "$work/manifest.json" "$work/blobs/sha256/$mdigest"
	printf '{"imageLayoutVersion":"1.0.0"}' >"$work/oci-layout"
	printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"annotations":{"io.containerd.image.name":"localhost/airlock/pause:1","org.opencontainers.image.ref.name":"1"}}]}' \
		"$mdigest" "${#manifest}" >"$work/index.json"
	tar -C "$work" -cf "$out" oci-layout index.json blobs
	rm -rf "$work"
}

cmd_build() {
	need_root "it installs packages and builds into $KUBE_DIR"
	step "Debian packages (runc, CNI plugins, conntrack, iptables, openssl)"
	install_missing runc containernetworking-plugins conntrack iptables openssl gcc libc6-dev
	[ -x "$RUNSC" ] || die "$RUNSC is missing: run scripts/setup-test.sh first (it builds runsc)"
	mkdir -p "$BIN" "$SRC"
	step "etcd"
	build_etcd
	step "containerd"
	build_containerd
	step "gVisor's containerd shim"
	build_gvisor_shim
	step "Kubernetes"
	build_kube
}

# cert NAME CN [O] [SANS]: a key and a certificate signed by the stack's CA.
cert() {
	local name=$1 cn=$2 org=${3:-} sans=${4:-} subj="/CN=$2"
	[ -n "$org" ] && subj="/O=$org/CN=$cn"
	openssl genrsa -out "$PKI/$name.key" 2048 2>/dev/null
	openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
	local ext="$PKI/$name.ext"
	{
		echo "basicConstraints=CA:FALSE"
		echo "keyUsage=digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=serverAuth,clientAuth"
		[ -n "$sans" ] && echo "subjectAltName=$sans"
	} >"$ext"
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 30 -extfile "$ext" -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr" "$ext"
}

kubeconfig() {
	local name=$1 user=$2
	cat >"$PKI/$name.kubeconfig" <<-EOF
		apiVersion: v1
		kind: Config
		clusters:
		- name: airlock
		  cluster:
		    server: https://127.0.0.1:$APISERVER_PORT
		    certificate-authority: $PKI/ca.crt
		users:
		- name: $user
		  user:
		    client-certificate: $PKI/$user.crt
		    client-key: $PKI/$user.key
		contexts:
		- name: airlock
		  context: {cluster: airlock, user: $user}
		current-context: airlock
	EOF
}

make_pki() {
	mkdir -p "$PKI"
	chmod 700 "$PKI"
	openssl genrsa -out "$PKI/ca.key" 2048 2>/dev/null
	openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=airlock-kube-ca" -days 30 -out "$PKI/ca.crt" 2>/dev/null
	cert apiserver kube-apiserver "" "IP:127.0.0.1,IP:$SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
	cert admin airlock-admin system:masters
	cert controller-manager system:kube-controller-manager
	cert scheduler system:kube-scheduler
	cert node "system:node:$NODE" system:nodes
	cert kubelet "$NODE" "" "IP:127.0.0.1,DNS:$NODE"
	cert apiserver-kubelet kube-apiserver-kubelet-client system:masters
	openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
	openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
	kubeconfig admin admin
	kubeconfig controller-manager controller-manager
	kubeconfig scheduler scheduler
	kubeconfig node node
}

# start NAME CMD...: run a daemon in its own session, its pid kept.
start() {
	local name=$1
	shift
	setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
	echo $! >"$PIDS/$name.pid"
}

# wait_for WHAT SECONDS CMD...: until CMD succeeds.
wait_for() {
	local what=$1 limit=$2 i=0
	shift 2
	until "$@" >/dev/null 2>&1; do
		i=$((i + 1))
		if [ $i -gt $((limit * 2)) ]; then
			echo "$what did not come up in ${limit}s; its log:" >&2
			tail -n 40 "$LOGS/$what.log" >&2 2>/dev/null || true
			die "$what did not come up"
		fi
		sleep 0.5
	done
}

write_configs() {
	mkdir -p "$RUN/containerd" "$RUN/cni/net.d" "$RUN/kubelet" "$RUN/pod-logs"
	cat >"$RUN/containerd/config.toml" <<-EOF
		version = 3
		root = "$RUN/containerd/root"
		state = "$RUN/containerd/state"
		disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.blockfile", "io.containerd.snapshotter.v1.erofs"]

		[grpc]
		  address = "$RUN/containerd/containerd.sock"

		[ttrpc]
		  address = "$RUN/containerd/containerd.sock.ttrpc"

		[plugins.'io.containerd.cri.v1.runtime']
		  restrict_oom_score_adj = true
		  [plugins.'io.containerd.cri.v1.runtime'.containerd]
		    default_runtime_name = "runc"
		    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
		      runtime_type = "io.containerd.runc.v2"
		      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
		        BinaryName = "$(command -v runc)"
		        SystemdCgroup = false
		    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc]
		      runtime_type = "io.containerd.runsc.v1"
		      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runsc.options]
		        TypeUrl = "io.containerd.runsc.v1.options"
		        ConfigPath = "$RUN/containerd/runsc.toml"
		  [plugins.'io.containerd.cri.v1.runtime'.cni]
		    bin_dirs = ["/usr/lib/cni"]
		    conf_dir = "$RUN/cni/net.d"

		[plugins.'io.containerd.cri.v1.images'.pinned_images]
		  sandbox = "localhost/airlock/pause:1"
	EOF
	cat >"$RUN/containerd/runsc.toml" <<-EOF
		binary_name = "$RUNSC"
		root = "$RUN/runsc"
		[runsc_config]
		  platform = "systrap"
	EOF
	cat >"$RUN/cni/net.d/10-airlock.conflist" <<-EOF
		{
		  "cniVersion": "1.0.0",
		  "name": "airlock-kube",
		  "plugins": [
		    {"type": "bridge", "bridge": "$BRIDGE", "isGateway": true, "ipMasq": false, "hairpinMode": true,
		     "ipam": {"type": "host-local", "dataDir": "$RUN/cni/ipam", "ranges": [[{"subnet": "$POD_CIDR"}]],
		              "routes": $POD_ROUTES}},
		    {"type": "loopback"}
		  ]
		}
	EOF
	# The Pods' DNS server is the node's bridge address, where nothing
	# answers but the node agent's filter (to which the agent redirects
	# sandbox Pods' DNS): no Pod asks the host's own resolver.
	echo "nameserver $POD_GATEWAY" >"$RUN/kubelet/resolv.conf"
	cat >"$RUN/kubelet/config.yaml" <<-EOF
		apiVersion: kubelet.config.k8s.io/v1beta1
		kind: KubeletConfiguration
		address: 127.0.0.1
		port: 10250
		readOnlyPort: 0
		healthzBindAddress: 127.0.0.1
		healthzPort: 10248
		authentication:
		  anonymous: {enabled: false}
		  webhook: {enabled: true}
		  x509: {clientCAFile: $PKI/ca.crt}
		authorization: {mode: Webhook}
		tlsCertFile: $PKI/kubelet.crt
		tlsPrivateKeyFile: $PKI/kubelet.key
		cgroupDriver: cgroupfs
		cgroupRoot: /$CGROUP_NAME
		failCgroupV1: false
		failSwapOn: false
		containerRuntimeEndpoint: unix://$RUN/containerd/containerd.sock
		podLogsDir: $RUN/pod-logs
		resolvConf: $RUN/kubelet/resolv.conf
		evictionHard: {memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}
		imageGCHighThresholdPercent: 100
		imageGCLowThresholdPercent: 99
		maxPods: 200
		serializeImagePulls: false
	EOF
}

save_sysctls() {
	local f=$RUN/sysctls.before
	[ -e "$f" ] && return
	for s in "${SYSCTLS[@]}"; do
		echo "$s=$(sysctl -n "$s")"
	done >"$f"
}

node_ready() {
	kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null | grep -qx True
}

cmd_up() {
	cmd_build
	if [ -e "$PIDS/kubelet.pid" ] && kill -0 "$(cat "$PIDS/kubelet.pid")" 2>/dev/null; then
		echo "the stack is up already ($RUN)"
		return
	fi
	# What an earlier run left (a crash, a killed CI job) goes first, the
	# same way as at the end: never a removal through a live mount.
	[ -d "$RUN" ] && cmd_down
	step "starting the stack in $RUN"
	mkdir -p "$RUN" "$LOGS" "$PIDS"
	save_sysctls
	ls /var/run/netns 2>/dev/null >"$RUN/netns.before" || true
	make_pki
	write_configs
	make_cgroups

	start etcd etcd --name airlock --data-dir "$RUN/etcd" \
		--listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
		--listen-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((ETCD_PORT + 1))" \
		--initial-cluster "airlock=http://127.0.0.1:$((ETCD_PORT + 1))" --listen-metrics-urls "" --log-level warn
	start containerd containerd --config "$RUN/containerd/config.toml"
	wait_for etcd 30 curl -fsS "http://127.0.0.1:$ETCD_PORT/health"
	echo "etcd is up"
	wait_for containerd 30 ctr --address "$RUN/containerd/containerd.sock" version
	pause_image "$RUN/pause.tar"
	ctr --address "$RUN/containerd/containerd.sock" -n k8s.io images import --local "$RUN/pause.tar" >/dev/null
	echo "containerd is up, the pause image imported"

	start kube-apiserver kube-apiserver --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
		--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$APISERVER_PORT" \
		--service-cluster-ip-range "$SERVICE_CIDR" \
		--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --client-ca-file "$PKI/ca.crt" \
		--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--kubelet-client-certificate "$PKI/apiserver-kubelet.crt" --kubelet-client-key "$PKI/apiserver-kubelet.key" \
		--kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP \
		--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction --allow-privileged=true \
		--profiling=false
	wait_for kube-apiserver 90 kubectl get --raw /readyz
	echo "kube-apiserver is up"
	start kube-controller-manager kube-controller-manager --kubeconfig "$PKI/controller-manager.kubeconfig" \
		--authentication-kubeconfig "$PKI/controller-manager.kubeconfig" --authorization-kubeconfig "$PKI/controller-manager.kubeconfig" \
		--bind-address 127.0.0.1 --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
		--cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
		--use-service-account-credentials --leader-elect=false --profiling=false
	start kube-scheduler kube-scheduler --kubeconfig "$PKI/scheduler.kubeconfig" \
		--authentication-kubeconfig "$PKI/scheduler.kubeconfig" --authorization-kubeconfig "$PKI/scheduler.kubeconfig" \
		--bind-address 127.0.0.1 --leader-elect=false --profiling=false
	start kubelet kubelet --config "$RUN/kubelet/config.yaml" --kubeconfig "$PKI/node.kubeconfig" \
		--hostname-override "$NODE" --node-ip 127.0.0.1 --root-dir "$RUN/kubelet"
	wait_for kubelet 120 node_ready
	kubectl apply -f - >/dev/null <<-EOF
		apiVersion: node.k8s.io/v1
		kind: RuntimeClass
		metadata: {name: gvisor}
		handler: runsc
	EOF
	echo "node $NODE is Ready (${SECONDS}s); RuntimeClass gvisor (runsc) made"
	echo "export KUBECONFIG=$KUBECONFIG"
}

# stop NAME: TERM, then KILL, the daemon `start` started.
stop() {
	local f=$PIDS/$1.pid pid
	[ -e "$f" ] || return 0
	pid=$(cat "$f")
	if kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$f"
}

cmd_down() {
	need_root "it removes mounts, cgroups and network devices"
	[ -d "$RUN" ] || { echo "nothing to tear down ($RUN does not exist)"; return; }
	step "tearing the stack down"
	local ctr=(ctr --address "$RUN/containerd/containerd.sock" -n k8s.io)
	# Pods first, through the cluster, so the kubelet stops their sandboxes
	# and CNI releases their network; then what is left, through containerd.
	if [ -e "$PIDS/kubelet.pid" ] && kubectl get --raw /readyz >/dev/null 2>&1; then
		kubectl delete pods --all -A --grace-period=0 --force --wait=false >/dev/null 2>&1 || true
		for _ in $(seq 1 60); do
			[ -z "$(kubectl get pods -A -o name 2>/dev/null)" ] && break
			sleep 0.5
		done
	fi
	stop kubelet
	stop kube-scheduler
	stop kube-controller-manager
	stop kube-apiserver
	if "${ctr[@]}" version >/dev/null 2>&1; then
		for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
			"${ctr[@]}" tasks kill -s SIGKILL "$t" >/dev/null 2>&1 || true
		done
		sleep 1
		for t in $("${ctr[@]}" tasks ls -q 2>/dev/null); do
			"${ctr[@]}" tasks delete -f "$t" >/dev/null 2>&1 || true
		done
		for c in $("${ctr[@]}" containers ls -q 2>/dev/null); do
			"${ctr[@]}" containers delete "$c" >/dev/null 2>&1 || true
		done
	fi
	# Shims our containerd started and that outlived their tasks.
	for f in $(find "$RUN/containerd/state" -name shim.pid 2>/dev/null); do
		kill -KILL "$(cat "$f")" 2>/dev/null || true
	done
	stop containerd
	stop etcd
	# Network namespaces containerd made for our Pods that the kubelet did
	# not get to remove (named cni-*, made after `up` listed those there),
	# and our bridge.
	for ns in $(ls /var/run/netns 2>/dev/null | grep '^cni-' || true); do
		grep -qx "$ns" "$RUN/netns.before" 2>/dev/null && continue
		ip netns del "$ns" 2>/dev/null || true
	done
	ip link del "$BRIDGE" 2>/dev/null || true
	# Mounts under our directory, deepest first.
	awk -v run="$RUN" '$2 == run || index($2, run "/") == 1 { print $2 }' /proc/mounts | sort -r | while read -r m; do
		umount -l "$m" 2>/dev/null || true
	done
	remove_cgroups
	local before=""
	if [ -e "$RUN/sysctls.before" ]; then
		before=$(cat "$RUN/sysctls.before")
		while IFS='=' read -r k v; do sysctl -qw "$k=$v" || true; done <"$RUN/sysctls.before"
	fi
	if awk -v run="$RUN" 'index($2, run "/") == 1 { found = 1 } END { exit !found }' /proc/mounts; then
		die "mounts under $RUN are still there; not removing it (see /proc/mounts)"
	fi
	rm -rf "$RUN"
	# Nothing of the stack may outlive it.
	local left=()
	for d in $(cgroup_dirs); do
		[ -d "$d" ] && left+=("cgroup $d")
	done
	ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("bridge $BRIDGE")
	if [ -n "$before" ]; then
		while IFS='=' read -r k v; do
			[ "$(sysctl -n "$k")" = "$v" ] || left+=("sysctl $k=$(sysctl -n "$k") (was $v)")
		done <<<"$before"
	fi
	if [ ${#left[@]} -gt 0 ]; then
		printf '  left behind: %s\n' "${left[@]}" >&2
		die "the stack was not torn down completely"
	fi
	echo "done: no process, mount, cgroup, network device or sysctl of the stack is left"
}

case "${1:-}" in
build) cmd_build ;;
up) cmd_up ;;
down) cmd_down ;;
env) echo "export KUBECONFIG=$KUBECONFIG PATH=$BIN:\$PATH" ;;
kubeconfig) echo "$KUBECONFIG" ;;
dir) echo "$KUBE_DIR" ;;
*) die "usage: $0 build|up|down|env|kubeconfig|dir" ;;
esac
