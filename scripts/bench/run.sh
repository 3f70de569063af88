#!/usr/bin/env bash
# make bench: sessionfs against the tools a user would pick instead, on the
# same data, in one run; writes docs/benchmarks.md and its charts.
# make bench-quick: the same code on tiny corpora (QUICK=1), inside make
# test, so the benchmark cannot rot; its report goes to .bench/quick/.
#
# Needs root (drop_caches, mounts). Installs the peers it needs (Debian
# packages, ratarmount from PyPI into .bench/venv). Timing and reports are
# in sessionfs-bench (bench/, a workspace member); this script sets up state.
set -euo pipefail
# shellcheck source=config.sh
. "$(dirname "$0")/config.sh"
lib=$root/scripts/bench/lib.sh
# shellcheck source=lib.sh
. "$lib"
cd "$root"
mkdir -p "$dir"
# BENCH_RESUME=1 keeps the results of an interrupted run and measures only
# what they lack (sessionfs-bench skips a workload and tool it has).
if [ "${BENCH_RESUME:-0}" != 1 ]; then rm -f "$results" "$failures"; fi
export SESSIONFS_MAX_BYTES=64GiB SESSIONFS_MAX_ENTRIES=1000000

# Runs a step; a peer that fails is reported, not fatal. sessionfs failing is.
try() {
  if ! "$@"; then
    echo "- a step failed: \`${*:1:5}\`…" >>"$failures"
    log "FAILED: $*"
  fi
}
measure() { "$tool" measure --out "$results" "$@"; }
# Whether a resumed run already has this workload and tool (to skip the
# set-up of steps sessionfs-bench would skip anyway).
have_result() { [ "${BENCH_RESUME:-0}" = 1 ] && grep -qF "{\"name\":\"$1\",\"tool\":\"$2\"" "$results" 2>/dev/null; }
record() { "$tool" record --out "$results" "$@"; }

# -- peers -------------------------------------------------------------------
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have fuse-overlayfs || need+=(fuse-overlayfs)
have squashfuse_ll || need+=(squashfuse)
have mksquashfs || need+=(squashfs-tools)
have archivemount || need+=(archivemount)
have gnuplot || need+=(gnuplot-nox)
have fusermount || need+=(fuse3)
have git || need+=(git)
have bc || need+=(bc)
have pgrep || need+=(procps)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
need_ratarmount

# -- corpora -----------------------------------------------------------------
corpus() { # KIND COUNT DIR [extra]
  [ -d "$3" ] || { log "generating corpus $1 ($2) in $3"; "$tool" corpus --kind "$1" --count "$2" --out "$3" "${@:4}"; }
}
corpus s "$s_files" "$S"
corpus m "$m_entries" "$M"
corpus b "$b_count" "$B" --size "$b_size"
if [ ! -d "$W" ]; then corpus s "$write_files" "$W.tmp" && rm -rf "$W.tmp/.git" && mv "$W.tmp" "$W"; fi

# Each corpus as a packet, a tar (for tar -x, ratarmount, archivemount), a
# squashfs image (uncompressed: the fastest squashfs can read) and an
# extracted copy (native).
images() { # NAME DIR
  local n=$1 d=$2
  [ -f "$dir/$n.packet" ] || "$bin" pack --workspace "$d" -o "$dir/$n.packet" >/dev/null
  [ -f "$dir/$n.tar" ] || tar -cf "$dir/$n.tar" -C "$d" .
  [ -f "$dir/$n.sqfs" ] || mksquashfs "$d" "$dir/$n.sqfs" -noappend -quiet -no-progress -noI -noD -noF -noX >/dev/null
  [ -d "$dir/$n.native" ] || { mkdir "$dir/$n.native" && tar -xf "$dir/$n.tar" -C "$dir/$n.native"; }
}
log "building packets, tars, squashfs images, native copies"
images S "$S"; images M "$M"; images B "$B"
"$venv/bin/python3" -c 'print()' >/dev/null

