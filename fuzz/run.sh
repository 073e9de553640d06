#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (FUZZ_SECONDS each, default 60)
# with cargo-fuzz on the nightly toolchain; crashers land in
# fuzz/artifacts/<target>/ (commit them: the fuzz_corpus test replays them).
# Then minimize the corpora before committing them: cargo +nightly fuzz cmin -O <target>.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
secs="${FUZZ_SECONDS:-60}"
command -v cargo-fuzz >/dev/null || { echo "fuzz/run.sh: cargo-fuzz not installed (cargo install cargo-fuzz)" >&2; exit 1; }
for t in manifest manifest_fields envelope config; do
	echo "==> fuzz $t for ${secs}s"
	cargo +nightly fuzz run -O "$t" "corpus/$t" -- -max_total_time="$secs" -rss_limit_mb=2048 -timeout=10
done
