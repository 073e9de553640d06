#!/usr/bin/env bash
# torpor benchmarks: torpor vs containerd-shim-runc-v2 on the test rig.
#
#   bench/run.sh                       (what `make bench` runs; as root)
#
# 1. builds the shim (cargo build --release -p torpor-shim),
# 2. brings up its own instance of the test rig (test/rig/up.sh with
#    TORPOR_RIG_STATE=/run/torpor-bench etc., so a developer's rig on
#    /run/torpor-test is neither disturbed nor disturbs the numbers; both
#    nodes: node B for cross_node.py),
# 3. runs the benchmark scripts (each merges its entries into bench/results.json),
# 4. renders BENCHMARKS.md and bench/results.svg (bench/report.py),
# 5. removes its pods and tears its rig down (test/rig/down.sh).
#
# containerd finds containerd-shim-torpor-v1 in a bin dir of the bench rig
# holding only a copy of target/release/containerd-shim-torpor-v1 (so nothing
# else in target/release shadows runc or other binaries for the baseline).
#
# Environment:
#   TORPOR_BENCH_ONLY="pod_start shim_rss"   benchmark scripts to run (bench/<name>.py; e.g. freeze_tier)
#   TORPOR_BENCH_PODS=40                     pods per runtime, pod_start_ms
#   TORPOR_BENCH_RSS_PODS=20                 pods per runtime, shim_rss_mib
#   TORPOR_BENCH_SCRIPT_TIMEOUT=420          seconds one benchmark script may take (default
#                                            1080 for suspend_resume: 30 runs of two sizes
#                                            against runc-v2, whose 1 GiB checkpoint takes 4-12 s)
#   TORPOR_BENCH_SKIP_BUILD=1                do not build the shim
#   TORPOR_RIG_KEEP=1                        leave the rig up afterwards
#   TORPOR_BENCH_RIG=shared                  use the rig of env.sh's defaults (or the
#                                            TORPOR_RIG_* already exported); a rig that
#                                            was running already is left up
# Exit code: non-zero if the baseline could not be measured, a script failed
# or the rig could not be brought up / torn down cleanly. A torpor failure is
# recorded in results.json (torpor: null, "error": ...) and does not fail the run.
set -uo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$BENCH_DIR/.." && pwd)"
if [ "${TORPOR_BENCH_RIG:-own}" != shared ]; then
	# The bench's own rig: every name env.sh lets a second rig override.
	export TORPOR_RIG_ROOT=/var/lib/torpor-bench
	export TORPOR_RIG_STATE=/run/torpor-bench
	export TORPOR_RIG_CNI_NETWORK=torpor-bench
	export TORPOR_RIG_BRIDGE=torpor-bench0
	export TORPOR_RIG_SUBNET=10.243.0.0/16
	export TORPOR_RIG_CGROUP=torpor-bench
fi
# shellcheck source=../test/rig/env.sh
. "$REPO_ROOT/test/rig/env.sh"

log() { echo "bench/run: $*" >&2; }
[ "$(id -u)" = 0 ] || { log "must run as root (the rig runs containerd)"; exit 1; }
command -v python3 >/dev/null || { log "python3 is required"; exit 1; }

export PYTHONDONTWRITEBYTECODE=1
SCRIPTS="${TORPOR_BENCH_ONLY:-pod_start shim_rss}"
[ -n "${TORPOR_BENCH_ONLY:-}" ] || SCRIPTS="$SCRIPTS checkpoint_restore" # checkpoint_<size>_ms, restore_<size>_ms
[ -n "${TORPOR_BENCH_ONLY:-}" ] || SCRIPTS="$SCRIPTS suspend_resume" # resume_256mib_ms, resume_1gib_ms, suspend_1gib_ms
[ -n "${TORPOR_BENCH_ONLY:-}" ] || SCRIPTS="$SCRIPTS resume_cold" # resume_256mib_cold_ms
[ -n "${TORPOR_BENCH_ONLY:-}" ] || SCRIPTS="$SCRIPTS wakeups" # wakeups_per_s
[ -n "${TORPOR_BENCH_ONLY:-}" ] || SCRIPTS="$SCRIPTS wake_burst" # wake_burst_100_p99_ms
[ -n "${TORPOR_BENCH_ONLY:-}" ] || SCRIPTS="$SCRIPTS suspended_memory" # suspended_actor_mib
[ -n "${TORPOR_BENCH_ONLY:-}" ] || SCRIPTS="$SCRIPTS freeze_tier" # resume_frozen_ms
[ -n "${TORPOR_BENCH_ONLY:-}" ] || SCRIPTS="$SCRIPTS store" # upload_mib_per_s, resuspend_upload_fraction, resume_remote_256mib_ms
[ -n "${TORPOR_BENCH_ONLY:-}" ] || SCRIPTS="$SCRIPTS cross_node" # resume_cross_node_256mib_ms, clone_10_actors_ms, clone_10_actors_remote_ms (both nodes)
SCRIPT_TIMEOUT="${TORPOR_BENCH_SCRIPT_TIMEOUT:-420}"
started=$SECONDS
rig_started=0
rc=0

