#!/bin/bash
# The node guest's suites (test/vm/node.sh), run by torpor-vm-suite.service
# at boot; the unit powers the guest off when this ends. Results go to the
# second disk (/dev/vdb), which the host reads back:
#   summary.txt    one `vm-check: <name> <pass|fail|skipped> [(why)]` line per
#                  check, then `vm-suite: rc=N`
#   node.txt       versions and node facts (cgroup, init, iptables, CRIU)
#   <pass>-<test>.log   each test binary's output; <pass>-rig/  the rig's logs
#   journal.txt    the guest's journal
#
# Passes: `systemd` (the rig's runc and torpor handlers with SystemdCgroup =
# true, pods in slices) and `cgroupfs` (cgroupfs driver on the same v2 tree).
# SUITES (from /torpor-vm/env): all, or a space-separated choice of node,
# unit, systemd, cgroupfs.
set -u
. /torpor-vm/env
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export HOME=/root
R=/results
mkdir -p "$R"
if ! mount -t ext4 /dev/vdb "$R"; then
	echo "vm-suite: cannot mount the results disk /dev/vdb"
	exit 1
fi
SUMMARY=$R/summary.txt
rc=0
T0=$SECONDS

check() { # name status [why]
	local line="vm-check: $1 $2${3:+ ($3)}"
	echo "$line" | tee -a "$SUMMARY"
	[ "$2" != fail ] || rc=1
}
# Failures of a bug found in the guest and written down in test/vm/README.md
# ("Known"): reported `skipped (Known: ...)` instead of `fail` while they
# fail, `pass` once they pass.
declare -A KNOWN=(
)
want() { [ "$SUITES" = all ] || [[ " $SUITES " == *" $1 "* ]]; }
test_exe() { awk -F'\t' -v n="$1" '$1 == n {print $2; exit}' /etc/torpor-vm-tests; }

# run_tests PASS TARGET NAME...: the test binary TARGET with exactly these
# tests, one thread; one check per test from libtest's lines.
run_tests() {
	local pass=$1 target=$2 exe out name status
	shift 2
	exe=$(test_exe "$target")
	if [ -z "$exe" ]; then
		check "$pass/$target" fail "no test binary"
		return
	fi
	out=$R/$pass-$target.log
	local t=$SECONDS
	(cd /tmp && RUST_BACKTRACE=1 timeout 1200 "$exe" --exact --test-threads=1 "$@") >"$out" 2>&1
	echo "vm-suite: $pass/$target: $((SECONDS - t)) s" >>"$R/times.txt"
	for name in "$@"; do
		status=$(sed -n "s/^test $name \.\.\. \([a-zA-Z]*\).*/\1/p" "$out" | head -n1)
		case "$status" in
		ok)
			if grep -q "^skipped: " "$out"; then check "$pass/$target::$name" skipped "$(grep -m1 '^skipped: ' "$out")"; else check "$pass/$target::$name" pass; fi
			;;
		ignored) check "$pass/$target::$name" skipped "ignored" ;;
		FAILED)
			if [ -n "${KNOWN[$pass/$target::$name]:-}" ]; then
				check "$pass/$target::$name" skipped "Known (test/vm/README.md): ${KNOWN[$pass/$target::$name]}; see $pass-$target.log"
			else
				check "$pass/$target::$name" fail "see $pass-$target.log"
			fi
			;;
		*) check "$pass/$target::$name" fail "did not run or hung (see $pass-$target.log)" ;;
		esac
	done
}

# ------------------------------------------------------------------ node facts
{
	echo "kernel: $(uname -r)"
	echo "init: $(readlink /proc/1/exe)"
	echo "system: $(systemctl is-system-running 2>&1)"
	echo "cgroup mount: $(stat -fc %T /sys/fs/cgroup)"
	echo "cgroup controllers: $(cat /sys/fs/cgroup/cgroup.controllers)"
	echo "iptables: $(iptables -V 2>&1)"
	echo "runc: $(runc --version 2>&1 | tr '\n' ' ')"
	echo "containerd: $(containerd --version 2>&1)"
	echo "criu: $(criu --version 2>&1 | tr '\n' ' ')"
	echo "criu check: $(criu check 2>&1 | tail -n1)"
	echo "criu check --feature mem_dirty_track: $(criu check --feature mem_dirty_track 2>&1 | tail -n1)"
	echo "criu check --all: $(criu check --all 2>&1 | tail -n3 | tr '\n' ' ')"
	echo "cpu: $(grep -m1 'model name' /proc/cpuinfo) ($(nproc) cpus)"
	echo "memory: $(grep MemTotal /proc/meminfo)"
	echo "CA certificates: $(find /etc/ssl/certs -name '*.pem' 2>/dev/null | wc -l) in /etc/ssl/certs"
} >"$R/node.txt" 2>&1
cat "$R/node.txt"

