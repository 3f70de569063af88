#!/usr/bin/env bash
# make bench-chunks (and make bench): copy-up and seal by chunk (issue 33), against
# file-level copy-up (fuse-overlayfs over the same tree). Three rows: 1 byte appended
# to a 1 GiB file; a 1 GiB SQLite database (WAL) changed as a harness's history is,
# then uniformly at random, sealed to s3:// through the shaped store (sessionfs-bench
# serve), with the bytes finer granularities would copy; a 256 MiB log grown 64 KiB
# a turn for 10 turns, sealed to s3:// with --rebase. Rows go to $results.
set -euo pipefail
. "$(dirname "$0")/config.sh"; . "$(dirname "$0")/lib.sh"
cd "$root"; d=$dir/chunks; m=$mnt/chunks; s3=$d/store/bench; mkdir -p "$s3" "$m" "$d/ws"
command -v fuse-overlayfs >/dev/null || { apt-get update -qq && apt-get install -y -qq fuse-overlayfs >/dev/null; }
R() { "$tool" record --out "$results" "$@"; } ; hb() { json_field bytes_hashed <"$d/s.json"; }
mb=$((quick ? 64 : 1024)) size=$((quick ? 64 << 20 : 1 << 30))
# A packet of a 1 GiB file and its seal hold a byte more than the default --max-bytes.
export SESSIONFS_MAX_BYTES=$((4 << 30))
trap 'unmount $m; kill $srv 2>/dev/null || true; rm -rf "$d"' EXIT
"$tool" serve --root "$d/store" --latency-ms 10 --mbit 1000 --port-file "$d/port" >/dev/null 2>&1 & srv=$!
while [ ! -s "$d/port" ]; do sleep 0.05; done
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 AWS_CONFIG_FILE=/dev/null \
  AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_ENDPOINT_URL=http://127.0.0.1:$(cat "$d/port")
# Two sizes: a whole number of chunks (the byte starts a new chunk) and 100
# bytes short of it (the write copies up the last, partial chunk: 4 MiB
# read and verified from a cold disk). Then a second turn on the rebased
# mount: its parent is the packet this daemon wrote, so nothing is verified.
for sz in "$size" "$((size - 100))"; do
  log "chunks: 1 byte appended to a file of $sz bytes, on a cold cache"
  rm -rf "$d/ws"; mkdir -p "$d/ws"; head -c "$sz" /dev/urandom >"$d/ws/big.bin"; "$bin" pack --workspace "$d/ws" -o "$d/big.packet" >/dev/null
  sw=() su=() ss=() sh=() sv=() s2=() h2=() v2=() ow=() ou=()
  for run in $(seq "$slow_runs"); do
    unmount "$m"; rm -rf "$d/up" "$d/ovl" "$d/s.packet" "$d/s2.packet"; mkdir -p "$d/ovl/u" "$d/ovl/w"
    "$bin" mount "$d/big.packet" "$m" --upper "$d/up" --part workspace >/dev/null; drop_caches
    t0=$(date +%s.%N); printf x >>"$m/big.bin"; sw+=("$(seconds_since "$t0")"); su+=("$(du -sB1 "$d/up/data" | cut -f1)")
    t0=$(date +%s.%N); "$bin" seal "$m" -o "$d/s.packet" --rebase >"$d/s.json"; ss+=("$(seconds_since "$t0")"); sh+=("$(hb)"); sv+=("$(json_field bytes_verified <"$d/s.json")")
    printf y >>"$m/big.bin"
    t0=$(date +%s.%N); "$bin" seal "$m" -o "$d/s2.packet" --rebase >"$d/s.json"; s2+=("$(seconds_since "$t0")"); h2+=("$(hb)"); v2+=("$(json_field bytes_verified <"$d/s.json")")
    unmount "$m"
    if [ "$sz" = "$size" ]; then
      fuse-overlayfs -o "lowerdir=$d/ws,upperdir=$d/ovl/u,workdir=$d/ovl/w" "$m"; drop_caches
      t0=$(date +%s.%N); printf x >>"$m/big.bin"; ow+=("$(seconds_since "$t0")"); unmount "$m"; ou+=("$(du -sB1 "$d/ovl/u" | cut -f1)")
    fi
  done
  n="append 1 byte to a file of $sz bytes (cold cache)"
  R --name "$n: the write" --tool sessionfs --value "${sw[@]}"
  R --name "$n: upper bytes" --tool sessionfs --unit B --value "${su[@]}"
  if [ "$sz" = "$size" ]; then
    R --name "$n: the write" --tool fuse-overlayfs --value "${ow[@]}"
    R --name "$n: upper bytes" --tool fuse-overlayfs --unit B --value "${ou[@]}"
  fi
  R --name "$n: seal --rebase" --tool "sessionfs (seconds)" --value "${ss[@]}"; R --name "$n: seal --rebase" --tool "bytes hashed" --unit B --value "${sh[@]}"
  R --name "$n: seal --rebase" --tool "parent bytes verified" --unit B --value "${sv[@]}"
  R --name "$n: the next turn's seal (1 more byte)" --tool "sessionfs (seconds)" --value "${s2[@]}"
  R --name "$n: the next turn's seal (1 more byte)" --tool "bytes hashed" --unit B --value "${h2[@]}"
  R --name "$n: the next turn's seal (1 more byte)" --tool "parent bytes verified" --unit B --value "${v2[@]}"
