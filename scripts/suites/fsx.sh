#!/usr/bin/env bash
# Runs fsx (crates.io 0.3.2) against files on a sessionfs mount: 100,000
# operations of read/write/truncate/fsync/close-open, then seeds of 10,000
# with mmap, fallocate, punch hole, copy_file_range and sendfile too.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${SESSIONFS:-$PWD/target/release/sessionfs}
ops=${FSX_OPS:-100000}
command -v fsx >/dev/null || cargo install --locked fsx@0.3.2
work=$(mktemp -d /tmp/sessionfs-fsx.XXXXXX)
cleanup() { "$bin" umount "$work/mnt" >/dev/null 2>&1 || fusermount3 -uz "$work/mnt" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/ws" "$work/mnt"
head -c 200000 /dev/urandom > "$work/ws/lower.bin"
"$bin" pack --workspace "$work/ws" -o "$work/p.packet" >/dev/null
"$bin" mount "$work/p.packet" "$work/mnt" --upper "$work/upper" --part workspace >/dev/null
cp "$work/mnt/lower.bin" "$work/mnt/lower.bin.ref"  # the lower file is exercised too, after copy-up
run() { # config, ops, seed, file
  echo "fsx: $1 $2 ops, seed $3, $4"
  fsx -q -f "scripts/suites/$1" -N "$2" -S "$3" -P "$work" "$work/mnt/$4" 2>&1 | tail -1
}
run fsx-basic.toml "$ops" 1 basic.bin
run fsx-basic.toml 20000 2 lower.bin
for seed in 3 4 5; do run fsx-full.toml 10000 "$seed" "full$seed.bin"; done
