# shellcheck shell=bash
# Source this file to talk to the torpor test rig (a private containerd).
#
#   . test/rig/env.sh
#   rig_crictl pods            # crictl against the rig's CRI socket
#   rig_ctr -n k8s.io c ls     # ctr against the rig's containerd
#
# Everything the rig owns lives under two directories:
#   TORPOR_RIG_ROOT  (persistent: containerd root, content store)  default /var/lib/torpor-test
#   TORPOR_RIG_STATE (volatile: sockets, state, logs, CNI conf)    default /run/torpor-test
# Every containerd path is derived from these two so that down.sh can never
# touch a containerd that is not the rig's (an inherited CONTAINERD_ADDRESS is
# deliberately ignored). A second rig beside the first needs its own ROOT,
# STATE, CNI network name, bridge, subnet and cgroup (see below).
#
# Two nodes. The rig is two "nodes" on this machine, A and B: each its own
# containerd, torpor-snapshotter (own local tier), CNI network (own bridge and
# pod subnet), cgroup parent and shim state, both sharing node A's S3 server
# and bucket (the object tier). The TORPOR_RIG_* variables a caller sets are
# node A's; node B's are derived from them unless TORPOR_RIG_B_* are set:
#   ROOT <root>-b, STATE <state>-b, CNI_NETWORK <network>-b, BRIDGE <bridge>b,
#   SUBNET the next /16 (10.240.0.0/16 -> 10.241.0.0/16), CGROUP <cgroup>-b.
# TORPOR_RIG_NODE=b (default a) makes this environment node B's: the
# TORPOR_RIG_* below then name node B's things. Both are exported as
# TORPOR_RIG_A_* / TORPOR_RIG_B_* (ROOT STATE CNI_NETWORK BRIDGE SUBNET CGROUP)
# and TORPOR_NODE_ID (node-a / node-b) names the node to its daemons.

_rig_env_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

export TORPOR_RIG_DIR="$_rig_env_dir"
export TORPOR_REPO_ROOT="${TORPOR_REPO_ROOT:-$(cd "$_rig_env_dir/../.." && pwd)}"
unset _rig_env_dir

export TORPOR_RIG_NODE="${TORPOR_RIG_NODE:-a}"
case "$TORPOR_RIG_NODE" in
a | b) ;;
*)
	echo "rig: TORPOR_RIG_NODE=$TORPOR_RIG_NODE: expected a or b" >&2
	return 1 2>/dev/null || exit 1
	;;
esac
# Node A's names: from TORPOR_RIG_* unless this environment was made for
# node B by an earlier env.sh (TORPOR_RIG_ENV_NODE=b: TORPOR_RIG_* are node
# B's then, node A's were saved in TORPOR_RIG_A_*).
for _v in ROOT:/var/lib/torpor-test STATE:/run/torpor-test CNI_NETWORK:torpor-test \
	BRIDGE:torpor-test0 SUBNET:10.240.0.0/16 CGROUP:torpor-test; do
	_k="${_v%%:*}"
	if [ "${TORPOR_RIG_ENV_NODE:-a}" = b ]; then
		_a="TORPOR_RIG_A_$_k"
	else
		_a="TORPOR_RIG_$_k"
	fi
	export "TORPOR_RIG_A_$_k=${!_a:-${_v#*:}}"
done
_rig_octet="${TORPOR_RIG_A_SUBNET#*.}"
_rig_octet="${_rig_octet%%.*}"
# TORPOR_RIG_B_* exported for another node A (a child that sets up a
# different rig) are not this rig's.
if [ -n "${TORPOR_RIG_B_FOR:-}" ] && [ "$TORPOR_RIG_B_FOR" != "$TORPOR_RIG_A_ROOT" ]; then
	unset TORPOR_RIG_B_ROOT TORPOR_RIG_B_STATE TORPOR_RIG_B_CNI_NETWORK TORPOR_RIG_B_BRIDGE \
		TORPOR_RIG_B_SUBNET TORPOR_RIG_B_CGROUP
