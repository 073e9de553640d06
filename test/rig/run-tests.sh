#!/usr/bin/env bash
# Run the torpor integration tests against a private containerd:
#   build the shim and torpor-snapshotter, up.sh, cargo test -p torpor-tests, then down.sh (always,
#   for a rig this script started; see TORPOR_RIG_DOWN).
#
#   test/rig/run-tests.sh                       all tests, runtime handler torpor
#   TORPOR_TEST_RUNTIME=runc test/rig/run-tests.sh   same tests against containerd-shim-runc-v2
#   test/rig/run-tests.sh --test crictl_basic   extra args go to cargo test (before `--`)
#   test/rig/run-tests.sh -- some_test_name     args after `--` go to the test binary
#
# Environment:
#   TORPOR_TEST_RUNTIME   runtime handler under test: torpor (default) or runc
#   TORPOR_TEST_THREADS   parallel tests (default 2)
#   TORPOR_RIG_KEEP=1     leave the rig running afterwards (for debugging)
#   TORPOR_RIG_DOWN=1     tear the rig down afterwards even if it was already
#                         running before this script (default: a rig this script
#                         did not start is left running)
#   TORPOR_SKIP_SHIM_BUILD=1  do not build the shim first (e.g. runc-only runs)
#   TORPOR_TEST_CLUSTER=0 without args: skip the end-to-end tests through kubectl
#
# Without cargo args, all tests but tests/k8s.rs, tests/workloads.rs and
# tests/k8s_native.rs run first; then the Kubernetes test cluster
# (test/cluster/up.sh) comes up on the rig and tests/k8s.rs and
# tests/workloads.rs (real servers from Debian's packages) run against it, one
# test at a time, and the cluster goes down again. (A kubelet kills the pods
# it does not know, so the crictl-driven tests never run while the cluster is
# up.) `--test k8s` or `--test workloads` runs only those, with the cluster.
# Last, tests/k8s_native.rs and tests/k8s_install.rs get a rig and cluster
# of their own whose containerds start plain (TORPOR_RIG_PLAIN=1: torpor is
# installed by `kubectl apply -k deploy/kubernetes`, and by the Helm chart
# deploy/helm/torpor); `--test k8s_native` or `--test k8s_install` runs only
# those.
# Exit code: cargo's (the first failing phase's).
set -uo pipefail

RIG_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=env.sh
. "$RIG_DIR/env.sh"

THREADS="${TORPOR_TEST_THREADS:-2}"
export TORPOR_TEST_RUNTIME="${TORPOR_TEST_RUNTIME:-torpor}"

cargo_args=()
test_args=()
seen_dashdash=0
for a in "$@"; do
	if [ "$seen_dashdash" = 0 ] && [ "$a" = "--" ]; then
		seen_dashdash=1
		continue
	fi
	if [ "$seen_dashdash" = 1 ]; then test_args+=("$a"); else cargo_args+=("$a"); fi
done

# A rig that was already running (someone else's session, a debugging run) is
# reused and left running; a rig this script started is always torn down.
rig_was_running=0
if rig_containerd_pid >/dev/null; then
	rig_was_running=1
fi

cluster_started=0
teardown() {
	local rc=$?
	trap - EXIT INT TERM
	if [ "$cluster_started" = 1 ] && [ "${TORPOR_RIG_KEEP:-0}" != 1 ]; then
		"$RIG_DIR/../cluster/down.sh" || { echo "rig/run-tests: cluster/down.sh reported leftovers" >&2; [ "$rc" != 0 ] || rc=1; }
	fi
	if [ "${TORPOR_RIG_KEEP:-0}" = 1 ]; then
		echo "rig/run-tests: TORPOR_RIG_KEEP=1, leaving the rig up (test/rig/down.sh to remove it)" >&2
	elif [ "$rig_was_running" = 1 ] && [ "${TORPOR_RIG_DOWN:-0}" != 1 ]; then
		echo "rig/run-tests: the rig was already running before; leaving it up (TORPOR_RIG_DOWN=1 tears it down anyway)" >&2
	else
		"$RIG_DIR/down.sh" || { echo "rig/run-tests: down.sh reported leftovers" >&2; [ "$rc" != 0 ] || rc=1; }
	fi
	exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cd "$TORPOR_REPO_ROOT" || exit 1

# Build first: up.sh puts target/release first in containerd's PATH.
if [ "${TORPOR_SKIP_SHIM_BUILD:-0}" = 1 ]; then
	echo "rig/run-tests: TORPOR_SKIP_SHIM_BUILD=1, not building the shim" >&2
else
	# With the test-only crash points (runtime/src/failpoint.rs); make build,
	# the bench and the demo build it without them.
	echo "rig/run-tests: building the shim (with failpoints), torporctl and the snapshotter" >&2
	cargo build --release -p torpor-shim --features torpor-shim/failpoints -p torporctl -p torpor-snapshotter --features torpor-snapshotter/failpoints -p torpor-agent || exit $?
fi

# The end-to-end tests through kubectl (tests/k8s.rs, tests/workloads.rs) need the cluster;
# tests/k8s_native.rs a cluster on plain containerds.
CLUSTER_TEST=k8s
WORKLOAD_TEST=workloads
TENANCY_TEST=k8s_tenancy
NATIVE_TEST=k8s_native
INSTALL_TEST=k8s_install
case " ${cargo_args[*]} " in
*" --test $NATIVE_TEST "* | *" --test=$NATIVE_TEST "* | *" --test $INSTALL_TEST "* | *" --test=$INSTALL_TEST "*)
	if [ "$rig_was_running" = 1 ]; then
		echo "rig/run-tests: --test $NATIVE_TEST / $INSTALL_TEST need a plain rig of their own: tear the running one down first (test/rig/down.sh)" >&2
		exit 1
	fi
	export TORPOR_RIG_PLAIN=1
	;;
