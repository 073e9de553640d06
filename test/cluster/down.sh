#!/usr/bin/env bash
# Tear the torpor test cluster down, leaving the rig's nodes (containerd,
# snapshotters) running and empty:
#   the kubelets; every pod they left on the nodes' containerds (crictl
#   stopp/rmp); mounts under the kubelets' root dirs; those dirs and the pod
#   log dirs; the kubepods cgroups under each node's cgroup parent; the
#   control plane (kube-scheduler, kube-controller-manager, kube-apiserver,
#   etcd); the host sysctls kubelet changed, put back; /var/lib/kubelet and
#   /var/log/containers if the cluster made them; any KUBE-* iptables chain;
#   the cluster's state dir.
#
#   test/cluster/down.sh          the cluster only
#   test/cluster/down.sh --rig    ... then the rig too (test/rig/down.sh)
#
# Exits non-zero if something of the cluster is still left at the end.
set -uo pipefail

# shellcheck source=env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

log() { echo "cluster/down: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }
with_rig=0
for a in "$@"; do
	case "$a" in
	--rig) with_rig=1 ;;
	*) echo "usage: $0 [--rig]" >&2; exit 2 ;;
	esac
done

mkdir -p "$TORPOR_RIG_A_ROOT"
exec 8>"$TORPOR_RIG_A_ROOT/cluster.lock"
flock -w 600 8 || { log "another cluster up.sh/down.sh does not finish"; exit 1; }

# stop NAME: SIGTERM, up to 15 s, then SIGKILL.
stop() {
	local pid
	pid="$(cluster_pid "$1")" || { rm -f "$TORPOR_CLUSTER_STATE/$1.pid"; return 0; }
	log "stopping $1 (pid $pid)"
	kill -TERM "$pid" 2>/dev/null
	for _ in $(seq 150); do
		[ -d "/proc/$pid" ] || break
		sleep 0.1
	done
	if [ -d "/proc/$pid" ]; then
		log "$1 ignored SIGTERM for 15s, killing"
		kill -KILL "$pid" 2>/dev/null
		sleep 0.3
	fi
	rm -f "$TORPOR_CLUSTER_STATE/$1.pid"
}

# Processes of the cluster's binaries that mention its state dir (also ones
# whose pid file is gone).
cluster_pids() {
	local p exe
	for p in /proc/[0-9]*; do
		exe="$(readlink "$p/exe" 2>/dev/null)" || continue
		case "$(basename "$exe")" in
		etcd | kube-apiserver | kube-controller-manager | kube-scheduler | kubelet) ;;
		*) continue ;;
		esac
		tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -F -- "$TORPOR_CLUSTER_STATE" >/dev/null && echo "${p#/proc/}"
	done
}

# ---------------------------------------------------------------- kubelets
stop kubelet-a
stop kubelet-b

# What the kubelets left on the nodes: every CRI pod (the rig's own tests
# do not run while the cluster is up: a kubelet kills pods it does not know).
for n in a b; do
	TORPOR_RIG_NODE=$n bash -c '
		. "$TORPOR_RIG_DIR/env.sh"
		rig_containerd_pid >/dev/null || exit 0
		for p in $(rig_crictl --timeout 30s pods -q 2>/dev/null); do
			rig_crictl --timeout 120s stopp "$p" >/dev/null 2>&1 || echo "cluster/down: node '"$n"': stopp $p failed" >&2
			rig_crictl --timeout 60s rmp -f "$p" >/dev/null 2>&1 || echo "cluster/down: node '"$n"': rmp $p failed" >&2
		done'
done

unmount_under() {
	local dir="$1" m mounts
	for _ in 1 2 3; do
		mounts="$(awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | tac)"
		[ -n "$mounts" ] || return 0
		while read -r m; do
			m="$(printf '%b' "$m")"
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
		done <<<"$mounts"
	done
}

