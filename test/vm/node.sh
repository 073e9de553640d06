#!/usr/bin/env bash
# A cgroup v2 node in a qemu guest (TCG; this host's own tree is v1 and is
# never touched): Debian's root file system (mmdebstrap of this host's
# release, cached), systemd as PID 1 on the unified hierarchy only, runc,
# CRIU, containerd 2.x, crictl, the CNI plugins and versitygw as `make deps`
# installed them on this host, iptables on the nft backend, and torpor's
# binaries and integration tests built here. The guest brings the test rig
# up (test/rig/up.sh, torpor-snapshotter as a systemd unit), runs its suites
# (test/vm/guest/suite.sh: once with SystemdCgroup = true, once with
# cgroupfs) and powers off; its results disk is read back here.
#
# Usage: test/vm/node.sh             build what is missing, boot, run the suites
#        test/vm/node.sh --prepare   only the cached parts: kernel and root fs
# Env:   TORPOR_VM_WORK     cache and scratch (default /var/cache/torpor/vm)
#        TORPOR_VM_OUT      where the results go (default <repo>/target/vm-node)
#        TORPOR_VM_TIMEOUT  seconds the guest may run (default 2400)
#        TORPOR_VM_SUITES   which suites the guest runs (default all; see guest/suite.sh)
#        TORPOR_VM_MEM / TORPOR_VM_SMP   guest memory (MiB, 4096) and CPUs (2)
#        TORPOR_SKIP_SHIM_BUILD=1        use what target/release holds
#
# Leaves nothing on the host but the cache and the results: no mount (the
# image is made with mkfs.ext4 -d and read back with debugfs), no network
# device (the guest has none), no process (qemu is killed on any exit).
set -euo pipefail
export PATH=/usr/local/go/bin:$HOME/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd "$(dirname "$0")/../.."
REPO=$(pwd)
WORK=${TORPOR_VM_WORK:-/var/cache/torpor/vm}
OUT=${TORPOR_VM_OUT:-$REPO/target/vm-node}
TIMEOUT=${TORPOR_VM_TIMEOUT:-2400}
KPKG=${TORPOR_VM_KERNEL_PKG:-linux-image-6.1.0-57-amd64}
MIRROR=${TORPOR_VM_MIRROR:-http://deb.debian.org/debian}
RELEASE=$(. /etc/os-release && echo "$VERSION_CODENAME")
PREPARE=0
case "${1:-}" in
"") ;;
--prepare) PREPARE=1 ;;
*) echo "usage: $0 [--prepare]" >&2; exit 2 ;;
esac
T0=$SECONDS

