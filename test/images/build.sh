#!/usr/bin/env bash
# Builds torpor's local test images as OCI layout tarballs:
#   ${TORPOR_IMAGES_DIR}/pause.tar  -> localhost/torpor-test/pause:latest
#   ${TORPOR_IMAGES_DIR}/actor.tar  -> localhost/torpor-test/actor:latest
# (with TORPOR_IMAGES_BASE_ONLY=1 only these two, as `make demo` needs)
# (default TORPOR_IMAGES_DIR=/var/cache/torpor/images). Import with
#   ctr -n k8s.io images import ${TORPOR_IMAGES_DIR}/actor.tar
#
# Rebuilds only when an input changed: the sources in this directory, the Go
# version and the busybox-static package version are hashed into a stamp.
#
# Then the workload suite's images (workloads/build.sh: PostgreSQL, Redis and
# nginx from Debian's packages, with a stamp of their own).
#
# usage: build.sh [--force]   build if out of date (always with --force)
#        build.sh --check     exit 0 if up to date, 1 if not (builds nothing)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../.." && pwd)
if [[ -f $repo/scripts/versions.env ]]; then
	# shellcheck source=/dev/null
	source "$repo/scripts/versions.env"
fi
out=${TORPOR_IMAGES_DIR:-/var/cache/torpor/images}
busybox=/bin/busybox

die() { echo "test/images/build.sh: $*" >&2; exit 1; }

mode=build
case "${1:-}" in
"") ;;
--force) mode=force ;;
--check) mode=check ;;
*) die "unknown argument '$1' (usage: build.sh [--force|--check])" ;;
esac

# --- tools -------------------------------------------------------------------
go=$(command -v go || true)
[[ -n $go ]] || go=/usr/local/go/bin/go
[[ -x $go ]] || die "Go not found (looked in PATH and /usr/local/go/bin)"
cc=$(command -v cc || command -v gcc || true)
[[ -n $cc ]] || die "no C compiler (cc) for the pause image (apt-get install gcc libc6-dev, or run scripts/deps.sh)"
bb_version=$(dpkg-query -W -f='${Version}' busybox-static 2>/dev/null || true)
[[ -n $bb_version && -x $busybox ]] ||
	die "busybox-static is not installed (apt-get install busybox-static, or run scripts/deps.sh)"

# --- is the build up to date? ---------------------------------------------------
# Everything under this directory (but docs and the workload images, which
# workloads/build.sh keeps), plus the toolchain and busybox versions.
inputs_hash=$(
	cd "$here"
	{
		find . -path ./workloads -prune -o -type f ! -name '*~' ! -name '*.md' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
		"$go" version
		"$cc" --version | head -n 1
		echo "busybox-static $bb_version"
	} | sha256sum | cut -c1-16
)
stamp=$out/build.stamp
images=(pause actor)
up_to_date() {
	[[ -f $stamp && $(cat "$stamp") == "$inputs_hash" ]] || return 1
	local i
	for i in "${images[@]}"; do [[ -s $out/$i.tar ]] || return 1; done
}
workloads=("$here/workloads/build.sh")
[[ $mode == build ]] || workloads+=("--$mode")
# TORPOR_IMAGES_BASE_ONLY=1 (scripts/deps.sh demo): pause and actor only, not
# the workload suite's images (what `make demo` needs; `make test` builds them).
[[ ${TORPOR_IMAGES_BASE_ONLY:-0} != 1 ]] || workloads=(true)
if [[ $mode == check ]]; then
	if up_to_date; then
		echo "test images up to date ($inputs_hash) in $out"
		exec "${workloads[@]}"
	fi
	echo "test images missing or out of date in $out (run test/images/build.sh)" >&2
	exit 1
fi
if [[ $mode == build ]] && up_to_date; then
	echo "test images up to date ($inputs_hash) in $out"
	exec "${workloads[@]}"
fi

# --- build -----------------------------------------------------------------------
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "building test images ($inputs_hash) into $out"
(
	cd "$here"
	# Static binaries; GOTOOLCHAIN=local: never try to download a toolchain.
	export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
	"$go" build -trimpath -ldflags='-s -w' -o "$tmp/" ./actor ./ocipack
	# pause in C, static, as small as the pause image of real clusters (a Go
	# pause kept ~2 MiB resident in every pod, charged to it while its actor
	# sleeps)
	"$cc" -static -Os -s -Wall -Werror -o "$tmp/pause" pause/pause.c
)

env_path=PATH=/bin:/usr/bin:/

# pause: just the pause binary.
"$tmp/ocipack" pack --name localhost/torpor-test/pause:latest --out "$out/pause.tar" \
	--entrypoint '["/pause"]' --env "$env_path" --workdir / \
	--file "/pause=$tmp/pause"

# actor: busybox with an applet symlink per command in /bin, plus /actor.
printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"$tmp/passwd"
printf 'root:x:0:\nnogroup:x:65534:\n' >"$tmp/group"
actor_args=(
	--name localhost/torpor-test/actor:latest --out "$out/actor.tar"
	--cmd '["/actor","counter"]' --env "$env_path" --workdir /
	--file "/actor=$tmp/actor" --file "/bin/busybox=$busybox"
	--file "/etc/passwd=$tmp/passwd" --file "/etc/group=$tmp/group"
	--dir /tmp=1777 --dir /root=700 --dir /usr/bin=755
	--dir /proc=555 --dir /sys=555 --dir /dev=755 --dir /run=755 --dir /var=755
)
applets=$("$busybox" --list) || die "'$busybox --list' failed"
for applet in $applets; do
	[[ $applet == busybox ]] && continue
	actor_args+=(--symlink "/bin/$applet=busybox")
done
"$tmp/ocipack" pack "${actor_args[@]}"

# Check both archives (digests, sizes, diff_ids, platform, name annotations).
"$tmp/ocipack" verify "$out/pause.tar" "$out/actor.tar"

echo "$inputs_hash" >"$stamp"
ls -l "$out"/pause.tar "$out"/actor.tar

"${workloads[@]}"
