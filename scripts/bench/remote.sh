#!/usr/bin/env bash
# make bench-remote: remote packets (issue 25) on corpus S behind a stand-in
# object store (sessionfs-bench serve: ranged GETs, 10 ms to first byte,
# 1 Gbit/s shared; and raw loopback), against downloading the packet first
# (8 ranged GETs of 8 MiB at a time, as `aws s3 cp`) and mounting it.
# Results in .bench/remote.jsonl, a markdown table on stdout.
set -euo pipefail
. "$(dirname "$0")/config.sh"; . "$(dirname "$0")/lib.sh"
cd "$root"; d=$dir/remote; mkdir -p "$d" "$mnt/remote"; m=$mnt/remote
out=$dir/remote.jsonl; rm -f "$out"; export SESSIONFS_MAX_BYTES=64GiB SESSIONFS_MAX_ENTRIES=1000000
[ -d "$S" ] || "$tool" corpus --kind s --count "$s_files" --out "$S"
# S: turn 1's checkpoint (a git status ran on the mount, so the index
# holds the mount's stat data); S2: turn 2's, 1% of the files changed.
turn() { # FROM TO SCRIPT
  [ -f "$d/$2.packet" ] && return; unmount "$m"; rm -rf "$d/upper"
  "$bin" mount "$d/$1.packet" "$m" --upper "$d/upper" --part workspace >/dev/null
  (cd "$m" && eval "$3"); "$bin" seal "$m" -o "$d/$2.packet" >/dev/null; unmount "$m"
}
[ -f "$d/S0.packet" ] || "$bin" pack --workspace "$S" -o "$d/S0.packet" >/dev/null
turn S0 S "git status --short >/dev/null"
turn S S2 "find . -path ./.git -prune -o -type f -print | sort | awk 'NR % 100 == 0' | while read -r f; do echo '// turn 2' >>\"\$f\"; done"
first=$(cd "$S" && find . -path ./.git -prune -o -type f -print | sort | head -1)
pids=()
trap 'unmount $m; kill "${pids[@]}" 2>/dev/null || true' EXIT
start() { "$tool" serve --root "$d" --latency-ms "$1" --mbit "$2" --port-file "$d/port" & pids+=($!); sleep 0.3; cat "$d/port"; }
shaped=$(start 10 1000); raw=$(start 0 0)
stats() { curl -s "127.0.0.1:$1/__stats" | json_field "$2"; }
reset() { curl -s -X POST "127.0.0.1:$1/__reset" >/dev/null; }
cold() { unmount "$m"; rm -rf "$d/upper" "$d/cache" "$d/dl.packet"; drop_caches; }
rmount() { "$bin" mount "$1" "$m" --upper "$d/upper" --part workspace --cache "$d/cache" "${@:2}" >"$d/mount.json"; }
M() { "$tool" measure --out "$out" --runs "$runs" --warmup 0 "$@"; }
R() { "$tool" record --out "$out" "$@"; }
export -f unmount rmount cold drop_caches; export bin d m
for net in "shaped:$shaped" "loopback:$raw"; do
  n=${net%%:*} p=${net#*:} url=http://127.0.0.1:${net#*:}
  M --name "resume S, $n" --tool "sessionfs mount" --prepare cold --cleanup "unmount $m" \
    --cmd "rmount $url/S.packet && head -c1 $m/$first >/dev/null"
  M --name "resume S, $n" --tool "download, then mount" --prepare cold --cleanup "unmount $m" \
    --cmd "$tool download $url/S.packet $d/dl.packet && rmount $d/dl.packet && head -c1 $m/$first >/dev/null"
  M --name "resume S, $n" --tool "GET the manifest (digest)" --prepare cold --cmd "$bin digest $url/S.packet >/dev/null"
done
url=http://127.0.0.1:$shaped
# Read amplification: grep -r over the whole tree, cold, default block.
cold; rmount "$url/S.packet" --prefetch none; reset "$shaped"
t0=$(date +%s.%N); grep -rq zzzz-no-such-word "$m" || true; R --name "grep -r S, shaped" --tool "sessionfs mount (seconds)" --value "$(seconds_since "$t0")"
content=$(find "$m" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
R --name "grep -r S, shaped" --tool "bytes fetched / bytes read" --unit x --value "$(echo "scale=4; $(stats "$shaped" bytes) / $content" | bc)"
# The first git status after resuming.
cold; rmount "$url/S.packet"; reset "$shaped"; git -C "$m" status --short >/dev/null
R --name "first git status, shaped" --tool "requests" --unit n --value "$(stats "$shaped" requests)"
R --name "first git status, shaped" --tool "MiB fetched" --unit MiB --value "$(echo "scale=2; $(stats "$shaped" bytes) / 1048576" | bc)"
# The next turn on the same node: S read whole, then S2 with the cache warm.
cold; rmount "$url/S.packet"; tar -cf /dev/null -C "$m" .; unmount "$m"; rm -rf "$d/upper"
rmount "$url/S2.packet" --prefetch none; reset "$shaped"; tar -cf /dev/null -C "$m" .
changed=$(find "$S" -path "$S/.git" -prune -o -type f -print | sort | awk 'NR % 100 == 0' | xargs -d '\n' stat -c %s | awk '{s+=$1+10} END {print s}')
R --name "next turn, cache warm" --tool "bytes fetched / bytes changed" --unit x --value "$(echo "scale=4; $(stats "$shaped" bytes) / $changed" | bc)"
# Memory: 64 sequential readers of the 64 largest files, at once, cold.
cold; rmount "$url/S.packet" --max-memory 64MiB --prefetch none
(cd "$m" && find . -path ./.git -prune -o -type f -printf '%s %p\n' | sort -rn | head -64 | cut -d' ' -f2- | xargs -d '\n' -P 64 -n 1 cat >/dev/null)
R --name "64 readers, --max-memory 64MiB" --tool "daemon peak RSS" --unit MiB --value "$(peak_rss_mib "$(json_field pid <"$d/mount.json")")"
unmount "$m"
"$tool" report "$out" --baseline "download, then mount"