fi
export TORPOR_RIG_B_FOR="$TORPOR_RIG_A_ROOT"
export TORPOR_RIG_B_ROOT="${TORPOR_RIG_B_ROOT:-$TORPOR_RIG_A_ROOT-b}"
export TORPOR_RIG_B_STATE="${TORPOR_RIG_B_STATE:-$TORPOR_RIG_A_STATE-b}"
export TORPOR_RIG_B_CNI_NETWORK="${TORPOR_RIG_B_CNI_NETWORK:-$TORPOR_RIG_A_CNI_NETWORK-b}"
export TORPOR_RIG_B_BRIDGE="${TORPOR_RIG_B_BRIDGE:-${TORPOR_RIG_A_BRIDGE}b}"
export TORPOR_RIG_B_SUBNET="${TORPOR_RIG_B_SUBNET:-${TORPOR_RIG_A_SUBNET%%.*}.$((_rig_octet + 1)).0.0/16}"
export TORPOR_RIG_B_CGROUP="${TORPOR_RIG_B_CGROUP:-$TORPOR_RIG_A_CGROUP-b}"
# this environment's node
_n="$(tr a-z A-Z <<<"$TORPOR_RIG_NODE")"
for _k in ROOT STATE CNI_NETWORK BRIDGE SUBNET CGROUP; do
	_a="TORPOR_RIG_${_n}_$_k"
	export "TORPOR_RIG_$_k=${!_a}"
done
unset _v _k _a _n
_rig_was_b=0
if [ "${TORPOR_RIG_ENV_NODE:-a}" = b ]; then _rig_was_b=1; fi
export TORPOR_RIG_ENV_NODE="$TORPOR_RIG_NODE"
export TORPOR_NODE_ID="node-$TORPOR_RIG_NODE"

# containerd
export TORPOR_RIG_CONTAINERD_ROOT="$TORPOR_RIG_ROOT/containerd"
export TORPOR_RIG_CONTAINERD_STATE="$TORPOR_RIG_STATE/containerd"
export TORPOR_RIG_CONFIG="$TORPOR_RIG_STATE/containerd.toml"
export TORPOR_RIG_LOG="$TORPOR_RIG_STATE/containerd.log"
export TORPOR_RIG_PIDFILE="$TORPOR_RIG_STATE/containerd.pid"
export TORPOR_RIG_ADDRESS="$TORPOR_RIG_STATE/containerd.sock"
# TORPOR_RIG_PLAIN=1 (test/cluster, tests/k8s_native.rs): a plain containerd
# without the torpor runtime nor the snapshotter; it imports the drop-ins of
# TORPOR_RIG_DROPIN_DIR (where torpor's node installer writes its own) and
# runs under a restart loop (test/rig/supervise.sh) so that the installer can
# restart it as on a node without systemd.
export TORPOR_RIG_DROPIN_DIR="$TORPOR_RIG_STATE/conf.d"
export TORPOR_RIG_SUPERVISOR_PIDFILE="$TORPOR_RIG_STATE/containerd-supervisor.pid"

# torpor-snapshotter (the proxy snapshotter `torpor`), run from the build tree.
# Its root (metadata.db, snapshots/) is persistent like containerd's; its
# socket lives in a 0700 directory of the state dir.
export TORPOR_SNAPSHOTTER_BIN="${TORPOR_SNAPSHOTTER_BIN:-$TORPOR_REPO_ROOT/target/release/torpor-snapshotter}"
export TORPOR_RIG_SNAPSHOTTER_ROOT="$TORPOR_RIG_ROOT/snapshotter"
export TORPOR_RIG_SNAPSHOTTER_SOCKET="$TORPOR_RIG_STATE/torpor/snapshotter.sock"
export TORPOR_RIG_STORE_SOCKET="$TORPOR_RIG_STATE/torpor/store.sock"
# The shims (through containerd's environment) and torporctl use the rig's store.
export TORPOR_STORE_SOCKET="$TORPOR_RIG_STORE_SOCKET"
export TORPOR_RIG_SNAPSHOTTER_CONFIG="$TORPOR_RIG_STATE/snapshotter.toml"
export TORPOR_RIG_SNAPSHOTTER_LOG="$TORPOR_RIG_STATE/snapshotter.log"
export TORPOR_RIG_SNAPSHOTTER_PIDFILE="$TORPOR_RIG_STATE/snapshotter.pid"