if want node; then
	if [ "$(stat -fc %T /sys/fs/cgroup)" = cgroup2fs ] && ! grep -q ' cgroup ' /proc/mounts; then
		check node/cgroup-v2-only pass
	else
		check node/cgroup-v2-only fail "$(grep cgroup /proc/mounts | tr '\n' ';')"
	fi
	case "$(readlink /proc/1/exe)" in */systemd) check node/systemd-pid1 pass ;; *) check node/systemd-pid1 fail "$(readlink /proc/1/exe)" ;; esac
	case "$(iptables -V 2>&1)" in *nf_tables*) check node/iptables-nft pass ;; *) check node/iptables-nft fail "$(iptables -V 2>&1)" ;; esac
	if criu check 2>&1 | grep -q 'Looks good'; then check node/criu-check pass; else check node/criu-check fail "$(criu check 2>&1 | tail -n1)"; fi
	if criu check --feature mem_dirty_track >/dev/null 2>&1; then
		check node/criu-mem-dirty-track pass
	else
		check node/criu-mem-dirty-track fail "$(criu check --feature mem_dirty_track 2>&1 | tail -n1)"
	fi
fi

# The runtime's cgroup unit tests, with the live one, on this v2 tree (what
# test/vm/run.sh's initramfs ran before).
if want unit; then
	exe=$(test_exe torpor_runtime)
	out=$R/unit-cgroup.log
	(cd /tmp && RUST_BACKTRACE=1 timeout 600 "$exe" system::cgroup --include-ignored --skip live_cgroup_v1_oom_watch --test-threads=1) >"$out" 2>&1
	urc=$?
	n=$(grep -c '^test .* ok$' "$out")
	if [ "$urc" = 0 ]; then check unit/system::cgroup pass "$n tests"; else check unit/system::cgroup fail "see unit-cgroup.log"; fi
fi

# ------------------------------------------------------------------ the rig
# rig_pass PASS: brings the rig up (node A only), runs PASS's tests, keeps
# the rig's logs and takes it down.
rig_pass() {
	local pass=$1
	export TORPOR_RIG_NODE_B=0 TORPOR_TEST_RUNTIME=torpor
	export TORPOR_RIG_SNAPSHOTTER_UNIT=torpor-snapshotter-rig
	if [ "$pass" = systemd ]; then export TORPOR_RIG_SYSTEMD_CGROUP=1; else export TORPOR_RIG_SYSTEMD_CGROUP=0; fi
	# shellcheck source=/dev/null
	. "$REPO/test/rig/env.sh"
	local t=$SECONDS
	if ! "$REPO/test/rig/up.sh" >"$R/$pass-up.log" 2>&1; then
		check "$pass/rig-up" fail "see $pass-up.log"
		"$REPO/test/rig/down.sh" >>"$R/$pass-up.log" 2>&1
		return
	fi
	echo "vm-suite: $pass/rig-up: $((SECONDS - t)) s" >>"$R/times.txt"
	check "$pass/rig-up" pass
	if systemctl is-active -q "$TORPOR_RIG_SNAPSHOTTER_UNIT.service"; then
		check "$pass/snapshotter-systemd-unit" pass
	else
		check "$pass/snapshotter-systemd-unit" fail "$(systemctl is-active "$TORPOR_RIG_SNAPSHOTTER_UNIT.service")"
	fi

	run_tests "$pass" node_v2 limits_land_in_memory_max_and_cpu_max_and_hold_after_a_resume \
		idle_time_suspends_and_a_connection_wakes_with_the_state \
		an_oom_kill_is_counted_in_memory_events_and_reported_as_oomkilled a_deleted_pod_leaves_no_scope_and_no_cgroup
	run_tests "$pass" crictl_basic pod_and_container_lifecycle
	run_tests "$pass" exit_codes oom_kill_is_reported_as_oomkilled
	run_tests "$pass" suspend state::suspend_resume_keeps_state freeze::freeze_and_thaw \
		while_suspended::exec_into_suspended_resumes_first while_suspended::stop_and_remove_suspended \
		state::stats_are_the_containers_cgroup_and_zero_while_suspended
	if [ "$pass" = systemd ]; then
		documented_options_check
		run_tests "$pass" networking a_connection_that_wakes_the_actor_comes_from_the_client_s_address
		run_tests "$pass" crash crash_suspend_after_persist
		run_tests "$pass" restart actors_survive_a_containerd_restart
		run_tests "$pass" checkpoint stateful::cri_counter_continues_at_the_pod_ip_after_restore \
			stateful::rootfs_changes_and_memory_survive_ctr_checkpoint_restore
		run_tests "$pass" ctr run_detached_ls_ps_exec_kill_delete_rm
	fi

	mkdir -p "$R/$pass-rig"
	cp "$TORPOR_RIG_LOG" "$TORPOR_RIG_SNAPSHOTTER_LOG" "$TORPOR_RIG_CONFIG" "$R/$pass-rig/" 2>/dev/null
	if "$REPO/test/rig/down.sh" >"$R/$pass-down.log" 2>&1; then
		check "$pass/rig-down-clean" pass
	else
		check "$pass/rig-down-clean" fail "see $pass-down.log"
	fi
	local left
	left=$(systemctl list-units --all --plain --no-legend | grep -E 'cri-containerd|torpor_test' || true)
	if [ -z "$left" ]; then check "$pass/no-units-left" pass; else check "$pass/no-units-left" fail "$(tr '\n' ';' <<<"$left")"; fi
}

