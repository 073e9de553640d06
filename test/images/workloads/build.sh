#!/usr/bin/env bash
# Packs ordinary servers from Debian's packages (bookworm) into local OCI
# images for the workload suite (test/tests/workloads.rs), as single-layer
# archives next to the other test images:
#   ${TORPOR_IMAGES_DIR}/postgres.tar -> localhost/torpor-test/postgres:15
#   ${TORPOR_IMAGES_DIR}/redis.tar    -> localhost/torpor-test/redis:7
#   ${TORPOR_IMAGES_DIR}/nginx.tar    -> localhost/torpor-test/nginx:1.22
# Each holds the program(s), every shared library they load (ldd, with the
# dynamic loader), the files they need (PostgreSQL's share/, a zoneinfo
# file, the configs of this directory), busybox (a shell and ps/kill for
# the tests' kubectl exec) and an /etc/passwd naming its non-root user:
#   postgres 101:101, redis 999:999, nginx 101:101.
# test/rig/up.sh imports every archive of the directory into both nodes.
#
# The packages are installed on this machine with apt-get if missing
# (scripts/deps.sh lists them too). Rebuilds only when an input changed:
# this directory, ocipack, Go's version, the packages' versions and the
# contents of every packed file are hashed into workloads.stamp.
#
# usage: build.sh [--force]   build if out of date (always with --force)
#        build.sh --check     exit 0 if up to date, 1 if not (builds nothing)
# (test/images/build.sh runs it with its own argument.)
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
images_src=$(cd "$here/.." && pwd)
repo=$(cd "$here/../../.." && pwd)
if [[ -f $repo/scripts/versions.env ]]; then
	# shellcheck source=/dev/null
	source "$repo/scripts/versions.env"
fi
out=${TORPOR_IMAGES_DIR:-/var/cache/torpor/images}
busybox=/bin/busybox
pg=/usr/lib/postgresql/15

die() { echo "test/images/workloads/build.sh: $*" >&2; exit 1; }

mode=build
case "${1:-}" in
"") ;;
--force) mode=force ;;
--check) mode=check ;;
*) die "unknown argument '$1' (usage: build.sh [--force|--check])" ;;
esac

