#!/usr/bin/env bash
# Runs `cargo test --all-targets` as on a machine without FUSE: in a private
# mount namespace whose /dev is a tmpfs holding the usual nodes but no
# `fuse`, so every FUSE test skips (printing why) and the rest run. Root
# only (unshare -m). Prints the counts: a skipped test passes, having
# printed `SKIPPED <test>: why` (shown here with --nocapture). Nothing else
# may build in this target directory meanwhile: a `cargo build` replaces
# the binary under test (built with the test hooks) with one without.
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "run as root (it needs a mount namespace)" >&2; exit 2; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT
unshare -m sh -c '
  set -e
  mount --make-rprivate /
  mount -t tmpfs -o mode=0755 nofuse /dev
  mknod -m 0666 /dev/null c 1 3; mknod -m 0666 /dev/zero c 1 5
  mknod -m 0666 /dev/full c 1 7; mknod -m 0666 /dev/random c 1 8
  mknod -m 0666 /dev/urandom c 1 9; mknod -m 0666 /dev/tty c 5 0
  ln -s /proc/self/fd /dev/fd; ln -s fd/0 /dev/stdin
  ln -s fd/1 /dev/stdout; ln -s fd/2 /dev/stderr
  mkdir /dev/shm /dev/pts && mount -t tmpfs shm /dev/shm
  mount -t devpts -o newinstance,ptmxmode=0666 devpts /dev/pts
  ln -s pts/ptmx /dev/ptmx
  exec env -u SESSIONFS_REQUIRE_FUSE cargo test --all-targets --no-fail-fast -- --nocapture
' 2>&1 | tee "$log" | grep -E "^test result|SKIPPED|FAILED|panicked" || true
passed=$(grep -Eo '[0-9]+ passed' "$log" | awk '{s+=$1} END {print s+0}')
# Once per test: a test may ask more than once (a property test, each case).
skipped=$(grep -o 'SKIPPED [^ :]*:' "$log" | sort -u | wc -l)
failed=$(grep -Eo '[0-9]+ failed' "$log" | awk '{s+=$1} END {print s+0}')
echo "without /dev/fuse: $((passed - skipped)) ran, $skipped skipped, $failed failed"
[ "$failed" = 0 ]
