#!/usr/bin/env bash
# Checks of the install's observability artifacts, without a cluster
# (`make deploy-test`; promtool and helm from `make deps`):
#   - deploy/observability/torpor-rules.yaml: promtool check rules, and
#     promtool test rules torpor-rules.test.yaml (the alerts fire, and only then);
#   - the Helm chart renders with metrics.serviceMonitor, .prometheusRule and
#     .dashboard off (the default: none of their objects) and on (each
#     object, the rules and dashboard those files hold), refuses a
#     ServiceMonitor of a loopback address, and passes helm lint;
#   - the kustomize base and the chart serve metrics on 127.0.0.1 by default.
# That the rules' and dashboard's queries name only metrics the daemon
# exports is the snapshotter's unit test deploy_queries_use_exported_metrics.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROMTOOL="${TORPOR_PROMTOOL:-/usr/local/bin/promtool}"
HELM="${TORPOR_HELM:-/usr/local/bin/helm}"
KUBECTL="${TORPOR_KUBECTL:-/usr/local/bin/kubectl}"
OBS="$ROOT/deploy/observability"
CHART="$ROOT/deploy/helm/torpor"
passed=0 failed=0
ok() { echo "ok: $*"; passed=$((passed + 1)); }
bad() { echo "FAILED: $*" >&2; failed=$((failed + 1)); }
need() { [ -x "$1" ] || { echo "$1 missing: make deps (scripts/deps.sh) installs it" >&2; exit 2; }; }
need "$PROMTOOL"
need "$HELM"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
# helm's own state out of $HOME
export HELM_CACHE_HOME="$tmp/helm/cache" HELM_CONFIG_HOME="$tmp/helm/config" HELM_DATA_HOME="$tmp/helm/data"

# ---- rules
if out="$("$PROMTOOL" check rules "$OBS/torpor-rules.yaml" 2>&1)"; then ok "promtool check rules: ${out##*SUCCESS: }"; else bad "promtool check rules: $out"; fi
if out="$(cd "$OBS" && "$PROMTOOL" test rules torpor-rules.test.yaml 2>&1)"; then ok "promtool test rules"; else bad "promtool test rules: $out"; fi

# ---- the chart (files/ links to deploy/observability: helm says so on stderr)
render() { "$HELM" template torpor "$CHART" -n torpor-system "$@" 2>"$tmp/stderr"; }
kinds() { grep -E '^kind: ' | sort | uniq -c | tr -s ' ' | tr '\n' ';'; }
if out="$("$HELM" lint "$CHART" --set metrics.prometheusRule.enabled=true --set metrics.dashboard.enabled=true 2>&1)"; then ok "helm lint"; else bad "helm lint: $out"; fi
if default="$(render)"; then
	k="$(kinds <<<"$default")"
	case "$k" in *ServiceMonitor* | *PrometheusRule* | *"Service;"*) bad "the default renders observability objects: $k" ;; *) ok "helm template, defaults: no ServiceMonitor, PrometheusRule or dashboard" ;; esac
	grep -q 'torpor-dashboard' <<<"$default" && bad "the default renders the dashboard"
	if grep -A1 'name: TORPOR_METRICS_ADDRESS' <<<"$default" | grep -q '"127.0.0.1:9464"' &&
		grep -A1 'name: TORPOR_AGENT_METRICS_ADDRESS' <<<"$default" | grep -q '"127.0.0.1:9465"'; then
		ok "helm template, defaults: metrics on 127.0.0.1:9464 and :9465"
	else
		bad "helm template, defaults: metrics not on 127.0.0.1:9464/9465"
	fi
else
	bad "helm template, defaults: $(cat "$tmp/stderr")"
fi
on=(--set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true --set metrics.dashboard.enabled=true)
if all="$(render "${on[@]}" --set metrics.rbacProxy.enabled=true)"; then
	k="$(kinds <<<"$all")"
	for want in ServiceMonitor PrometheusRule "Service;" ClusterRole; do
		case "$k" in *"$want"*) ;; *) bad "helm template, all on: no ${want%;}: $k" ;; esac
	done
	# the PrometheusRule holds every alert of the rules file
	n_file="$(grep -c -- '- alert: ' "$OBS/torpor-rules.yaml")"
	n_chart="$(grep -c -- '- alert: ' <<<"$all")"
	[ "$n_file" = "$n_chart" ] || bad "the PrometheusRule has $n_chart alerts, torpor-rules.yaml $n_file"
	# the dashboard ConfigMap, labelled for Grafana's sidecar, holds the JSON
	grep -q 'grafana_dashboard: "1"' <<<"$all" || bad "the dashboard ConfigMap has no grafana_dashboard label"
	grep -q '"uid": "torpor-node"' <<<"$all" || bad "the dashboard ConfigMap does not hold torpor-dashboard.json"
	grep -q -- '--upstream=http://127.0.0.1:9464/' <<<"$all" || bad "kube-rbac-proxy does not proxy the daemon's metrics"
	grep -q 'scheme: https' <<<"$all" || bad "the ServiceMonitor does not scrape kube-rbac-proxy over HTTPS"
	[ "$failed" = 0 ] && ok "helm template, all on (kube-rbac-proxy): $k"
else
	bad "helm template, all on: $(cat "$tmp/stderr")"
fi
if out="$(render "${on[@]}" --set metrics.address=0.0.0.0:9464 --set agent.metricsAddress=0.0.0.0:9465)"; then
	grep -q 'port: 9464' <<<"$out" && grep -q 'port: 9465' <<<"$out" && ! grep -q 'scheme: https' <<<"$out" &&
		ok "helm template, all on, metrics on the node's interfaces: scraped over HTTP" || bad "helm template, all on, 0.0.0.0: ports or scheme"
else
	bad "helm template, all on, 0.0.0.0: $(cat "$tmp/stderr")"
fi
if render --set metrics.serviceMonitor.enabled=true >/dev/null; then
	bad "helm template renders a ServiceMonitor of a loopback address"
elif grep -q "loopback" "$tmp/stderr"; then
	ok "helm template refuses a ServiceMonitor of 127.0.0.1, saying why"
else
	bad "helm template, ServiceMonitor of 127.0.0.1: $(cat "$tmp/stderr")"
fi

# ---- the kustomize base
if [ -x "$KUBECTL" ]; then
	if k="$("$KUBECTL" kustomize "$ROOT/deploy/kubernetes" 2>&1)"; then
		if grep -A1 'name: TORPOR_METRICS_ADDRESS' <<<"$k" | grep -q '127.0.0.1:9464' &&
			grep -A1 'name: TORPOR_AGENT_METRICS_ADDRESS' <<<"$k" | grep -q '127.0.0.1:9465'; then
			ok "kubectl kustomize deploy/kubernetes: metrics on 127.0.0.1:9464 and :9465"
		else
			bad "kubectl kustomize deploy/kubernetes: metrics not on 127.0.0.1:9464/9465"
		fi
	else
		bad "kubectl kustomize deploy/kubernetes: $k"
	fi
else
	echo "skipped: $KUBECTL missing (the kustomize base)"
fi

echo "deploy checks: $passed passed, $failed failed"
[ "$failed" = 0 ]