kubepods_dirs() { # NODE: the node's kubepods cgroups, deepest first
	local cg="TORPOR_RIG_$(tr a-z A-Z <<<"$1")_CGROUP" h
	for h in /sys/fs/cgroup/*/"${!cg}/kubepods"; do
		[ -d "$h" ] && find "$h" -depth -type d
	done
}

for n in a b; do
	root="$(cluster_kubelet_root "$n")"
	logs="$(cluster_pod_logs "$n")"
	unmount_under "$root"
	[ -e "$root" ] && { rm -rf "${root:?}" || log "cannot remove $root"; }
	# kubelet's symlinks into this node's pod logs
	for l in /var/log/containers/*.log; do
		[ -L "$l" ] || continue
		case "$(readlink "$l")" in "$logs"/*) rm -f "$l" ;; esac
	done
	rm -rf "${logs:?}"
	# processes left in the kubepods cgroups (containers of pods whose shim died)
	for d in $(kubepods_dirs "$n"); do
		for f in "$d/cgroup.procs" "$d/tasks"; do
			[ -r "$f" ] || continue
			while read -r p; do
				[ -n "$p" ] && kill -KILL "$p" 2>/dev/null
			done <"$f"
		done
	done
	sleep 0.2
	for d in $(kubepods_dirs "$n"); do
		for _ in 1 2 3 4 5; do rmdir "$d" 2>/dev/null && break; sleep 0.2; done
	done
done
for p in /var/lib/kubelet /var/log/containers; do
	m="$TORPOR_CLUSTER_STATE/created$(tr / _ <<<"$p")"
	[ -e "$m" ] && { rm -rf "${p:?}" || log "cannot remove $p"; }
done

# ----------------------------------------------------------- control plane
stop kube-scheduler
stop kube-controller-manager
stop kube-apiserver
stop etcd
for pid in $(cluster_pids); do
	log "killing leftover cluster process $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-100))"
	kill -KILL "$pid" 2>/dev/null
done

# ------------------------------------------------------------------- host
if [ -f "$TORPOR_CLUSTER_STATE/sysctl.orig" ]; then
	while read -r s v; do
		[ -n "$s" ] && echo "$v" >"/proc/sys/$s" 2>/dev/null || log "cannot restore $s=$v"
	done <"$TORPOR_CLUSTER_STATE/sysctl.orig"
fi
# kubelet runs with makeIPTablesUtilChains: false, so it adds no chains; remove
# its chains should one have appeared anyway (nothing else here makes KUBE-*).
kube_chains() { # CMD TABLE
	"$1-save" -t "$2" 2>/dev/null | sed -n 's/^:\(KUBE-[A-Za-z0-9-]*\) .*/\1/p'
}
for cmd in iptables ip6tables; do
	command -v "$cmd-save" >/dev/null || continue
	for table in filter nat mangle; do
		for c in $(kube_chains "$cmd" "$table"); do
			log "$cmd -t $table: removing chain $c"
			"$cmd-save" -t "$table" | grep -E -- "^-A [A-Z]+ .*-j $c( |\$)" | while read -r r; do
				eval "$cmd -t $table ${r/#-A/-D}" 2>/dev/null
			done
			"$cmd" -t "$table" -F "$c" 2>/dev/null
			"$cmd" -t "$table" -X "$c" 2>/dev/null
		done
	done
done

rm -rf "${TORPOR_CLUSTER_STATE:?}"

# ----------------------------------------------------------------- verify
left=()
[ -n "$(cluster_pids)" ] && left+=("processes: $(cluster_pids | tr '\n' ' ')")
for n in a b; do
	root="$(cluster_kubelet_root "$n")"
	grep -qF -e " $root/" -e " $root " /proc/self/mountinfo && left+=("mounts under $root")
	[ -e "$root" ] && left+=("$root")
	[ -n "$(kubepods_dirs "$n")" ] && left+=("cgroups: $(kubepods_dirs "$n" | tr '\n' ' ')")
done
for cmd in iptables ip6tables; do
	command -v "$cmd-save" >/dev/null || continue
	for table in filter nat mangle; do
		[ -n "$(kube_chains "$cmd" "$table")" ] && left+=("$cmd -t $table chains: $(kube_chains "$cmd" "$table" | tr '\n' ' ')")
	done
done
[ -e "$TORPOR_CLUSTER_STATE" ] && left+=("$TORPOR_CLUSTER_STATE")
rc=0
if [ "${#left[@]}" -gt 0 ]; then
	log "LEFT BEHIND: ${left[*]}"
	rc=1
else
	log "cluster is down"
fi
exec 8>&-
if [ "$with_rig" = 1 ]; then
	"$TORPOR_RIG_DIR/down.sh" || rc=1
fi
exit "$rc"
