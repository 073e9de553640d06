#!/usr/bin/env bash
# The torpor demo: a stateful actor (an in-memory counter served over TCP,
# holding 256 MiB of memory) runs as a pod with runtimeClassName torpor on a
# private containerd. It is suspended (checkpointed with CRIU: processes
# gone, memory freed, the pod still Running to Kubernetes) and resumed, and
# woken again by an inbound request; its state is shown to survive, with
# the timings.
# Everything it starts is removed at the end, even on failure.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../test/rig/env.sh
. "$REPO/test/rig/env.sh"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
ms_since() { echo $(( ($(date +%s%N) - $1) / 1000000 )); }
counter() { # counter IP CMD -> the reply of the actor's counter
	exec 3<>"/dev/tcp/$1/8080"; printf '%s\n' "$2" >&3; local r; read -r r <&3; exec 3<&-; echo "$r"
}

WORK="$(mktemp -d)"
POD=""
cleanup() {
	set +e
	[ -n "$POD" ] && rig_crictl stopp "$POD" >/dev/null && rig_crictl rmp "$POD" >/dev/null
	rm -rf "$WORK"
	"$TORPOR_RIG_DIR/down.sh" >/dev/null
}
trap cleanup EXIT

say "starting a private containerd with the torpor runtime"
"$TORPOR_RIG_DIR/up.sh" >/dev/null

NAME="demo-actor-$$"
cat >"$WORK/pod.json" <<JSON
{"metadata":{"name":"$NAME","namespace":"default","uid":"$NAME","attempt":0},
 "annotations":{"torpor.dev/actor":"default/$NAME"},
 "linux":{"cgroup_parent":"/$TORPOR_RIG_CGROUP/pod-$NAME"},"log_directory":"$WORK"}
JSON
cat >"$WORK/ctr.json" <<JSON
{"metadata":{"name":"counter"},"image":{"image":"$TORPOR_ACTOR_IMAGE"},
 "command":["/actor","counter","--port","8080","--alloc-mib","256"],"log_path":"counter.log","linux":{}}
JSON

say "running the actor pod (runtimeClassName: torpor)"
t=$(date +%s%N)
POD=$(rig_crictl runp --runtime torpor "$WORK/pod.json")
CID=$(rig_crictl create "$POD" "$WORK/ctr.json" "$WORK/pod.json")
rig_crictl start "$CID" >/dev/null
IP=$(rig_crictl inspectp -o go-template --template '{{.status.network.ip}}' "$POD")
for _ in $(seq 300); do (counter "$IP" get) >/dev/null 2>&1 && break; sleep 0.1; done
echo "pod $POD running at $IP in $(ms_since "$t") ms"

say "the actor builds up state"
for _ in 1 2 3; do echo "inc -> $(counter "$IP" inc)"; done

CTL="$REPO/target/release/torporctl"
PID=$(rig_crictl inspect -o go-template --template '{{.info.pid}}' "$CID")
rss() { awk '/VmRSS/ {printf "%d MiB", $2/1024}' "/proc/$1/status" 2>/dev/null || echo "no process"; }
echo "actor process $PID uses $(rss "$PID")"

say "suspend: checkpoint with CRIU, free the memory"
t=$(date +%s%N); "$CTL" suspend "default/$NAME" >/dev/null; echo "suspended in $(ms_since "$t") ms"
"$CTL" status "default/$NAME"
echo "actor process $PID: $(rss "$PID")"
echo "crictl still reports: $(rig_crictl inspect -o go-template --template '{{.status.state}}' "$CID")"

say "an inbound request wakes it: restored into the same pod, same IP"
t=$(date +%s%N); r=$(counter "$IP" inc); echo "inc -> $r   (was 3 before the suspend), answered in $(ms_since "$t") ms"
"$CTL" status "default/$NAME"

say "kubelet probes do not wake it"
"$CTL" suspend "default/$NAME" >/dev/null
echo "probe: $(curl -s -m 5 -H 'User-Agent: kube-probe/1.31' "http://$IP:8080/healthz")"
"$CTL" status "default/$NAME" | tail -1
"$CTL" resume "default/$NAME" >/dev/null

say "container logs"
rig_crictl logs "$CID"
say "done; removing everything"