esac

"$RIG_DIR/up.sh" || exit $?
start_cluster() {
	echo "rig/run-tests: starting the Kubernetes test cluster (test/cluster/up.sh)" >&2
	cluster_started=1
	"$RIG_DIR/../cluster/up.sh" || return $?
	# shellcheck source=../cluster/env.sh
	. "$RIG_DIR/../cluster/env.sh"
}
run_cluster_tests() { # cargo args...
	start_cluster || return $?
	echo "rig/run-tests: end-to-end tests through kubectl, 1 test thread" >&2
	cargo test -p torpor-tests --release --no-fail-fast "$@" -- --test-threads=1 "${test_args[@]}"
}

echo "rig/run-tests: runtime under test: $TORPOR_TEST_RUNTIME, $THREADS test threads" >&2
if [ "${#cargo_args[@]}" = 0 ]; then
	# every test target but the cluster's, then the cluster's
	targets=(--lib)
	for f in "$TORPOR_REPO_ROOT"/test/tests/*.rs; do
		t="$(basename "$f" .rs)"
		[ "$t" = "$CLUSTER_TEST" ] || [ "$t" = "$WORKLOAD_TEST" ] || [ "$t" = "$TENANCY_TEST" ] || [ "$t" = "$NATIVE_TEST" ] || [ "$t" = "$INSTALL_TEST" ] || targets+=(--test "$t")
	done
	cargo test -p torpor-tests --release --no-fail-fast "${targets[@]}" -- --test-threads="$THREADS" "${test_args[@]}"
	rc=$?
	if [ "${TORPOR_TEST_CLUSTER:-1}" != 0 ]; then
		run_cluster_tests --test "$CLUSTER_TEST" --test "$WORKLOAD_TEST" --test "$TENANCY_TEST"
		rc2=$?
		[ "$rc" != 0 ] || rc=$rc2
		# a plain rig and cluster of its own for tests/k8s_native.rs
		if [ "$rig_was_running" = 1 ]; then
			echo "rig/run-tests: the rig was running before: not replacing it with a plain one, $NATIVE_TEST and $INSTALL_TEST skipped" >&2
			[ "$rc" != 0 ] || rc=1
		else
			echo "rig/run-tests: a plain rig and cluster for $INSTALL_TEST and $NATIVE_TEST" >&2
			"$RIG_DIR/../cluster/down.sh" --rig || { [ "$rc" != 0 ] || rc=1; }
			export TORPOR_RIG_PLAIN=1
			"$RIG_DIR/up.sh" || exit $?
			run_cluster_tests --test "$INSTALL_TEST" --test "$NATIVE_TEST"
			rc2=$?
			[ "$rc" != 0 ] || rc=$rc2
		fi
	fi
	exit "$rc"
fi
case " ${cargo_args[*]} " in
*" --test $CLUSTER_TEST "* | *" --test=$CLUSTER_TEST "* | *" --test $WORKLOAD_TEST "* | *" --test=$WORKLOAD_TEST "* | *" --test $TENANCY_TEST "* | *" --test=$TENANCY_TEST "* | *" --test $NATIVE_TEST "* | *" --test=$NATIVE_TEST "* | *" --test $INSTALL_TEST "* | *" --test=$INSTALL_TEST "*)
	run_cluster_tests "${cargo_args[@]}"
	exit $?
	;;
esac
cargo test -p torpor-tests --release "${cargo_args[@]}" -- --test-threads="$THREADS" "${test_args[@]}"
