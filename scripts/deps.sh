#!/usr/bin/env bash
# deps.sh: install everything torpor's tests need on a Debian 12 (bookworm)
# machine, as root, without questions. This is what `make deps` runs.
#
#   scripts/deps.sh           install what is missing, then check everything
#   scripts/deps.sh --check   only check (prints each tool and its version)
#   scripts/deps.sh demo      only what `make demo` needs: steps 1-3 without
#                             the test suites' packages, and the pause and
#                             actor images (no Kubernetes, promtool, helm or
#                             workload images; `make test` runs the full one)
#
# What it does, in order (every step is skipped when already done):
#   1. apt (bookworm): runc, iptables, iproute2, busybox-static, curl, socat,
#      jq, ... plus CRIU's build dependencies.
#   2. CRIU >= 4.2, built from the Debian source package of forky/sid,
#      with torpor's patches (scripts/criu-patches/*.patch) applied.
#      Why not the binary package: forky's criu needs libc6 >= 2.38, and
#      taking libc6 from trixie on bookworm drags base-files, gnutls, nettle
#      and libc6-dev along and removes build-essential, postgresql, locales
#      and more (seen with `apt-get -s`). Built from the same source against
#      bookworm's libraries, criu 4.2.1 passes `criu check` here and leaves
#      the system's packages alone. Only deb-src entries of the newer suites
#      are added, and a pin keeps any binary package of theirs at priority 100.
#   3. containerd 2.x (containerd, ctr, containerd-shim-runc-v2), crictl, the
#      CNI plugins, checkpointctl and versitygw (the S3 server of the object
#      tier's tests), built from their Go modules with the
#      machine's Go (CGO_ENABLED=0).
#   4. Kubernetes (kube-apiserver, kube-controller-manager, kube-scheduler,
#      kubelet, kubectl) and etcd, built from their Go modules at one pinned
#      release, for the cluster rig (test/cluster). The longest step by far
#      when not cached (see build_kubernetes).
#   5. The local test images (test/images/build.sh).
#   6. A check of every tool and version; fails naming what is wrong.
#
#   scripts/deps.sh kubernetes   only step 4 (and its check)
#   scripts/deps.sh promtool     only promtool (and its check)
#   scripts/deps.sh helm         only helm (the Helm chart's cluster test; see
#                                the section "helm" at the end)
#
# Built artifacts are cached outside the clone, keyed by version, in
# ${TORPOR_DEPS_CACHE:-/var/cache/torpor/deps}/<tool>-<version>/ and copied
# from there to /usr/local/bin, /usr/local/sbin and /opt/cni/bin. Versions are
# pinned in scripts/versions.env.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/.." && pwd)
# shellcheck source=scripts/versions.env
source "$here/versions.env"

log() { printf '==> %s\n' "$*"; }
die() { printf 'deps.sh: error: %s\n' "$*" >&2; exit 1; }

mode=install
case "${1:-}" in
"") ;;
--check) mode=check ;;
demo) mode=demo ;;
kubernetes) mode=kubernetes ;;
promtool) mode=promtool ;;
helm) mode=helm ;;
-h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
*) die "unknown argument '$1' (usage: deps.sh [--check | demo | kubernetes | promtool | helm])" ;;
esac
[[ $(id -u) == 0 ]] || die "must run as root (it installs packages and runs 'criu check')"

# Tools installed here must be found by the checks even if the caller's PATH
# lacks these directories (the caller's order is kept otherwise).
for d in /usr/local/sbin /usr/local/bin /usr/local/go/bin; do
	case ":$PATH:" in *":$d:"*) ;; *) PATH=$PATH:$d ;; esac
done
export PATH

start=$SECONDS

# --------------------------------------------------------------------------
# 1. Debian packages (bookworm)
# --------------------------------------------------------------------------
APT_PACKAGES=(
	# used by the tests and by CRIU/runc at run time
	runc iptables iproute2 busybox-static ca-certificates curl socat jq xz-utils
	# CRIU's run-time libraries (bookworm versions)
	libbsd0 libgnutls30 libnftables1 libprotobuf-c1 libnl-3-200 libnet1 libuuid1
	# CRIU's build dependencies (Debian's Build-Depends, less docs and python)
	gcc libc6-dev make patch pkg-config python3 libbsd-dev libcap-dev libgnutls28-dev libnet1-dev
	libnftables-dev libnl-3-dev libprotobuf-c-dev libprotobuf-dev
	protobuf-c-compiler protobuf-compiler uuid-dev
)
# What only `make test` needs (not installed by `deps.sh demo`).
APT_TEST_PACKAGES=(
	# the cgroup v2 guest of test/vm/run.sh (make test)
	qemu-system-x86 cpio
	# the workload suite's servers, packed into images (test/images/workloads)
	postgresql-15 redis-server redis-tools nginx
)

APT_SOURCES_FILE=/etc/apt/sources.list.d/torpor-newer.sources
APT_PREFS_FILE=/etc/apt/preferences.d/torpor-newer

# Source packages only: nothing binary comes from the newer suites.
apt_sources_text() {
	cat <<EOF
# Added by torpor scripts/deps.sh: source packages of newer Debian suites,
# used to build CRIU >= ${CRIU_MIN_VERSION} (see scripts/deps.sh).
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: ${CRIU_SOURCE_SUITES}
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
EOF
}