# CNI
export TORPOR_RIG_CNI_BIN_DIR="${TORPOR_RIG_CNI_BIN_DIR:-/opt/cni/bin}"
export TORPOR_RIG_CNI_CONF_DIR="$TORPOR_RIG_STATE/cni/net.d"
export TORPOR_RIG_CNI_IPAM_DIR="$TORPOR_RIG_STATE/cni/ipam"
# TORPOR_RIG_CNI_NETWORK, TORPOR_RIG_BRIDGE, TORPOR_RIG_SUBNET: the node's
# network (above; overridable only to run a second, separate rig beside this one)
export TORPOR_RIG_SUBNET_PREFIX="${TORPOR_RIG_SUBNET%.*.*}."
# TORPOR_RIG_CGROUP (above): cgroupfs parent (below each hierarchy's root) of
# the test pods' cgroups; the tests use /$TORPOR_RIG_CGROUP/pod-<name>,
# down.sh removes what is left.

# torpor's own host state. Node A's shims use the defaults (/var/lib/torpor,
# /run/torpor/shims, /run/torpor/actors.lock: keyed by unique ids, shared with
# other rigs); node B's shims and torporctl have their own, as on another
# machine (containerd passes its environment on to the shims).
if [ "$TORPOR_RIG_NODE" = b ]; then
	export TORPOR_STATE_ROOT="$TORPOR_RIG_ROOT/torpor"
	export TORPOR_SHIM_SOCKET_DIR="$TORPOR_RIG_STATE/torpor/shims"
	export TORPOR_CLAIM_DIR="$TORPOR_RIG_STATE/torpor/actors.lock"
elif [ "$_rig_was_b" = 1 ]; then
	unset TORPOR_STATE_ROOT TORPOR_SHIM_SOCKET_DIR TORPOR_CLAIM_DIR
fi

# Crash points of the test shim (a `failpoints` build, see run-tests.sh and
# runtime/src/failpoint.rs): containerd passes its environment on to the
# shims; a test arms a point by writing its name to $TORPOR_FAILPOINTS_DIR/<shim id>.
export TORPOR_FAILPOINTS_DIR="$TORPOR_RIG_STATE/failpoints"

# Images (built by scripts/deps.sh, see test/images/README.md)
export TORPOR_IMAGES_DIR="${TORPOR_IMAGES_DIR:-/var/cache/torpor/images}"
export TORPOR_PAUSE_IMAGE="localhost/torpor-test/pause:latest"
export TORPOR_ACTOR_IMAGE="localhost/torpor-test/actor:latest"

# Clients. ctr reads CONTAINERD_ADDRESS, crictl reads CONTAINER_RUNTIME_ENDPOINT
# and IMAGE_SERVICE_ENDPOINT; the test crate reads all of these too.
export CONTAINERD_ADDRESS="$TORPOR_RIG_ADDRESS"
export CONTAINER_RUNTIME_ENDPOINT="unix://$TORPOR_RIG_ADDRESS"
export IMAGE_SERVICE_ENDPOINT="unix://$TORPOR_RIG_ADDRESS"
export TORPOR_CRICTL="${TORPOR_CRICTL:-$(command -v crictl || echo /usr/local/bin/crictl)}"
export TORPOR_CTR="${TORPOR_CTR:-$(command -v ctr || echo /usr/local/bin/ctr)}"
export TORPOR_CONTAINERD="${TORPOR_CONTAINERD:-$(command -v containerd || echo /usr/local/bin/containerd)}"

# Per-RPC timeout for crictl (the default 2s is too short on a loaded 2-core box).
export TORPOR_CRICTL_TIMEOUT="${TORPOR_CRICTL_TIMEOUT:-120s}"

rig_crictl() {
	"$TORPOR_CRICTL" --runtime-endpoint "unix://$TORPOR_RIG_ADDRESS" \
		--image-endpoint "unix://$TORPOR_RIG_ADDRESS" \
		--timeout "$TORPOR_CRICTL_TIMEOUT" "$@"
}

rig_ctr() {
	"$TORPOR_CTR" --address "$TORPOR_RIG_ADDRESS" "$@"
}

