#!/usr/bin/env bash
# Runs every fuzz target (or $FUZZ_TARGETS) for FUZZ_SECONDS each (default
# 60) with cargo-fuzz: on the nightly toolchain if one is installed, else on
# stable with RUSTC_BOOTSTRAP=1. New inputs land in corpus/<target>/,
# crashers in artifacts/<target>/ (commit them: make test replays both).
# Minimise a corpus before committing it: cargo fuzz cmin -O <target>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
secs="${FUZZ_SECONDS:-60}"
targets="${FUZZ_TARGETS:-fuzz_rootfs_apply fuzz_annotations manifest manifest_fields envelope lease chunk config control}"
command -v cargo-fuzz >/dev/null || { echo "fuzz/run.sh: cargo-fuzz not installed (cargo install cargo-fuzz)" >&2; exit 1; }
if rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
	fuzz=(cargo +nightly fuzz)
else
	export RUSTC_BOOTSTRAP=1
	fuzz=(cargo fuzz)
fi
for t in $targets; do
	echo "==> fuzz $t for ${secs}s"
	nice -n 10 "${fuzz[@]}" run -O "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10
done
