#!/bin/sh
# torpor's node installer and launcher: the entry point of the torpor-node
# DaemonSet's image (deploy/kubernetes/daemonset.yaml). The pod has the
# host's PID namespace; every mode but `agent` runs in a privileged
# container with the host's / at /host.
#
#   node.sh install     copy the shim, torporctl, torpor-snapshotter and CRIU onto
#                       the node, write containerd's drop-in, restart containerd
#                       if the drop-in changed (initContainer `install`)
#   node.sh snapshotter run torpor-snapshotter in the host's mount namespace
#                       (container `snapshotter`)
#   node.sh agent       run torpor-agent (container `agent`: unprivileged, no
#                       capability, only the shims' socket dir of the host,
#                       mounted read-only at the same path)
#   node.sh lifecycle   wait (container `lifecycle`: what follows runs in it)
#   node.sh ready       the pod's readiness probe: the snapshot store answers
#   node.sh prestop     on the DaemonSet's deletion (not on an upgrade): uninstall
#   node.sh uninstall   remove the drop-in and the binaries, restart containerd
#
# containerd is the process serving its socket (SO_PEERCRED of a connection
# to $TORPOR_CONTAINERD_SOCKET, `torporctl node socket-peer`), and must run in
# the host's mount namespace (PID 1's, TORPOR_HOST_PID): never a process found
# by its name or command line (a pod can run a binary called containerd with
# any arguments), and nothing is run in a namespace taken from such a process.
# Settings: the defaults below, then /etc/torpor-node/default.env, then
# /etc/torpor-node/$NODE_NAME.env (the ConfigMap torpor-node-env; a node
# whose paths differ gets its own file). All paths are the host's.
set -eu

log() { echo "torpor-node[$1]: $2" >&2; }
die() { log "$MODE" "ERROR: $*"; exit 1; }
MODE="${1:-}"
HOST="${TORPOR_HOST_ROOT:-/host}"   # the host's / (tests: another dir)
IMG="${TORPOR_IMAGE_ROOT:-}"         # the image's / (tests: another dir)

# ---- settings (host paths)
TORPOR_PREFIX=/usr/local                         # bin/, sbin/criu, lib/torpor/
TORPOR_CONTAINERD_DROPIN=/etc/containerd/conf.d/torpor.toml
TORPOR_CONTAINERD_SOCKET=/run/containerd/containerd.sock
TORPOR_CONTAINERD_MATCH=                         # optional: a string containerd's command line must contain (a check only: containerd is the peer of its socket)
TORPOR_CONTAINERD_SERVICE=containerd             # the systemd unit, when systemd is PID 1
TORPOR_HOST_PID=1                                # a process of the host's mount namespace (containerd must run in it; the snapshotter is started in it)
TORPOR_SNAPSHOTTER_SOCKET=/run/torpor/snapshotter.sock
TORPOR_SNAPSHOTTER_CONFIG=/etc/torpor/snapshotter.toml
TORPOR_STORE_SOCKET=/run/torpor/store.sock       # the snapshotter's store.address (what the shims use)
TORPOR_SHIM_SOCKET_DIR=/run/torpor/shims
TORPOR_RESTART_TIMEOUT_S=120
for f in "$IMG/etc/torpor-node/default.env" "$IMG/etc/torpor-node/${NODE_NAME:-}.env"; do
	if [ -f "$f" ]; then
		# shellcheck disable=SC1090
		. "$f"
	fi
done
export TORPOR_SHIM_SOCKET_DIR
case "$TORPOR_HOST_PID" in '' | *[!0-9]* | 0*) die "TORPOR_HOST_PID='$TORPOR_HOST_PID' is not a pid" ;; esac

BIN="$TORPOR_PREFIX/bin"
SHARE="$TORPOR_PREFIX/lib/torpor"
MARK="# installed by torpor-node"

# ---- containerd
CTL="$IMG/torpor/bin/torporctl"
# containerd_pid [quiet]: the host's containerd: the process serving its
# socket (SO_PEERCRED, in the host's PID namespace: the pod has hostPID),
# refused unless it runs in the host's mount namespace (TORPOR_HOST_PID's)
containerd_pid() {
	if [ "${1:-}" = quiet ]; then
		pid="$("$CTL" node socket-peer --mount-ns-of "$TORPOR_HOST_PID" "$HOST$TORPOR_CONTAINERD_SOCKET" 2>/dev/null)" || return 1
	else
		pid="$("$CTL" node socket-peer --mount-ns-of "$TORPOR_HOST_PID" "$HOST$TORPOR_CONTAINERD_SOCKET")" || return 1
	fi
	if [ -n "$TORPOR_CONTAINERD_MATCH" ] && ! tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$TORPOR_CONTAINERD_MATCH"; then
		[ "${1:-}" = quiet ] || log "$MODE" "the peer of $TORPOR_CONTAINERD_SOCKET (pid $pid) has no '$TORPOR_CONTAINERD_MATCH' in its command line (TORPOR_CONTAINERD_MATCH)"
		return 1
	fi
	echo "$pid"
}