apt_prefs_text() {
	cat <<'EOF'
# Added by torpor scripts/deps.sh.
# Should binary entries of newer suites ever be added, only packages named
# explicitly may come from them: never upgrade bookworm's libc & co. behind
# apt's back (a half-upgraded libc broke a machine once).
Package: *
Pin: release n=trixie
Pin-Priority: 100

Package: *
Pin: release n=forky
Pin-Priority: 100

Package: *
Pin: release n=sid
Pin-Priority: 100

# bookworm's criu 3.17 fails on this kernel (vdso) and would shadow nothing
# but confuse: runc only Recommends it, keep it out.
Package: criu
Pin: release n=bookworm
Pin-Priority: -1
EOF
}

# write_if_changed FILE: replaces FILE with stdin if the content differs.
# Returns 0 if it wrote, 1 if FILE was already up to date.
write_if_changed() {
	local file=$1 tmp
	tmp=$(mktemp)
	cat >"$tmp"
	if [[ -f $file ]] && cmp -s "$tmp" "$file"; then
		rm -f "$tmp"
		return 1
	fi
	install -m 0644 "$tmp" "$file"
	rm -f "$tmp"
	return 0
}

apt_updated=0
apt_update() {
	log "apt-get update"
	apt-get update -q -o DPkg::Lock::Timeout=600 >/dev/null || die "apt-get update failed"
	apt_updated=1
}

