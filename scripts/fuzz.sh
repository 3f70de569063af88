#!/usr/bin/env bash
# Runs the strict reader's fuzz targets briefly (FUZZ_SECONDS each, default
# 30) with cargo-fuzz on the stable toolchain (no sanitizer), seeded with the
# golden packets. A crash fails the run and leaves the input in
# fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${FUZZ_SECONDS:-30}
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
mkdir -p fuzz/corpus/packet fuzz/corpus/manifest
cp tests/golden/small.packet fuzz/corpus/packet/
tar -xOf tests/golden/small.packet packet.json > fuzz/corpus/manifest/small.json
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for target in manifest packet; do
  if ! cargo fuzz run -s none -O "$target" -- -max_total_time="$secs" -rss_limit_mb=1024 -timeout=10 >"$log" 2>&1; then
    tail -40 "$log" >&2
    echo "fuzz: $target failed (a crash leaves its input in fuzz/artifacts/$target)" >&2
    exit 1
  fi
  echo "fuzz: $target: $(grep -E '^Done' "$log")"
done
echo "fuzz: no crash in ${secs}s per target"
