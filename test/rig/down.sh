#!/usr/bin/env bash
# Tear the torpor test rig down, also after failures, crashes or a killed
# containerd: pods, containers, tasks, shims and their container processes,
# containerd, the rig's torpor-snapshotter, mounts, network namespaces, the CNI bridge and veths, iptables
# rules of the rig's network, cgroups, shim sockets and the state dir.
# Both nodes: node B first (TORPOR_RIG_NODE=b down.sh, also when it was never
# up), then node A and the S3 server. TORPOR_RIG_NODE=b tears down node B only.
#
#   test/rig/down.sh           keep the content store ($TORPOR_RIG_ROOT)
#   test/rig/down.sh --purge   also delete $TORPOR_RIG_ROOT (images re-import quickly;
#                              this includes the snapshotter's root and its snapshots)
#
# Exits non-zero if something of the rig is still left at the end.
set -uo pipefail

# shellcheck source=env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

PURGE="${TORPOR_RIG_PURGE:-0}"
for a in "$@"; do
	case "$a" in
	--purge) PURGE=1 ;;
	*) echo "usage: $0 [--purge]" >&2; exit 2 ;;
	esac
done

log() { echo "rig/down[node $TORPOR_RIG_NODE]: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "must run as root"; exit 1; }

# The Kubernetes test cluster on top of the rig (test/cluster), if it was
# started: its kubelets and control plane go first.
cluster_rc=0
if [ "$TORPOR_RIG_NODE" = a ] && [ -e "$TORPOR_RIG_STATE/cluster" ]; then
	TORPOR_CLUSTER_STATE="$TORPOR_RIG_STATE/cluster" "$TORPOR_RIG_DIR/../cluster/down.sh" || cluster_rc=1
fi

node_b_rc=0
if [ "$TORPOR_RIG_NODE" = a ] && { [ -e "$TORPOR_RIG_B_ROOT" ] || [ -e "$TORPOR_RIG_B_STATE" ]; }; then
	b_args=()
	[ "$PURGE" = 1 ] && b_args=(--purge)
	TORPOR_RIG_NODE=b "$TORPOR_RIG_DIR/down.sh" "${b_args[@]}" || node_b_rc=1
fi

rig_lock || exit 1

TASK_DIR="$TORPOR_RIG_CONTAINERD_STATE/io.containerd.runtime.v2.task"
SHIM_SOCKET_ROOT=/run/containerd/s

# (namespace id) pairs of every task bundle the rig has, for the fallbacks below.
bundles() {
	local d
	for d in "$TASK_DIR"/*/*; do
		[ -d "$d" ] || continue
		echo "$(basename "$(dirname "$d")") $(basename "$d")"
	done
}

# pids of shim processes that belong to the rig: started with the rig's
# containerd address, or running in a bundle dir under the rig's state dir.
rig_shim_pids() {
	local p exe cwd cmd
	for p in /proc/[0-9]*; do
		exe="$(readlink "$p/exe" 2>/dev/null)" || continue
		case "$(basename "$exe")" in
		containerd-shim-*) ;;
		*) continue ;;
		esac
		cmd="$(tr '\0' ' ' <"$p/cmdline" 2>/dev/null)"
		cwd="$(readlink "$p/cwd" 2>/dev/null || true)"
		case " $cmd " in
		*" $TORPOR_RIG_ADDRESS "* | *"address $TORPOR_RIG_ADDRESS"* | *"address=$TORPOR_RIG_ADDRESS"*)
			echo "${p#/proc/}"; continue ;;
		esac
		case "$cwd" in
		"$TORPOR_RIG_STATE"/*) echo "${p#/proc/}" ;;
		esac
	done
}

# all descendants of a pid (children first in the output order does not matter:
# everything is SIGKILLed).
descendants() {
	local parent="$1" c
	for c in $(ps -o pid= --ppid "$parent" 2>/dev/null); do
		echo "$c"
		descendants "$c"
	done
}

# unix socket paths a process is listening on
listening_sockets() {
	local pid="$1" inodes
	inodes="$(for fd in /proc/"$pid"/fd/*; do readlink "$fd" 2>/dev/null; done |
		sed -n 's/^socket:\[\([0-9]*\)\]$/\1/p' | sort -u)"
	[ -n "$inodes" ] || return 0
	awk -v inodes="$inodes" 'BEGIN { n = split(inodes, a, "\n"); for (i = 1; i <= n; i++) want[a[i]] = 1 }
		NR > 1 && ($7 in want) && $8 != "" { p = $8; sub(/^@/, "", p); print p }' /proc/net/unix
}

rig_cgroup_dirs() {
	# cgroups the rig's pods use (cgroup_parent /$TORPOR_RIG_CGROUP/...), in
	# every hierarchy, deepest first.
	local h
	for h in /sys/fs/cgroup/*/"$TORPOR_RIG_CGROUP" /sys/fs/cgroup/"$TORPOR_RIG_CGROUP"; do
		[ -d "$h" ] && find "$h" -depth -type d
	done
}

# ------------------------------------------------------- 1. polite, via the API
if pid="$(rig_containerd_pid)"; then
	log "containerd running (pid $pid): removing pods, containers and tasks"
	if [ -x "$TORPOR_CRICTL" ]; then
		for p in $(rig_crictl --timeout 30s pods -q 2>/dev/null); do
			rig_crictl --timeout 60s stopp "$p" >/dev/null 2>&1 || log "stopp $p failed"
			rig_crictl --timeout 60s rmp -f "$p" >/dev/null 2>&1 || log "rmp $p failed"
		done
		# containers whose pod is already gone
		for c in $(rig_crictl --timeout 30s ps -a -q 2>/dev/null); do
			rig_crictl --timeout 60s rm -f "$c" >/dev/null 2>&1 || true
		done
	fi
	if [ -x "$TORPOR_CTR" ]; then
		for ns in $(rig_ctr namespaces ls -q 2>/dev/null); do
			for t in $(rig_ctr -n "$ns" tasks ls -q 2>/dev/null); do
				rig_ctr -n "$ns" tasks kill -a -s SIGKILL "$t" >/dev/null 2>&1 || true
			done
			for t in $(rig_ctr -n "$ns" tasks ls -q 2>/dev/null); do
				for _ in $(seq 50); do
					rig_ctr -n "$ns" tasks delete -f "$t" >/dev/null 2>&1 && break
					sleep 0.1
				done
			done
			for c in $(rig_ctr -n "$ns" containers ls -q 2>/dev/null); do
				rig_ctr -n "$ns" containers rm "$c" >/dev/null 2>&1 || log "ctr -n $ns c rm $c failed"
			done
		done
	fi
fi

# stop_pid NAME PID: SIGTERM, up to 10 s for it to exit, then SIGKILL.
stop_pid() {
	log "stopping $1 (pid $2)"
	kill -TERM "$2" 2>/dev/null
	for _ in $(seq 100); do
		[ -d "/proc/$2" ] || return 0
		sleep 0.1
	done
	log "$1 ignored SIGTERM for 10s, killing"
	kill -KILL "$2" 2>/dev/null
	sleep 0.2
}

# ---------------------------------------------------------- 2. stop containerd
# Its restart loop first (TORPOR_RIG_PLAIN=1 up.sh), so that it stays down.
if [ -f "$TORPOR_RIG_SUPERVISOR_PIDFILE" ]; then
	spid="$(cat "$TORPOR_RIG_SUPERVISOR_PIDFILE" 2>/dev/null || true)"
	if [ -n "$spid" ] && [ -d "/proc/$spid" ] && tr '\0' ' ' <"/proc/$spid/cmdline" 2>/dev/null | grep -qF -- "$TORPOR_RIG_DIR/supervise.sh"; then
		stop_pid "containerd's restart loop" "$spid"
	fi
	rm -f "$TORPOR_RIG_SUPERVISOR_PIDFILE"
fi
if pid="$(rig_containerd_pid)"; then
	stop_pid containerd "$pid"
fi
rm -f "$TORPOR_RIG_PIDFILE"

# ------------------------------------------------- 2b. stop torpor-snapshotter
# After containerd (which may still remove snapshots through it above).
if pid="$(rig_snapshotter_pid)"; then
	stop_pid torpor-snapshotter "$pid"
fi
rm -f "$TORPOR_RIG_SNAPSHOTTER_PIDFILE"
# A snapshotter killed before its stop leaves the node's RCU setting
# expedited and its own value in a marker (snapshotter::rcu): put back
# once no snapshotter of any rig is left.
rcu_marker=/run/torpor-snapshotter.rcu_expedited
if [ -f "$rcu_marker" ] && ! pgrep -x torpor-snapshot >/dev/null; then
	case "$(cat "$rcu_marker")" in
	0 | 1) cat "$rcu_marker" >/sys/kernel/rcu_expedited || true ;;
	esac
	rm -f "$rcu_marker"
