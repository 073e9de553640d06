#!/bin/sh
# A cgroup v2 node for torpor's cgroup code, on a host whose own tree is v1
# (never touched: the guest has its own kernel). Boots Debian's kernel under
# qemu with cgroup_no_v1=all, from an initramfs holding busybox, the
# runtime's unit-test binary and its recorded trees, and runs there:
#   - the cgroup unit tests, with the live one (`live_cgroup_v2`: makes,
#     reads, freezes, thaws and kills a real v2 cgroup through the module);
#   - with --record DIR: test/vm/record-v2.sh, and writes the recorded v2
#     trees below DIR (runtime/tests/data/cgroup to refresh them).
#
# Usage: test/vm/run.sh [--record DIR]
# Env:   TORPOR_VM_ACCEL=tcg|kvm (default tcg: KVM guests hang here, see
#        test/vm/README.md), TORPOR_VM_WORK (default /var/cache/torpor/vm).
set -eu
cd "$(dirname "$0")/../.."
REPO=$(pwd)
RECORD=""
if [ "${1:-}" = "--record" ]; then RECORD=$(realpath -m "$2"); fi
WORK=${TORPOR_VM_WORK:-/var/cache/torpor/vm}
KPKG=${TORPOR_VM_KERNEL_PKG:-linux-image-6.1.0-57-amd64}
ACCEL=${TORPOR_VM_ACCEL:-tcg}
mkdir -p "$WORK"

need() { command -v "$1" >/dev/null || { echo "vm: installing $2"; apt-get install -y --no-install-recommends "$2" >/dev/null; }; }
need qemu-system-x86_64 qemu-system-x86
need cpio cpio
command -v busybox >/dev/null && ldd "$(command -v busybox)" 2>&1 | grep -q "not a dynamic" || need busybox.static busybox-static
BUSYBOX=$(command -v busybox)

# The kernel, from Debian's package (extracted, never installed).
KDIR="$WORK/$KPKG"
if [ ! -d "$KDIR/boot" ]; then
  (cd "$WORK" && timeout 600 apt-get download "$KPKG")
  mkdir -p "$KDIR" && dpkg-deb -x "$WORK/${KPKG}"_*.deb "$KDIR"
fi
KERNEL=$(ls "$KDIR"/boot/vmlinuz-*)

# The runtime's unit tests, built on the host, run on the guest's kernel.
BIN=$(nice -n 10 cargo test -p torpor-runtime --lib --no-run --message-format=json 2>/dev/null |
  sed -n 's/.*"executable":"\([^"]*torpor_runtime-[^"]*\)".*/\1/p' | tail -1)
[ -x "$BIN" ] || { echo "vm: no test binary built" >&2; exit 1; }

IRD="$WORK/initramfs"
rm -rf "$IRD" && mkdir -p "$IRD/bin" "$IRD/proc" "$IRD/sys" "$IRD/dev" "$IRD/tmp"
cp "$BUSYBOX" "$IRD/bin/busybox"
cp test/vm/init.sh "$IRD/init"
objcopy --strip-debug "$BIN" "$IRD/torpor-runtime-tests"
for lib in $(ldd "$BIN" | sed -n 's/.*=> \(\/[^ ]*\).*/\1/p; s/^\s*\(\/[^ ]*\) .*/\1/p'); do
  mkdir -p "$IRD$(dirname "$lib")" && cp -L "$lib" "$IRD$lib"
done
# The tests find their trees where the build put CARGO_MANIFEST_DIR.
mkdir -p "$IRD$REPO/runtime/tests/data" && cp -a runtime/tests/data/cgroup "$IRD$REPO/runtime/tests/data/"
if [ -n "$RECORD" ]; then
  cp test/vm/record-v2.sh "$IRD/payload.sh"
else
  cat > "$IRD/payload.sh" <<'EOF'
#!/bin/sh
cd /tmp && RUST_BACKTRACE=1 /torpor-runtime-tests system::cgroup --include-ignored --skip live_cgroup_v1_oom_watch --test-threads=1
EOF
fi
chmod +x "$IRD/payload.sh" "$IRD/init"
(cd "$IRD" && find . | cpio -o -H newc 2>/dev/null | gzip -1 > "$WORK/initrd.gz")

case "$ACCEL" in
  kvm) MACHINE="-enable-kvm -cpu host,-arch-capabilities" ;;
  *) MACHINE="-accel tcg -cpu max" ;;
esac
LOG="$WORK/console.log"
echo "vm: booting $(basename "$KERNEL") ($ACCEL); console in $LOG"
# shellcheck disable=SC2086
timeout 1200 nice -n 10 qemu-system-x86_64 $MACHINE -m 2048 -smp 1 -nographic -no-reboot \
  -kernel "$KERNEL" -initrd "$WORK/initrd.gz" \
  -append "console=ttyS0 panic=-1 quiet cgroup_no_v1=all systemd.unified_cgroup_hierarchy=1" \
  </dev/null >"$LOG" 2>&1 || { echo "vm: qemu failed or timed out; last console lines:" >&2; tail -20 "$LOG" >&2; exit 1; }
tr -d '\r' < "$LOG" | grep -a -E '^(guest:|test |test result|---)' || true
tr -d '\r' < "$LOG" | grep -a -q '^guest: payload rc=0$' || { echo "vm: the payload failed" >&2; exit 1; }
if [ -n "$RECORD" ]; then
  rm -rf "$RECORD/v2-cgroupfs" "$RECORD/v2-systemd"
  test/vm/fixtures-from-log.sh "$LOG" "$RECORD"
  echo "vm: recorded v2 trees below $RECORD"
fi
