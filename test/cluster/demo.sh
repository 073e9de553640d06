#!/usr/bin/env bash
# The demo on the test cluster: an actor pod under kubelet, suspended while
# Ready, woken by a request with its state, then everything torn down.
#   flock /tmp/torpor-rig.lock test/cluster/demo.sh   (needs make deps and make build)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
"$here/up.sh"
trap '"$here/down.sh" --rig' EXIT
# shellcheck source=env.sh
. "$here/env.sh"
k() { cluster_kubectl "$@"; }
say() { printf '\n==> %s\n' "$*"; }

k apply -f "$TORPOR_REPO_ROOT/RuntimeClass.yaml"
k create namespace demo >/dev/null
k -n demo apply -f - <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: actor
spec:
  runtimeClassName: torpor
  dnsPolicy: Default
  containers:
  - name: actor
    image: localhost/torpor-test/actor:latest
    imagePullPolicy: Never
    command: ["/actor", "counter", "--alloc-mib", "256"]
    readinessProbe: {httpGet: {path: /healthz, port: 8080}, periodSeconds: 1}
YAML
k -n demo wait --for=condition=Ready pod/actor --timeout=180s
node="$(k -n demo get pod actor -o jsonpath='{.spec.nodeName}')"
ip="$(k -n demo get pod actor -o jsonpath='{.status.podIP}')"
say "pod demo/actor Ready on $node at $ip"
for _ in 1 2 3; do printf 'inc -> '; printf 'inc\n' | timeout 30 socat - "TCP:$ip:8080"; done
ctl() { # torporctl on the pod's node
	if [ "$node" = node-b ]; then
		TORPOR_STORE_SOCKET="$TORPOR_RIG_B_STATE/torpor/store.sock" TORPOR_SHIM_SOCKET_DIR="$TORPOR_RIG_B_STATE/torpor/shims" \
			TORPOR_STATE_ROOT="$TORPOR_RIG_B_ROOT/torpor" "$TORPOR_REPO_ROOT/target/release/torporctl" "$@"
	else
		TORPOR_STORE_SOCKET="$TORPOR_RIG_A_STATE/torpor/store.sock" "$TORPOR_REPO_ROOT/target/release/torporctl" "$@"
	fi
}
say "torporctl suspend demo/actor"
time ctl suspend demo/actor
say "kubectl get pod: still Running and Ready"
k -n demo get pod actor -o wide
say "a request to $ip wakes it"
time (printf 'get\n' | timeout 60 socat - "TCP:$ip:8080")
ctl status demo/actor
k delete namespace demo --wait=true --timeout=180s >/dev/null