fi

# the S3 server, node A's (its data under $TORPOR_RIG_S3_DIR stays until --purge)
if [ "$TORPOR_RIG_NODE" = a ]; then
	"$TORPOR_RIG_DIR/s3.sh" stop || log "could not stop the S3 server"
fi

# --------------------------------------- 3. leftover shims and their containers
shim_sockets=()
for pid in $(rig_shim_pids); do
	while read -r s; do
		[ -n "$s" ] && shim_sockets+=("$s")
	done < <(listening_sockets "$pid")
	kids="$(descendants "$pid")"
	log "killing leftover shim $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-120)) and its processes: ${kids//$'\n'/ }"
	# freeze the tree first by stopping the shim so it does not respawn/reap
	kill -STOP "$pid" 2>/dev/null
	for k in $kids; do kill -KILL "$k" 2>/dev/null; done
	kill -KILL "$pid" 2>/dev/null
done
# processes still in the rig's cgroups (e.g. reparented container processes)
for d in $(rig_cgroup_dirs); do
	for f in "$d/cgroup.procs" "$d/tasks"; do
		[ -r "$f" ] || continue
		while read -r p; do
			[ -n "$p" ] || continue
			log "killing leftover process $p in cgroup $d"
			kill -KILL "$p" 2>/dev/null
		done <"$f"
	done
