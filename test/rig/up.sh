#!/usr/bin/env bash
# Start the torpor test rig: a private containerd 2.x with CRI, the baseline
# runtime `runc` (snapshotter overlayfs) and the runtime under test `torpor`
# (snapshotter `torpor`: the torpor-snapshotter daemon from the build tree), a
# private CNI bridge network and the locally built test images.
#
# Idempotent: when the rig's snapshotter and containerd are already running
# they are reused (only the images are re-imported). Tear down with
# test/rig/down.sh.
#
# Two nodes (env.sh): node A, then node B (TORPOR_RIG_NODE=b up.sh: its own
# containerd, torpor-snapshotter, CNI network and cgroup parent, node A's S3
# server as its object tier). TORPOR_RIG_NODE_B=0 brings up node A only.
#
# Environment:
#   TORPOR_RIG_ROOT, TORPOR_RIG_STATE   see env.sh
#   TORPOR_IMAGES_DIR                   where the test image tars are (/var/cache/torpor/images)
#   TORPOR_RIG_LOG_LEVEL                containerd log level (default info)
#   TORPOR_SHIM_DIR                     directory put first in containerd's PATH so that it
#                                       finds containerd-shim-torpor-v1 (default <repo>/target/release)
#   TORPOR_SNAPSHOTTER_BIN              the torpor-snapshotter binary (default <repo>/target/release/torpor-snapshotter)
#   TORPOR_RIG_SNAPSHOTTER_LOG_LEVEL    its log level (default info)
#   TORPOR_RIG_SYSTEMD_CGROUP=1         the runc and torpor handlers with SystemdCgroup = true
#                                       (a node whose init is systemd, e.g. test/vm's guest;
#                                       the tests then give pods a slice as cgroup parent)
#   TORPOR_RIG_SNAPSHOTTER_UNIT=NAME    run torpor-snapshotter as the transient systemd
#                                       service NAME (Type=notify, as deploy/systemd's unit)
set -euo pipefail

# shellcheck source=env.sh
. "$(dirname "${BASH_SOURCE[0]}")/env.sh"