install_apt_packages() { # PACKAGE...
	local pkgs=("$@")
	local changed=0
	if apt_sources_text | write_if_changed "$APT_SOURCES_FILE"; then changed=1; fi
	if apt_prefs_text | write_if_changed "$APT_PREFS_FILE"; then changed=1; fi

	# Which packages are not fully installed? (one dpkg-query for all)
	local -A installed=()
	local pkg status
	while IFS=$'\t' read -r pkg status; do
		[[ $status == installed ]] && installed[$pkg]=1
	done < <(dpkg-query -W -f='${Package}\t${db:Status-Status}\n' "${pkgs[@]}" 2>/dev/null || true)
	local missing=()
	for pkg in "${pkgs[@]}"; do
		[[ -n ${installed[$pkg]:-} ]] || missing+=("$pkg")
	done

	if ((changed)) || ((${#missing[@]})); then
		apt_update
	fi
	if ((${#missing[@]})); then
		log "apt-get install ${missing[*]}"
		apt-get install -y -q -o DPkg::Lock::Timeout=600 --no-install-recommends "${missing[@]}" >/tmp/torpor-deps-apt.log 2>&1 ||
			{ tail -n 30 /tmp/torpor-deps-apt.log >&2; die "apt-get install failed (full log: /tmp/torpor-deps-apt.log)"; }
	else
		log "apt packages: all ${#pkgs[@]} installed"
	fi
}

# --------------------------------------------------------------------------
# helpers for cached artifacts
# --------------------------------------------------------------------------

# install_bin SRC DST: copies SRC to DST (mode 0755) if they differ. Goes
# through a temporary file and a rename, so a running DST is not disturbed.
install_bin() {
	local src=$1 dst=$2
	[[ -f $src ]] || die "missing built file $src"
	if [[ -f $dst ]] && cmp -s "$src" "$dst"; then
		return 0
	fi
	mkdir -p "$(dirname "$dst")"
	install -m 0755 "$src" "$dst.torpor-new"
	mv -f "$dst.torpor-new" "$dst"
	echo "    installed $dst"
}

# cache_complete DIR FILE...: the cache entry was finished and has every FILE.
cache_complete() {
	local dir=$1 f
	shift
	[[ -f $dir/.complete ]] || return 1
	for f in "$@"; do [[ -x $dir/$f ]] || return 1; done
}

# finish_cache DIR: marks DIR.tmp as complete and moves it to DIR.
finish_cache() {
	local dir=$1
	date -u +%Y-%m-%dT%H:%M:%SZ >"$dir.tmp/.complete"
	rm -rf "$dir"
	mv "$dir.tmp" "$dir"
}

# version_ge HAVE NEED: HAVE >= NEED in Debian version order (leading v ignored)
version_ge() {
	dpkg --compare-versions "${1#v}" ge "${2#v}"
}

# --------------------------------------------------------------------------
# 2. CRIU from the Debian source package of a newer suite
# --------------------------------------------------------------------------
criu_dir=""

# The patches (scripts/criu-patches/*.patch, applied in name order with
# patch -p1) are part of CRIU's cache key: a digest of their contents.
criu_patches=("$here"/criu-patches/*.patch)
[[ -e ${criu_patches[0]} ]] || criu_patches=()
criu_key() { # UPSTREAM: the cache directory's name
	local key="criu-$1-$CRIU_BUILD"
	((${#criu_patches[@]})) && key="$key-p$(cat "${criu_patches[@]}" | sha256sum | cut -c1-12)"
	echo "$key"
}

# criu_source_uris SUITE DIR: prints "DEBVERSION URL SHA256" of the orig
# tarball of criu in SUITE, or nothing if SUITE has no criu source. DIR must
# be empty: apt leaves out of its list the files already in the cwd.
criu_source_uris() {
	local suite=$1 dir=$2 out debver line url sha
	out=$(cd "$dir" && apt-get source --print-uris "criu/$suite" 2>/dev/null) || return 0
	debver=$(sed -n "s/^Selected version '\([^']*\)'.*/\1/p" <<<"$out")
	line=$(grep -E "^'[^']*\.orig\.tar\.[a-z0-9]+' " <<<"$out" | head -n1) || true
	[[ -n $debver && -n $line ]] || return 0
	url=$(sed -E "s/^'([^']*)'.*/\1/" <<<"$line")
	sha=$(grep -oE 'SHA256:[0-9a-f]{64}' <<<"$line" | cut -d: -f2) || true
	[[ -n $sha ]] || return 0
	echo "$debver $url $sha"
}

build_criu() {
	# Pick the source: the pinned version if a suite has it, else the first
	# suite whose version is new enough.
	local suite found="" candidates=() c upstream attempt empty
	empty=$(mktemp -d)
	for attempt in 1 2; do
		candidates=()
		for suite in $CRIU_SOURCE_SUITES; do
			c=$(criu_source_uris "$suite" "$empty")
			[[ -n $c ]] && candidates+=("$suite $c")
		done
		((${#candidates[@]})) && break
		((attempt == 1 && apt_updated == 0)) || break
		apt_update # the deb-src index may be missing or stale
	done
	rmdir "$empty"
	((${#candidates[@]})) || die "no criu source package found in suites '$CRIU_SOURCE_SUITES' (is $APT_SOURCES_FILE there and apt-get update done?)"
	for c in "${candidates[@]}"; do
		upstream=$(awk '{print $2}' <<<"$c" | sed -E 's/^[0-9]+://; s/-[^-]*$//')
		if [[ $upstream == "$CRIU_VERSION" ]]; then found="$c $upstream" && break; fi
	done
	if [[ -z $found ]]; then
		for c in "${candidates[@]}"; do
			upstream=$(awk '{print $2}' <<<"$c" | sed -E 's/^[0-9]+://; s/-[^-]*$//')
			if version_ge "$upstream" "$CRIU_MIN_VERSION"; then
				echo "deps.sh: warning: criu $CRIU_VERSION is no longer in '$CRIU_SOURCE_SUITES', using $upstream (update CRIU_VERSION in scripts/versions.env)" >&2
				found="$c $upstream" && break
			fi
		done
	fi
	[[ -n $found ]] || die "no criu >= $CRIU_MIN_VERSION in suites '$CRIU_SOURCE_SUITES' (found: ${candidates[*]})"

	local debver url sha
	read -r suite debver url sha upstream <<<"$found"
	criu_dir=$TORPOR_DEPS_CACHE/$(criu_key "$upstream")
	if cache_complete "$criu_dir" sbin/criu; then
		return 0
	fi

	log "building criu $upstream ($CRIU_BUILD; Debian $debver source from $suite)"
	local tmp tarball
	tmp=$(mktemp -d)
	# CRIU_BUILD=lean: no GnuTLS (NO_GNUTLS) and no nftables (CRIU's
	# Makefile.config finds libnftables through pkg-config only: the wrapper
	# hides it).
	local flags=() what
	case $CRIU_BUILD in
	lean)
		printf '#!/bin/sh\nfor a in "$@"; do case "$a" in libnftables*) exit 1;; esac; done\nexec pkg-config "$@"\n' >"$tmp/pkg-config"
		chmod +x "$tmp/pkg-config"
		flags=(NO_GNUTLS=1 PKG_CONFIG="$tmp/pkg-config")
		what="lean (NO_GNUTLS=1; libnftables hidden from pkg-config)"
		;;
	full) what="full (every feature its build finds)" ;;
	*) rm -rf "$tmp"; die "CRIU_BUILD must be lean or full, not '$CRIU_BUILD'" ;;
	esac
	tarball=$tmp/${url##*/}
	curl -fsSL --retry 3 -o "$tarball" "$url" || { rm -rf "$tmp"; die "download of $url failed"; }
	echo "$sha  $tarball" | sha256sum -c --quiet - || { rm -rf "$tmp"; die "checksum mismatch for $url"; }
	tar -C "$tmp" -xf "$tarball"
	local src
	src=$(find "$tmp" -mindepth 1 -maxdepth 1 -type d -name 'criu-*' | head -n1)
	[[ -n $src ]] || { rm -rf "$tmp"; die "unexpected layout of $tarball"; }
	local p
	for p in "${criu_patches[@]}"; do
		patch -d "$src" -p1 --forward --batch --quiet <"$p" || { rm -rf "$tmp"; die "patch ${p##*/} does not apply to criu $upstream"; }
		what="$what; patched: ${p##*/}"
	done
	if ! make -C "$src" -j"$(nproc)" "${flags[@]}" criu >"$tmp/build.log" 2>&1; then
		cp "$tmp/build.log" /tmp/torpor-deps-criu-build.log
		tail -n 30 "$tmp/build.log" >&2
		rm -rf "$tmp"
		die "criu build failed (full log: /tmp/torpor-deps-criu-build.log)"
	fi
	local built
	built=$("$src/criu/criu" --version | awk '/^Version:/ {print $2}')
	[[ $built == "$upstream" ]] || { rm -rf "$tmp"; die "built criu reports version '$built', expected $upstream"; }

	rm -rf "$criu_dir.tmp"
	mkdir -p "$criu_dir.tmp/sbin"
	install -m 0755 "$src/criu/criu" "$criu_dir.tmp/sbin/criu"
	printf 'criu %s\nsource: Debian %s criu %s\nurl: %s\nsha256: %s\nbuild: %s\n' \
		"$upstream" "$suite" "$debver" "$url" "$sha" "$what" >"$criu_dir.tmp/BUILDINFO"
	finish_cache "$criu_dir"
	rm -rf "$tmp"
}

install_criu() {
	criu_dir=$TORPOR_DEPS_CACHE/$(criu_key "$CRIU_VERSION")
	if cache_complete "$criu_dir" sbin/criu; then
		log "criu $CRIU_VERSION ($CRIU_BUILD): cached"
	else
		build_criu # sets criu_dir (the version built may differ, see there)
	fi
	install_bin "$criu_dir/sbin/criu" /usr/local/sbin/criu
}

# --------------------------------------------------------------------------
# 3. Go tools
# --------------------------------------------------------------------------
go_bin=""
find_go() {
	go_bin=$(command -v go || true)
	[[ -n $go_bin ]] || die "Go not found (looked in PATH and /usr/local/go/bin); need Go >= $GO_MIN_VERSION"
	local v
	v=$("$go_bin" env GOVERSION)
	version_ge "${v#go}" "$GO_MIN_VERSION" || die "Go ${v#go} found at $go_bin, need >= $GO_MIN_VERSION"
}

# build_go_tool NAME VERSION LDFLAGS TAGS "BIN..." PKG...
# Builds the packages PKG (all from one module, at VERSION) into
# $TORPOR_DEPS_CACHE/NAME-VERSION/bin unless that entry is complete with
# every BIN. Tries `go install pkg@version` first; if Go refuses (e.g. the
# module's go.mod has replace directives), builds from a temporary module
# that requires the tool instead.
build_go_tool() {
	local name=$1 version=$2 ldflags=$3 tags=$4 bins=$5
	shift 5
	local dir=$TORPOR_DEPS_CACHE/$name-$version b expected=()
	for b in $bins; do expected+=("bin/$b"); done
	if cache_complete "$dir" "${expected[@]}"; then
		log "$name $version: cached"
		return 0
	fi
	[[ -n $go_bin ]] || find_go
	log "building $name $version with $("$go_bin" env GOVERSION)"
	rm -rf "$dir.tmp"
	mkdir -p "$dir.tmp/bin"
	local pkgs=() p
	for p in "$@"; do pkgs+=("$p@$version"); done
	local logf=$TORPOR_DEPS_CACHE/$name-$version.build.log
	# NICE=N (environment): the build runs under nice -n N.
	local -a nice=()
	[[ -z ${NICE:-} ]] || nice=(nice -n "$NICE")
	local -a goenv=("${nice[@]}" env CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false GOBIN="$dir.tmp/bin")
	if ! "${goenv[@]}" "$go_bin" install -trimpath -tags "$tags" -ldflags "$ldflags" "${pkgs[@]}" >"$logf" 2>&1; then
		log "  'go install ...@$version' failed, retrying from a temporary module"
		local mod
		mod=$(mktemp -d)
		if ! (
			cd "$mod" &&
				"${goenv[@]}" "$go_bin" mod init torpor.invalid/deps-build &&
				"${goenv[@]}" "$go_bin" get "${pkgs[@]}" &&
				"${goenv[@]}" "$go_bin" install -trimpath -tags "$tags" -ldflags "$ldflags" "$@"
		) >>"$logf" 2>&1; then
			rm -rf "$mod"
			tail -n 30 "$logf" >&2
			die "building $name $version failed (full log: $logf)"
		fi
		rm -rf "$mod"
	fi
	for b in $bins; do
		[[ -x $dir.tmp/bin/$b ]] || die "building $name $version produced no '$b' (log: $logf)"
	done
	printf '%s %s\nbuilt with %s, CGO_ENABLED=0, tags "%s"\npackages: %s\n' \
		"$name" "$version" "$("$go_bin" env GOVERSION)" "$tags" "$*" >"$dir.tmp/BUILDINFO"
	finish_cache "$dir"
	rm -f "$logf"
}

# cni_pkg NAME: the Go package of a CNI plugin.
cni_pkg() {
	local base=github.com/containernetworking/plugins/plugins
	case $1 in
	bridge | loopback | ptp | macvlan | ipvlan | host-device | vlan | tap | dummy) echo "$base/main/$1" ;;
	host-local | dhcp | static) echo "$base/ipam/$1" ;;
	portmap | firewall | tuning | bandwidth | sbr | vrf) echo "$base/meta/$1" ;;
	*) die "unknown CNI plugin '$1' in CNI_PLUGINS" ;;
	esac
}

install_go_tools() {
	local d=$TORPOR_DEPS_CACHE

	# containerd: no_btrfs, as the btrfs snapshotter needs cgo.
	local ctrd=github.com/containerd/containerd/v2
	build_go_tool containerd "$CONTAINERD_VERSION" \
		"-s -w -X $ctrd/version.Version=$CONTAINERD_VERSION" "no_btrfs" \
		"containerd ctr containerd-shim-runc-v2" \
		"$ctrd/cmd/containerd" "$ctrd/cmd/ctr" "$ctrd/cmd/containerd-shim-runc-v2"

	build_go_tool crictl "$CRICTL_VERSION" \
		"-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" "" \
		"crictl" sigs.k8s.io/cri-tools/cmd/crictl

	local p cni_pkgs=()
	for p in $CNI_PLUGINS; do cni_pkgs+=("$(cni_pkg "$p")"); done
	build_go_tool cni-plugins "$CNI_PLUGINS_VERSION" \
		"-s -w -X github.com/containernetworking/plugins/pkg/utils/buildversion.BuildVersion=$CNI_PLUGINS_VERSION" "" \
		"$CNI_PLUGINS" "${cni_pkgs[@]}"

	build_go_tool checkpointctl "$CHECKPOINTCTL_VERSION" \
		"-s -w -X main.name=checkpointctl -X main.version=${CHECKPOINTCTL_VERSION#v}" "" \
		"checkpointctl" github.com/checkpoint-restore/checkpointctl

	build_go_tool versitygw "$VERSITYGW_VERSION" \
		"-s -w -X main.Version=$VERSITYGW_VERSION -X main.Build=go-module" "" \
		"versitygw" github.com/versity/versitygw/cmd/versitygw

	local b
	for b in containerd ctr containerd-shim-runc-v2; do
		install_bin "$d/containerd-$CONTAINERD_VERSION/bin/$b" "/usr/local/bin/$b"
	done
	install_bin "$d/crictl-$CRICTL_VERSION/bin/crictl" /usr/local/bin/crictl
	install_bin "$d/checkpointctl-$CHECKPOINTCTL_VERSION/bin/checkpointctl" /usr/local/bin/checkpointctl
	install_bin "$d/versitygw-$VERSITYGW_VERSION/bin/versitygw" /usr/local/bin/versitygw
	for p in $CNI_PLUGINS; do
		install_bin "$d/cni-plugins-$CNI_PLUGINS_VERSION/bin/$p" "/opt/cni/bin/$p"
	done
}

# prometheus_release MODULE_VERSION: the Prometheus release a module version
# of github.com/prometheus/prometheus is (v0.316.0 -> 3.16.0).
prometheus_release() {
	local s=${1#v0.} mm
	mm=${s%%.*}
	[[ $mm =~ ^[0-9]{3}$ ]] || die "PROMETHEUS_MODULE_VERSION $1 is not v0.<major><minor:2>.<patch>"
	echo "${mm:0:1}.$((10#${mm:1})).${s#*.}"
}

# install_promtool: promtool from the Prometheus Go module, cached by module
# version. Niced: it is a large module (cold, with an empty Go module cache:
# 1532 s on this project's 2-core machine while other builds ran; warm, a copy).
install_promtool() {
	local v=$PROMETHEUS_MODULE_VERSION rel cv=github.com/prometheus/common/version
	rel=$(prometheus_release "$v")
	local t0=$SECONDS
	NICE=10 build_go_tool promtool "$v" \
		"-s -w -X $cv.Version=$rel -X $cv.Branch=HEAD -X $cv.Revision=go-module -X $cv.BuildUser=torpor -X $cv.BuildDate=19700101-00:00:00" "" \
		"promtool" github.com/prometheus/prometheus/cmd/promtool
	if ((SECONDS - t0 > 5)); then log "  promtool built in $((SECONDS - t0)) s"; fi
	install_bin "$TORPOR_DEPS_CACHE/promtool-$v/bin/promtool" /usr/local/bin/promtool
}

# --------------------------------------------------------------------------
# 4. Kubernetes and etcd
# --------------------------------------------------------------------------
KUBE_BINS="kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl"

# kube_build_gomod: the go.mod of the module the Kubernetes binaries are built
# from. It requires k8s.io/kubernetes and replaces every staging module (which
# k8s.io/kubernetes' own go.mod points at ./staging/src/...) with its
# published version of the same release.
kube_build_gomod() {
	local m
	printf 'module torpor.invalid/kubernetes-build\n\ngo 1.26\n\nrequire k8s.io/kubernetes %s\n\nreplace (\n' "$KUBERNETES_VERSION"
	for m in api apiextensions-apiserver apimachinery apiserver cli-runtime client-go \
		cloud-provider cluster-bootstrap code-generator component-base component-helpers \
		controller-manager cri-api cri-client cri-streaming csi-translation-lib \
		dynamic-resource-allocation endpointslice externaljwt kms kube-aggregator \
		kube-controller-manager kube-proxy kube-scheduler kubectl kubelet metrics \
		mount-utils pod-security-admission sample-apiserver streaming; do
		printf '\tk8s.io/%s => k8s.io/%s %s\n' "$m" "$m" "$KUBERNETES_STAGING_VERSION"
	done
	printf ')\n'
}

# go_build_in_module NAME LOGFILE GOMOD_TEXT VERSION LDFLAGS OUTDIR PKG...:
# builds PKG (each a main package of one module, at VERSION) into OUTDIR from
# a temporary module whose go.mod is GOMOD_TEXT; `go get PKG@VERSION` fills in
# go.sum.
go_build_in_module() {
	local name=$1 logf=$2 gomod=$3 version=$4 ldflags=$5 out=$6
	shift 6
	local p at=()
	for p in "$@"; do at+=("$p@$version"); done
	[[ -n $go_bin ]] || find_go
	local mod
	mod=$(mktemp -d)
	printf '%s\n' "$gomod" >"$mod/go.mod"
	local -a goenv=(env CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false)
	# nice: a cold build takes many minutes of every core.
	if ! (
		cd "$mod" &&
			timeout 900 "${goenv[@]}" "$go_bin" get "${at[@]}" &&
			timeout 5400 nice -n 10 "${goenv[@]}" "$go_bin" build -trimpath -ldflags "$ldflags" -o "$out/" "$@"
	) >>"$logf" 2>&1; then
		rm -rf "$mod"
		tail -n 30 "$logf" >&2
		die "building $name failed (full log: $logf)"
	fi
	rm -rf "$mod"
}

# build_kubernetes: etcd and the Kubernetes binaries, each cached by version.
# Measured cold (empty Go module and build caches) on this project's 2-core
# machine: see the note in the commit that changes it and README's cluster
# section; warm (cache entry present) it is a copy.
build_kubernetes() {
	local d=$TORPOR_DEPS_CACHE t0

	local edir=$d/etcd-$ETCD_VERSION
	if cache_complete "$edir" bin/etcd; then
		log "etcd $ETCD_VERSION: cached"
	else
		log "building etcd $ETCD_VERSION with $("${go_bin:-go}" env GOVERSION)"
		t0=$SECONDS
		rm -rf "$edir.tmp"
		mkdir -p "$edir.tmp/bin"
		local elog=$d/etcd-$ETCD_VERSION.build.log
		: >"$elog"
		# The server module's main package is the etcd binary.
		go_build_in_module "etcd $ETCD_VERSION" "$elog" \
			"$(printf 'module torpor.invalid/etcd-build\n\ngo 1.26\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION")" \
			"$ETCD_VERSION" "-s -w" "$edir.tmp/bin" "go.etcd.io/etcd/server/v3"
		mv "$edir.tmp/bin/v3" "$edir.tmp/bin/etcd" 2>/dev/null || mv "$edir.tmp/bin/server" "$edir.tmp/bin/etcd"
		[[ -x $edir.tmp/bin/etcd ]] || die "building etcd produced no binary (log: $elog)"
		printf 'etcd %s\nbuilt with %s, CGO_ENABLED=0, in %ds\npackage: go.etcd.io/etcd/server/v3\n' \
			"$ETCD_VERSION" "$("$go_bin" env GOVERSION)" "$((SECONDS - t0))" >"$edir.tmp/BUILDINFO"
		finish_cache "$edir"
		rm -f "$elog"
	fi

	local kdir=$d/kubernetes-$KUBERNETES_VERSION b expected=()
	for b in $KUBE_BINS; do expected+=("bin/$b"); done
	if cache_complete "$kdir" "${expected[@]}"; then
		log "kubernetes $KUBERNETES_VERSION: cached"
	else
		[[ -n $go_bin ]] || find_go
		log "building kubernetes $KUBERNETES_VERSION ($KUBE_BINS) with $("$go_bin" env GOVERSION); cold, this takes long"
		t0=$SECONDS
		rm -rf "$kdir.tmp"
		mkdir -p "$kdir.tmp/bin"
		local klog=$d/kubernetes-$KUBERNETES_VERSION.build.log
		: >"$klog"
		# The version variables Kubernetes' own build sets (hack/lib/version.sh):
		# kubelet reports it on its Node, kubectl compares it with the server's.
		local v=${KUBERNETES_VERSION#v} ldflags="-s -w" pkg
		local major=${v%%.*} minor=${v#*.}
		minor=${minor%%.*}
		for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
			ldflags+=" -X $pkg.gitVersion=$KUBERNETES_VERSION -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
			ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
		done
		local pkgs=()
		for b in $KUBE_BINS; do pkgs+=("k8s.io/kubernetes/cmd/$b"); done
		go_build_in_module "kubernetes $KUBERNETES_VERSION" "$klog" "$(kube_build_gomod)" \
			"$KUBERNETES_VERSION" "$ldflags" "$kdir.tmp/bin" "${pkgs[@]}"
		for b in $KUBE_BINS; do
			[[ -x $kdir.tmp/bin/$b ]] || die "building kubernetes produced no '$b' (log: $klog)"
		done
		printf 'kubernetes %s (staging modules %s)\nbuilt with %s, CGO_ENABLED=0, in %ds\npackages: %s\n' \
			"$KUBERNETES_VERSION" "$KUBERNETES_STAGING_VERSION" "$("$go_bin" env GOVERSION)" \
			"$((SECONDS - t0))" "${pkgs[*]}" >"$kdir.tmp/BUILDINFO"
		finish_cache "$kdir"
		rm -f "$klog"
	fi

	install_bin "$edir/bin/etcd" /usr/local/bin/etcd
	for b in $KUBE_BINS; do
		install_bin "$kdir/bin/$b" "/usr/local/bin/$b"
	done
}

# install_kubernetes: build_kubernetes under its own lock, so that
# `deps.sh kubernetes` and a full run never build it twice at once.
install_kubernetes() {
	mkdir -p "$TORPOR_DEPS_CACHE"
	exec 8>"$TORPOR_DEPS_CACHE/.lock-kubernetes"
	flock 8
	build_kubernetes
	exec 8>&-
}

# --------------------------------------------------------------------------
# 6. checks
# --------------------------------------------------------------------------
problems=()

# report TOOL VERSION STATUS [DETAIL]
report() { printf '  %-24s %-16s %-8s %s\n' "$1" "$2" "$3" "${4:-}"; }

# check_tool NAME MIN VERSION_COMMAND...: runs the command (found in PATH) and
# takes the first thing that looks like a version from its output.
check_tool() {
	local name=$1 min=$2 path out ver
	shift 2
	if ! path=$(command -v "$name"); then
		report "$name" "-" MISSING
		problems+=("$name not found in PATH")
		return
	fi
	out=$("$@" 2>&1 | head -n 5) || true
	ver=$(grep -oE 'v?[0-9]+\.[0-9]+(\.[0-9]+)?[0-9A-Za-z.+~-]*' <<<"$out" | head -n1) || true
	if [[ -z $ver ]]; then
		report "$name" "?" BROKEN "$path"
		problems+=("$name at $path does not report a version ('$*')")
	elif [[ -n $min ]] && ! version_ge "$ver" "$min"; then
		report "$name" "$ver" OLD "$path"
		problems+=("$name ${ver#v} found, need >= ${min#v}")
	else
		report "$name" "$ver" ok "$path"
	fi
}

# check_kubernetes: the cluster rig's binaries, by their installed path (a
# kubectl elsewhere in PATH, e.g. /usr/bin, is not ours).
check_kubernetes() {
	local b out ver want
	for b in etcd $KUBE_BINS; do
		want=$KUBERNETES_VERSION
		[[ $b == etcd ]] && want=$ETCD_VERSION
		if [[ ! -x /usr/local/bin/$b ]]; then
			report "$b" "-" MISSING
			problems+=("/usr/local/bin/$b missing (scripts/deps.sh kubernetes)")
			continue
		fi
		case $b in
		kubectl) out=$(timeout 20 /usr/local/bin/kubectl version --client 2>&1) || true ;;
		*) out=$(timeout 20 "/usr/local/bin/$b" --version 2>&1) || true ;;
		esac
		ver=$(grep -oE 'v?[0-9]+\.[0-9]+\.[0-9]+' <<<"$out" | head -n1) || true
		if [[ v${ver#v} == "$want" ]]; then
			report "$b" "$ver" ok "/usr/local/bin/$b"
		else
			report "$b" "${ver:-?}" WRONG "/usr/local/bin/$b"
			problems+=("/usr/local/bin/$b reports '${ver:-no version}', want $want")
		fi
	done
}

check_all() {
	log "checking dependencies"
	check_kubernetes
	check_helm
	check_tool promtool "$(prometheus_release "$PROMETHEUS_MODULE_VERSION")" promtool --version
	check_node_tools
	check_report
}

# check_demo: what `make demo` needs (deps.sh demo).
check_demo() {
	log "checking the demo's dependencies"
	TORPOR_IMAGES_BASE_ONLY=1 check_node_tools
	check_report
}

# check_node_tools: CRIU, runc, containerd and its tools, CNI, the base
# Debian tools, Go and the test images (with TORPOR_IMAGES_BASE_ONLY=1 only
# pause and actor).
check_node_tools() {
	check_tool criu "$CRIU_MIN_VERSION" criu --version
	if command -v criu >/dev/null; then
		local out
		out=$(criu check 2>&1) || true
		if grep -q 'Looks good' <<<"$out"; then
			report "criu check" "" ok "Looks good"
		else
			report "criu check" "" FAILED "$(tail -n1 <<<"$out")"
			problems+=("'criu check' does not say 'Looks good': $(tail -n1 <<<"$out")")
		fi
	fi
	check_tool runc "$RUNC_MIN_VERSION" runc --version
	check_tool containerd "$CONTAINERD_VERSION" containerd --version
	check_tool ctr "$CONTAINERD_VERSION" ctr --version
	check_tool containerd-shim-runc-v2 "$CONTAINERD_VERSION" containerd-shim-runc-v2 -v
	check_tool crictl "$CRICTL_VERSION" crictl --version
	check_tool checkpointctl "$CHECKPOINTCTL_VERSION" checkpointctl --version
	check_tool versitygw "$VERSITYGW_VERSION" versitygw --version
	local p
	for p in $CNI_PLUGINS; do
		if [[ -x /opt/cni/bin/$p ]]; then
			local v
			v=$(/opt/cni/bin/"$p" --version 2>&1 | grep -oE 'v[0-9]+\.[0-9]+\.[0-9]+' | head -n1) || true
			if [[ -n $v ]] && version_ge "$v" "$CNI_PLUGINS_VERSION"; then
				report "cni/$p" "$v" ok "/opt/cni/bin/$p"
			else
				report "cni/$p" "${v:-?}" OLD "/opt/cni/bin/$p"
				problems+=("CNI plugin $p ${v:-(no version)} found, need >= $CNI_PLUGINS_VERSION")
			fi
		else
			report "cni/$p" "-" MISSING
			problems+=("CNI plugin /opt/cni/bin/$p missing")
		fi
	done
	check_tool iptables "" iptables --version
	check_tool iptables-restore "" iptables-restore --version
	check_tool ip "" ip -V
	check_tool busybox "" busybox
	check_tool curl "" curl --version
	check_tool socat "" socat -V
	check_tool jq "" jq --version
	check_tool go "$GO_MIN_VERSION" go env GOVERSION

	local audit
	audit=$(dpkg --audit 2>&1) || true
	if [[ -z $audit ]]; then
		report "dpkg --audit" "" ok "clean"
	else
		report "dpkg --audit" "" FAILED "$(head -n1 <<<"$audit")"
		problems+=("dpkg --audit reports half-installed packages: $(tr '\n' ' ' <<<"$audit" | cut -c1-200)")
	fi

	local img_out
	if img_out=$("$repo/test/images/build.sh" --check 2>&1); then
		report "test images" "" ok "${TORPOR_IMAGES_DIR}/{pause,actor}.tar"
	else
		report "test images" "" MISSING "$img_out"
		problems+=("test images missing or stale in $TORPOR_IMAGES_DIR (run test/images/build.sh)")
	fi
}

check_report() {
	if ((${#problems[@]})); then
		printf '\ndeps.sh: NOT READY:\n' >&2
		printf '  - %s\n' "${problems[@]}" >&2
		return 1
	fi
	printf '\nall dependencies present (%ds)\n' "$((SECONDS - start))"
}

# --------------------------------------------------------------------------
# helm (the Helm chart deploy/helm/torpor and its cluster test,
# test/tests/k8s_install.rs): built from its Go module (helm.sh/helm/v3),
# cached in $TORPOR_DEPS_CACHE/helm-<version>/, installed to /usr/local/bin.
# --------------------------------------------------------------------------
: "${HELM_VERSION:=v3.22.1}"

install_helm() {
	# its own lock: `deps.sh helm` may run beside a full run
	mkdir -p "$TORPOR_DEPS_CACHE"
	exec 7>"$TORPOR_DEPS_CACHE/.lock-helm"
	flock 7
	NICE=${NICE:-10} build_go_tool helm "$HELM_VERSION" \
		"-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" "" \
		"helm" helm.sh/helm/v3/cmd/helm
	install_bin "$TORPOR_DEPS_CACHE/helm-$HELM_VERSION/bin/helm" /usr/local/bin/helm
	exec 7>&-
}

check_helm() {
	check_tool helm "$HELM_VERSION" helm version --short
}

helm_mode() {
	install_helm
	log "checking dependencies"
	check_helm
	if ((${#problems[@]})); then
		printf '  - %s\n' "${problems[@]}" >&2
		exit 1
	fi
	exit 0
}

# --------------------------------------------------------------------------
# 7. the cgroup v2 node guest (test/vm/node.sh, make vm-test)
# --------------------------------------------------------------------------
# Host tools it needs: mmdebstrap makes the guest's Debian root file system,
# kmod's depmod and modprobe pick the kernel modules of its initramfs.
APT_TEST_PACKAGES+=(mmdebstrap kmod)

# install_vm_guest: the guest's kernel (Debian's package, extracted) and its
# root file system, cached under /var/cache/torpor/vm by release, package
# list and kernel (test/vm/node.sh --prepare; a no-op when cached).
install_vm_guest() {
	log "node guest: kernel and root file system (test/vm/node.sh --prepare)"
	"$repo/test/vm/node.sh" --prepare || die "test/vm/node.sh --prepare failed"
}

# --------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------
if [[ $mode == check ]]; then
	check_all
	exit
fi
if [[ $mode == kubernetes ]]; then
	install_kubernetes
	log "checking dependencies"
	check_kubernetes
	if ((${#problems[@]})); then
		printf '  - %s\n' "${problems[@]}" >&2
		exit 1
	fi
	exit 0
fi

if [[ $mode == helm ]]; then
	helm_mode
fi

if [[ $mode == promtool ]]; then
	mkdir -p "$TORPOR_DEPS_CACHE"
	exec 9>"$TORPOR_DEPS_CACHE/.lock"
	flock 9
	install_promtool
	log "checking dependencies"
	check_tool promtool "$(prometheus_release "$PROMETHEUS_MODULE_VERSION")" promtool --version
	if ((${#problems[@]})); then
		printf '  - %s\n' "${problems[@]}" >&2
		exit 1
	fi
	exit 0
fi

mkdir -p "$TORPOR_DEPS_CACHE"
# One deps.sh at a time on a machine (e.g. a developer and CI).
exec 9>"$TORPOR_DEPS_CACHE/.lock"
flock 9

if [[ $mode == demo ]]; then
	install_apt_packages "${APT_PACKAGES[@]}"
	install_criu
	install_go_tools
	log "test images (pause, actor)"
	TORPOR_IMAGES_BASE_ONLY=1 "$repo/test/images/build.sh"
	check_demo
	exit
fi

install_apt_packages "${APT_PACKAGES[@]}" "${APT_TEST_PACKAGES[@]}"
install_criu
install_go_tools
install_promtool
install_kubernetes
install_helm
log "test images"
"$repo/test/images/build.sh"
# (install_vm_guest: by `make vm-node-test`, not yet part of `make test`)
check_all