teardown() {
	local r=$?
	trap - EXIT INT TERM
	[ "$rc" != 0 ] || rc=$r
	# pods of an interrupted script
	python3 "$BENCH_DIR/bench.py" cleanup || true
	rm -rf "${TORPOR_RIG_STATE:?}/bench"
	if [ "$rig_started" = 1 ]; then
		if [ "${TORPOR_RIG_KEEP:-0}" = 1 ]; then
			log "TORPOR_RIG_KEEP=1: leaving the rig up (test/rig/down.sh removes it)"
		else
			# The bench's own rig goes whole, with its stores and S3 data
			# (every run uploads gigabytes); a shared one keeps its data.
			purge=()
			[ "${TORPOR_BENCH_RIG:-own}" = shared ] || purge=(--purge)
			"$REPO_ROOT/test/rig/down.sh" "${purge[@]}" || { log "test/rig/down.sh reported leftovers"; [ "$rc" != 0 ] || rc=1; }
		fi
	fi
	log "done in $((SECONDS - started))s (exit $rc)"
	exit "$rc"
}
trap teardown EXIT
trap 'rc=130; exit 130' INT
trap 'rc=143; exit 143' TERM

cd "$REPO_ROOT" || exit 1

# ------------------------------------------------------------------ 1. build
if [ "${TORPOR_BENCH_SKIP_BUILD:-0}" = 1 ]; then
	log "TORPOR_BENCH_SKIP_BUILD=1: not building the shim"
else
	log "building the shim (cargo build --release -p torpor-shim)"
	if ! cargo build --release -p torpor-shim; then
		log "WARNING: the shim does not build; torpor entries will report errors"
	fi
fi
[ -x "$REPO_ROOT/target/release/containerd-shim-torpor-v1" ] ||
	log "WARNING: target/release/containerd-shim-torpor-v1 missing; torpor entries will report errors"

# --------------------------------------------------------------------- 2. rig
if [ "${TORPOR_BENCH_RIG:-own}" != shared ]; then
	rig_started=1 # ours: always torn down (also after an earlier interrupted run)
	if rig_containerd_pid >/dev/null; then
		log "the bench rig ($TORPOR_RIG_STATE) is still up from an earlier run: restarting it"
		"$REPO_ROOT/test/rig/down.sh" || { log "test/rig/down.sh failed"; rc=1; exit 1; }
	fi
	mkdir -p "$TORPOR_RIG_STATE/bin"
	if [ -x "$REPO_ROOT/target/release/containerd-shim-torpor-v1" ]; then
		cp "$REPO_ROOT/target/release/containerd-shim-torpor-v1" "$TORPOR_RIG_STATE/bin/"
	fi
	export TORPOR_SHIM_DIR="$TORPOR_RIG_STATE/bin"
elif rig_containerd_pid >/dev/null; then
	log "reusing the running rig ($TORPOR_RIG_ADDRESS); it is left up afterwards." \
		"Note: anything else using it now disturbs the numbers."
else
	rig_started=1
fi
log "rig: $TORPOR_RIG_ADDRESS"
"$REPO_ROOT/test/rig/up.sh" || { log "test/rig/up.sh failed"; rc=1; exit 1; }

# -------------------------------------------------------------- 3. measure
python3 "$BENCH_DIR/bench.py" environment ||
	log "WARNING: could not record versions"
for s in $SCRIPTS; do
	script="$BENCH_DIR/$s.py"
	[ -f "$script" ] || { log "no such benchmark: $script"; rc=1; continue; }
	limit="$SCRIPT_TIMEOUT"
	[ "$s" != suspend_resume ] || [ -n "${TORPOR_BENCH_SCRIPT_TIMEOUT:-}" ] || limit=1080
	log "running $s (timeout ${limit}s)"
	t0=$SECONDS
	TORPOR_BENCH_SCRIPT_TIMEOUT="$limit" timeout --signal=TERM --kill-after=30 "$limit" python3 "$script"
	r=$?
	if [ "$r" != 0 ]; then
		log "$s failed (exit $r)"
		rc=1
	fi
	log "$s took $((SECONDS - t0))s"
done

# --------------------------------------------------------------- 4. report
python3 "$BENCH_DIR/report.py" || rc=1
# The baseline must always be measurable; a null baseline is a harness/rig failure.
python3 - "$BENCH_DIR/results.json" <<'PY' || rc=1
import json, sys
d = json.load(open(sys.argv[1]))
bad = [e["name"] for e in d["results"] if e.get("baseline") is None and not e.get("baseline_na")]
errs = [f'{e["name"]}: {e["error"]}' for e in d["results"] if e.get("error")]
for e in d["results"]:
    print(f'  {e["name"]:<22} torpor={e["torpor"]!s:<10} baseline={e["baseline"]!s:<10} {e["unit"]}', file=sys.stderr)
for m in errs:
    print(f"  torpor error: {m}", file=sys.stderr)
if bad:
    print(f"bench/run: baseline missing for: {', '.join(bad)}", file=sys.stderr)
    sys.exit(1)
PY
