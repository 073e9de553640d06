#!/bin/sh
# torpor's node installer and launcher: the entry point of the torpor-node
# DaemonSet's image (deploy/kubernetes/daemonset.yaml). The pod has the
# host's PID namespace; every mode but `agent` runs in a privileged
# container with the host's / at /host.
#
#   node.sh install     check containerd (version >= 2, its main config imports
#                       the drop-in's path, the cgroup driver), copy the shim,
#                       torporctl, torpor-snapshotter and CRIU onto the node,
#                       write containerd's drop-in, restart containerd if the
#                       drop-in changed (initContainer `install`)
#   node.sh snapshotter run torpor-snapshotter in the host's mount namespace
#                       (container `snapshotter`)
#   node.sh agent       run torpor-agent (container `agent`: unprivileged, no
#                       capability, only the shims' socket dir of the host,
#                       mounted read-only at the same path)
#   node.sh lifecycle   once the store answers and the kubelet reports the torpor
#                       runtime handler, label the node torpor.dev/ready=true
#                       (the RuntimeClass's nodeSelector); then wait
#                       (container `lifecycle`: what follows runs in it)
#   node.sh ready       the pod's readiness probe: the store answers and the node
#                       is labelled (a rolling upgrade moves on only then)
#   node.sh prestop     remove the ready label; uninstall when the API says torpor
#                       leaves this node (the DaemonSet gone or no longer selecting
#                       it: `kubectl torpor uninstall`), never on an upgrade; when
#                       the API cannot tell (401/403, unreachable) or torpor pods
#                       are still on the node, leave torpor installed (fail closed)
#   node.sh uninstall   remove the drop-in and the binaries, restart containerd;
#                       say what stays on disk (TORPOR_UNINSTALL_WIPE=1: remove it)
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
TORPOR_CONTAINERD_CONFIG=                        # containerd's main config (default: its --config, else /etc/containerd/config.toml)
TORPOR_CGROUP_DRIVER=                            # systemd|cgroupfs (default: runc's SystemdCgroup in containerd's config, else the kubelet's cgroupDriver)
TORPOR_KUBELET_CONFIG=/var/lib/kubelet/config.yaml
TORPOR_DATA_DIRS=/var/lib/torpor                 # what an uninstall leaves (snapshot store, actors' state), removed with TORPOR_UNINSTALL_WIPE=1
TORPOR_UNINSTALL_WIPE=0
TORPOR_METRICS_ADDRESS="${TORPOR_METRICS_ADDRESS:-}"  # the daemon's metrics_address (the pod's environment, 127.0.0.1:9464 in the install; empty: the config's)
TORPOR_AGENT_METRICS_ADDRESS="${TORPOR_AGENT_METRICS_ADDRESS:-}"  # the agent's --metrics-address (the pod's environment, 127.0.0.1:9465 in the install; empty: off)
for f in "$IMG/etc/torpor-node/default.env" "$IMG/etc/torpor-node/${NODE_NAME:-}.env"; do
	if [ -f "$f" ]; then
		# shellcheck disable=SC1090
		. "$f"
	fi
done
export TORPOR_SHIM_SOCKET_DIR
case "$TORPOR_HOST_PID" in '' | *[!0-9]* | 0*) die "TORPOR_HOST_PID='$TORPOR_HOST_PID' is not a pid" ;; esac

BIN="$TORPOR_PREFIX/bin"
SECRETS="${TORPOR_SECRETS_DIR:-/etc/torpor-secrets}"   # the Secrets' mounts (store-key/, object-store/)
RUNCFG="${TORPOR_RUNTIME_CONFIG_DIR:-/run/torpor-config}"  # a root-only tmpfs of the snapshotter's container
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