# Prints the pid of the rig's containerd if it is running (and answers), else nothing.
rig_containerd_pid() {
	local pid
	if [ -f "$TORPOR_RIG_PIDFILE" ]; then
		pid="$(cat "$TORPOR_RIG_PIDFILE" 2>/dev/null || true)"
		if [ -n "$pid" ] && [ -d "/proc/$pid" ] &&
			tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -F -- "--config $TORPOR_RIG_CONFIG" >/dev/null; then
			echo "$pid"
			return 0
		fi
	fi
	# Fallback: scan for a containerd started with the rig's config.
	local p exe
	for p in /proc/[0-9]*; do
		exe="$(readlink "$p/exe" 2>/dev/null || true)"
		case "$exe" in */containerd) ;; *) continue ;; esac
		if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -F -- "--config $TORPOR_RIG_CONFIG" >/dev/null; then
			echo "${p#/proc/}"
			return 0
		fi
	done
	return 1
}

# Prints the pid of the rig's torpor-snapshotter if it is running, else nothing.
rig_snapshotter_pid() {
	local pid p
	if [ -f "$TORPOR_RIG_SNAPSHOTTER_PIDFILE" ]; then
		pid="$(cat "$TORPOR_RIG_SNAPSHOTTER_PIDFILE" 2>/dev/null || true)"
		if [ -n "$pid" ] && [ -d "/proc/$pid" ] &&
			tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -F -- "--config $TORPOR_RIG_SNAPSHOTTER_CONFIG" >/dev/null; then
			echo "$pid"
			return 0
		fi
	fi
	for p in /proc/[0-9]*; do
		case "$(readlink "$p/exe" 2>/dev/null)" in */torpor-snapshotter*) ;; *) continue ;; esac
		if tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -F -- "--config $TORPOR_RIG_SNAPSHOTTER_CONFIG" >/dev/null; then
			echo "${p#/proc/}"
			return 0
		fi
	done
	return 1
}

# crictl warns on every call that /etc/crictl.yaml does not exist (and would
# use it if it did): use the rig's own.
export CRI_CONFIG_FILE="$TORPOR_RIG_DIR/crictl.yaml"

# Serialises up.sh and down.sh of one rig (fd 9 stays open until the script ends).
rig_lock() {
	mkdir -p "$TORPOR_RIG_ROOT"
	exec 9>"$TORPOR_RIG_ROOT/rig.lock"
	if ! flock -w 600 9; then
		echo "rig: could not get $TORPOR_RIG_ROOT/rig.lock within 600s" >&2
		return 1
	fi
}

# S3-compatible server of the object tier (versitygw, posix backend), started
# by up.sh, stopped by down.sh; test/rig/s3.sh start|stop|status controls it
# (tests stop and restart it). The port follows the subnet's second octet so
# that side-by-side rigs do not collide (10.240.0.0/16 -> 19240).
# Node A's server, for both nodes.
export TORPOR_RIG_S3_PORT="${TORPOR_RIG_S3_PORT:-$((19000 + _rig_octet))}"
unset _rig_octet
export TORPOR_RIG_S3_ENDPOINT="http://127.0.0.1:$TORPOR_RIG_S3_PORT"
export TORPOR_RIG_S3_BUCKET="${TORPOR_RIG_S3_BUCKET:-torpor}"
export TORPOR_RIG_S3_REGION="us-east-1"
export TORPOR_RIG_S3_ACCESS_KEY="torpor-rig"
export TORPOR_RIG_S3_SECRET_KEY="torpor-rig-secret-key"
export TORPOR_RIG_S3_DIR="$TORPOR_RIG_A_ROOT/s3"
export TORPOR_RIG_S3_PIDFILE="$TORPOR_RIG_A_STATE/s3.pid"
export TORPOR_RIG_S3_LOG="$TORPOR_RIG_A_STATE/s3.log"

# The object tier is sealed (docs/STORE.md, "Encryption") under the key
# $TORPOR_RIG_STORE_KEY_DIR/$TORPOR_RIG_STORE_KEY_ID, generated by up.sh and
# kept with the data it seals (persistent, like the S3 data; --purge drops
# both). A test restarts the daemon under another key id.
export TORPOR_RIG_STORE_KEY_DIR="$TORPOR_RIG_A_ROOT/keys"
export TORPOR_RIG_STORE_KEY_ID="${TORPOR_RIG_STORE_KEY_ID:-rig}"
unset _rig_was_b