# -- mounting the peers ----------------------------------------------------------
mkdir -p "$mnt"/{sessionfs,squashfuse_ll,fuse-overlayfs,ratarmount,archivemount}
export bin dir mnt ratarmount
for t in sessionfs squashfuse_ll fuse-overlayfs ratarmount archivemount; do unmount "$mnt/$t"; done
# ratarmount's index, made once untimed so that "cached index" means it.
[ -f "$dir/S.tar.index.sqlite" ] || { mount_as ratarmount S >/dev/null && unmount_as ratarmount; }
[ -f "$dir/M.tar.index.sqlite" ] || { mount_as ratarmount M >/dev/null && unmount_as ratarmount; }
[ -f "$dir/B.tar.index.sqlite" ] || { mount_as ratarmount B >/dev/null && unmount_as ratarmount; }

# -- command to first byte ---------------------------------------------------
first_file() { (cd "$1" && find . -type f -not -path './.git/*' | LC_ALL=C sort | sed -n 1p); }
first_byte() { # NAME
  local n=$1 f; f=$(first_file "$dir/$n.native")
  log "first byte, $n ($f)"
  local read="head -c1 $mnt/%s/$f >/dev/null"
  measure --name "first byte $n" --tool sessionfs --runs "$runs" \
    --cmd "$bin mount $dir/$n.packet $mnt/sessionfs --upper $dir/fb-upper --part workspace >/dev/null && $(printf "$read" sessionfs)" \
    --cleanup "$bin umount $mnt/sessionfs >/dev/null; rm -rf $dir/fb-upper"
  measure --name "first byte $n" --tool "tar -x" --runs "$slow_runs" --warmup 0 \
    --cmd "mkdir $dir/x && tar -xf $dir/$n.tar -C $dir/x && head -c1 $dir/x/$f >/dev/null" --cleanup "rm -rf $dir/x"
  try measure --name "first byte $n" --tool squashfuse_ll --runs "$runs" \
    --cmd "squashfuse_ll $dir/$n.sqfs $mnt/squashfuse_ll && $(printf "$read" squashfuse_ll)" --cleanup "fusermount3 -u $mnt/squashfuse_ll"
  try measure --name "first byte $n" --tool "ratarmount (cached index)" --runs "$runs" \
    --cmd "$ratarmount $dir/$n.tar $mnt/ratarmount >/dev/null 2>&1 && $(printf "$read" ratarmount)" --cleanup "fusermount -u $mnt/ratarmount"
  try measure --name "first byte $n" --tool "ratarmount (first mount)" --runs 1 --warmup 0 \
    --prepare "mv $dir/$n.tar.index.sqlite $dir/$n.index.keep" \
    --cmd "$ratarmount $dir/$n.tar $mnt/ratarmount >/dev/null 2>&1 && $(printf "$read" ratarmount)" \
    --cleanup "fusermount -u $mnt/ratarmount; mv -f $dir/$n.index.keep $dir/$n.tar.index.sqlite"
  try measure --name "first byte $n" --tool archivemount --runs 1 --warmup 0 \
    --cmd "archivemount -o ro $dir/$n.tar $mnt/archivemount && $(printf "$read" archivemount)" --cleanup "fusermount -u $mnt/archivemount"
}
first_byte S
first_byte M

# -- metadata and content, warm and cold ------------------------------------
tools_ro="native sessionfs squashfuse_ll fuse-overlayfs ratarmount"
grep_cmd="grep -r -q zzzz-not-there %s || true"
readall_cmd="find %s -type f -exec cat {} + >/dev/null"
for t in $tools_ro; do
  log "warm and cold workloads on S: $t"
  r=$(mount_as "$t" S) || { echo "- mounting S with $t failed" >>"$failures"; continue; }
  # ratarmount takes up to a minute a run here: fewer runs, said in the table.
  runs_t=$runs slow_t=$slow_runs
  [ "$t" = ratarmount ] && runs_t=$slow_runs slow_t=1
  try measure --name "warm find S" --tool "$t" --runs "$runs_t" --cmd "find $r >/dev/null"
  try measure --name "warm stat of every entry S" --tool "$t" --runs "$runs_t" --cmd "find $r -printf '%s %i %T@\n' >/dev/null"
  try measure --name "warm ls -lR S" --tool "$t" --runs "$runs_t" --cmd "ls -lR $r >/dev/null"
  try measure --name "warm du S" --tool "$t" --runs "$runs_t" --cmd "du -s $r >/dev/null"
  try measure --name "warm grep -r S" --tool "$t" --runs "$runs_t" --cmd "$(printf "$grep_cmd" "$r")"
  try measure --name "warm read all S" --tool "$t" --runs "$runs_t" --cmd "$(printf "$readall_cmd" "$r")"
  try measure --name "warm git status S" --tool "$t" --runs "$runs_t" --cmd "git -C $r -c safe.directory='*' status --porcelain >/dev/null 2>&1 || true"
  if [ "$t" != native ]; then
    pid=$(daemon_pid "$t" S) && record --name "daemon peak RSS S (after the above)" --tool "$t" --unit MiB --value "$(peak_rss_mib "$pid")"
  fi
  # Cold: a fresh mount (nothing cached in the daemon either) after the
  # kernel's caches are dropped.
  remount=". $lib; unmount_as $t; drop_caches; mount_as $t S >/dev/null"
  for w in "cold find S|find $r >/dev/null" "cold grep -r S|$(printf "$grep_cmd" "$r")" "cold read all S|$(printf "$readall_cmd" "$r")"; do
    try measure --name "${w%%|*}" --tool "$t" --runs "$slow_t" --warmup 0 --prepare "bash -c '$remount'" --cmd "${w#*|}"
  done
  unmount_as "$t"
