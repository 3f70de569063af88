#!/usr/bin/env bash
# The demo: pack a sample workspace (a git repository) and an agent harness
# home, then verify, inspect and unpack it, printing each JSON result.
set -euo pipefail
bin=${SESSIONFS:-"$(dirname "$0")/../target/release/sessionfs"}
work=$(mktemp -d /tmp/sessionfs-demo.XXXXXX)
trap 'rm -rf "$work"' EXIT
step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

step "a workspace (git repository) and a codex home with credentials in it"
mkdir -p "$work/ws/src" "$work/codex/sessions"
printf 'fn main() {\n    println!("hello");\n}\n' > "$work/ws/src/main.rs"
printf '[package]\nname = "demo"\nversion = "0.1.0"\nedition = "2021"\n' > "$work/ws/Cargo.toml"
echo 'API_KEY=do-not-ship' > "$work/ws/.env"
git -C "$work/ws" init -q && git -C "$work/ws" add -A . ':!.env'
git -C "$work/ws" -c user.name=demo -c user.email=demo@example.com commit -qm "first"
echo '{"token":"secret"}' > "$work/codex/auth.json"
echo '{"turn":1}' > "$work/codex/sessions/rollout.jsonl"

step "pack (the credentials are left out and reported)"
"$bin" pack --workspace "$work/ws" --harness "$work/codex" --harness-kind codex -o "$work/session.packet" | tee "$work/pack.json"
digest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["digest"])' "$work/pack.json")

step "verify every byte against digest $digest"
"$bin" verify "$work/session.packet" --digest "$digest"

step "inspect (reads the manifest only) and digest"
"$bin" inspect "$work/session.packet"
"$bin" digest "$work/session.packet"

step "unpack elsewhere and check the repository"
"$bin" unpack "$work/session.packet" --into "$work/restored" --digest "$digest"

step "pack the restored tree again: same digest (before git touches its index)"
"$bin" pack --workspace "$work/restored/workspace" --harness "$work/restored/harness" --harness-kind codex \
  -o "$work/again.packet" | python3 -c 'import json,sys; d=json.load(sys.stdin)["digest"]; print(d); assert d == sys.argv[1], "digests differ"' "$digest"

step "the repository works: log and status"
git -C "$work/restored/workspace" log --oneline
git -C "$work/restored/workspace" status --short
ls -la "$work/restored/harness"