# deploy/containerd/torpor.toml's form of the torpor handler (runtime_type
# io.containerd.torpor.v1 and an `options` table, which CRI sends as
# runtimeoptions) is the rig's `torpor` in this pass, which every test of
# the pass goes through. Two more handlers of that form (test/rig/up.sh)
# check that the table's values reach the shim and a wrong key is refused:
# `torpor-options` sets runc's Root (the pod's runc state must be there),
# `torpor-bad-options` has a misspelt key (the pod must be refused, the
# message naming it).
documented_options_check() {
	local d=/tmp/documented-options out id root="$TORPOR_RIG_STATE/torpor-options-runc"
	mkdir -p "$d"
	printf '{"metadata":{"name":"documented","namespace":"default","uid":"documented","attempt":0},"log_directory":"%s","linux":{"cgroup_parent":"torpor_test-documented.slice"}}\n' "$d" >"$d/pod.json"
	out=$(rig_crictl runp --runtime torpor-options "$d/pod.json" 2>&1)
	id=$(rig_crictl pods -q --name documented 2>/dev/null | head -n1)
	if [ -z "$id" ]; then
		check systemd/documented-torpor-options fail "no pod: $(tail -c 300 <<<"$out" | tr '\n' ' ')"
	elif [ ! -d "$root/k8s.io/$id" ]; then
		check systemd/documented-torpor-options fail "the options' Root was not used: no $root/k8s.io/$id ($(ls "$root" 2>&1 | tr '\n' ' '))"
	else
		check systemd/documented-torpor-options pass
	fi
	for id in $(rig_crictl pods -q --name documented 2>/dev/null); do
		rig_crictl stopp "$id" >/dev/null 2>&1
		rig_crictl rmp -f "$id" >/dev/null 2>&1
	done
	sed -i 's/"documented"/"misspelt"/g' "$d/pod.json"
	out=$(rig_crictl runp --runtime torpor-bad-options "$d/pod.json" 2>&1)
	if grep -q 'unknown runtime option.*SystemdCgroups' <<<"$out"; then
		check systemd/torpor-options-unknown-key-refused pass
	else
		check systemd/torpor-options-unknown-key-refused fail "$(tail -c 300 <<<"$out" | tr '\n' ' ')"
	fi
	for id in $(rig_crictl pods -q --name misspelt 2>/dev/null); do
		rig_crictl stopp "$id" >/dev/null 2>&1
		rig_crictl rmp -f "$id" >/dev/null 2>&1
	done
	rm -rf "$root"
	systemctl stop torpor_test-documented.slice torpor_test.slice >/dev/null 2>&1
}

# Each pass in a subshell: its exported environment stays its own (its
# failures are counted from the summary).
if want systemd; then (rig_pass systemd); fi
if want cgroupfs; then (rig_pass cgroupfs); fi
grep -q '^vm-check: [^ ]* fail' "$SUMMARY" && rc=1

echo "vm-suite: total $((SECONDS - T0)) s" >>"$R/times.txt"
journalctl -b --no-pager >"$R/journal.txt" 2>&1
echo "vm-suite: rc=$rc" | tee -a "$SUMMARY"
sync
umount "$R"
# At once: the results are written, the root disk is thrown away (a
# graceful stop waited minutes on leftovers once).
systemctl poweroff --force --force