# containerd_check PID: containerd 2.x, a main config that imports the
# drop-in's path, and the cgroup driver; sets CGROUP_SYSTEMD (true|false).
# Refuses (dies) with what to do when it cannot tell.
containerd_check() {
	cpid="$1"
	ver="$(timeout 30 nsenter -t "$TORPOR_HOST_PID" -m -- "/proc/$cpid/exe" --version 2>/dev/null | grep -oE ' v?[0-9]+\.[0-9]+\.[0-9]+' | head -n1 | tr -d ' v')" || ver=""
	[ -n "$ver" ] || die "cannot tell containerd's version (pid $cpid: /proc/$cpid/exe --version in the host's mount namespace)"
	case "$ver" in
	0.* | 1.*) die "containerd $ver (pid $cpid): torpor needs containerd 2.x (its drop-in is config version 3, the CRI plugin io.containerd.cri.v1.runtime)" ;;
	esac
	cfg="$TORPOR_CONTAINERD_CONFIG"
	if [ -z "$cfg" ]; then
		cfg="$(tr '\0' '\n' <"/proc/$cpid/cmdline" | awk 'p { print; exit } $0 == "--config" || $0 == "-c" { p = 1 } sub(/^--config=/, "") { print; exit }')"
		cfg="${cfg:-/etc/containerd/config.toml}"
	fi
	case "$cfg" in
	*/rancher/k3s/* | */rancher/rke2/*) die "containerd $ver runs with $cfg, a k3s/rke2 config generated from config.toml.tmpl: not supported yet (add the drop-in to the template's imports by hand and set TORPOR_CONTAINERD_CONFIG / TORPOR_CONTAINERD_DROPIN)" ;;
	esac
	[ -f "$HOST$cfg" ] || die "containerd's main config $cfg does not exist: without it containerd $ver imports no drop-in. Write one (containerd config default > $cfg) or set TORPOR_CONTAINERD_CONFIG"
	conf="$("$CTL" node containerd-config --root "$HOST" --ignore "$TORPOR_CONTAINERD_DROPIN" "$cfg")" || die "cannot read containerd's config $cfg"
	eval "$conf"
	[ "$CONTAINERD_CONFIG_VERSION" -ge 3 ] 2>/dev/null ||
		die "containerd's main config $cfg is version '$CONTAINERD_CONFIG_VERSION': the drop-in is version 3 and an import may not be newer than the main config (containerd config migrate)"
	imported=0
	old_ifs="$IFS"
	IFS='
'
	set -f # the imports are patterns to match, not to expand here
	for pat in $CONTAINERD_IMPORTS; do
		# shellcheck disable=SC2254
		case "$TORPOR_CONTAINERD_DROPIN" in $pat) imported=1 ;; esac
	done
	set +f
	IFS="$old_ifs"
	[ "$imported" = 1 ] || die "containerd's main config $cfg does not import $TORPOR_CONTAINERD_DROPIN (its imports: [$(echo "$CONTAINERD_IMPORTS" | tr '\n' ' ')]): add imports = ['$(dirname "$TORPOR_CONTAINERD_DROPIN")/*.toml'] to it, or set TORPOR_CONTAINERD_DROPIN to a path it imports"
	# the cgroup driver: what runc runs with now, else the kubelet's
	kubelet_driver=""
	if [ -f "$HOST$TORPOR_KUBELET_CONFIG" ]; then
		kubelet_driver="$(sed -n 's/^cgroupDriver:[[:space:]]*"\{0,1\}\([a-z]*\)"\{0,1\}.*/\1/p' "$HOST$TORPOR_KUBELET_CONFIG" | head -n1)"
	fi
	case "$TORPOR_CGROUP_DRIVER:$CONTAINERD_SYSTEMD_CGROUP:$kubelet_driver" in
	systemd:*) CGROUP_SYSTEMD=true how="TORPOR_CGROUP_DRIVER" ;;
	cgroupfs:*) CGROUP_SYSTEMD=false how="TORPOR_CGROUP_DRIVER" ;;
	:true:cgroupfs | :false:systemd) die "runc's SystemdCgroup = $CONTAINERD_SYSTEMD_CGROUP in containerd's config but the kubelet's cgroupDriver is $kubelet_driver ($TORPOR_KUBELET_CONFIG): fix the node, or set TORPOR_CGROUP_DRIVER" ;;
	:true:*) CGROUP_SYSTEMD=true how="runc's SystemdCgroup in $cfg" ;;
	:false:*) CGROUP_SYSTEMD=false how="runc's SystemdCgroup in $cfg" ;;
	:unset:systemd) CGROUP_SYSTEMD=true how="the kubelet's cgroupDriver ($TORPOR_KUBELET_CONFIG)" ;;
	:unset:cgroupfs) CGROUP_SYSTEMD=false how="the kubelet's cgroupDriver ($TORPOR_KUBELET_CONFIG)" ;;
	*) die "cannot tell the node's cgroup driver: no SystemdCgroup for runc in containerd's config ($cfg and its imports), no cgroupDriver in $TORPOR_KUBELET_CONFIG${TORPOR_CGROUP_DRIVER:+, TORPOR_CGROUP_DRIVER='$TORPOR_CGROUP_DRIVER' is not systemd|cgroupfs}: set TORPOR_CGROUP_DRIVER=systemd or cgroupfs (torpor-node-env)" ;;
	esac
	log "$MODE" "containerd $ver (pid $cpid), config $cfg (version $CONTAINERD_CONFIG_VERSION, imports $TORPOR_CONTAINERD_DROPIN); cgroup driver: $([ "$CGROUP_SYSTEMD" = true ] && echo systemd || echo cgroupfs) (from $how)"
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

