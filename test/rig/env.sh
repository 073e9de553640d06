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

_rig_env_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

export TORPOR_RIG_DIR="$_rig_env_dir"
export TORPOR_REPO_ROOT="${TORPOR_REPO_ROOT:-$(cd "$_rig_env_dir/../.." && pwd)}"
export TORPOR_RIG_ROOT="${TORPOR_RIG_ROOT:-/var/lib/torpor-test}"
export TORPOR_RIG_STATE="${TORPOR_RIG_STATE:-/run/torpor-test}"
unset _rig_env_dir

# containerd
export TORPOR_RIG_CONTAINERD_ROOT="$TORPOR_RIG_ROOT/containerd"
export TORPOR_RIG_CONTAINERD_STATE="$TORPOR_RIG_STATE/containerd"
export TORPOR_RIG_CONFIG="$TORPOR_RIG_STATE/containerd.toml"
export TORPOR_RIG_LOG="$TORPOR_RIG_STATE/containerd.log"
export TORPOR_RIG_PIDFILE="$TORPOR_RIG_STATE/containerd.pid"
export TORPOR_RIG_ADDRESS="$TORPOR_RIG_STATE/containerd.sock"

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
# (overridable only to run a second, separate rig beside this one)
export TORPOR_RIG_CNI_NETWORK="${TORPOR_RIG_CNI_NETWORK:-torpor-test}"
export TORPOR_RIG_BRIDGE="${TORPOR_RIG_BRIDGE:-torpor-test0}"
export TORPOR_RIG_SUBNET="${TORPOR_RIG_SUBNET:-10.240.0.0/16}"
export TORPOR_RIG_SUBNET_PREFIX="${TORPOR_RIG_SUBNET%.*.*}."
# cgroupfs parent (below each hierarchy's root) of the test pods' cgroups; the
# tests use /$TORPOR_RIG_CGROUP/pod-<name>, down.sh removes what is left.
export TORPOR_RIG_CGROUP="${TORPOR_RIG_CGROUP:-torpor-test}"

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
_rig_octet="${TORPOR_RIG_SUBNET#*.}"
export TORPOR_RIG_S3_PORT="${TORPOR_RIG_S3_PORT:-$((19000 + ${_rig_octet%%.*}))}"
unset _rig_octet
export TORPOR_RIG_S3_ENDPOINT="http://127.0.0.1:$TORPOR_RIG_S3_PORT"
export TORPOR_RIG_S3_BUCKET="${TORPOR_RIG_S3_BUCKET:-torpor}"
export TORPOR_RIG_S3_REGION="us-east-1"
export TORPOR_RIG_S3_ACCESS_KEY="torpor-rig"
export TORPOR_RIG_S3_SECRET_KEY="torpor-rig-secret-key"
export TORPOR_RIG_S3_DIR="$TORPOR_RIG_ROOT/s3"
export TORPOR_RIG_S3_PIDFILE="$TORPOR_RIG_STATE/s3.pid"
export TORPOR_RIG_S3_LOG="$TORPOR_RIG_STATE/s3.log"

# The object tier is sealed (docs/STORE.md, "Encryption") under the key
# $TORPOR_RIG_STORE_KEY_DIR/$TORPOR_RIG_STORE_KEY_ID, generated by up.sh and
# kept with the data it seals (persistent, like the S3 data; --purge drops
# both). A test restarts the daemon under another key id.
export TORPOR_RIG_STORE_KEY_DIR="$TORPOR_RIG_ROOT/keys"
export TORPOR_RIG_STORE_KEY_ID="${TORPOR_RIG_STORE_KEY_ID:-rig}"