done

log "big files (B): sequential and random reads"
bigf=big0.bin
for t in $tools_ro; do
  r=$(mount_as "$t" B) || continue
  try measure --name "warm sequential read of a 1 GiB file" --tool "$t" --runs "$runs" --bytes "$b_size" \
    --cmd "dd if=$r/$bigf of=/dev/null bs=1M status=none"
  remount=". $lib; unmount_as $t; drop_caches; mount_as $t B >/dev/null"
  try measure --name "cold sequential read of a 1 GiB file" --tool "$t" --runs "$slow_runs" --warmup 0 --bytes "$b_size" \
    --prepare "bash -c '$remount'" --cmd "dd if=$r/$bigf of=/dev/null bs=1M status=none"
  try measure --name "first random 4 KiB read in a 1 GiB file (cold mount)" --tool "$t" --runs "$runs" --warmup 0 \
    --prepare "bash -c '$remount'" --cmd "dd if=$r/$bigf of=/dev/null bs=4096 skip=$((b_size / 4096 / 2 + 3)) count=1 status=none"
  unmount_as "$t"
done

# -- pack and verify ---------------------------------------------------------
log "pack and verify S"
sbytes=$(du -sb --apparent-size "$S" | cut -f1)
# The previous run's packet is removed outside the timing: replacing it
# would add the freeing of 1 GiB of blocks (0.16 s here) to pack's time,
# which tar's pipeline, writing nothing, does not pay.
measure --name "pack S" --tool sessionfs --runs "$runs" --bytes "$sbytes" --prepare "rm -f $dir/p.packet" --cmd "$bin pack --workspace $S -o $dir/p.packet"
measure --name "pack S" --tool "tar -cf - | sha256sum" --runs "$runs" --bytes "$sbytes" --cmd "tar -cf - -C $S . | sha256sum"
measure --name "verify S" --tool sessionfs --runs "$runs" --bytes "$sbytes" --cmd "$bin verify $dir/p.packet"
measure --name "verify S" --tool "tar -cf - | sha256sum" --runs "$runs" --bytes "$sbytes" --cmd "tar -cf - -C $S . | sha256sum"
measure --name "verify S" --tool "sha256sum FILE" --runs "$runs" --bytes "$sbytes" --cmd "sha256sum $dir/S.tar"
rm -f "$dir/p.packet"