# The snapshotter's root: its config's top-level `root` (the ConfigMap's
# snapshotter.toml if any, else the host's file), else the built-in default.
snapshotter_root() {
	local f="$HOST$TORPOR_SNAPSHOTTER_CONFIG" r=""
	[ -f "$IMG/etc/torpor-node/snapshotter.toml" ] && f="$IMG/etc/torpor-node/snapshotter.toml"
	if [ -f "$f" ]; then
		r="$(awk '/^[[:space:]]*\[/ { exit }
			/^[[:space:]]*root[[:space:]]*=/ { sub(/^[^=]*=[[:space:]]*/, ""); sub(/[[:space:]]*(#.*)?$/, ""); gsub(/^["\047]|["\047]$/, ""); print; exit }' "$f")"
	fi
	echo "${r:-/var/lib/torpor/snapshotter}"
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
    exports = { root = '$(snapshotter_root)' }

[plugins.'io.containerd.cri.v1.images'.runtime_platforms.torpor]
  snapshotter = 'torpor'

[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.torpor]
  runtime_type = 'io.containerd.torpor.v1'
  runtime_path = '$BIN/containerd-shim-torpor-v1'
  snapshotter = 'torpor'
  pod_annotations = ['torpor.dev/*']
  container_annotations = ['torpor.dev/*']
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.torpor.options]
    # the node's cgroup driver (runc's and the kubelet's)
    SystemdCgroup = $CGROUP_SYSTEMD
TOML
}

install() {
	cpid="$(containerd_pid)" || die "containerd not found: no process in the host's mount namespace serves $TORPOR_CONTAINERD_SOCKET"
	containerd_check "$cpid"
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
	for d in $TORPOR_DATA_DIRS; do
		[ -e "$HOST$d" ] || continue
		if [ "$TORPOR_UNINSTALL_WIPE" = 1 ]; then
			rm -rf "${HOST:?}$d"
			log "$MODE" "removed $d (wipe)"
		else
			msg="left on disk: $d ($(du -sh "$HOST$d" 2>/dev/null | cut -f1)): the snapshot store (actors' process memory and files, plaintext unless store.encryption has a key) and the actors' state; remove it with kubectl torpor uninstall --wipe, or rm -rf $d on the node"
			log "$MODE" "$msg"
			echo "torpor was uninstalled from this node on $(date -u '+%Y-%m-%dT%H:%M:%SZ'); $msg" >"$HOST$d/TORPOR-UNINSTALLED.txt" || true
		fi
	done
	[ -f "$HOST$TORPOR_SNAPSHOTTER_CONFIG" ] && log "$MODE" "left on disk: $TORPOR_SNAPSHOTTER_CONFIG (yours)"
	return 0
}

case "$MODE" in
install) install ;;
uninstall) uninstall ;;
prestop)
	# a hook's output is nobody's: into the container's log where the
	# container's stderr can be opened again (it cannot everywhere: EACCES
	# seen on the cluster rig; a failed redirection of exec would end the
	# hook before it uninstalls). Else kubelet logs it if the hook fails.
	if (: 2>/proc/1/fd/2) 2>/dev/null; then exec 2>/proc/1/fd/2; fi
	# First: no new torpor pod is scheduled here (the RuntimeClass's nodeSelector).
	/torpor/bin/torpor-agent node-unready || log "$MODE" "WARNING: could not remove the node's label torpor.dev/ready"
	left="torpor stays installed on this node ($TORPOR_CONTAINERD_DROPIN, $BIN, $TORPOR_DATA_DIRS); to remove it: install again and run kubectl torpor uninstall, or node.sh uninstall in this image on the node"
	if ! intent="$(/torpor/bin/torpor-agent uninstall-intent)"; then
		log "$MODE" "the API server did not say whether torpor leaves this node (above): failing closed, $left"
		exit 0
	fi
	case "$intent" in
	stay) log "$MODE" "the DaemonSet still selects this node (an upgrade or a restart): leaving torpor installed" ;;
	uninstall*)
		if ! pods="$(/torpor/bin/torpor-agent torpor-pods)"; then
			log "$MODE" "cannot list this node's torpor pods: failing closed, $left"
			exit 0
		fi
		if [ -n "$pods" ]; then
			log "$MODE" "refusing to uninstall: torpor pods are on this node: $(echo "$pods" | tr '\n' ' '); $left"
			exit 0
		fi
		[ "$intent" = "uninstall wipe" ] && TORPOR_UNINSTALL_WIPE=1
		uninstall
		;;
	*) log "$MODE" "unexpected answer '$intent': failing closed, $left" ;;
	esac
	;;
