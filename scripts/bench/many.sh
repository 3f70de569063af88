#!/usr/bin/env bash
# make bench-many: many sessions on one node (issue 34). N (16) mounts of N
# different packets at once, each a tree of $files source files and a
# `.git` (corpus s) with its own 1% of files changed and a file of its own,
# so that most content is shared between packets: local files, then remote
# (http://, served by sessionfs-bench serve on loopback, unshaped) with one
# node cache for all, cold then warm. On every mount, an agent-like turn:
# `git status`, stat every file, read every file, `grep -r`, write 20 files;
# one mount alone first, then the N-1 others all at once. The same turns on
# N plain directories (the packets unpacked) give what the machine itself
# allows. Prints RSS per daemon, their sum and their PSS sum (shared pages
# counted once), each turn's time alone and among the others (fastest and
# slowest), and the cache's hit rate (bytes the mounts took from the node
# cache over those they read remotely). Needs root (mounts). Leaves
# nothing behind in .bench/many.
set -euo pipefail
. "$(dirname "$0")/config.sh"; . "$(dirname "$0")/lib.sh"
n=${BENCH_MOUNTS:-16} files=${BENCH_MANY_FILES:-2000} d=$dir/many
cd "$root"
srv=
cleanup() {
  for i in $(seq "$n"); do unmount "$mnt/many/$i"; done
  [ -z "$srv" ] || kill "$srv" 2>/dev/null || true
  rm -rf "$d"
}
trap cleanup EXIT
rm -rf "$d"; mkdir -p "$d/pk" "$mnt/many"
"$tool" corpus --kind s --count "$files" --out "$d/base" >/dev/null
for i in $(seq "$n"); do
  cp -a "$d/base" "$d/ws"; echo "$i" >"$d/ws/session-id"
  (cd "$d/ws" && find . -path ./.git -prune -o -type f -print | LC_ALL=C sort | awk -v i="$i" 'NR % 100 == i % 100') |
    while read -r f; do echo "// $i" >>"$d/ws/$f"; done
  "$bin" pack --workspace "$d/ws" -o "$d/pk/s$i.packet" >/dev/null; rm -rf "$d/ws"
done
rm -rf "$d/base"
"$tool" serve --root "$d" --port-file "$d/port" >/dev/null 2>&1 & srv=$!
while [ ! -s "$d/port" ]; do sleep 0.05; done; port=$(cat "$d/port")

# turn ROOT I: the agent-like turn in ROOT; its seconds go to $d/t-I.
turn() {
  local t0; t0=$(date +%s.%N)
  (
    cd "$1"
    git -c safe.directory='*' status --porcelain >/dev/null
    find . -type f -exec stat -c %s {} + >/dev/null
    find . -type f -exec cat {} + >/dev/null
    grep -rl 'fn ' . >/dev/null || true
    for j in $(seq 20); do echo "turn $j" >"new-$j.txt"; done
  )
  seconds_since "$t0" >"$d/t-$2"
}
# cache_bytes: bytes in the node cache's files.
cache_bytes() { (find "$d/cache" -type f -printf '%s\n' 2>/dev/null || true) | awk '{t += $1} END {print t + 0}'; }
# turns ROOT-PATTERN: one turn alone on 1, then 2..N at once; sets alone,
# among (wall time of the N-1), fastest and slowest of them, and cached
# (bytes in the node cache when the N-1 start). With settle=1 the N-1
# start once the cache has stopped growing (the first mount's reads are
# added to it by a writer thread, behind the reads; at most 20 s), and
# settled says how long that took.
turns() {
  turn "$(printf "$1" 1)" 1; alone=$(cat "$d/t-1") settled=0
  if [ "${settle:-0}" = 1 ]; then
    local t0 before=-1 now; t0=$(date +%s.%N); now=$(cache_bytes)
    while [ "$now" != "$before" ] && [ "$(echo "$(seconds_since "$t0") < 20" | bc)" = 1 ]; do
      before=$now; sleep 0.5; now=$(cache_bytes)
    done
    settled=$(echo "$(seconds_since "$t0") - 0.5" | bc)
  fi
  cached=$(cache_bytes)
  local t0 pids=(); t0=$(date +%s.%N)
  for i in $(seq 2 "$n"); do turn "$(printf "$1" "$i")" "$i" & pids+=($!); done
  wait "${pids[@]}"; among=$(seconds_since "$t0")
  fastest=$(for i in $(seq 2 "$n"); do cat "$d/t-$i"; done | sort -g | head -1)
  slowest=$(for i in $(seq 2 "$n"); do cat "$d/t-$i"; done | sort -g | tail -1)
}
times_line() { # LABEL
  printf '%s: turn alone %.2f s; %d turns at once %.2f s (each %.2f-%.2f s)\n' \
    "$1" "$alone" "$((n - 1))" "$among" "$fastest" "$slowest"
}

