#!/usr/bin/env bash
# Start the torpor test cluster on the two-node rig (test/rig):
#   etcd, kube-apiserver (TLS from certs made here, RBAC and the Node
#   authorizer on), kube-controller-manager, kube-scheduler, and one kubelet
#   per rig node: node-a on node A's containerd, node-b on node B's, each with
#   its node's pod subnet as the Node's podCIDR.
#
#   test/cluster/up.sh             the rig (test/rig/up.sh), then everything not running yet
#   test/cluster/up.sh kubelet-a   only (re)start what is named and not running
#                                  (etcd kube-apiserver kube-controller-manager kube-scheduler kubelet-a kubelet-b)
#
# Idempotent: what runs is reused. Tear down with test/cluster/down.sh (or
# test/rig/down.sh, which calls it first). Binaries: scripts/deps.sh
# kubernetes (TORPOR_K8S_BIN, default /usr/local/bin). The kubelet settings
# are in test/cluster/kubelet.yaml.in, with why each one is needed here.
# The control plane listens on 127.0.0.1, each kubelet on its node's address
# (its pod subnet's gateway, 10.240.0.1 / 10.241.0.1); ports in env.sh.
set -euo pipefail

# shellcheck source=env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

log() { echo "cluster/up: $*" >&2; }
die() { echo "cluster/up: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"

ALL=(etcd kube-apiserver kube-controller-manager kube-scheduler kubelet-a kubelet-b)
want=("$@")
rig_up=0
if [ "${#want[@]}" = 0 ]; then
	want=("${ALL[@]}")
	rig_up=1
fi
for w in "${want[@]}"; do
	case " ${ALL[*]} " in *" $w "*) ;; *) die "unknown component '$w' (one of: ${ALL[*]})" ;; esac