restart_containerd() {
	if [ "$(cat /proc/1/comm 2>/dev/null)" = systemd ]; then
		log "$MODE" "systemctl restart $TORPOR_CONTAINERD_SERVICE (host systemd)"
		timeout "$TORPOR_RESTART_TIMEOUT_S" nsenter -t 1 -m -u -i -n -p -- systemctl restart "$TORPOR_CONTAINERD_SERVICE" ||
			die "systemctl restart $TORPOR_CONTAINERD_SERVICE failed"
		return 0
	fi
	# No systemd: containerd's supervisor (runit, s6, openrc's supervise-daemon,
	# a restart loop) starts it again after it exits.
	old="$(containerd_pid)" || die "containerd not found: no process in the host's mount namespace serves $TORPOR_CONTAINERD_SOCKET"
	log "$MODE" "restarting containerd (pid $old, the peer of $TORPOR_CONTAINERD_SOCKET; SIGTERM, its supervisor starts it again)"
	kill -TERM "$old" || die "cannot signal containerd (pid $old)"
	i=0
	while :; do
		new="$(containerd_pid quiet)" && [ "$new" != "$old" ] && break
		i=$((i + 1))
		[ "$i" -le $((TORPOR_RESTART_TIMEOUT_S * 2)) ] || die "containerd did not come back within ${TORPOR_RESTART_TIMEOUT_S}s (is it supervised?)"
		sleep 0.5
	done
	log "$MODE" "containerd is back (pid $new)"
}

# install_file SRC DST MODE: copies unless the same; atomic (a running shim keeps its old inode).
changed=0
install_file() {
	if [ -f "$HOST$2" ] && cmp -s "$1" "$HOST$2"; then return 0; fi
	mkdir -p "$(dirname "$HOST$2")"
	cp "$1" "$HOST$2.torpor-new" && chmod "$3" "$HOST$2.torpor-new" && mv -f "$HOST$2.torpor-new" "$HOST$2" ||
		die "cannot install $2"
	log "$MODE" "installed $2"
	changed=1
}

dropin() {
	cat <<TOML
$MARK (deploy/kubernetes, image/node.sh): remove with kubectl delete -k
# The torpor runtime handler (RuntimeClass torpor) and its snapshotter; see
# deploy/containerd/torpor.toml for what each setting does.
version = 3

[proxy_plugins]
  [proxy_plugins.torpor]
    type = 'snapshot'
    address = '$TORPOR_SNAPSHOTTER_SOCKET'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.torpor]
  runtime_type = 'io.containerd.torpor.v1'
  runtime_path = '$BIN/containerd-shim-torpor-v1'
  snapshotter = 'torpor'
  pod_annotations = ['torpor.dev/*']
  container_annotations = ['torpor.dev/*']
TOML
}