snapshotter)
	# In the host's mount namespace (PID 1's, TORPOR_HOST_PID's), where
	# containerd runs (checked: containerd mounts the paths the snapshotter
	# returns), and its store lives on the host's disk. Never in a namespace
	# taken from a process found by a scan: a pod could have made that process.
	pid="$(containerd_pid)" || die "containerd not found: no process in the host's mount namespace serves $TORPOR_CONTAINERD_SOCKET"
	log "$MODE" "starting $BIN/torpor-snapshotter in the host's mount namespace (pid $TORPOR_HOST_PID's, $(readlink "/proc/$TORPOR_HOST_PID/ns/mnt")), containerd's (pid $pid, the peer of $TORPOR_CONTAINERD_SOCKET)"
	# Its config: the host's file with the object tier's credentials from
	# the Secret mounted at $SECRETS/object-store, written to this
	# container's root-only tmpfs ($RUNCFG, an emptyDir in memory), opened
	# and unlinked: the daemon reads it as /proc/self/fd/4. The store key
	# comes on descriptor 3 (TORPOR_STORE_KEY_FD). Never in the environment.
	# (the config: the ConfigMap's snapshotter.toml if any, else the host's file)
	opts="--root $HOST"
	config="$TORPOR_SNAPSHOTTER_CONFIG"
	[ -f "$IMG/etc/torpor-node/snapshotter.toml" ] && opts="--root ${IMG:-/}" config=/etc/torpor-node/snapshotter.toml
	[ -d "$SECRETS/object-store" ] && opts="$opts --options-dir $SECRETS/object-store"
	[ -n "$TORPOR_METRICS_ADDRESS" ] && opts="$opts --metrics-address $TORPOR_METRICS_ADDRESS"
	umask 077
	mkdir -p "$RUNCFG" && chmod 0700 "$RUNCFG" || die "cannot make $RUNCFG root-only"
	# shellcheck disable=SC2086
	"$CTL" node snapshotter-config $opts "$config" >"$RUNCFG/snapshotter.toml" 2>"$RUNCFG/warning" ||
		die "cannot compose the snapshotter's config: $(cat "$RUNCFG/warning")"
	if [ -s "$RUNCFG/warning" ]; then
		log "$MODE" "**********************************************************************"
		log "$MODE" "$(cat "$RUNCFG/warning")"
		log "$MODE" "**********************************************************************"
	fi
	exec 4<"$RUNCFG/snapshotter.toml"
	rm -f "$RUNCFG/snapshotter.toml" "$RUNCFG/warning"
	for k in "$SECRETS"/store-key/*; do
		[ -f "$k" ] || continue
		exec 3<"$k"
		TORPOR_STORE_KEY_FD=3 TORPOR_STORE_KEY_ID="$(basename "$k")"
		export TORPOR_STORE_KEY_FD TORPOR_STORE_KEY_ID
		log "$MODE" "the store key $TORPOR_STORE_KEY_ID comes from the Secret (descriptor 3)"
		break
	done
	# the lease's node id: the Kubernetes node's name (unless node_id is in the config)
	TORPOR_NODE_ID="${NODE_NAME:-}"
	export TORPOR_NODE_ID
	exec nsenter -t "$TORPOR_HOST_PID" -m -- "$BIN/torpor-snapshotter" --config /proc/self/fd/4
	;;
ready)
	# The pod's readiness probe (on the lifecycle container): the
	# snapshotter's store answers (a resume and the shims' lease
	# confirmations need it), so a rolling upgrade moves on to the next node
	# only then. (Not on the snapshotter: a probe execs in the mount namespace
	# of the container's process, and the snapshotter's is the host's.)
	# and the node is labelled ready (lifecycle)
	[ -f /tmp/torpor-node-labelled ] || exit 1
	exec "$CTL" --store-socket "$HOST$TORPOR_STORE_SOCKET" snapshots status >/dev/null
	;;
lifecycle)
	# Holds the pod's readiness probe (ready) and its preStop hook
	# (prestop): they need the host, which the agent's container has not.
	# First it labels the node ready once torpor works there.
	trap 'exit 0' TERM INT
	until "$CTL" --store-socket "$HOST$TORPOR_STORE_SOCKET" snapshots status >/dev/null 2>&1; do sleep 1; done
	until /torpor/bin/torpor-agent node-ready --handler torpor; do
		log "$MODE" "not labelling the node ready (above); trying again in 10 s"
		sleep 10
	done
	: >/tmp/torpor-node-labelled
	log "$MODE" "waiting (readiness probe: node.sh ready; preStop: node.sh prestop)"
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
	# (a node's own TORPOR_AGENT_METRICS_ADDRESS, from its env file, wins)
	export TORPOR_AGENT_METRICS_ADDRESS
	exec /torpor/bin/torpor-agent --socket-dir "$TORPOR_SHIM_SOCKET_DIR"
	;;
*) echo "usage: node.sh install|uninstall|prestop|snapshotter|lifecycle|ready|agent" >&2; exit 2 ;;
esac
