#!/usr/bin/env bash
# make bench-pack: pack and verify throughput on corpus S (100,000 files,
# about 1 GiB, warm page cache) in one run, next to GNU tar writing the same
# tree to a file and fsyncing it (pack's goal: no slower) and to
# `tar -cf - | sha256sum`; pack with --file-sha256 beside them. Prints a
# markdown table (ratios to tar + fsync); results in .bench/pack.jsonl.
set -euo pipefail
cd "$(dirname "$0")/../.."
files=${BENCH_FILES:-100000}
runs=${BENCH_RUNS:-5}
dir=.bench
bin=$PWD/target/release/sessionfs
tool=$PWD/target/release/sessionfs-bench
mkdir -p "$dir"
corpus="$dir/S-$files"
[ -d "$corpus" ] || "$tool" corpus --kind s --count "$files" --out "$corpus"
out="$dir/pack.jsonl"; rm -f "$out"
bytes=$(du -sb --apparent-size "$corpus" | cut -f1)
# The warm-up run fills the page cache. Outputs are removed before each
# run, untimed: replacing a 1 GiB file adds the freeing of its blocks.
m() { "$tool" measure --out "$out" --runs "$runs" --bytes "$bytes" "$@"; }
m --name "pack S" --tool "sessionfs" --prepare "rm -f $dir/s.packet" --cmd "$bin pack --workspace $corpus -o $dir/s.packet"
m --name "pack S" --tool "sessionfs, --file-sha256" --prepare "rm -f $dir/s.packet" --cmd "$bin pack --workspace $corpus -o $dir/s.packet --file-sha256"
m --name "pack S" --tool "tar -cf FILE + fsync" --prepare "rm -f $dir/s.tar" --cmd "tar -cf $dir/s.tar -C $corpus . && sync $dir/s.tar"
m --name "pack S" --tool "tar -cf - | sha256sum" --cmd "tar -cf - -C $corpus . | sha256sum"
m --name "verify S" --tool "sessionfs" --cmd "$bin verify $dir/s.packet"
m --name "verify S" --tool "tar -cf - | sha256sum" --cmd "tar -cf - -C $corpus . | sha256sum"
m --name "verify S" --tool "sha256sum FILE" --cmd "sha256sum $dir/s.tar"
rm -f "$dir/s.tar"
"$tool" report "$out" --baseline "tar -cf FILE + fsync"