done
wanted() { case " ${want[*]} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
	[ -x "$TORPOR_K8S_BIN/$b" ] || die "$TORPOR_K8S_BIN/$b missing (scripts/deps.sh kubernetes)"
done
command -v openssl >/dev/null || die "openssl missing"

if [ "$rig_up" = 1 ]; then
	"$TORPOR_RIG_DIR/up.sh" || die "the rig did not come up (test/rig/up.sh)"
fi

mkdir -p "$TORPOR_RIG_A_ROOT"
exec 8>"$TORPOR_RIG_A_ROOT/cluster.lock"
flock -w 600 8 || die "another cluster up.sh/down.sh does not finish"
mkdir -p "$TORPOR_CLUSTER_STATE" "$TORPOR_CLUSTER_PKI" "$KUBECACHEDIR"

# wait_for SECONDS DESCRIPTION COMMAND...
wait_for() {
	local secs="$1" what="$2"
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@" >/dev/null 2>&1; do
		[ "$SECONDS" -lt "$deadline" ] || { log "$what: not within ${secs}s"; return 1; }
		sleep 0.5
	done
}

# node_ip NODE: the node's address, its pod subnet's gateway on the node's
# CNI bridge (10.240.0.1 for node A). kubelet refuses a loopback node IP and
# wants one on an interface; each rig node's bridge is its own, on this
# machine, so kube-apiserver reaches each kubelet at its own address.
node_ip() {
	local subnet="TORPOR_RIG_$(tr a-z A-Z <<<"$1")_SUBNET"
	local net="${!subnet%/*}"
	echo "${net%.*}.1"
}

# ensure_bridge NODE: the node's CNI bridge with the gateway address, made
# before the first pod so that kubelet can serve on it (the bridge plugin
# reuses a bridge that has exactly its gateway address; test/rig/down.sh
# removes it with the rig).
ensure_bridge() {
	local N br subnet ip
	N="$(tr a-z A-Z <<<"$1")"
	br="TORPOR_RIG_${N}_BRIDGE"
	subnet="TORPOR_RIG_${N}_SUBNET"
	ip="$(node_ip "$1")/${!subnet#*/}"
	ip link show "${!br}" >/dev/null 2>&1 || ip link add "${!br}" type bridge || die "cannot create bridge ${!br}"
	ip -4 -o addr show dev "${!br}" | grep -qF " $ip " || ip addr add "$ip" dev "${!br}" || die "cannot add $ip to ${!br}"
	ip link set "${!br}" up || die "cannot bring ${!br} up"
}

# ------------------------------------------------------------------ certs
PKI="$TORPOR_CLUSTER_PKI"
# cert NAME SUBJECT [SAN]: an EC P-256 key and a certificate signed by the
# cluster CA (client and server use; one year; regenerated on every fresh up).
cert() {
	local name="$1" subj="$2" san="${3:-}"
	[ -s "$PKI/$name.crt" ] && return 0
	openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/$name.key" 2>/dev/null
	openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
	{
		echo "basicConstraints=critical,CA:FALSE"
		echo "keyUsage=critical,digitalSignature,keyEncipherment"
		echo "extendedKeyUsage=serverAuth,clientAuth"
		[ -n "$san" ] && echo "subjectAltName=$san"
	} >"$PKI/$name.ext"
	openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-days 365 -sha256 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
	rm -f "$PKI/$name.csr" "$PKI/$name.ext"
}

make_pki() {
	[ -s "$PKI/ca.crt" ] && [ -s "$PKI/.complete" ] && return 0
	log "generating the cluster's CA and certificates in $PKI"
	rm -rf "${PKI:?}"/*
	(
		umask 077
		openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/ca.key" 2>/dev/null
		openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=torpor-test-cluster-ca" -days 365 -sha256 \
			-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
			-out "$PKI/ca.crt" 2>/dev/null
		cert apiserver "/CN=kube-apiserver" \
			"IP:127.0.0.1,IP:${TORPOR_CLUSTER_SERVICE_CIDR%.*}.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
		# kube-apiserver -> kubelet (exec, logs, port-forward): system:masters
		cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
		cert admin "/O=system:masters/CN=torpor-test-admin"
		cert kube-controller-manager "/CN=system:kube-controller-manager"
		cert kube-scheduler "/CN=system:kube-scheduler"
		local n
		for n in a b; do
			# the Node authorizer knows a kubelet by this name and group
			cert "kubelet-$n" "/O=system:nodes/CN=system:node:node-$n"
			cert "kubelet-$n-serving" "/CN=node-$n" "IP:$(node_ip "$n"),IP:127.0.0.1,DNS:node-$n"
		done
		# service account tokens
		openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/sa.key" 2>/dev/null
		openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
		date -u +%FT%TZ >"$PKI/.complete"
	) || die "certificate generation failed"
}

# kubeconfig NAME CERT: a kubeconfig for the cluster with client cert CERT.
kubeconfig() {
	cat >"$TORPOR_CLUSTER_STATE/$1.kubeconfig" <<YAML
# Generated by test/cluster/up.sh
apiVersion: v1
kind: Config
clusters:
- name: torpor-test
  cluster:
    server: https://127.0.0.1:$TORPOR_CLUSTER_APISERVER_PORT
    certificate-authority: $PKI/ca.crt
users:
- name: $1
  user:
    client-certificate: $PKI/$2.crt
    client-key: $PKI/$2.key
contexts:
- name: $1@torpor-test
  context:
    cluster: torpor-test
    user: $1
current-context: $1@torpor-test
YAML
}

make_pki
kubeconfig admin admin
kubeconfig kube-controller-manager kube-controller-manager
kubeconfig kube-scheduler kube-scheduler
kubeconfig kubelet-a kubelet-a
kubeconfig kubelet-b kubelet-b

# start NAME BINARY ARGS...: starts a component in its own session (stdin
# /dev/null, log and pid in the state dir) unless it runs.
start() {
	local name="$1" pid
	shift
	if pid="$(cluster_pid "$name")"; then
		log "$name running (pid $pid)"
		return 1
	fi
	log "starting $name; log: $TORPOR_CLUSTER_STATE/$name.log"
	echo "---- $(date -Is) cluster/up.sh starting $name" >>"$TORPOR_CLUSTER_STATE/$name.log"
	setsid "$@" </dev/null >>"$TORPOR_CLUSTER_STATE/$name.log" 2>&1 8>&- &
	echo $! >"$TORPOR_CLUSTER_STATE/$name.pid"
	return 0
}

failed() { # NAME: show its log's tail and die
	tail -n 40 "$TORPOR_CLUSTER_STATE/$1.log" >&2 || true
	die "$1 did not become healthy (log: $TORPOR_CLUSTER_STATE/$1.log)"
}

curl_admin() {
	curl -fsS --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$@"
}

# ------------------------------------------------------------- control plane
if wanted etcd && start etcd "$TORPOR_ETCD" \
	--name torpor-test --data-dir "$TORPOR_CLUSTER_STATE/etcd" \
	--listen-client-urls "http://127.0.0.1:$TORPOR_CLUSTER_ETCD_PORT" \
	--advertise-client-urls "http://127.0.0.1:$TORPOR_CLUSTER_ETCD_PORT" \
	--listen-peer-urls "http://127.0.0.1:$TORPOR_CLUSTER_ETCD_PEER_PORT" \
	--initial-advertise-peer-urls "http://127.0.0.1:$TORPOR_CLUSTER_ETCD_PEER_PORT" \
	--initial-cluster "torpor-test=http://127.0.0.1:$TORPOR_CLUSTER_ETCD_PEER_PORT" \
	--listen-metrics-urls "" --log-level warn; then
	# etcd on loopback only, plain HTTP: only kube-apiserver talks to it.
	wait_for 60 "etcd health" curl -fsS --max-time 2 "http://127.0.0.1:$TORPOR_CLUSTER_ETCD_PORT/health" || failed etcd
fi

if wanted kube-apiserver && start kube-apiserver "$TORPOR_K8S_BIN/kube-apiserver" \
	--etcd-servers "http://127.0.0.1:$TORPOR_CLUSTER_ETCD_PORT" \
	--bind-address 127.0.0.1 --advertise-address 127.0.0.1 --secure-port "$TORPOR_CLUSTER_APISERVER_PORT" \
	--cert-dir "$TORPOR_CLUSTER_STATE/apiserver" \
	--tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
	--client-ca-file "$PKI/ca.crt" \
	--authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
	--allow-privileged=true \
	--service-account-issuer https://kubernetes.default.svc.cluster.local \
	--service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
	--service-cluster-ip-range "$TORPOR_CLUSTER_SERVICE_CIDR" \
	--kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
	--kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
	--kubelet-certificate-authority "$PKI/ca.crt" \
	--kubelet-preferred-address-types InternalIP \
	--endpoint-reconciler-type none \
	--profiling=false; then
	# (--endpoint-reconciler-type none: the 'kubernetes' Service would get the
	# loopback address as its endpoint, which the API refuses.)
	wait_for 120 "kube-apiserver readyz" curl_admin "https://127.0.0.1:$TORPOR_CLUSTER_APISERVER_PORT/readyz" ||
		failed kube-apiserver
fi
# Before anything else may need them: wait for RBAC's bootstrap roles.
wait_for 120 "kube-apiserver readyz" curl_admin "https://127.0.0.1:$TORPOR_CLUSTER_APISERVER_PORT/readyz" ||
	failed kube-apiserver

# The Nodes, made before their kubelets register, so that each gets its rig
# node's subnet as its podCIDR (the rig's CNI config hands out addresses
# from it; kubelet keeps an existing Node's podCIDR).
for n in a b; do
	subnet="TORPOR_RIG_$(tr a-z A-Z <<<"$n")_SUBNET"
	if ! cluster_kubectl get node "node-$n" >/dev/null 2>&1; then
		cluster_kubectl create -f - >/dev/null <<YAML || die "could not create Node node-$n"
apiVersion: v1
kind: Node
metadata:
  name: node-$n
  labels:
    kubernetes.io/hostname: node-$n
    torpor.dev/rig-node: "$n"
spec:
  podCIDR: ${!subnet}
  podCIDRs: [${!subnet}]
YAML
	fi
done

if wanted kube-controller-manager && start kube-controller-manager "$TORPOR_K8S_BIN/kube-controller-manager" \
	--kubeconfig "$TORPOR_CLUSTER_STATE/kube-controller-manager.kubeconfig" \
	--authentication-kubeconfig "$TORPOR_CLUSTER_STATE/kube-controller-manager.kubeconfig" \
	--authorization-kubeconfig "$TORPOR_CLUSTER_STATE/kube-controller-manager.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port "$TORPOR_CLUSTER_CM_PORT" \
	--cert-dir "$TORPOR_CLUSTER_STATE/kube-controller-manager" \
	--leader-elect=false \
	--use-service-account-credentials \
	--service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
	--allocate-node-cidrs=false \
	--profiling=false; then
	wait_for 60 "kube-controller-manager healthz" curl -fsSk --max-time 2 "https://127.0.0.1:$TORPOR_CLUSTER_CM_PORT/healthz" ||
		failed kube-controller-manager
fi

if wanted kube-scheduler && start kube-scheduler "$TORPOR_K8S_BIN/kube-scheduler" \
	--kubeconfig "$TORPOR_CLUSTER_STATE/kube-scheduler.kubeconfig" \
	--authentication-kubeconfig "$TORPOR_CLUSTER_STATE/kube-scheduler.kubeconfig" \
	--authorization-kubeconfig "$TORPOR_CLUSTER_STATE/kube-scheduler.kubeconfig" \
	--bind-address 127.0.0.1 --secure-port "$TORPOR_CLUSTER_SCHEDULER_PORT" \
	--cert-dir "$TORPOR_CLUSTER_STATE/kube-scheduler" \
	--leader-elect=false --profiling=false; then
	wait_for 60 "kube-scheduler healthz" curl -fsSk --max-time 2 "https://127.0.0.1:$TORPOR_CLUSTER_SCHEDULER_PORT/healthz" ||
		failed kube-scheduler
fi

# ------------------------------------------------------------------ kubelets
# Host settings a kubelet changes (protectKernelDefaults: false), recorded
# once before the first kubelet starts; down.sh writes them back.
SYSCTLS="vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes"
if [ ! -f "$TORPOR_CLUSTER_STATE/sysctl.orig" ]; then
	for s in $SYSCTLS; do echo "$s $(cat "/proc/sys/$s")"; done >"$TORPOR_CLUSTER_STATE/sysctl.orig.tmp"
	mv "$TORPOR_CLUSTER_STATE/sysctl.orig.tmp" "$TORPOR_CLUSTER_STATE/sysctl.orig"
fi
# Host paths kubelet hard-codes (the device plugin socket dir under
# /var/lib/kubelet, symlinks in /var/log/containers): down.sh removes them
# if they were not there before.
for p in /var/lib/kubelet /var/log/containers; do
	m="$TORPOR_CLUSTER_STATE/created$(tr / _ <<<"$p")"
	[ -e "$m" ] || [ -e "$m.no" ] || { if [ -e "$p" ]; then touch "$m.no"; else touch "$m"; fi; }
done

start_kubelet() {
	local n="$1" N port healthz root logs cg
	N="$(tr a-z A-Z <<<"$n")"
	port="TORPOR_CLUSTER_KUBELET_${N}_PORT"
	healthz="TORPOR_CLUSTER_KUBELET_${N}_HEALTHZ"
	cg="TORPOR_RIG_${N}_CGROUP"
	local sock
	sock="$(TORPOR_RIG_NODE=$n bash -c ". '$TORPOR_RIG_DIR/env.sh' && echo \$TORPOR_RIG_ADDRESS")"
	root="$(cluster_kubelet_root "$n")"
	logs="$(cluster_pod_logs "$n")"
	mkdir -p "$root" "$logs" "$root/volume-plugins"
	# kubelet requires its cgroupRoot to exist in every hierarchy
	local h
	for h in /sys/fs/cgroup/*/; do
		case "$h" in */unified/) continue ;; esac
		mkdir -p "$h${!cg}"
	done
	ensure_bridge "$n"
	# node-b is a small node: TORPOR_CLUSTER_B_MEMORY_MIB (default 4096) of
	# allocatable memory, the rest of the machine's reserved for the system
	# (allocatable = capacity - systemReserved - evictionHard's
	# memory.available), so that what fits on it is counted as on a small
	# node (issue 42's density test); node-a offers the whole machine.
	# kubelet evicts when its pods' working set comes within evictionHard
	# of their cgroup's limit (allocatable + evictionHard): node-b's 300Mi
	# leaves a test room to press it without the kernel's OOM killer.
	local reserved=0 total_kib eviction_mib=100
	if [ "$n" = b ]; then
		eviction_mib=300
		total_kib="$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)"
		reserved=$((total_kib - (${TORPOR_CLUSTER_B_MEMORY_MIB:-4096} + eviction_mib) * 1024))
		[ "$reserved" -gt 0 ] || reserved=0
	fi
	sed -e "s|@NODE@|$n|g" -e "s|@SYSTEM_RESERVED_MEMORY@|${reserved}Ki|g" -e "s|@EVICTION_MEMORY@|${eviction_mib}Mi|g" -e "s|@ADDRESS@|$(node_ip "$n")|g" -e "s|@CONTAINERD_SOCKET@|$sock|g" -e "s|@CGROUP@|${!cg}|g" \
		-e "s|@PORT@|${!port}|g" -e "s|@HEALTHZ_PORT@|${!healthz}|g" -e "s|@PKI@|$PKI|g" \
		-e "s|@POD_LOGS@|$logs|g" -e "s|@KUBELET_ROOT@|$root|g" \
		"$TORPOR_CLUSTER_DIR/kubelet.yaml.in" >"$TORPOR_CLUSTER_STATE/kubelet-$n.yaml"
	if start "kubelet-$n" "$TORPOR_K8S_BIN/kubelet" \
		--config "$TORPOR_CLUSTER_STATE/kubelet-$n.yaml" \
		--kubeconfig "$TORPOR_CLUSTER_STATE/kubelet-$n.kubeconfig" \
		--root-dir "$root" \
		--hostname-override "node-$n" --node-ip "$(node_ip "$n")" \
		--v 2; then
		wait_for 120 "kubelet-$n healthz" curl -fsS --max-time 2 "http://127.0.0.1:${!healthz}/healthz" || failed "kubelet-$n"
	fi
}
wanted kubelet-a && start_kubelet a
wanted kubelet-b && start_kubelet b

node_ready() {
	[ "$(cluster_kubectl get node "$1" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]
}
for n in a b; do
	if wanted "kubelet-$n"; then
		wait_for 120 "node-$n Ready" node_ready "node-$n" || {
			cluster_kubectl describe node "node-$n" >&2 || true
			failed "kubelet-$n"
		}
	fi
done

# The service account controller works: 'default' exists in 'default'.
wait_for 60 "ServiceAccount default/default" cluster_kubectl -n default get serviceaccount default ||
	failed kube-controller-manager

log "ready: KUBECONFIG=$TORPOR_KUBECONFIG kubectl=$TORPOR_KUBECTL (. test/cluster/env.sh)"
