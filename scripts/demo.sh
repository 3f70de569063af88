#!/usr/bin/env bash
# The demo: a session's life across two agent turns.
#
# Pack a sample git repository and an agent harness home, mount the packet
# (no extraction), run an edit-build-commit turn inside the mount as a
# non-root user, seal with --rebase, run a second turn, seal again, then
# unpack the final packet elsewhere and show that git log and the files are
# right. Prints every JSON result, the digests and the seal statistics.
# Needs root (to mount for another user), fuse3, git, make and cc.
set -euo pipefail
bin=${SESSIONFS:-"$(cd "$(dirname "$0")/.." && pwd)/target/release/sessionfs"}
agent_uid=${DEMO_UID:-1000}
work=$(mktemp -d /tmp/sessionfs-demo.XXXXXX)
chmod 755 "$work" # the agent user walks into it
mnt="$work/mnt"
cleanup() {
  "$bin" umount "$mnt" --lazy >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }
# Runs a command as the agent user, with a home of its own.
as_agent() {
  setpriv --reuid "$agent_uid" --regid "$agent_uid" --clear-groups \
    env HOME="$work/home" GIT_AUTHOR_NAME=agent GIT_AUTHOR_EMAIL=agent@example.com \
    GIT_COMMITTER_NAME=agent GIT_COMMITTER_EMAIL=agent@example.com "$@"
}

step "a workspace (a C program in git) and a codex home with credentials in it"
mkdir -p "$work/ws/src" "$work/codex/sessions" "$work/home"
chown "$agent_uid:$agent_uid" "$work/home"
cat > "$work/ws/src/main.c" <<'EOF'
#include <stdio.h>
int main(void) { puts("hello from turn 0"); return 0; }
EOF
printf 'hello: src/main.c\n\tcc -O2 -o $@ $<\n' > "$work/ws/Makefile"
printf 'hello\n' > "$work/ws/.gitignore"
echo 'API_KEY=do-not-ship' > "$work/ws/.env"
git -C "$work/ws" init -q -b main && git -C "$work/ws" add -A . ':!.env'
git -C "$work/ws" -c user.name=demo -c user.email=demo@example.com commit -qm "turn 0: hello"
echo '{"token":"secret"}' > "$work/codex/auth.json"
echo '{"turn":0}' > "$work/codex/sessions/rollout.jsonl"

step "pack (the credentials are left out and reported)"
"$bin" pack --workspace "$work/ws" --harness "$work/codex" --harness-kind codex -o "$work/turn0.packet" | tee "$work/pack.json"
d0=$(field "$work/pack.json" digest)

step "verify every byte against $d0; inspect reads the manifest only"
"$bin" verify "$work/turn0.packet" --digest "$d0"
"$bin" inspect "$work/turn0.packet"

step "mount it for user $agent_uid: ready when the command returns, nothing extracted"
mkdir "$mnt"
"$bin" mount "$work/turn0.packet" "$mnt" --digest "$d0" --upper "$work/upper" \
  --uid "$agent_uid" --gid "$agent_uid" --allow-other

step "turn 1, as user $agent_uid: edit, build, run, commit (and a stray .env)"
as_agent sh -ec "
  cd '$mnt/workspace'
  sed -i 's/turn 0/turn 1/' src/main.c
  make -s && ./hello
  git commit -qam 'turn 1: greet from turn 1'
  echo 'TOKEN=leaked' > .env
  echo '{\"turn\":1}' >> '$mnt/harness/sessions/rollout.jsonl'
  git log --oneline
"

step "seal turn 1 with --rebase: the mount goes on from the new packet"
"$bin" seal "$mnt" -o "$work/turn1.packet" --receipt "$work/turn1.receipt.json" --rebase | tee "$work/seal1.json"
d1=$(field "$work/seal1.json" digest)
"$bin" status "$mnt" | python3 -c 'import json,sys; s=json.load(sys.stdin); print("mount now serves", s["digest"])'

step "turn 2, as user $agent_uid: a new file, a rename, build, commit"
as_agent sh -ec "
  cd '$mnt/workspace'
  printf 'A demo of sessionfs.\n' > NOTES.md
  git mv src/main.c src/hello.c
  sed -i 's/turn 1/turn 2/; s#src/main.c#src/hello.c#' src/hello.c Makefile
  make -s && ./hello
  git add -A && git commit -qm 'turn 2: notes, rename'
  echo '{\"turn\":2}' >> '$mnt/harness/sessions/rollout.jsonl'
"

step "seal turn 2: costs only what turn 2 changed"
"$bin" seal "$mnt" -o "$work/turn2.packet" --receipt "$work/turn2.receipt.json" | tee "$work/seal2.json"
d2=$(field "$work/seal2.json" digest)
echo "receipt of turn 2:" >&2
python3 -c 'import json,sys
for c in json.load(open(sys.argv[1]))["changes"]:
    print(" ", c["op"], c.get("path") or c["from"] + " -> " + c["to"])' "$work/turn2.receipt.json"
"$bin" umount "$mnt"

step "unpack the last packet elsewhere: the repository, the build, the history"
"$bin" unpack "$work/turn2.packet" --into "$work/restored" --digest "$d2"
git -C "$work/restored/workspace" log --oneline
git -C "$work/restored/workspace" status --short
"$work/restored/workspace/hello"
test "$("$work/restored/workspace/hello")" = "hello from turn 2"
test ! -e "$work/restored/workspace/.env"
test ! -e "$work/restored/harness/auth.json"
cat "$work/restored/harness/sessions/rollout.jsonl"
test "$(git -C "$work/restored/workspace" log --format=%s | head -1)" = "turn 2: notes, rename"

step "digests and seal statistics"
python3 - "$work" "$d0" "$d1" "$d2" <<'EOF'
import json, sys
work, digests = sys.argv[1], sys.argv[2:]
print(f"turn 0 (pack): {digests[0]}")
for n in (1, 2):
    s = json.load(open(f"{work}/seal{n}.json"))
    assert s["digest"] == digests[n]
    print(f"turn {n} (seal): {s['digest']}  parent {s['parent'][:19]}…  "
          f"added {s['added']} modified {s['modified']} deleted {s['deleted']} renamed {s['renamed']} "
          f"reused {s['reused']}  hashed {s['bytes_hashed']} B  copied {s['bytes_copied']} B  "
          f"excluded {[e['path'] for e in s['excluded']]}  {s['seconds'] * 1000:.1f} ms")
EOF