install() {
	for b in containerd-shim-torpor-v1 torporctl torpor-snapshotter kubectl-torpor; do
		install_file "$IMG/torpor/bin/$b" "$BIN/$b" 0755
	done
	# CRIU with the libraries it was built against, behind a wrapper
	for f in "$IMG"/torpor/criu/*; do
		install_file "$f" "$SHARE/criu/$(basename "$f")" 0755
	done
	tmp="$(mktemp)"
	printf '#!/bin/sh\n%s\nLD_LIBRARY_PATH=%s/criu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s/criu/criu "$@"\n' \
		"$MARK" "$SHARE" "$SHARE" >"$tmp"
	install_file "$tmp" "$TORPOR_PREFIX/sbin/criu" 0755
	changed=0 # binaries are picked up by the next shim; only the drop-in needs a restart
	dropin >"$tmp"
	# pending: a restart that failed is tried again by the next run
	pending="$HOST$TORPOR_CONTAINERD_DROPIN.restart-pending"
	if ! { [ -f "$HOST$TORPOR_CONTAINERD_DROPIN" ] && cmp -s "$tmp" "$HOST$TORPOR_CONTAINERD_DROPIN"; }; then
		mkdir -p "$(dirname "$pending")" && : >"$pending" || die "cannot write $pending"
	fi
	install_file "$tmp" "$TORPOR_CONTAINERD_DROPIN" 0644
	rm -f "$tmp"
	if [ -f "$pending" ]; then
		restart_containerd
		rm -f "$pending"
	else
		log "$MODE" "containerd's drop-in $TORPOR_CONTAINERD_DROPIN is current"
	fi
}

uninstall() {
	restart=0
	if [ -f "$HOST$TORPOR_CONTAINERD_DROPIN" ]; then
		grep -qF "$MARK" "$HOST$TORPOR_CONTAINERD_DROPIN" || die "$TORPOR_CONTAINERD_DROPIN was not written by torpor-node: left alone"
		rm -f "$HOST$TORPOR_CONTAINERD_DROPIN" "$HOST$TORPOR_CONTAINERD_DROPIN.restart-pending"
		log "$MODE" "removed $TORPOR_CONTAINERD_DROPIN"
		restart=1
	fi
	for b in containerd-shim-torpor-v1 torporctl torpor-snapshotter kubectl-torpor; do
		rm -f "$HOST$BIN/$b"
	done
	if [ -f "$HOST$TORPOR_PREFIX/sbin/criu" ] && grep -qF "$MARK" "$HOST$TORPOR_PREFIX/sbin/criu"; then
		rm -f "$HOST$TORPOR_PREFIX/sbin/criu"
	fi
	rm -rf "${HOST:?}$SHARE/criu"
	rmdir "$HOST$SHARE" 2>/dev/null || true
	log "$MODE" "removed the binaries from $TORPOR_PREFIX"
	[ "$restart" = 0 ] || restart_containerd
}

case "$MODE" in
install) install ;;
uninstall) uninstall ;;
prestop)
	# An upgrade replaces this pod while the DaemonSet stays: nothing to do.
	# When the DaemonSet is gone (kubectl delete -k), uninstall.
	if /torpor/bin/torpor-agent daemonset-gone; then
		uninstall
	else
		log "$MODE" "the DaemonSet stays (an upgrade or a restart): leaving torpor installed"
	fi
	;;
snapshotter)
	# In the host's mount namespace (PID 1's, TORPOR_HOST_PID's), where
	# containerd runs (checked: containerd mounts the paths the snapshotter
	# returns), and its store lives on the host's disk. Never in a namespace
	# taken from a process found by a scan: a pod could have made that process.
	pid="$(containerd_pid)" || die "containerd not found: no process in the host's mount namespace serves $TORPOR_CONTAINERD_SOCKET"
	log "$MODE" "starting $BIN/torpor-snapshotter in the host's mount namespace (pid $TORPOR_HOST_PID's, $(readlink "/proc/$TORPOR_HOST_PID/ns/mnt")), containerd's (pid $pid, the peer of $TORPOR_CONTAINERD_SOCKET)"
	if [ -f "$HOST$TORPOR_SNAPSHOTTER_CONFIG" ]; then
		exec nsenter -t "$TORPOR_HOST_PID" -m -- "$BIN/torpor-snapshotter" --config "$TORPOR_SNAPSHOTTER_CONFIG"
	fi
	exec nsenter -t "$TORPOR_HOST_PID" -m -- "$BIN/torpor-snapshotter"
	;;
ready)
	# The pod's readiness probe (on the lifecycle container): the
	# snapshotter's store answers (a resume and the shims' lease
	# confirmations need it), so a rolling upgrade moves on to the next node
	# only then. (Not on the snapshotter: a probe execs in the mount namespace
	# of the container's process, and the snapshotter's is the host's.)
	exec "$CTL" --store-socket "$HOST$TORPOR_STORE_SOCKET" snapshots status >/dev/null
	;;
lifecycle)
	# Holds the pod's readiness probe (ready) and its preStop hook
	# (prestop): they need the host, which the agent's container has not.
	log "$MODE" "waiting (readiness probe: node.sh ready; preStop: node.sh prestop)"
	trap 'exit 0' TERM INT
	while :; do
		sleep 3600 &
		wait $! || true
	done
	;;
agent)
	# Unprivileged: the agent container has the host's shim socket dir at the
	# same path (read-only) and nothing else of the host.
	awk -v d="$TORPOR_SHIM_SOCKET_DIR" '$5 == d { found = 1 } END { exit !found }' /proc/self/mountinfo ||
		die "$TORPOR_SHIM_SOCKET_DIR (TORPOR_SHIM_SOCKET_DIR) is not mounted in the agent's container: mount the host's directory at that path (volume shims in daemonset.yaml)"
	exec /torpor/bin/torpor-agent --socket-dir "$TORPOR_SHIM_SOCKET_DIR"
	;;
*) echo "usage: node.sh install|uninstall|prestop|snapshotter|lifecycle|ready|agent" >&2; exit 2 ;;
esac
