#!/usr/bin/env bash
# make bench-remote: remote packets (issue 25) on corpus S behind a stand-in
# object store (sessionfs-bench serve: S3's reads, listings and multipart
# uploads, 10 ms to first byte, 1 Gbit/s each way; and raw loopback),
# against what a user does instead: download the packet (8 ranged GETs of
# 8 MiB at a time, as `aws s3 cp`) and mount it; mount the object with
# ratarmount through fsspec's S3 (s3fs); mount the bucket with mountpoint-s3
# and `sessionfs mount` the packet file in it; seal to a file and upload it
# whole. Results in .bench/remote.jsonl, a markdown table on stdout.
# BENCH_ONLY=grep runs the cold `grep -r` rows alone (issue 32's goal for
# --prefetch all), without the peers: a few minutes.
set -euo pipefail
. "$(dirname "$0")/config.sh"; . "$(dirname "$0")/lib.sh"
cd "$root"; d=$dir/remote; s3=$d/bench; mkdir -p "$s3" "$mnt/remote"; m=$mnt/remote
out=$dir/remote.jsonl; rm -f "$out"; peers=${BENCH_PEERS:-1}; only=${BENCH_ONLY:-}; [ "$only" != grep ] || peers=0; export SESSIONFS_MAX_BYTES=64GiB SESSIONFS_MAX_ENTRIES=1000000
[ -d "$S" ] || "$tool" corpus --kind s --count "$s_files" --out "$S"
# The peers that mount the bucket, installed when missing: s3fs beside
# ratarmount in .bench/venv; mount-s3 (bench/peers/mount-s3, mountpoint-s3's
# file system: see its Cargo.toml) built into .bench/mount-s3, 20 minutes
# on 2 cores the first time. A peer that does not install is left out.
mounts3=$root/.bench/mount-s3/bin/mount-s3 mp=$mnt/remote-s3; mkdir -p "$mp"
if [ "$peers" != 0 ]; then
  need_ratarmount s3fs
  dpkg -s cmake libclang-dev libfuse-dev >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends cmake libclang-dev libfuse-dev >/dev/null; }
  [ -x "$mounts3" ] || CARGO_TARGET_DIR=$root/.bench/mount-s3-target cargo install -q --locked --root "$root/.bench/mount-s3" --path bench/peers/mount-s3 \
    || log "mount-s3 did not build: no mountpoint-s3 rows"