done
rm -rf "$d/ws" "$d/big.packet" "$d/s.packet" "$d/up" "$d/ovl"; mkdir -p "$d/ws"
# A harness's history: rows of a thread's turns, the newest last.
rows=$((size / 1100)); sqlite3 "$d/ws/history.db" "PRAGMA journal_mode=WAL; CREATE TABLE h(id INTEGER PRIMARY KEY, thread INT, body BLOB);
  WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $rows) INSERT INTO h SELECT i, i % 64, randomblob(1000) FROM n;" >/dev/null
"$bin" pack --workspace "$d/ws" -o "$s3/db.packet" >/dev/null; dbsize=$(stat -c %s "$d/ws/history.db")
for how in "newest|UPDATE h SET body = randomblob(1000) WHERE id > (SELECT max(id) - 1000 FROM h)" \
           "uniformly random|UPDATE h SET body = randomblob(1000) WHERE id IN (SELECT abs(random()) % $rows + 1 FROM h LIMIT 1000)"; do
  n="SQLite $mb MiB (WAL): 1,000 inserts, 1,000 updates of the ${how%%|*} rows"
  unmount "$m"; rm -rf "$d/up" "$d/cache"
  "$bin" mount s3://bench/db.packet "$m" --upper "$d/up" --part workspace --cache "$d/cache" --prefetch none >/dev/null
  sqlite3 "$m/history.db" "PRAGMA journal_mode=WAL; BEGIN; INSERT INTO h(thread, body) SELECT 7, randomblob(1000) FROM h LIMIT 1000; ${how#*|}; COMMIT;" >/dev/null
  up=$(du -sB1 "$d/up/data" | cut -f1); "$bin" seal "$m" -o s3://bench/db2.packet >"$d/s.json"
  python3 - "$d/ws/history.db" "$m/history.db" >"$d/gran" <<'EOF'
import sys
a, b = open(sys.argv[1], "rb"), open(sys.argv[2], "rb")
diff = {g: set() for g in (4096, 65536, 1 << 20, 4 << 20)}
pos = 0
while True:
    x, y = a.read(4096), b.read(4096)
    if not x and not y: break
    if x != y:
        for g in diff: diff[g].add(pos // g)
    pos += 4096
for g, s in diff.items(): print(g >> 10, len(s) * g)
EOF
  R --name "$n" --tool "upper bytes (% of the db: $((100 * up / dbsize)))" --unit B --value "$up"
  R --name "$n" --tool "bytes hashed by the seal" --unit B --value "$(hb)"
  R --name "$n" --tool "parent bytes copied by the store, unverified" --unit B --value "$(json_field unverified_copied_bytes <"$d/s.json")"
  R --name "$n" --tool "bytes uploaded by the seal to s3://" --unit B --value "$(json_field uploaded_bytes <"$d/s.json")"
  while read -r k b; do R --name "$n" --tool "copy-up at $k KiB granularity would copy" --unit B --value "$b"; done <"$d/gran"
  unmount "$m"; rm -f "$s3/db2.packet"* "$d/store/.extents/bench/db2.packet"*
done
rm -rf "$d/ws" "$s3/db.packet"*; mkdir -p "$d/ws"
log "chunks: an append-only log grown 64 KiB a turn, sealed to s3:// with --rebase"
head -c $((size / 4)) /dev/urandom >"$d/ws/rollout.jsonl"; "$bin" pack --workspace "$d/ws" -o "$s3/log0.packet" >/dev/null
rm -rf "$d/up" "$d/cache"; "$bin" mount s3://bench/log0.packet "$m" --upper "$d/up" --part workspace --cache "$d/cache" >/dev/null
for turn in $(seq 10); do
  head -c 65536 /dev/urandom >>"$m/rollout.jsonl"; "$bin" seal "$m" -o "s3://bench/log$turn.packet" --rebase >"$d/s.json"
  lh+=("$(hb)"); lu+=("$(json_field uploaded_bytes <"$d/s.json")"); lv+=("$(json_field unverified_copied_bytes <"$d/s.json")")  # (the objects share the store's extents)
done
n="append-only log of $((mb / 4)) MiB, 64 KiB a turn, seal --rebase to s3:// (10 turns)"
R --name "$n" --tool "bytes hashed per turn" --unit B --value "${lh[@]}"; R --name "$n" --tool "bytes uploaded per turn" --unit B --value "${lu[@]}"
R --name "$n" --tool "parent bytes copied by the store, unverified, per turn" --unit B --value "${lv[@]}"