log() { echo "rig/up[node $TORPOR_RIG_NODE]: $*" >&2; }
die() { echo "rig/up[node $TORPOR_RIG_NODE]: ERROR: $*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "must run as root"

TORPOR_SHIM_DIR="${TORPOR_SHIM_DIR:-$TORPOR_REPO_ROOT/target/release}"
LOG_LEVEL="${TORPOR_RIG_LOG_LEVEL:-info}"
# TORPOR_RIG_PLAIN=1: containerd without torpor (see env.sh)
PLAIN="${TORPOR_RIG_PLAIN:-0}"
SNAPSHOTTER_LOG_LEVEL="${TORPOR_RIG_SNAPSHOTTER_LOG_LEVEL:-info}"
export TORPOR_ROOTFS_CAPTURE_MAX_BYTES="${TORPOR_ROOTFS_CAPTURE_MAX_BYTES:-268435456}" # the shims' rootfs capture cap (256 MiB; default 1 GiB): tests/suspend/rootfs.rs goes past it

# ---------------------------------------------------------------- dependencies
missing=()
for b in "$TORPOR_CONTAINERD" "$TORPOR_CTR" "$TORPOR_CRICTL"; do
	[ -x "$b" ] || missing+=("$b")
done
command -v runc >/dev/null || missing+=(runc)
command -v containerd-shim-runc-v2 >/dev/null || missing+=(containerd-shim-runc-v2)
for p in bridge host-local loopback; do
	[ -x "$TORPOR_RIG_CNI_BIN_DIR/$p" ] || missing+=("$TORPOR_RIG_CNI_BIN_DIR/$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
	die "missing dependencies: ${missing[*]} (run scripts/deps.sh)"
fi
[ -x "$TORPOR_SNAPSHOTTER_BIN" ] ||
	die "$TORPOR_SNAPSHOTTER_BIN not built (cargo build --release -p torpor-snapshotter)"
shopt -s nullglob
image_tars=("$TORPOR_IMAGES_DIR"/*.tar)
shopt -u nullglob
[ "${#image_tars[@]}" -gt 0 ] || die "no test images in $TORPOR_IMAGES_DIR (run scripts/deps.sh)"
if [ ! -x "$TORPOR_SHIM_DIR/containerd-shim-torpor-v1" ]; then
	log "warning: $TORPOR_SHIM_DIR/containerd-shim-torpor-v1 not built yet; runtime torpor will fail until it is (cargo build --release -p torpor-shim)"
fi

rig_lock || die "another up.sh/down.sh of this rig does not finish"

mkdir -p "$TORPOR_RIG_STATE" "$TORPOR_RIG_ROOT" "$TORPOR_RIG_CONTAINERD_ROOT" "$TORPOR_FAILPOINTS_DIR" \
	"$TORPOR_RIG_CONTAINERD_STATE" "$TORPOR_RIG_CNI_CONF_DIR" "$TORPOR_RIG_CNI_IPAM_DIR"

# --------------------------------------------------------------------- config
write_cni_conf() {
	# A plain bridge network. ipMasq=false: the pods only talk to the host and to
	# each other, so the bridge plugin installs no iptables rules at all.
	cat >"$TORPOR_RIG_CNI_CONF_DIR/10-torpor-test.conflist.tmp" <<JSON
{
  "cniVersion": "1.0.0",
  "name": "$TORPOR_RIG_CNI_NETWORK",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$TORPOR_RIG_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$TORPOR_RIG_CNI_IPAM_DIR",
        "ranges": [[{ "subnet": "$TORPOR_RIG_SUBNET" }]],
        "routes": [{ "dst": "0.0.0.0/0" }]
      }
    }
  ]
}
JSON
	mv "$TORPOR_RIG_CNI_CONF_DIR/10-torpor-test.conflist.tmp" "$TORPOR_RIG_CNI_CONF_DIR/10-torpor-test.conflist"
}

write_containerd_config() {
	# containerd 2.0 spells the CNI binary directory `bin_dir`, 2.1+ `bin_dirs`
	# (and warns about bin_dir). Ask the binary which one it knows.
	local cni_bin_key
	if "$TORPOR_CONTAINERD" config default 2>/dev/null | grep '^\s*bin_dirs\s*=' >/dev/null; then
		cni_bin_key="bin_dirs = ['$TORPOR_RIG_CNI_BIN_DIR']"
	else
		cni_bin_key="bin_dir = '$TORPOR_RIG_CNI_BIN_DIR'"
	fi
	local imports="" torpor_snapshotter torpor_runtime torpor_platform
	# CRI looks up the snapshotter's exported root for the runtimes listed here
	torpor_platform="    [plugins.'io.containerd.cri.v1.images'.runtime_platforms.torpor]
      snapshotter = 'torpor'"
	torpor_snapshotter="# The snapshotter under test: torpor-snapshotter, a proxy snapshotter.
[proxy_plugins]
  [proxy_plugins.torpor]
    type = 'snapshot'
    address = '$TORPOR_RIG_SNAPSHOTTER_SOCKET'
    # its snapshots' filesystem, for CRI's stats (deploy/containerd/torpor.toml)
    exports = { root = '$TORPOR_RIG_SNAPSHOTTER_ROOT' }"
	torpor_runtime="        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.torpor]
          runtime_type = 'io.containerd.torpor.v1'
          snapshotter = 'torpor'
          pod_annotations = ['torpor.dev/*']
          container_annotations = ['torpor.dev/*']"
	local systemd_cgroup=false
	if [ "${TORPOR_RIG_SYSTEMD_CGROUP:-0}" = 1 ]; then
		systemd_cgroup=true
		# As deploy/containerd/torpor.toml documents it: CRI sends the
		# options table of a runtime type other than runc-v2's as
		# runtimeoptions (its TOML), which the shim reads as runc's options.
		# torpor-options: the same form with options a check can see
		# (runc's Root), and torpor-bad-options a misspelt key the shim
		# must refuse, naming it (test/vm/guest/suite.sh).
		torpor_runtime="$torpor_runtime
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.torpor.options]
            SystemdCgroup = true
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.torpor-options]
          runtime_type = 'io.containerd.torpor.v1'
          snapshotter = 'torpor'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.torpor-options.options]
            SystemdCgroup = true
            Root = '$TORPOR_RIG_STATE/torpor-options-runc'
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.torpor-bad-options]
          runtime_type = 'io.containerd.torpor.v1'
          snapshotter = 'torpor'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.torpor-bad-options.options]
            SystemdCgroups = true"
	fi
	if [ "$PLAIN" = 1 ]; then
		imports="'$TORPOR_RIG_DROPIN_DIR/*.toml'"
		torpor_snapshotter="# plain: no torpor (its installer adds it in $TORPOR_RIG_DROPIN_DIR)"
		torpor_runtime=""
		torpor_platform=""
	fi
	cat >"$TORPOR_RIG_CONFIG.tmp" <<TOML
# Generated by test/rig/up.sh -- the torpor test rig's private containerd.
version = 3
root = '$TORPOR_RIG_CONTAINERD_ROOT'
state = '$TORPOR_RIG_CONTAINERD_STATE'
temp = ''
# Never read the host's drop-ins (containerd 2.4 imports /etc/containerd/conf.d/*.toml
# by default) nor serve the host-wide NRI socket. Plain (TORPOR_RIG_PLAIN=1):
# the rig's own drop-in dir, where torpor's node installer writes.
imports = [$imports]
disabled_plugins = ['io.containerd.nri.v1.nri']

[grpc]
  address = '$TORPOR_RIG_ADDRESS'

[ttrpc]
  address = ''

[debug]
  address = ''
  level = '$LOG_LEVEL'

[metrics]
  address = ''

$torpor_snapshotter

[plugins]
  [plugins.'io.containerd.internal.v1.opt']
    path = '$TORPOR_RIG_ROOT/opt'

  [plugins.'io.containerd.cri.v1.images']
    snapshotter = 'overlayfs'

    [plugins.'io.containerd.cri.v1.images'.pinned_images]
      sandbox = '$TORPOR_PAUSE_IMAGE'

$torpor_platform

  [plugins.'io.containerd.cri.v1.runtime']
    # Pod network namespaces are bind-mounted under the CRI state dir
    # ($TORPOR_RIG_CONTAINERD_STATE/io.containerd.grpc.v1.cri/netns), not in
    # the host-wide /var/run/netns, so everything of the rig stays in its dirs.
    netns_mounts_under_state_dir = true
    # This machine withholds CAP_SYS_RESOURCE even from root, so no process
    # may lower its oom_score_adj (kubelet asks -998 for sandboxes): clamp
    # every container's score to containerd's own, as on rootless nodes.
    restrict_oom_score_adj = true

    [plugins.'io.containerd.cri.v1.runtime'.containerd]
      default_runtime_name = 'runc'

      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes]
        [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
          runtime_type = 'io.containerd.runc.v2'
          [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
            SystemdCgroup = $systemd_cgroup

$torpor_runtime

    [plugins.'io.containerd.cri.v1.runtime'.cni]
      $cni_bin_key
      conf_dir = '$TORPOR_RIG_CNI_CONF_DIR'
      max_conf_num = 1

  [plugins.'io.containerd.grpc.v1.cri']
    disable_tcp_service = true
    stream_server_address = '127.0.0.1'
    stream_server_port = '0'
TOML
	mv "$TORPOR_RIG_CONFIG.tmp" "$TORPOR_RIG_CONFIG"
}

# The object tier's key (32 random bytes, 0600), made once per rig root.
ensure_store_key() {
	local key="$TORPOR_RIG_STORE_KEY_DIR/$TORPOR_RIG_STORE_KEY_ID"
	[ -s "$key" ] && return 0
	(umask 077 && mkdir -p "$TORPOR_RIG_STORE_KEY_DIR" && head -c 32 /dev/urandom >"$key.tmp" && mv "$key.tmp" "$key") ||
		die "could not create the store key $key"
	log "generated the object tier's key $key"
}

write_snapshotter_config() {
	ensure_store_key
	# One loopback port per node and rig, from the node's pod subnet (like
	# the S3 port): 10.240.0.0/16 -> 19640, 10.241.0.0/16 -> 19641; a second
	# rig beside the first (its own subnet) never collides.
	local octet=${TORPOR_RIG_SUBNET#*.}
	octet=${octet%%.*}
	local metrics_port=$((19400 + octet))
	cat >"$TORPOR_RIG_SNAPSHOTTER_CONFIG.tmp" <<TOML
# Generated by test/rig/up.sh -- the rig's torpor-snapshotter (docs/CONFIG.md).
root = '$TORPOR_RIG_SNAPSHOTTER_ROOT'
log_level = '$SNAPSHOTTER_LOG_LEVEL'
# Prometheus /metrics (docs/METRICS.md; tests/metrics.rs scrapes it): a
# loopback port of this node and rig
metrics_address = '127.0.0.1:$metrics_port'

[snapshotter]
address = '$TORPOR_RIG_SNAPSHOTTER_SOCKET'
# the tests check that snapshots live below the rig's snapshotter root
upperdir_label = true

[store]
address = '$TORPOR_RIG_STORE_SOCKET'
# the object tier: the rig's S3 server (credentials in the daemon's AWS_* env)
remote_url = 's3://$TORPOR_RIG_S3_BUCKET/objects'
remote_options = { endpoint = '$TORPOR_RIG_S3_ENDPOINT', region = '$TORPOR_RIG_S3_REGION', allow_http = 'true' }
# retry a down object tier quickly (the tests stop and restart it)
retry_initial = '500ms'
retry_max = '3s'
# a streamed resume gives up on a stalled object tier after this long (the
# tests stall it)
stream_stall_timeout = '3s'
# this node's name in actor leases; a short lease so that the tests of a
# dead node do not wait long for its expiry
node_id = '${TORPOR_NODE_ID:-node-a}'
lease_ttl = '${TORPOR_RIG_LEASE_TTL:-6s}'

[store.encryption]
keys = { '$TORPOR_RIG_STORE_KEY_ID' = '$TORPOR_RIG_STORE_KEY_DIR/$TORPOR_RIG_STORE_KEY_ID' }

[tenancy]
# the namespace of the golden snapshots any namespace's pods may clone
# (tests/tenancy.rs)
clone_source_namespaces = ['torpor-golden']
TOML
	mv "$TORPOR_RIG_SNAPSHOTTER_CONFIG.tmp" "$TORPOR_RIG_SNAPSHOTTER_CONFIG"
}

snapshotter_answers() {
	[ -S "$TORPOR_RIG_SNAPSHOTTER_SOCKET" ] && rig_snapshotter_pid >/dev/null
}

# Starts the rig's torpor-snapshotter unless it runs already.
start_snapshotter() {
	local pid
	if pid="$(rig_snapshotter_pid)"; then
		log "reusing running torpor-snapshotter (pid $pid, $TORPOR_RIG_SNAPSHOTTER_SOCKET)"
		return 0
	fi
	write_snapshotter_config
	log "starting torpor-snapshotter ($TORPOR_SNAPSHOTTER_BIN); log: $TORPOR_RIG_SNAPSHOTTER_LOG"
	echo "---- $(date -Is) rig/up.sh starting torpor-snapshotter" >>"$TORPOR_RIG_SNAPSHOTTER_LOG"
	if [ -n "${TORPOR_RIG_SNAPSHOTTER_UNIT:-}" ]; then
		# A systemd service: started once it sent READY=1; its environment is
		# the rig's (TORPOR_*, RUST_*) and the object tier's credentials.
		local env=() v
		for v in $(compgen -e); do
			case "$v" in TORPOR_* | RUST_*) env+=("--setenv=$v=${!v}") ;; esac
		done
		timeout 120 systemd-run --quiet --collect --unit="$TORPOR_RIG_SNAPSHOTTER_UNIT" -p Type=notify \
			-p LimitNOFILE=1048576 -p StandardOutput="append:$TORPOR_RIG_SNAPSHOTTER_LOG" \
			-p StandardError="append:$TORPOR_RIG_SNAPSHOTTER_LOG" "${env[@]}" \
			--setenv=AWS_ACCESS_KEY_ID="$TORPOR_RIG_S3_ACCESS_KEY" --setenv=AWS_SECRET_ACCESS_KEY="$TORPOR_RIG_S3_SECRET_KEY" \
			"$TORPOR_SNAPSHOTTER_BIN" --config "$TORPOR_RIG_SNAPSHOTTER_CONFIG" 9>&- ||
			{ tail -n 30 "$TORPOR_RIG_SNAPSHOTTER_LOG" >&2; die "systemd unit $TORPOR_RIG_SNAPSHOTTER_UNIT did not start"; }
		pid=$(systemctl show -p MainPID --value "$TORPOR_RIG_SNAPSHOTTER_UNIT")
		echo "$pid" >"$TORPOR_RIG_SNAPSHOTTER_PIDFILE"
		wait_for 60 "snapshotter socket" snapshotter_answers || die "torpor-snapshotter did not create $TORPOR_RIG_SNAPSHOTTER_SOCKET within 60s"
		log "torpor-snapshotter up (systemd unit $TORPOR_RIG_SNAPSHOTTER_UNIT, pid $pid)"
		return 0
	fi
	AWS_ACCESS_KEY_ID="$TORPOR_RIG_S3_ACCESS_KEY" AWS_SECRET_ACCESS_KEY="$TORPOR_RIG_S3_SECRET_KEY" \
		setsid "$TORPOR_SNAPSHOTTER_BIN" --config "$TORPOR_RIG_SNAPSHOTTER_CONFIG" \
		</dev/null >>"$TORPOR_RIG_SNAPSHOTTER_LOG" 2>&1 9>&- &
	pid=$!
	echo "$pid" >"$TORPOR_RIG_SNAPSHOTTER_PIDFILE"
	if ! wait_for 60 "snapshotter socket" snapshotter_answers; then
		tail -n 30 "$TORPOR_RIG_SNAPSHOTTER_LOG" >&2 || true
		die "torpor-snapshotter did not create $TORPOR_RIG_SNAPSHOTTER_SOCKET within 60s"
	fi
	log "torpor-snapshotter up (pid $pid)"
}

# ------------------------------------------------------------------- helpers
cri_ready() {
	local conds
	conds="$(rig_crictl --timeout 5s info -o go-template \
		--template '{{range .status.conditions}}{{.type}}={{.status}} {{end}}' 2>/dev/null)" || return 1
	case " $conds " in *" RuntimeReady=true "*) ;; *) return 1 ;; esac
	case " $conds " in *" NetworkReady=true "*) ;; *) return 1 ;; esac
}

wait_for() { # seconds description command... (the description documents the call)
	local secs="$1"
	shift 2
	local deadline=$((SECONDS + secs))
	until "$@"; do
		if [ "$SECONDS" -ge "$deadline" ]; then
			return 1
		fi
		sleep 0.2
	done
}

import_images() {
	local ns tar
	for ns in k8s.io default; do
		for tar in "${image_tars[@]}"; do
			# --local: import in this client (no transfer service), unpacking into
			# the default snapshotter (overlayfs) for the host platform.
			if ! rig_ctr -n "$ns" images import --local "$tar" >"$TORPOR_RIG_STATE/import.log" 2>&1; then
				cat "$TORPOR_RIG_STATE/import.log" >&2
				die "import of $tar into namespace $ns failed"
			fi
			# ... and into torpor-snapshotter (runtime torpor's snapshotter)
			[ "$PLAIN" = 1 ] && continue
			if ! rig_ctr -n "$ns" images import --local --snapshotter torpor "$tar" >"$TORPOR_RIG_STATE/import.log" 2>&1; then
				cat "$TORPOR_RIG_STATE/import.log" >&2
				die "import of $tar into namespace $ns (snapshotter torpor) failed"
			fi
		done
		# Capture the list first: `ctr | grep -q` under pipefail fails at
		# random when grep exits early and ctr gets SIGPIPE.
		local images
		images="$(rig_ctr -n "$ns" images ls -q 2>/dev/null)" || die "ctr images ls in namespace $ns failed"
		for img in "$TORPOR_PAUSE_IMAGE" "$TORPOR_ACTOR_IMAGE"; do
			grep -qxF "$img" <<<"$images" ||
				die "image $img not present in namespace $ns after importing ${image_tars[*]}"
		done
	done
}

# ---------------------------------------------------------------------- main
# The S3 server first (the store's object tier), then the snapshotter
# (containerd's proxy plugin connects to its socket), then containerd.
"$TORPOR_RIG_DIR/s3.sh" start || die "the rig's S3 server did not start (see $TORPOR_RIG_S3_LOG)"
if [ "$PLAIN" = 1 ]; then
	# its config only: torpor's DaemonSet runs it (deploy/kubernetes)
	write_snapshotter_config
	mkdir -p "$TORPOR_RIG_DROPIN_DIR" "$(dirname "$TORPOR_RIG_SNAPSHOTTER_SOCKET")"
else
	start_snapshotter
fi

if pid="$(rig_containerd_pid)"; then
	# running: reuse it (give a containerd that is still starting time for CRI)
	if ! wait_for 60 "CRI ready" cri_ready; then
		tail -n 30 "$TORPOR_RIG_LOG" >&2 || true
		die "rig containerd (pid $pid) is running but CRI is not ready; see $TORPOR_RIG_LOG or run test/rig/down.sh"
	fi
	log "reusing running containerd (pid $pid, $TORPOR_RIG_ADDRESS)"
else
	# Remember the host's ip_forward (the bridge plugin turns it on) so that
	# down.sh can put it back. Only the first up after a down records it.
	# (node A's: one host setting for both nodes)
	if [ "$TORPOR_RIG_NODE" = a ] && [ ! -f "$TORPOR_RIG_ROOT/ip_forward.orig" ]; then
		cat /proc/sys/net/ipv4/ip_forward >"$TORPOR_RIG_ROOT/ip_forward.orig"
	fi
	write_cni_conf
	write_containerd_config
	rm -f "$TORPOR_RIG_ADDRESS" "$TORPOR_RIG_ADDRESS.ttrpc"
	log "starting containerd ($("$TORPOR_CONTAINERD" --version)); log: $TORPOR_RIG_LOG"
	echo "---- $(date -Is) rig/up.sh starting containerd" >>"$TORPOR_RIG_LOG"
	# The shim dir goes first in PATH so containerd resolves
	# containerd-shim-torpor-v1 from the build tree without installing it.
	# (9>&-: containerd must not inherit the rig lock.)
	if [ "$PLAIN" = 1 ]; then
		# under a restart loop (the pid file follows containerd), and without
		# the build tree in PATH: the torpor runtime is what the installer put in
		setsid "$TORPOR_RIG_DIR/supervise.sh" "$TORPOR_RIG_PIDFILE" "$TORPOR_CONTAINERD" --config "$TORPOR_RIG_CONFIG" \
			</dev/null >>"$TORPOR_RIG_LOG" 2>&1 9>&- &
		echo "$!" >"$TORPOR_RIG_SUPERVISOR_PIDFILE"
		wait_for 30 "containerd pid" test -s "$TORPOR_RIG_PIDFILE" || die "containerd's restart loop did not start it"
		pid="$(cat "$TORPOR_RIG_PIDFILE")"
	else
		PATH="$TORPOR_SHIM_DIR:$PATH" setsid "$TORPOR_CONTAINERD" --config "$TORPOR_RIG_CONFIG" \
			</dev/null >>"$TORPOR_RIG_LOG" 2>&1 9>&- &
		pid=$!
		echo "$pid" >"$TORPOR_RIG_PIDFILE"
	fi
	if ! wait_for 60 "containerd socket" test -S "$TORPOR_RIG_ADDRESS"; then
		tail -n 30 "$TORPOR_RIG_LOG" >&2 || true
		die "containerd did not create $TORPOR_RIG_ADDRESS within 60s"
	fi
	if ! wait_for 60 "CRI ready" cri_ready; then
		rig_crictl info >&2 || true
		tail -n 30 "$TORPOR_RIG_LOG" >&2 || true
		die "CRI not ready within 60s"
	fi
	log "containerd up (pid $pid)"
fi

import_images
log "ready: CONTAINERD_ADDRESS=$TORPOR_RIG_ADDRESS CONTAINER_RUNTIME_ENDPOINT=unix://$TORPOR_RIG_ADDRESS"

if [ "$TORPOR_RIG_NODE" = a ] && [ "${TORPOR_RIG_NODE_B:-1}" != 0 ]; then
	TORPOR_RIG_NODE=b "$TORPOR_RIG_DIR/up.sh" || die "node B did not come up (TORPOR_RIG_NODE=b test/rig/up.sh)"
fi