# -- seal --------------------------------------------------------------------
# change_files ROOT K SEED: rewrites every K-th regular file outside .git
# with new bytes of the same size (1% for K=100); prints the bytes changed.
change_files() {
  (cd "$1" && find . -type f -not -path './.git/*' | LC_ALL=C sort | awk -v k="$2" -v s="$3" 'NR % k == s % k') |
    while read -r f; do
      n=$(stat -c %s "$1/$f"); head -c "$n" /dev/urandom >"$1/$f.new" && mv "$1/$f.new" "$1/$f"; echo "$n"
    done | awk '{t += $1} END {print t + 0}'
}
# (a function, so that a resumed run that has its results skips it whole)
seal_one_percent() {
log "seal after changing 1% of S"
r=$(mount_as sessionfs S)
changed=$(change_files "$r" 100 1)
# (each run writes a new file, as a turn does; the floor's copy is removed too)
measure --name "seal after changing 1% of S" --tool sessionfs --runs "$runs" \
  --cmd "$bin seal $r -o $dir/sealed.packet >/dev/null" --cleanup "rm -f $dir/sealed.packet"
"$bin" seal "$r" -o "$dir/sealed.packet" >"$dir/seal.json"
manifest=$("$bin" inspect "$dir/sealed.packet" | json_field manifest_bytes)
python3 - "$dir/seal.json" "$changed" "$manifest" <<'EOF' | while IFS=$'\t' read -r what value; do record --name "seal after changing 1% of S: bytes" --tool "$what" --value "$value" --unit B; done
import json, sys
s = json.load(open(sys.argv[1]))
print("content bytes changed on the mount", sys.argv[2], sep="\t")
print("bytes hashed by the seal", s["bytes_hashed"], sep="\t")
print("bytes copied from the parent packet", s["bytes_copied"], sep="\t")
print("bytes verified while copying", s["bytes_verified"], sep="\t")
print("packet bytes written", s["packet_bytes"], sep="\t")
print("manifest bytes of the sealed packet", sys.argv[3], sep="\t")
EOF
pk=$dir/S.packet
measure --name "seal after changing 1% of S" --tool "I/O floor (cp + fsync of the packet)" --runs "$runs" \
  --cmd "dd if=$pk of=$dir/floor.packet bs=4M conv=fsync status=none" --cleanup "rm -f $dir/floor.packet"
merged=$dir/merged.native
rm -rf "$merged" && "$bin" unpack "$dir/sealed.packet" --into "$dir/merged" --part workspace >/dev/null && mv "$dir/merged" "$merged"
measure --name "seal after changing 1% of S" --tool "full pack of the merged view (sessionfs pack)" --runs "$slow_runs" \
  --cmd "$bin pack --workspace $merged -o $dir/full.packet" --cleanup "rm -f $dir/full.packet"
measure --name "seal after changing 1% of S" --tool "tar -cf - | sha256sum of the merged view" --runs "$slow_runs" \
  --cmd "tar -cf - -C $merged . | sha256sum"
rm -rf "$merged"
unmount_as sessionfs
}
have_result "seal after changing 1% of S: bytes" "bytes hashed by the seal" || seal_one_percent

seal_rebase_turns() {
log "seal --rebase, turn after turn"
r=$(mount_as sessionfs S)
turn_times=()
for turn in 1 2 3 4; do
  change_files "$r" 100 "$((turn * 7))" >/dev/null
  start=$(date +%s.%N)
  "$bin" seal "$r" -o "$dir/turn$turn.packet" --rebase >"$dir/turn.json"
  turn_times+=("$(seconds_since "$start")")
  [ "$turn" -gt 1 ] && rm -f "$dir/turn$((turn - 1)).packet"
done
record --name "seal --rebase after changing 1% of S" --tool "sessionfs, turn 1" --value "${turn_times[0]}"
record --name "seal --rebase after changing 1% of S" --tool "sessionfs, turns 2-4" --value "${turn_times[@]:1}"
unmount_as sessionfs
rm -f "$dir"/turn*.packet "$dir/sealed.packet"
}
have_result "seal --rebase after changing 1% of S" "sessionfs, turn 1" || seal_rebase_turns

# -- write path --------------------------------------------------------------
log "write path: copy $write_files files in, git add, rm -rf"
for t in native sessionfs fuse-overlayfs; do
  r=$(mount_as "$t" S) || continue
  try measure --name "write path: cp -a $write_files files, git add, rm -rf" --tool "$t" --runs "$slow_runs" \
    --cmd "cp -a $W $r/newtree && git -C $r -c safe.directory='*' add -A newtree && rm -rf $r/newtree && git -C $r -c safe.directory='*' add -A newtree"
  unmount_as "$t"
done

# -- memory on M -------------------------------------------------------------
log "daemon memory on M"
for t in sessionfs squashfuse_ll fuse-overlayfs ratarmount; do
  have_result "daemon peak RSS M (stat and read everything)" "$t" && continue
  r=$(mount_as "$t" M) || continue
  find "$r" -printf '%s\n' >/dev/null && find "$r" -type f -exec cat {} + >/dev/null
  pid=$(daemon_pid "$t" M) && try record --name "daemon peak RSS M (stat and read everything)" --tool "$t" --unit MiB --value "$(peak_rss_mib "$pid")"
  unmount_as "$t"
