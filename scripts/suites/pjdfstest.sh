#!/usr/bin/env bash
# Runs the third-party POSIX suite pjdfstest (crates.io 0.2.2) against a
# sessionfs mount, as root with allow_other, and prints its Summary line.
# Fails on any unexpected failure.
set -euo pipefail
cd "$(dirname "$0")/../.."
bin=${SESSIONFS:-$PWD/target/release/sessionfs}
command -v pjdfstest >/dev/null || cargo install --locked pjdfstest@0.2.2
work=$(mktemp -d /tmp/sessionfs-pjd.XXXXXX)
chmod 755 "$work" # the suite switches to unprivileged users, who must reach the mount
cleanup() { "$bin" umount "$work/mnt" >/dev/null 2>&1 || fusermount3 -uz "$work/mnt" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/ws" "$work/mnt" "$work/other"
echo seed > "$work/ws/seed"
"$bin" pack --workspace "$work/ws" -o "$work/p.packet" >/dev/null
"$bin" mount "$work/p.packet" "$work/mnt" --upper "$work/upper" --part workspace --allow-other >/dev/null
mkdir "$work/mnt/t"
cd "$work/mnt/t"
status=0
pjdfstest -c "$OLDPWD/scripts/suites/pjdfstest.toml" -p "$work/mnt/t" -s "$work/other" >"$work/pjd.log" 2>&1 || status=$?
grep -E 'FAILED$' -A2 "$work/pjd.log" || true
grep -E '^Summary' "$work/pjd.log"
# Any failure fails the run. (open::etxtbsy used to fail now and then under
# load: the daemon truncated at OPEN before the kernel's ETXTBSY check; see
# tests/mount_ops.rs, a_running_executable_refuses_truncation_and_keeps_its_content.)
exit $status