# --- packages --------------------------------------------------------------
PACKAGES=(postgresql-15 redis-server redis-tools nginx busybox-static)
installed() { [[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true) == installed ]]; }
missing=()
for p in "${PACKAGES[@]}"; do installed "$p" || missing+=("$p"); done
if ((${#missing[@]})); then
	[[ $mode != check ]] || { echo "workload images: packages not installed: ${missing[*]}" >&2; exit 1; }
	[[ $(id -u) == 0 ]] || die "packages ${missing[*]} missing and not root to install them"
	echo "workload images: apt-get install ${missing[*]}"
	# (a service that a package would start is not needed: the images run it)
	if ! DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q -o DPkg::Lock::Timeout=600 \
		--no-install-recommends "${missing[@]}" >/tmp/torpor-workload-apt.log 2>&1; then
		timeout 600 apt-get update -q -o DPkg::Lock::Timeout=600 >/dev/null || die "apt-get update failed"
		DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -q -o DPkg::Lock::Timeout=600 \
			--no-install-recommends "${missing[@]}" >/tmp/torpor-workload-apt.log 2>&1 ||
			{ tail -n 30 /tmp/torpor-workload-apt.log >&2; die "apt-get install ${missing[*]} failed (log: /tmp/torpor-workload-apt.log)"; }
	fi
fi

# --- what each image holds ----------------------------------------------------
# files[DST]=SRC (regular files, symlinks followed), per image; plus the
# directories and symlinks given to ocipack as they are.
declare -A files
add_file() { # DST SRC
	[[ -f $2 ]] || die "$2 (for $1) is not a file"
	files[$1]=$2
}
# An ELF program or module and every library it loads (ldd's closure).
add_elf() { # PATH [DST]
	local f=$1 dst=${2:-$1} line lib
	add_file "$dst" "$f"
	local deps
	deps=$(timeout 60 ldd "$f") || die "ldd $f failed"
	while IFS= read -r line; do
		case $line in
		*"not found"*) die "ldd $f: $line" ;;
		*"=> /"*) lib=${line#*=> }; lib=${lib%% (*} ;;
		*/ld-linux*) lib=${line#"${line%%/*}"}; lib=${lib%% (*} ;;
		*) continue ;;
		esac
		add_file "$lib" "$lib"
	done <<<"$deps"
}
add_tree() { # SRC_DIR [find args to leave out...]: every regular file under it, same paths
	local d=$1 f
	shift
	while IFS= read -r -d '' f; do add_file "$f" "$f"; done < <(find "$d" "$@" -type f -print0)
}

common_args=() # ocipack args every image has: busybox, /tmp, the rootfs skeleton
applets=$("$busybox" --list) || die "'$busybox --list' failed"
common() {
	files=()
	add_file /bin/busybox "$busybox"
	common_args=(--dir /tmp=1777 --dir /proc=555 --dir /sys=555 --dir /dev=755 --dir /run=755 --dir /etc=755)
	local a
	for a in $applets; do
		[[ $a == busybox ]] || common_args+=(--symlink "/bin/$a=busybox")
	done
}
passwd_group() { # TMPDIR USER UID GID
	printf 'root:x:0:0:root:/root:/bin/sh\n%s:x:%s:%s:%s:/nonexistent:/bin/sh\n' "$2" "$3" "$4" "$2" >"$1/passwd.$2"
	printf 'root:x:0:\n%s:x:%s:\n' "$2" "$4" >"$1/group.$2"
	add_file /etc/passwd "$1/passwd.$2"
	add_file /etc/group "$1/group.$2"
}

# Fills files[] and args[] for image $1 (tmp dir $2 for generated files).
args=()
spec() {
	local name=$1 tmp=$2 b
	common
	case $name in
	postgres)
		for b in postgres initdb pg_ctl pg_isready psql; do add_elf "$pg/bin/$b"; done
		# initdb loads these (PL/pgSQL, the snowball dictionaries)
		add_elf "$pg/lib/plpgsql.so"
		add_elf "$pg/lib/dict_snowball.so"
		add_tree /usr/share/postgresql/15 -path /usr/share/postgresql/15/man -prune -o
		add_file /usr/share/zoneinfo/Etc/UTC /usr/share/zoneinfo/Etc/UTC
		add_file /usr/share/zoneinfo/UTC /usr/share/zoneinfo/Etc/UTC
		add_file /usr/local/bin/postgres-entrypoint.sh "$here/postgres-entrypoint.sh"
		passwd_group "$tmp" postgres 101 101
		args=(--name localhost/torpor-test/postgres:15
			--entrypoint '["/usr/local/bin/postgres-entrypoint.sh"]'
			--env "PATH=$pg/bin:/usr/local/bin:/usr/bin:/bin" --env TZ=UTC --env PGDATA=/var/lib/postgresql/data/pgdata
			--workdir /tmp --dir /var/lib/postgresql=755)
		;;
	redis)
		# Debian ships one binary for redis-server and redis-check-*; it picks
		# its part by the name it is run as
		add_elf /usr/bin/redis-check-rdb /usr/bin/redis-server
		add_elf /usr/bin/redis-cli
		add_file /etc/redis/redis.conf "$here/redis.conf"
		passwd_group "$tmp" redis 999 999
		args=(--name localhost/torpor-test/redis:7
			--entrypoint '["/usr/bin/redis-server"]' --cmd '["/etc/redis/redis.conf"]'
			--env PATH=/usr/bin:/bin --workdir /data --dir /data=755)
		;;
	nginx)
		add_elf /usr/sbin/nginx
		add_file /etc/nginx/nginx.conf "$here/nginx.conf"
		passwd_group "$tmp" nginx 101 101
		args=(--name localhost/torpor-test/nginx:1.22
			--entrypoint '["/usr/sbin/nginx"]' --cmd '["-e","stderr","-g","daemon off;"]'
			--env PATH=/usr/sbin:/usr/bin:/bin --workdir / --dir /srv/www=755 --dir /var/lib/nginx=755)
		;;
	*) die "no image $name" ;;
	esac
	local dst
	for dst in "${!files[@]}"; do args+=(--file "$dst=${files[$dst]}"); done
	args+=(--out "$out/$name.tar" "${common_args[@]}")
}

images=(postgres redis nginx)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- is the build up to date? ---------------------------------------------------
go=$(command -v go || true)
[[ -n $go ]] || go=/usr/local/go/bin/go
[[ -x $go ]] || die "Go not found (looked in PATH and /usr/local/go/bin)"
inputs_hash=$(
	{
		cd "$here"
		find . -type f ! -name '*~' ! -name '*.md' -print0 | LC_ALL=C sort -z | xargs -0 sha256sum
		sha256sum "$images_src/ocipack/main.go"
		"$go" version
		dpkg-query -W -f='${Package} ${Version}\n' "${PACKAGES[@]}"
		for i in "${images[@]}"; do
			spec "$i" "$tmp"
			echo "image $i"
			for dst in "${!files[@]}"; do echo "$dst $(sha256sum <"${files[$dst]}")"; done | LC_ALL=C sort
		done
	} | sha256sum | cut -c1-16
)
stamp=$out/workloads.stamp
up_to_date() {
	[[ -f $stamp && $(cat "$stamp") == "$inputs_hash" ]] || return 1
	local i
	for i in "${images[@]}"; do [[ -s $out/$i.tar ]] || return 1; done
}
if up_to_date && [[ $mode != force ]]; then
	echo "workload images up to date ($inputs_hash) in $out"
	exit 0
fi
if [[ $mode == check ]]; then
	echo "workload images missing or out of date in $out (run test/images/build.sh)" >&2
	exit 1
fi

# --- build -----------------------------------------------------------------------
mkdir -p "$out"
echo "building workload images ($inputs_hash) into $out"
(
	cd "$images_src"
	export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false
	timeout 600 "$go" build -trimpath -ldflags='-s -w' -o "$tmp/" ./ocipack
)
tars=()
for i in "${images[@]}"; do
	spec "$i" "$tmp"
	"$tmp/ocipack" pack "${args[@]}"
	tars+=("$out/$i.tar")
done
"$tmp/ocipack" verify "${tars[@]}"
echo "$inputs_hash" >"$stamp"
ls -l "${tars[@]}"