done

# -- scale ---------------------------------------------------------------------
# scale_point CHANGE: mounts scale.packet cold (timed), stats every entry,
# runs CHANGE (a command, given the mounted root), seals (timed); sets ms,
# rss and seal.
scale_point() {
  drop_caches
  local start; start=$(date +%s.%N)
  "$bin" mount "$dir/scale.packet" "$mnt/sessionfs" --upper "$dir/scale-upper" --part workspace >"$dir/scale-mount.json"
  ms=$(echo "$(seconds_since "$start") * 1000" | bc)
  find "$mnt/sessionfs" -printf '%s\n' >/dev/null
  rss=$(peak_rss_mib "$(json_field pid <"$dir/scale-mount.json")")
  $1 "$mnt/sessionfs"
  start=$(date +%s.%N)
  "$bin" seal "$mnt/sessionfs" -o "$dir/scale-sealed.packet" >/dev/null
  seal=$(seconds_since "$start")
  unmount "$mnt/sessionfs"; rm -rf "$dir/scale-upper" "$dir/scale-sealed.packet"
}
append_line() { echo x >>"$1/d0/e0/f2"; }
overwrite_7_bytes() { printf 'changed' | dd of="$1/big0.bin" bs=1 seek=4096 conv=notrunc status=none; }

have_result "scale: mount, entries" "${scale_entries##* } entries" || echo "# entries mount_ms rss_mib seal_s" >"$scale"
for n in $scale_entries; do
  have_result "scale: mount, entries" "$n entries" && continue
  c=$dir/scale-M-$n
  [ "$n" = "$m_entries" ] && c=$M
  corpus m "$n" "$c"
  "$bin" pack --workspace "$c" -o "$dir/scale.packet" >/dev/null
  scale_point append_line
  rm -f "$dir/scale.packet"
  [ "$quick" = 1 ] || [ "$c" = "$M" ] || rm -rf "$c"
  echo "$n $ms $rss $seal" >>"$scale"
  record --name "scale: mount, entries" --tool "$n entries" --value "$(echo "$ms / 1000" | bc -l)"
  record --name "scale: daemon RSS after find, entries" --tool "$n entries" --unit MiB --value "$rss"
  record --name "scale: seal of one changed file, entries" --tool "$n entries" --value "$seal"
done
have_result "scale: mount, content" "${scale_units##* } $unit_name" || echo "# content_units mount_ms rss_mib seal_s floor_s" >"$scale_b"
for g in $scale_units; do
  have_result "scale: mount, content" "$g $unit_name" && continue
  c=$dir/scale-B-$g
  corpus b "$g" "$c" --size "$scale_unit"
  "$bin" pack --workspace "$c" -o "$dir/scale.packet" >/dev/null
  rm -rf "$c" # before the seal: at 16 GiB the disk holds two packets, not three trees
  scale_point overwrite_7_bytes
  start=$(date +%s.%N)
  dd if="$dir/scale.packet" of="$dir/scale-floor" bs=4M conv=fsync status=none
  floor=$(seconds_since "$start")
  rm -f "$dir/scale.packet" "$dir/scale-floor"
  echo "$g $ms $rss $seal $floor" >>"$scale_b"
  record --name "scale: mount, content" --tool "$g $unit_name" --value "$(echo "$ms / 1000" | bc -l)"
  record --name "scale: seal after a 7-byte change, content" --tool "$g $unit_name" --value "$seal"
  record --name "scale: seal after a 7-byte change, content" --tool "$g $unit_name, I/O floor" --value "$floor"
done

# -- copy-up and seal by chunk ------------------------------------------------
[ "$quick" = 1 ] || have_result "append 1 byte to a file of 1073741824 bytes (cold cache): the write" sessionfs || scripts/bench/chunks.sh

# -- report ------------------------------------------------------------------
# shellcheck source=report.sh
. "$root/scripts/bench/report.sh"
if [ "$quick" = 1 ] && [ -s "$failures" ]; then
  log "steps failed:"; cat "$failures" >&2; exit 1
fi
