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
# Exit code: cargo's.
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

teardown() {
	local rc=$?
	trap - EXIT INT TERM
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
	cargo build --release -p torpor-shim --features torpor-shim/failpoints -p torporctl -p torpor-snapshotter || exit $?
fi

"$RIG_DIR/up.sh" || exit $?

echo "rig/run-tests: runtime under test: $TORPOR_TEST_RUNTIME, $THREADS test threads" >&2
cargo test -p torpor-tests --release "${cargo_args[@]}" -- --test-threads="$THREADS" "${test_args[@]}"
