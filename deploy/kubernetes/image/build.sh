#!/usr/bin/env bash
# Builds torpor's node image (the torpor-node DaemonSet's, see
# ../daemonset.yaml) as an OCI archive, without a registry or a container
# builder: busybox (the installer's shell and tools), the release binaries
# (containerd-shim-torpor-v1, torporctl, torpor-snapshotter, torpor-agent,
# kubectl-torpor), CRIU >= 4.2 with the libraries it links, and node.sh.
#
#   deploy/kubernetes/image/build.sh [--tag TAG] [--out FILE] [--import SOCKET]...
#
#   --tag TAG        image localhost/torpor/node:TAG (default: torpor's version,
#                    the workspace's Cargo.toml; a changed build needs a new tag:
#                    nodes keep an image whose tag they have)
#   --out FILE       the archive (default: target/torpor-node-TAG.tar)
#   --import SOCKET  then import it into the containerd at SOCKET, namespace k8s.io
#                    (repeatable: once per node; on a real node
#                    `ctr -n k8s.io images import FILE` does the same)
#
# Inputs: target/release/ (cargo build --release -p torpor-shim -p torporctl
# -p torpor-snapshotter -p torpor-agent), CRIU at $TORPOR_CRIU
# (/usr/local/sbin/criu), busybox-static at /bin/busybox, Go (for the
# archive writer test/images/ocipack).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(cd "$here/../../.." && pwd)
die() { echo "deploy/kubernetes/image/build.sh: $*" >&2; exit 1; }

tag="" out="" imports=()
while [ $# -gt 0 ]; do
	case "$1" in
	--tag) tag="$2"; shift 2 ;;
	--out) out="$2"; shift 2 ;;
	--import) imports+=("$2"); shift 2 ;;
	*) die "unknown argument '$1'" ;;
	esac
done
[ -n "$tag" ] || tag="$(sed -n 's/^version *= *"\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n1)"
[[ $tag =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || die "bad tag '$tag'"
name="localhost/torpor/node:$tag"
release="${TORPOR_RELEASE_DIR:-$repo/target/release}"
out="${out:-$repo/target/torpor-node-$tag.tar}"
criu="${TORPOR_CRIU:-/usr/local/sbin/criu}"
busybox=/bin/busybox
bins=(containerd-shim-torpor-v1 torporctl torpor-snapshotter torpor-agent kubectl-torpor)
for b in "${bins[@]}"; do
	[ -x "$release/$b" ] || die "$release/$b not built (cargo build --release -p torpor-shim -p torporctl -p torpor-snapshotter -p torpor-agent)"
done
[ -x "$criu" ] || die "CRIU not found at $criu (TORPOR_CRIU)"
v="$("$criu" --version | sed -n 's/^Version: *//p')"
case "$v" in 4.[2-9]* | 4.[1-9][0-9]* | [5-9].*) ;; *) die "CRIU $v at $criu: need 4.2 or later" ;; esac
[ -x "$busybox" ] || die "busybox-static missing ($busybox)"
go=$(command -v go || echo /usr/local/go/bin/go)
[ -x "$go" ] || die "Go not found"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$repo/test/images" && CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS=-buildvcs=false timeout 600 "$go" build -trimpath -o "$tmp/ocipack" ./ocipack) ||
	die "building ocipack failed"

args=(--name "$name" --out "$out" --entrypoint '["/torpor/node.sh"]' --env PATH=/bin:/torpor/bin --workdir /
	--file "/torpor/node.sh=$here/node.sh" --file "/bin/busybox=$busybox"
	--dir /tmp=1777 --dir /proc=555 --dir /sys=555 --dir /dev=755 --dir /run=755 --dir /host=755 --dir /etc=755)
for b in "${bins[@]}"; do args+=(--file "/torpor/bin/$b=$release/$b"); done
# CRIU and what it links but the C library and the loader (the node's)
args+=(--file "/torpor/criu/criu=$criu")
while read -r lib; do
	case "$(basename "$lib")" in libc.so.* | ld-linux* | libm.so.* | libpthread.so.* | libdl.so.*) continue ;; esac
	args+=(--file "/torpor/criu/$(basename "$lib")=$(readlink -f "$lib")")
done < <(ldd "$criu" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }')
# torpor-agent runs in the image: the C library and loader it links, at
# their own paths (busybox is static)
while read -r lib; do
	args+=(--file "$lib=$(readlink -f "$lib")")
done < <(ldd "$release/torpor-agent" | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' | sort -u)
for applet in $("$busybox" --list); do
	[ "$applet" = busybox ] || args+=(--symlink "/bin/$applet=busybox")
done
mkdir -p "$(dirname "$out")"
"$tmp/ocipack" pack "${args[@]}"
"$tmp/ocipack" verify "$out"
echo "built $name: $out ($(du -h "$out" | cut -f1))"

ctr="${TORPOR_CTR:-$(command -v ctr || echo /usr/local/bin/ctr)}"
for sock in "${imports[@]}"; do
	timeout 300 "$ctr" --address "$sock" -n k8s.io images import --local "$out" >/dev/null ||
		die "import into $sock failed"
	echo "imported $name into $sock (k8s.io)"
done
