# shellcheck shell=bash
# Source this file to talk to the torpor test cluster (test/cluster/up.sh):
#
#   . test/cluster/env.sh
#   kubectl get nodes          # the cluster's own kubectl, with its admin kubeconfig
#
# The cluster sits on the two-node rig (test/rig/env.sh, sourced here): one
# control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler) and one kubelet per rig node, node-a on node A's
# containerd, node-b on node B's. Everything it owns lives under
#   TORPOR_CLUSTER_STATE  (certs, kubeconfigs, etcd data, configs, logs, pids)  <node A state>/cluster
#   <node X root>/kubelet (kubelet root dir) and <node X root>/pod-logs (container logs)
# and in the cgroups <node X cgroup>/kubepods; test/cluster/down.sh removes all of it.

_cluster_env_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# The rig's environment of node A (the cluster needs both nodes' names).
# shellcheck source=../rig/env.sh
TORPOR_RIG_NODE=a . "$_cluster_env_dir/../rig/env.sh"
export TORPOR_CLUSTER_DIR="$_cluster_env_dir"
unset _cluster_env_dir

export TORPOR_CLUSTER_STATE="${TORPOR_CLUSTER_STATE:-$TORPOR_RIG_A_STATE/cluster}"
export TORPOR_CLUSTER_PKI="$TORPOR_CLUSTER_STATE/pki"

# Binaries: ours from scripts/deps.sh (a kubectl elsewhere in PATH, such as
# /usr/bin/kubectl, may be any version: never used).
export TORPOR_K8S_BIN="${TORPOR_K8S_BIN:-/usr/local/bin}"
export TORPOR_KUBECTL="${TORPOR_KUBECTL:-$TORPOR_K8S_BIN/kubectl}"
export TORPOR_ETCD="${TORPOR_ETCD:-$TORPOR_K8S_BIN/etcd}"

# Ports, all on 127.0.0.1 (the kubelets' differ: two on one machine).
export TORPOR_CLUSTER_ETCD_PORT="${TORPOR_CLUSTER_ETCD_PORT:-12379}"
export TORPOR_CLUSTER_ETCD_PEER_PORT="${TORPOR_CLUSTER_ETCD_PEER_PORT:-12380}"
export TORPOR_CLUSTER_APISERVER_PORT="${TORPOR_CLUSTER_APISERVER_PORT:-16443}"
export TORPOR_CLUSTER_CM_PORT="${TORPOR_CLUSTER_CM_PORT:-10257}"
export TORPOR_CLUSTER_SCHEDULER_PORT="${TORPOR_CLUSTER_SCHEDULER_PORT:-10259}"
export TORPOR_CLUSTER_KUBELET_A_PORT=10250 TORPOR_CLUSTER_KUBELET_A_HEALTHZ=10248
export TORPOR_CLUSTER_KUBELET_B_PORT=10350 TORPOR_CLUSTER_KUBELET_B_HEALTHZ=10348
# Service ClusterIPs are allocated from here; nothing routes them (no
# kube-proxy), the tests talk to pod IPs.
export TORPOR_CLUSTER_SERVICE_CIDR="${TORPOR_CLUSTER_SERVICE_CIDR:-10.96.0.0/24}"

export TORPOR_KUBECONFIG="$TORPOR_CLUSTER_STATE/admin.kubeconfig"
export KUBECONFIG="$TORPOR_KUBECONFIG"
# kubectl's discovery cache (default ~/.kube/cache) with the cluster's state.
export KUBECACHEDIR="$TORPOR_CLUSTER_STATE/kubectl-cache"

# Per node X (a, b): kubelet's root dir, pod log dir, config, log and pid.
cluster_kubelet_root() { local r="TORPOR_RIG_$(tr a-z A-Z <<<"$1")_ROOT"; echo "${!r}/kubelet"; }
cluster_pod_logs() { local r="TORPOR_RIG_$(tr a-z A-Z <<<"$1")_ROOT"; echo "${!r}/pod-logs"; }
export TORPOR_CLUSTER_KUBELET_A_LOG="$TORPOR_CLUSTER_STATE/kubelet-a.log"
export TORPOR_CLUSTER_KUBELET_B_LOG="$TORPOR_CLUSTER_STATE/kubelet-b.log"

cluster_kubectl() { "$TORPOR_KUBECTL" --kubeconfig "$TORPOR_KUBECONFIG" "$@"; }

# cluster_pid NAME: the pid of cluster component NAME (etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler, kubelet-a, kubelet-b) if it runs.
# A pid file is trusted only if that process still runs the binary with this
# cluster's state dir on its command line.
cluster_pid() {
	local f="$TORPOR_CLUSTER_STATE/$1.pid" pid
	[ -f "$f" ] || return 1
	pid="$(cat "$f" 2>/dev/null)" || return 1
	[ -n "$pid" ] && [ -d "/proc/$pid" ] || return 1
	tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -F -- "$TORPOR_CLUSTER_STATE" >/dev/null || return 1
	echo "$pid"
}