fi
# A turn's changes: 1% of the files, in 10 runs of neighbours (a turn edits
# a few places), one line appended to each.
change() { (cd "$1" && find . -path ./.git -prune -o -type f -print | sort | awk -v n="$2" 'NR % int(n / 10) < n / 1000') | while read -r f; do echo "// turn 2" >>"$1/$f"; done; }
# S: turn 1's checkpoint (a git status ran on the mount, so the index holds
# the mount's stat data); S2: turn 2's.
turn() { # FROM TO COMMAND
  [ -f "$s3/$2.packet" ] && return; unmount "$m"; rm -rf "$d/upper"
  "$bin" mount "$s3/$1.packet" "$m" --upper "$d/upper" --part workspace >/dev/null
  (cd "$m" && eval "$3"); "$bin" seal "$m" -o "$s3/$2.packet" >/dev/null; unmount "$m"
}
[ -f "$s3/S0.packet" ] || "$bin" pack --workspace "$S" -o "$s3/S0.packet" >/dev/null
turn S0 S "git status --short >/dev/null"
[ "$only" = grep ] || turn S S2 "change . $s_files"
first=$(cd "$S" && find . -path ./.git -prune -o -type f -print | sort | sed -n 1p)
pids=()
trap 'unmount $m; unmount $mp; kill "${pids[@]}" 2>/dev/null || true' EXIT
start() { # LATENCY_MS MBIT NAME: a server, its port in $d/NAME.port
  rm -f "$d/$3.port"; "$tool" serve --root "$d" --latency-ms "$1" --mbit "$2" --port-file "$d/$3.port" >/dev/null 2>&1 &
  pids+=($!); while [ ! -s "$d/$3.port" ]; do sleep 0.05; done
}
start 10 1000 shaped; start 0 0 raw; shaped=$(cat "$d/shaped.port") raw=$(cat "$d/raw.port")
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
stats() { curl -s "127.0.0.1:$1/__stats" | json_field "$2"; }
reset() { curl -s -X POST "127.0.0.1:$1/__reset" >/dev/null; }
cold() { unmount "$m"; rm -rf "$d/upper" "$d/cache" "$d/dl.packet"; drop_caches; }
rmount() { "$bin" mount "$1" "$m" --upper "$d/upper" --part workspace --cache "$d/cache" "${@:2}" >"$d/mount.json"; }
M() { "$tool" measure --out "$out" --runs "$runs" --warmup 0 "$@"; }
R() { "$tool" record --out "$out" "$@"; }
# ratarmount stays in the foreground (it will not daemonize with s3fs's
# threads running) and is up when its mount point is. Its index goes to
# $XDG_CACHE_HOME/ratarmount (here $d/xdg), which ratcold removes: each run
# builds it.
ratmount() { XDG_CACHE_HOME=$d/xdg "$ratarmount" -f s3://bench/S.packet "$m" >"$d/ratarmount.log" 2>&1 & until mountpoint -q "$m"; do kill -0 $! 2>/dev/null || return 1; sleep 0.01; done; }
ratcold() { cold; rm -rf "$d/xdg/ratarmount"; mkdir -p "$d/xdg"; }
mps3() { "$mounts3" bench "$mp" --endpoint-url "$AWS_ENDPOINT_URL" --force-path-style --read-only >/dev/null; }
mpcold() { cold; unmount "$mp"; }
export -f unmount rmount cold drop_caches ratmount ratcold mps3 mpcold; export bin d m mp ratarmount mounts3
for net in "shaped:$shaped" "loopback:$raw"; do
  [ "$only" != grep ] || break
  n=${net%%:*} p=${net#*:}; export AWS_ENDPOINT_URL=http://127.0.0.1:$p
  M --name "resume S, $n" --tool "sessionfs mount" --prepare cold --cleanup "unmount $m" \
    --cmd "rmount s3://bench/S.packet && head -c1 $m/$first >/dev/null"
  M --name "resume S, $n" --tool "download, then mount" --prepare cold --cleanup "unmount $m" \
    --cmd "$tool download http://127.0.0.1:$p/bench/S.packet $d/dl.packet && rmount $d/dl.packet && head -c1 $m/$first >/dev/null"
  M --name "resume S, $n" --tool "GET the manifest (digest)" --prepare cold --cmd "$bin digest s3://bench/S.packet >/dev/null"
done
export AWS_ENDPOINT_URL=http://127.0.0.1:$shaped
# The peers that mount the bucket, shaped: ratarmount s3:// (s3fs), and
# mount-s3 with `sessionfs mount` of the packet file through it
# (BENCH_PEERS=0 leaves them out: 7 minutes).
[ "$peers" = 0 ] || M --name "resume S, shaped" --tool "ratarmount s3:// (s3fs; builds its index)" --prepare ratcold --cleanup "unmount $m" \
  --cmd "ratmount && head -c1 $m/workspace/$first >/dev/null"
[ "$peers" = 0 ] || [ ! -x "$mounts3" ] || M --name "resume S, shaped" --tool "mount-s3, then sessionfs mount of the file" --prepare mpcold --cleanup mpcold \
  --cmd "mps3 && rmount $mp/S.packet && head -c1 $m/$first >/dev/null"
# Read amplification: grep -r over the whole tree, cold, default block;
# timed from the mount's start, as the download below is.
# (The counters start after the mount: the amplification is the reads'.)
cold; t0=$(date +%s.%N); rmount s3://bench/S.packet --prefetch none; reset "$shaped"
grep -rq zzzz-no-such-word "$m" || true; R --name "grep -r S, shaped" --tool "sessionfs mount (seconds)" --value "$(seconds_since "$t0")"
content=$(find "$m" -type f -printf '%s\n' | awk '{s+=$1} END {print s}')
fetched() { R --name "grep -r S, shaped" --tool "$1" --unit "${3:-x}" --value "$(echo "scale=4; $2 / ${4:-$content}" | bc)"; } # TOOL BYTES [UNIT PER]
fetched "bytes fetched / bytes read" "$(stats "$shaped" bytes)"
# The same with the whole packet prefetched in the background.
cold; t0=$(date +%s.%N); rmount s3://bench/S.packet --prefetch all
grep -rq zzzz-no-such-word "$m" || true; R --name "grep -r S, shaped" --tool "sessionfs mount --prefetch all (seconds)" --value "$(seconds_since "$t0")"
# What a user does instead: download, mount, grep (the packet still in the
# page cache from the download); and the two apart, for the goal's bound:
# the download alone, and grep over a local mount of the packet with the
# page cache dropped (the packet on disk).
cold; t0=$(date +%s.%N); "$tool" download "http://127.0.0.1:$shaped/bench/S.packet" "$d/dl.packet"
R --name "grep -r S, shaped" --tool "download alone (seconds)" --value "$(seconds_since "$t0")"
rmount "$d/dl.packet"; grep -rq zzzz-no-such-word "$m" || true
R --name "grep -r S, shaped" --tool "download, mount, grep (seconds)" --value "$(seconds_since "$t0")"
unmount "$m"; rm -rf "$d/upper"; drop_caches; t0=$(date +%s.%N); rmount "$d/dl.packet"; grep -rq zzzz-no-such-word "$m" || true
R --name "grep -r S, shaped" --tool "local packet: mount, grep, cold page cache (seconds)" --value "$(seconds_since "$t0")"
if [ "$only" = grep ]; then
  unmount "$m"; "$tool" report "$out" --baseline "download, mount, grep (seconds)"; exit 0
fi
# The peers, from nothing to the end of grep (their mount included), and
# what they fetched: ratarmount's mount alone reads every header for its index.
if [ "$peers" = 1 ]; then
  ratcold; reset "$shaped"; t0=$(date +%s.%N); ratmount; b=$(stats "$shaped" bytes); grep -rq zzzz-no-such-word "$m/workspace" || true
  R --name "grep -r S, shaped" --tool "ratarmount s3://: mount, grep (seconds)" --value "$(seconds_since "$t0")"
  fetched "ratarmount s3://: MiB fetched by the mount" "$b" MiB 1048576; fetched "ratarmount s3://: bytes fetched / bytes read" "$(stats "$shaped" bytes)"
fi
if [ "$peers" = 1 ] && [ -x "$mounts3" ]; then
  mpcold; reset "$shaped"; t0=$(date +%s.%N); mps3; rmount "$mp/S.packet"; grep -rq zzzz-no-such-word "$m" || true
  R --name "grep -r S, shaped" --tool "mount-s3 + sessionfs mount: mount, grep (seconds)" --value "$(seconds_since "$t0")"
  fetched "mount-s3 + sessionfs mount: bytes fetched / bytes read" "$(stats "$shaped" bytes)"; mpcold
fi
# --prefetch: the next turn reads again what the last one read (turn 2 of
# S read 1,000 files, which S2.packet.trace names). Mount S2 cold, let the
# agent start (1 s: a harness's start and its first model call; or none),
# then read those files; timed from the first read.
(cd "$S" && find . -path ./.git -prune -o -type f -print | sort | awk -v n="$s_files" 'NR % int(n / 10) < n / 1000') >"$d/replay.list"
for i in $(seq "$runs"); do
  for start in 1 0; do
    for pf in none trace all; do
      cold; rmount s3://bench/S2.packet --prefetch "$pf"; sleep "$start"
      t0=$(date +%s.%N); (cd "$m" && xargs -a "$d/replay.list" -d '\n' cat >/dev/null)
      R --name "the last turn's reads again, ${start} s after the mount, shaped" --tool "sessionfs mount --prefetch $pf (seconds)" --value "$(seconds_since "$t0")"
    done
  done
done
# The first git status after resuming.
cold; rmount s3://bench/S.packet --prefetch none; reset "$shaped"; git -C "$m" status --short >/dev/null
R --name "first git status, shaped" --tool "requests" --unit n --value "$(stats "$shaped" requests)"
R --name "first git status, shaped" --tool "MiB fetched" --unit MiB --value "$(echo "scale=2; $(stats "$shaped" bytes) / 1048576" | bc)"
# The next turn on the same node: S read whole, then S2 with the cache warm.
# What changed between them: the changed files' members (header, content,
# padding), the bytes of S2 that S does not have.
# (tar to a pipe: GNU tar writing to /dev/null reads no file.)
readall() { tar -cf - -C "$m" . | cat >/dev/null; }
cold; rmount s3://bench/S.packet; readall; unmount "$m"; rm -rf "$d/upper"
rmount s3://bench/S2.packet --prefetch none; reset "$shaped"; readall
changed=$(find "$m" -path "$m/.git" -prune -o -type f -print | sort | awk -v n="$s_files" 'NR % int(n / 10) < n / 1000' | xargs -d '\n' stat -c %s | awk '{s+=int(($1+511)/512)*512+512} END {print s}')
R --name "next turn, cache warm" --tool "bytes fetched / bytes changed" --unit x --value "$(echo "scale=4; $(stats "$shaped" bytes) / $changed" | bc)"
# Seal to s3:// after the turn's changes, against sealing to a file and
# uploading it whole (8 parts of 8 MiB at a time).
packet=$(stat -c %s "$s3/S.packet")
for i in $(seq "$runs"); do
  cold; rmount s3://bench/S.packet --prefetch none; change "$m" "$s_files"; rm -rf "$d/.extents" "$d/.uploads" "$s3/out.packet" "$s3/out.packet.trace"
  t0=$(date +%s.%N); "$bin" seal "$m" -o s3://bench/out.packet >"$d/seal.json"; seal_s=$(seconds_since "$t0")
  R --name "seal to s3:// after 1% changed, shaped" --tool "sessionfs seal -o s3:// (seconds)" --value "$seal_s"
  R --name "seal to s3:// after 1% changed, shaped" --tool "uploaded MiB" --unit MiB --value "$(echo "scale=2; $(json_field uploaded_bytes <"$d/seal.json") / 1048576" | bc)"
  R --name "seal to s3:// after 1% changed, shaped" --tool "packet / uploaded" --unit x --value "$(echo "scale=2; $packet / $(json_field uploaded_bytes <"$d/seal.json")" | bc)"
  "$bin" seal "$m" -o "$d/local.packet" >/dev/null; "$tool" download "http://127.0.0.1:$raw/bench/out.packet" "$d/got.packet"
  cmp -s "$d/local.packet" "$d/got.packet" || { echo "bench: the uploaded seal differs from the local one" >&2; exit 1; }
  t0=$(date +%s.%N); "$tool" upload "$d/local.packet" "http://127.0.0.1:$shaped/bench/whole.packet"
  R --name "seal to s3:// after 1% changed, shaped" --tool "upload the whole packet (seconds)" --value "$(seconds_since "$t0")"
  rm -rf "$d/local.packet" "$d/got.packet" "$d/.extents" "$d/.uploads"
done
# Memory: 64 sequential readers of the 64 largest files, at once, cold.
cold; rmount s3://bench/S.packet --max-memory 64MiB --prefetch none
(cd "$m" && find . -path ./.git -prune -o -type f -printf '%s %p\n' | sort -rn | sed -n 1,64p | cut -d' ' -f2- | xargs -d '\n' -P 64 -n 1 cat >/dev/null)
R --name "64 readers, --max-memory 64MiB" --tool "daemon peak RSS" --unit MiB --value "$(peak_rss_mib "$(json_field pid <"$d/mount.json")")"
unmount "$m"
"$tool" report "$out" --baseline "download, then mount"
