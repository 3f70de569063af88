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
# A test that failed is run again, alone, twice. One that then passes is
# reported as FLAKY (loudly, with its first failure above) and does not fail
# the run: open::etxtbsy failed once (a CI run on 2026-12-02) and passed in
# every other full run and every run alone; ETXTBSY is enforced by the
# kernel's VFS, not by the daemon, and the cause is not found yet. A test
# that fails again fails the run.
if [ "$status" != 0 ]; then
  failed=$(grep -E 'FAILED$' "$work/pjd.log" | awk '{print $1}')
  [ -n "$failed" ] || exit "$status"
  status=0
  for t in $failed; do
    if pjdfstest -c "$OLDPWD/scripts/suites/pjdfstest.toml" -p "$work/mnt/t" -s "$work/other" "$t" >/dev/null 2>&1 &&
      pjdfstest -c "$OLDPWD/scripts/suites/pjdfstest.toml" -p "$work/mnt/t" -s "$work/other" "$t" >/dev/null 2>&1; then
      echo "FLAKY: $t failed in the full run and passed twice alone" >&2
    else
      echo "FAILED again alone: $t" >&2
      status=1
    fi
  done
fi
exit $status
