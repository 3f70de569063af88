#!/usr/bin/env bash
# A concurrency stress of a mount: ten writer processes (scripts/stress/
# writers.py: appends, renames, hard links, files unlinked while open, mmap,
# lower reads and in-place writes, trees made and removed) run while the
# mount is sealed with --rebase about once a second; every packet is
# verified, unpacked and checked against the writers' invariants (check.py).
# Every 15 seals the writers are stopped, and two seals and a --rebase must
# give one digest, the view must not change across the rebase, and the
# packet must equal the view. Not part of `make test` (it runs for minutes);
# it found the rebase's generation, held-number and left-out-entry bugs and
# the split-write cut fixed on 2026-12-04.
#
# usage: scripts/stress/run.sh [SECONDS]   (root, FUSE; default 150 s)
# env:   SESSIONFS (default target/release/sessionfs), STRESS_DIR (a new
#        temporary directory by default; kept when the run fails)
# exit:  0 when nothing failed; 1 otherwise (the failures are printed).
# Expected and not counted: "hardlink mismatch" from the hl writer, since
# after --rebase the names of a file hard-linked on the mount are separate
# files (docs/SEMANTICS.md, Rebase).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
S=$(realpath "${SESSIONFS:-$here/../../target/release/sessionfs}")
DUR=${1:-150}
T=${STRESS_DIR:-$(mktemp -d /tmp/sessionfs-stress.XXXXXX)}
mkdir -p "$T/mp" "$T/seals" "$T/ws/src" "$T/ws/big"
cd "$T"
for i in $(seq 1 200); do printf 'file %d\n' "$i" > "ws/src/f$i.txt"; done
head -c $((20 << 20)) /dev/urandom > ws/big/blob.bin
head -c $((5 << 20)) /dev/urandom > ws/big/blob2.bin
"$S" pack --workspace ws -o base.packet > /dev/null
"$S" mount base.packet mp --upper up > mount.json
W=mp/workspace
ERR=$T/writer-errors.log
: > "$ERR"
PIDS=()
for k in app:1 app:2 ren:1 ren:2 hl:1 ul:1 mm:1 rd:1 bw:1 tree:1; do
    python3 "$here/writers.py" "$W" "${k%%:*}" "${k##*:}" "$ERR" "$T/ws" &
    PIDS+=($!)
done
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
digest() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["digest"])' "$1"; }
end=$((SECONDS + DUR))
n=0
while [ $SECONDS -lt $end ]; do
    n=$((n + 1))
    out=seals/s$n.packet
    if ! timeout 120 "$S" seal mp -o "$out" --rebase > seal.json 2> seal.err; then
        fail "seal $n: $(cat seal.json)"
        sleep 1
        continue
    fi
    timeout 120 "$S" verify "$out" > /dev/null || fail "verify $n"
    rm -rf un
    if timeout 120 "$S" unpack "$out" --into un > /dev/null; then
        python3 "$here/check.py" un/workspace "$T/ws" > check.txt || { fail "check $n"; head -5 check.txt; }
    else
        fail "unpack $n"
    fi
    if [ $((n % 15)) -eq 0 ]; then
        kill -STOP "${PIDS[@]}"
        sleep 0.5
        python3 "$here/treehash.py" "$W" m > pre.txt
        "$S" seal mp -o qa.packet > qa.json
        "$S" seal mp -o qb.packet > qb.json
        "$S" seal mp -o qr.packet --rebase > qr.json
        [ "$(digest qa.json)" = "$(digest qb.json)" ] || fail "two seals of a still mount differ ($n)"
        [ "$(digest qa.json)" = "$(digest qr.json)" ] || fail "the rebase's seal differs ($n)"
        python3 "$here/treehash.py" "$W" m > post.txt
        diff pre.txt post.txt > /dev/null || { fail "the view changed across a rebase ($n)"; diff pre.txt post.txt | head -5; }
        rm -rf unq
        "$S" unpack qa.packet --into unq > /dev/null
        python3 "$here/treehash.py" unq/workspace m > unq.txt
        diff pre.txt unq.txt > /dev/null || { fail "the packet is not the view ($n)"; diff pre.txt unq.txt | head -5; }
        rm -rf unq qa.packet qb.packet
        kill -CONT "${PIDS[@]}"
        echo "still-mount check after seal $n done"
    fi
    ls -1v seals/ | head -n -3 | while read -r f; do rm -f "seals/$f"; done
    sleep 1
done
kill "${PIDS[@]}" 2> /dev/null || true
wait 2> /dev/null || true
"$S" umount mp > /dev/null
expected=$(grep -c 'hardlink mismatch' "$ERR" || true)
if grep -v 'hardlink mismatch' "$ERR" | grep -q .; then
    fail "writer errors:"
    grep -v 'hardlink mismatch' "$ERR" | sed 's/^[0-9:]* //' | sort | uniq -c | sort -rn | head -20
fi
echo "seals=$n failures=$fails (hard-link names split by a rebase, expected: $expected)"
if [ $fails -eq 0 ] && [ -z "${STRESS_DIR:-}" ]; then rm -rf "$T"; else echo "kept: $T"; fi
[ $fails -eq 0 ]