done
sleep 0.3

# runc state of containers whose shim died without deleting them
if command -v runc >/dev/null; then
	while read -r ns id; do
		[ -n "$id" ] || continue
		# runc roots: containerd-shim-runc-v2 default, torpor shim default (runtime/src/runc.rs)
		for root in "/run/containerd/runc/$ns" "/run/torpor/runc/$ns" "$TORPOR_RIG_STATE/runc/$ns"; do
			if [ -d "$root/$id" ]; then
				runc --root "$root" kill -a "$id" KILL >/dev/null 2>&1
				runc --root "$root" delete -f "$id" >/dev/null 2>&1 || rm -rf "${root:?}/${id:?}"
			fi
		done
		# cgroup of ctr-created containers: /<namespace>/<id>
		for h in /sys/fs/cgroup/*/"$ns"/"$id" /sys/fs/cgroup/"$ns"/"$id"; do
			[ -d "$h" ] || continue
			for f in "$h/cgroup.procs" "$h/tasks"; do
				[ -r "$f" ] || continue
				while read -r p; do
					[ -n "$p" ] && kill -KILL "$p" 2>/dev/null
				done <"$f"
			done
			for _ in 1 2 3 4 5; do rmdir "$h" 2>/dev/null && break; sleep 0.2; done
		done
	done < <(bundles)
fi

# `ctr c restore` (containerd 2.4's client) leaves a full copy of each
# checkpoint it restored in /tmp/ctrd-checkpoint*: gigabytes per restore.
rm -rf /tmp/ctrd-checkpoint*

# torpor's per-shim state of the rig's bundles: control sockets, in-container
# request dirs and actor records/snapshots (the rig keeps no actor beyond it)
while read -r ns id; do
	[ -n "$id" ] || continue
	# the request dir is a tmpfs of its own (runtime::oci::bundle)
	umount -l "/run/torpor/actors/${id:?}" 2>/dev/null
	rm -rf "${TORPOR_SHIM_SOCKET_DIR:-/run/torpor/shims}/$id.sock" "/run/torpor/actors/${id:?}" \
		"${TORPOR_STATE_ROOT:-/var/lib/torpor}/actors/${id:?}"
done < <(bundles)

# CRIU launchers (runtime::system::criu_launcher) of the rig's shim binaries,
# and those whose binary is gone
for l in /run/torpor/criu-launcher/*/criu; do
	[ -L "$l" ] || continue
	t="$(readlink "$l")"
	case "$t" in
	"$TORPOR_RIG_STATE"/*) ;;
	*) [ -e "$l" ] && continue ;;
	esac
	rm -f "$l"
	rmdir "$(dirname "$l")" 2>/dev/null
done

# shim sockets: those seen above plus the well-known hash of every bundle
# (sha256 of <containerd address>/<namespace>/<id>, see containerd pkg/shim).
while read -r ns id; do
	[ -n "$id" ] || continue
	for suffix in "" "/debug"; do
		h="$(printf '%s' "$TORPOR_RIG_ADDRESS/$ns/$id$suffix" | sha256sum | cut -d' ' -f1)"
		shim_sockets+=("$SHIM_SOCKET_ROOT/$h")
	done
done < <(bundles)
for s in "${shim_sockets[@]}"; do
	case "$s" in
	"$SHIM_SOCKET_ROOT"/* | "$TORPOR_RIG_STATE"/*) rm -f "$s" ;;
	esac
done

# ------------------------------------------------------------------ 4. mounts
unmount_under() {
	local dir="$1" m
	[ -n "$dir" ] || return 0
	# mountinfo field 5 is the mount point (octal-escaped); unmount in reverse
	# order of mounting so that nested mounts go first.
	for _ in 1 2 3; do
		local mounts
		mounts="$(awk -v d="$dir" '$5 == d || index($5, d "/") == 1 { print $5 }' /proc/self/mountinfo | tac)"
		[ -n "$mounts" ] || return 0
		while read -r m; do
			m="$(printf '%b' "$m")"
			umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
		done <<<"$mounts"
	done
}
unmount_under "$TORPOR_RIG_STATE"
unmount_under "$TORPOR_RIG_ROOT"

# --------------------------------------------------------------- 5. network
# netns the rig's containerd created are under its state dir (unmounted above);
# as a fallback also drop host-wide named netns that hold an address of the
# rig's subnet.
if command -v ip >/dev/null; then
	for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
		if ip -n "$ns" -4 -o addr show 2>/dev/null | grep " inet $TORPOR_RIG_SUBNET_PREFIX" >/dev/null; then
			log "deleting leftover netns $ns"
			ip netns delete "$ns" 2>/dev/null
		fi
	done
	if ip link show "$TORPOR_RIG_BRIDGE" >/dev/null 2>&1; then
		veths="$(ip -o link show master "$TORPOR_RIG_BRIDGE" 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1)"
		for v in $veths; do
			ip link delete "$v" 2>/dev/null
		done
		ip link delete "$TORPOR_RIG_BRIDGE" 2>/dev/null || log "cannot delete bridge $TORPOR_RIG_BRIDGE"
	fi
fi

# iptables: the rig's CNI config installs none (ipMasq false, no portmap), but
# remove anything that names the rig's network or subnet in case a plugin did.
cleanup_iptables() {
	local cmd="$1" save="$2" table rules chains r c
	command -v "$save" >/dev/null || return 0
	for table in nat filter mangle; do
		rules="$("$save" -t "$table" 2>/dev/null | grep -E '^-A ' |
			grep -E "name: \\\\?\"$TORPOR_RIG_CNI_NETWORK\\\\?\"|$TORPOR_RIG_SUBNET|$TORPOR_RIG_BRIDGE" || true)"
		[ -n "$rules" ] || continue
		# chains these rules jump to (per-pod CNI-xxxx chains)
		chains="$(grep -oE -- '-j CNI-[A-Za-z0-9_-]+' <<<"$rules" | awk '{print $2}' | sort -u)"
		while read -r r; do
			[ -n "$r" ] || continue
			log "iptables -t $table: removing ${r:0:120}"
			eval "$cmd -t $table ${r/#-A/-D}" 2>/dev/null
		done <<<"$rules"
		for c in $chains; do
			# only chains nothing references any more
			if ! "$save" -t "$table" 2>/dev/null | grep -E '^-A ' | grep -E -- "-j $c( |\$)" >/dev/null; then
				"$cmd" -t "$table" -F "$c" 2>/dev/null
				"$cmd" -t "$table" -X "$c" 2>/dev/null
			fi
		done
	done
}
cleanup_iptables iptables iptables-save

# CNI result cache of the rig's network (libcni's default cache dir)
rm -f /var/lib/cni/results/"$TORPOR_RIG_CNI_NETWORK"-* 2>/dev/null

# host ip_forward as it was before the first up
if [ -f "$TORPOR_RIG_ROOT/ip_forward.orig" ]; then
	cat "$TORPOR_RIG_ROOT/ip_forward.orig" >/proc/sys/net/ipv4/ip_forward 2>/dev/null
	rm -f "$TORPOR_RIG_ROOT/ip_forward.orig"
fi

# ------------------------------------------------------------------ 6. cgroups
# Under systemd (TORPOR_RIG_SYSTEMD_CGROUP=1) the pods' slices
# (<cgroup>-pod_<name>.slice, test/src/rig.rs) stay active once empty, as
# kubelet's pod slices would without kubelet stopping them: stopping the
# rig's parent slice stops them all.
rig_slice="${TORPOR_RIG_CGROUP//-/_}.slice"
if [ -d /run/systemd/system ] && command -v systemctl >/dev/null &&
	systemctl list-units --all --plain --no-legend "$rig_slice" 2>/dev/null | grep -q .; then
	timeout 60 systemctl stop "$rig_slice" || log "cannot stop the slice $rig_slice"
fi
for d in $(rig_cgroup_dirs); do
	rmdir "$d" 2>/dev/null || log "cannot remove cgroup $d"
done

# ------------------------------------------------------------------ 7. files
rm -rf "${TORPOR_RIG_STATE:?}"
if [ "$PURGE" = 1 ]; then
	log "purging $TORPOR_RIG_ROOT"
	rm -rf "${TORPOR_RIG_ROOT:?}"
fi

# ------------------------------------------------------------------ 8. verify
left=()
[ -n "$(rig_shim_pids)" ] && left+=("shim processes: $(rig_shim_pids | tr '\n' ' ')")
rig_containerd_pid >/dev/null && left+=("containerd")
rig_snapshotter_pid >/dev/null && left+=("torpor-snapshotter")

[ "$TORPOR_RIG_NODE" = a ] && "$TORPOR_RIG_DIR/s3.sh" status 2>/dev/null && left+=("S3 server (versitygw)")
grep -qF -e " $TORPOR_RIG_STATE/" -e " $TORPOR_RIG_STATE " /proc/self/mountinfo && left+=("mounts under $TORPOR_RIG_STATE")
grep -qF -e " $TORPOR_RIG_ROOT/" /proc/self/mountinfo && left+=("mounts under $TORPOR_RIG_ROOT")
ip link show "$TORPOR_RIG_BRIDGE" >/dev/null 2>&1 && left+=("bridge $TORPOR_RIG_BRIDGE")
if command -v iptables-save >/dev/null && iptables-save 2>/dev/null | grep -E "$TORPOR_RIG_SUBNET|$TORPOR_RIG_BRIDGE|name: \\\\?\"$TORPOR_RIG_CNI_NETWORK" >/dev/null; then
	left+=("iptables rules")
fi
[ -n "$(rig_cgroup_dirs)" ] && left+=("cgroups: $(rig_cgroup_dirs | tr '\n' ' ')")
[ -e "$TORPOR_RIG_STATE" ] && left+=("$TORPOR_RIG_STATE")
if [ "${#left[@]}" -gt 0 ]; then
	log "LEFT BEHIND: ${left[*]}"
	exit 1
fi
if [ "$cluster_rc" != 0 ]; then
	log "the cluster (test/cluster/down.sh) left something behind (above)"
	exit 1
fi
if [ "$node_b_rc" != 0 ]; then
	log "node A is down, node B left something behind (above)"
	exit 1
fi
log "rig is down"