log() { printf 'vm-node: %s\n' "$*" >&2; }
die() { printf 'vm-node: error: %s\n' "$*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || die "must run as root"
for t in mmdebstrap qemu-system-x86_64 mkfs.ext4 debugfs cpio depmod; do
  command -v "$t" >/dev/null || die "$t missing (run scripts/deps.sh)"
done
busybox=/bin/busybox
{ ldd "$busybox" 2>&1 || true; } | grep -q "not a dynamic" || die "$busybox is not busybox-static's (run scripts/deps.sh)"
mkdir -p "$WORK"

# The guest's Debian packages: systemd and D-Bus (runc's systemd driver
# talks to systemd over D-Bus), runc (Debian's, as on this host), CRIU's
# run-time libraries (the binary is this host's /usr/local/sbin/criu),
# iptables (nft backend, Debian's default) and what the rig scripts call.
# No ca-certificates: torpor-snapshotter opens the rig's http:// object
# tier without any (it refused to start without them: "builder error").
GUEST_PACKAGES=systemd,systemd-sysv,dbus,runc,iptables,iproute2,procps,kmod,psmisc,curl,socat,jq,xz-utils,busybox-static,libseccomp2,libprotobuf-c1,libnl-3-200,libnet1,libbsd0,libcap2
# Modules the node loads (overlay, bridge, veth, nf_tables, ...): these
# subtrees of the kernel package, not its 400 MB of hardware drivers.
MODULE_DIRS="arch block crypto fs lib mm net virt drivers/block drivers/virtio drivers/net/veth.ko drivers/net/dummy.ko drivers/net/tun.ko drivers/char/hw_random"

# ------------------------------------------------------------------ kernel
KDIR=$WORK/$KPKG
if [ ! -f "$KDIR/.complete" ]; then
  log "downloading $KPKG (extracted, never installed)"
  rm -rf "$KDIR" "$WORK/dl" && mkdir -p "$WORK/dl" "$KDIR"
  (cd "$WORK/dl" && timeout 600 apt-get download "$KPKG" 2>/dev/null)
  dpkg-deb -x "$WORK"/dl/"${KPKG}"_*.deb "$KDIR"
  rm -rf "$WORK/dl"
  depmod -a -b "$KDIR" "$(basename "$(ls -d "$KDIR"/lib/modules/*)")"
  touch "$KDIR/.complete"
fi
KERNEL=$(ls "$KDIR"/boot/vmlinuz-*)
KVER=${KERNEL##*/vmlinuz-}
KMOD=$KDIR/lib/modules/$KVER

# --------------------------------------------------------------- root fs
# Cached by release, package list, kernel and this recipe's version.
RECIPE=3
KEY=$(printf '%s\n' "$RELEASE" "$GUEST_PACKAGES" "$KPKG" "$MODULE_DIRS" "$RECIPE" | sha256sum | cut -c1-12)
ROOTFS=$WORK/rootfs-$RELEASE-$KEY
if [ ! -f "$ROOTFS/.complete" ]; then
  t=$SECONDS
  log "building the guest's root file system ($RELEASE, mmdebstrap from $MIRROR) in $ROOTFS"
  rm -rf "$ROOTFS" "$ROOTFS.tmp"
  timeout 1200 mmdebstrap --variant=minbase --mode=root --format=directory --quiet \
    --aptopt='Acquire::Check-Valid-Until "false"' --aptopt='Acquire::Retries "3"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --include="$GUEST_PACKAGES" \
    "$RELEASE" "$ROOTFS.tmp" \
    "deb $MIRROR $RELEASE main" "deb $MIRROR $RELEASE-updates main" \
    "deb ${MIRROR%/debian}/debian-security $RELEASE-security main" >"$WORK/mmdebstrap.log" 2>&1 ||
    { tail -20 "$WORK/mmdebstrap.log" >&2; rm -rf "$ROOTFS.tmp"; die "mmdebstrap failed (log: $WORK/mmdebstrap.log)"; }
  R=$ROOTFS.tmp
  echo torpor-node >"$R/etc/hostname"
  : >"$R/etc/fstab"
  # No logins and no timers: the guest boots, runs the suites, powers off.
  for u in getty@tty1.service serial-getty@ttyS0.service apt-daily.timer apt-daily-upgrade.timer \
    systemd-timesyncd.service e2scrub_all.timer fstrim.timer; do
    ln -sf /dev/null "$R/etc/systemd/system/$u"
  done
  mkdir -p "$R/lib/modules/$KVER/kernel"
  for d in $MODULE_DIRS; do
    mkdir -p "$R/lib/modules/$KVER/kernel/$(dirname "$d")"
    cp -a "$KMOD/kernel/$d" "$R/lib/modules/$KVER/kernel/$d"
  done
  cp -a "$KMOD"/modules.builtin* "$KMOD"/modules.order "$R/lib/modules/$KVER/"
  depmod -a -b "$R" "$KVER"
  date -u +%FT%TZ >"$R/.complete"
  mv "$R" "$ROOTFS"
  # older recipes' trees
  for old in "$WORK"/rootfs-*; do [ "$old" = "$ROOTFS" ] || rm -rf "$old"; done
  log "root file system built in $((SECONDS - t)) s"
fi

[ "$PREPARE" = 0 ] || { log "kernel and root file system ready ($((SECONDS - T0)) s)"; exit 0; }

# ----------------------------------------------------------- torpor builds
if [ "${TORPOR_SKIP_SHIM_BUILD:-0}" != 1 ]; then
  # The same build as test/rig/run-tests.sh's (make test builds it once).
  log "building the shim (with failpoints), torporctl, the snapshotter and the agent"
  nice -n 10 cargo build --release -p torpor-shim --features torpor-shim/failpoints -p torporctl \
    -p torpor-snapshotter --features torpor-snapshotter/failpoints -p torpor-agent >&2
fi
# name<TAB>executable of each integration test target and the runtime's unit tests
SUITES=${TORPOR_VM_SUITES:-all}
unit=()
case " $SUITES " in *" all "* | *" unit "*) unit=(-p torpor-runtime --lib) ;; esac
tests_json=$(nice -n 10 cargo test --release -p torpor-tests --no-run --message-format=json 2>/dev/null &&
  { [ ${#unit[@]} = 0 ] || nice -n 10 cargo test --release "${unit[@]}" --no-run --message-format=json 2>/dev/null; }) ||
  die "cargo test --no-run failed (run it for the errors)"
TEST_LIST=$(jq -r 'select(.reason == "compiler-artifact" and .executable != null and .profile.test == true) | "\(.target.name)\t\(.executable)"' <<<"$tests_json")
[ -n "$TEST_LIST" ] || die "no test binaries built"

# ------------------------------------------------------------------ stage
RUN=$WORK/run
cleanup() {
  local rc=$?
  trap - EXIT INT TERM
  if [ -n "${QEMU_PID:-}" ] && kill -0 "$QEMU_PID" 2>/dev/null; then
    kill -KILL "$QEMU_PID" 2>/dev/null || true
    wait "$QEMU_PID" 2>/dev/null || true
  fi
  rm -rf "$RUN"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
rm -rf "$RUN" && mkdir -p "$RUN"
STAGE=$RUN/root
t=$SECONDS
# Hard links: mkfs.ext4 only reads them, the guest writes to its own image.
cp -al "$ROOTFS" "$STAGE"
rm -f "$STAGE/.complete"

host_bins=(/usr/local/bin/containerd /usr/local/bin/ctr /usr/local/bin/containerd-shim-runc-v2
  /usr/local/bin/crictl /usr/local/bin/versitygw /usr/local/bin/checkpointctl /usr/local/sbin/criu)
for b in "${host_bins[@]}"; do
  [ -x "$b" ] || die "$b missing (run scripts/deps.sh)"
  mkdir -p "$STAGE$(dirname "$b")" && cp "$b" "$STAGE$b"
done
mkdir -p "$STAGE/opt/cni/bin" && cp -a /opt/cni/bin/. "$STAGE/opt/cni/bin/"
images=${TORPOR_IMAGES_DIR:-/var/cache/torpor/images}
ls "$images"/pause.tar "$images"/actor.tar >/dev/null || die "no test images in $images (run scripts/deps.sh)"
mkdir -p "$STAGE$images" && cp "$images"/pause.tar "$images"/actor.tar "$STAGE$images/"

# The repository's parts the tests use, at the same path (the test binaries
# name their scripts and binaries through CARGO_MANIFEST_DIR).
mkdir -p "$STAGE$REPO/target/release/deps" "$STAGE$REPO/test" "$STAGE$REPO/runtime/tests/data"
cp -a test/rig "$STAGE$REPO/test/"
cp -a runtime/tests/data/cgroup "$STAGE$REPO/runtime/tests/data/"
for b in containerd-shim-torpor-v1 torporctl torpor-snapshotter torpor-agent; do
  [ -x "target/release/$b" ] || die "target/release/$b not built"
  objcopy --strip-debug "target/release/$b" "$STAGE$REPO/target/release/$b"
done
: >"$STAGE/etc/torpor-vm-tests"
while IFS=$'\t' read -r name exe; do
  objcopy --strip-debug "$exe" "$STAGE$exe"
  printf '%s\t%s\n' "$name" "$exe" >>"$STAGE/etc/torpor-vm-tests"
done <<<"$TEST_LIST"

# Every shared library of what was copied in must be the guest's too.
missing=()
for f in /usr/local/sbin/criu "$REPO"/target/release/{containerd-shim-torpor-v1,torporctl,torpor-snapshotter,torpor-agent} $(cut -f2 <<<"$TEST_LIST"); do
  while read -r lib; do
    [ -e "$STAGE$lib" ] || missing+=("$f needs $lib")
  done < <(ldd "$f" 2>/dev/null | sed -n 's/.*=> \(\/[^ ]*\).*/\1/p; s/^\s*\(\/[^ ]*\) .*/\1/p')
done
[ ${#missing[@]} = 0 ] || die "libraries missing in the guest: ${missing[*]}"

# The suite and the unit that runs it at boot, powering off when done.
mkdir -p "$STAGE/torpor-vm"
cp test/vm/guest/suite.sh "$STAGE/torpor-vm/suite.sh"
chmod +x "$STAGE/torpor-vm/suite.sh"
printf 'REPO=%q\nSUITES=%q\n' "$REPO" "$SUITES" >"$STAGE/torpor-vm/env"
cp test/vm/guest/torpor-vm-suite.service "$STAGE/etc/systemd/system/"
mkdir -p "$STAGE/etc/systemd/system/multi-user.target.wants"
ln -sf ../torpor-vm-suite.service "$STAGE/etc/systemd/system/multi-user.target.wants/torpor-vm-suite.service"

# The root disk: an ext4 image made from the staged tree (no loop mount).
truncate -s 12G "$RUN/root.img"
mkfs.ext4 -q -F -L torpor-root -d "$STAGE" "$RUN/root.img"
rm -rf "$STAGE"
# The results disk, empty; read back with debugfs after the guest is gone.
truncate -s 1G "$RUN/results.img"
mkfs.ext4 -q -F -L results "$RUN/results.img"

# The initramfs: busybox and the modules that mount the root disk.
IRD=$RUN/initramfs
mkdir -p "$IRD/bin" "$IRD/proc" "$IRD/sys" "$IRD/dev" "$IRD/lib/modules/$KVER"
cp "$busybox" "$IRD/bin/busybox"
cp test/vm/node-init.sh "$IRD/init" && chmod +x "$IRD/init"
for m in virtio_pci virtio_blk crc32c_generic ext4; do
  for f in $(modprobe -d "$KDIR" -S "$KVER" --show-depends "$m" | awk '$1 == "insmod" {print $2}'); do
    rel=${f#"$KMOD"/}
    mkdir -p "$IRD/lib/modules/$KVER/$(dirname "$rel")" && cp "$f" "$IRD/lib/modules/$KVER/$rel"
  done
done
cp "$KMOD"/modules.builtin* "$KMOD"/modules.order "$IRD/lib/modules/$KVER/"
depmod -a -b "$IRD" "$KVER"
(cd "$IRD" && find . | cpio -o -H newc 2>/dev/null | gzip -1 >"$RUN/initrd.gz")
log "image staged in $((SECONDS - t)) s"

# ------------------------------------------------------------------- boot
LOG=$RUN/console.log
log "booting $KVER under TCG (-smp ${TORPOR_VM_SMP:-2}, ${TORPOR_VM_MEM:-4096} MiB); at most $TIMEOUT s"
t=$SECONDS
nice -n 10 qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp "${TORPOR_VM_SMP:-2}" -m "${TORPOR_VM_MEM:-4096}" \
  -nographic -no-reboot -nic none \
  -kernel "$KERNEL" -initrd "$RUN/initrd.gz" \
  -append "console=ttyS0 panic=-1 quiet cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1 systemd.show_status=0" \
  -drive file="$RUN/root.img",if=virtio,format=raw,cache=unsafe \
  -drive file="$RUN/results.img",if=virtio,format=raw \
  </dev/null >"$LOG" 2>&1 &
QEMU_PID=$!
qrc=0
deadline=$((SECONDS + TIMEOUT))
while kill -0 "$QEMU_PID" 2>/dev/null && [ $SECONDS -lt $deadline ]; do sleep 2; done
if kill -0 "$QEMU_PID" 2>/dev/null; then
  log "the guest did not power off within $TIMEOUT s; killing it"
  qrc=124
fi
kill -KILL "$QEMU_PID" 2>/dev/null || true
wait "$QEMU_PID" 2>/dev/null || true
QEMU_PID=""
log "guest ran $((SECONDS - t)) s"

# ---------------------------------------------------------------- results
rm -rf "$OUT" && mkdir -p "$OUT"
tr -d '\r' <"$LOG" >"$OUT/console.log"
debugfs -R "rdump / $OUT" "$RUN/results.img" >/dev/null 2>&1 || log "could not read the results disk"
rm -rf "$OUT/lost+found"
log "results in $OUT ($(ls "$OUT" | tr '\n' ' '))"
grep -h '^vm-check:' "$OUT/summary.txt" 2>/dev/null >&2 || true
log "total $((SECONDS - T0)) s"
[ "$qrc" = 0 ] || { tail -30 "$OUT/console.log" >&2; exit 1; }
grep -qx 'vm-suite: rc=0' "$OUT/summary.txt" 2>/dev/null || { log "the guest's suites failed (see $OUT)"; exit 1; }