round() { # LABEL SOURCE-PREFIX EXTRA-MOUNT-ARGS...
  local label=$1 src=$2; shift 2
  for i in $(seq "$n"); do
    m=$mnt/many/$i; mkdir -p "$m"; rm -rf "$d/up-$i"
    "$bin" mount "$src/s$i.packet" "$m" --upper "$d/up-$i" --part workspace "$@" >"$d/mount-$i.json"
  done
  turns "$mnt/many/%s"
  local rss=0 pss=0 cache=0 fetched=0 cache1=0 fetched1=0 line="$label: RSS MiB per daemon:" pid r st c f
  for i in $(seq "$n"); do
    pid=$(json_field pid <"$d/mount-$i.json")
    r=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
    rss=$((rss + r)); pss=$((pss + $(awk '/^Pss:/ {print $2}' "/proc/$pid/smaps_rollup")))
    line="$line $(printf '%.1f' "$(echo "$r / 1024" | bc -l)")"
    if [ "$src" != "$d/pk" ]; then
      st=$("$bin" status "$mnt/many/$i")
      c=$(echo "$st" | python3 -c 'import json,sys; print(json.load(sys.stdin)["remote"]["cache_bytes"])')
      f=$(echo "$st" | python3 -c 'import json,sys; print(json.load(sys.stdin)["remote"]["fetched_bytes"])')
      cache=$((cache + c)) fetched=$((fetched + f))
      [ "$i" != 1 ] || cache1=$c fetched1=$f
    fi
  done
  echo "$line"
  printf '%s: %d daemons, RSS %.1f MiB in all (PSS %.1f MiB), %.1f MiB each\n' \
    "$label" "$n" "$(echo "$rss / 1024" | bc -l)" "$(echo "$pss / 1024" | bc -l)" "$(echo "$rss / 1024 / $n" | bc -l)"
  times_line "$label"
  if [ "$src" != "$d/pk" ]; then
    printf '%s: cache hit rate %.1f%% (%.1f MiB from the cache, %.1f MiB fetched)\n' \
      "$label" "$(echo "100 * $cache / ($cache + $fetched)" | bc -l)" "$(echo "$cache / 1048576" | bc -l)" "$(echo "$fetched / 1048576" | bc -l)"
    printf '%s: the first mount alone %.1f MiB from the cache, %.1f MiB fetched; %.1f MiB in the cache when the %d others started (%.1f s after its turn); their hit rate %.1f%%\n' \
      "$label" "$(echo "$cache1 / 1048576" | bc -l)" "$(echo "$fetched1 / 1048576" | bc -l)" "$(echo "$cached / 1048576" | bc -l)" "$((n - 1))" "$settled" \
      "$(echo "100 * ($cache - $cache1) / ($cache - $cache1 + $fetched - $fetched1)" | bc -l)"
  fi
  for i in $(seq "$n"); do unmount "$mnt/many/$i"; done
}

for i in $(seq "$n"); do "$bin" unpack "$d/pk/s$i.packet" --into "$d/nat-$i" --part workspace >/dev/null; done
turns "$d/nat-%s"; times_line "plain directories (the packets unpacked)"; rm -rf "$d"/nat-*
round local "$d/pk"
remote="http://127.0.0.1:$port/pk"
round "remote, cold cache" "$remote" --cache "$d/cache" --prefetch none
round "remote, warm cache" "$remote" --cache "$d/cache" --prefetch none
rm -rf "$d/cache"; settle=1
round "remote, cold cache, the others once the first's reads are cached" "$remote" --cache "$d/cache" --prefetch none
echo "packets: $n of $(du -h "$d/pk/s1.packet" | cut -f1) each, $files files and a .git; $(nproc) cores"
