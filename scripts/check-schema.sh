#!/usr/bin/env bash
# Validates real manifests against docs/packet.schema.json (JSON Schema
# 2020-12, with the jsonschema package from .venv), and checks that the
# schema rejects what the format forbids.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=target/release/sessionfs
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/ws/src" "$work/h"
echo hi > "$work/ws/src/a.rs"; chmod +x "$work/ws/src/a.rs"
head -c 9000000 /dev/zero > "$work/ws/big"; ln -s src/a.rs "$work/ws/l"; echo '{}' > "$work/h/x.json"
"$bin" pack --workspace "$work/ws" --harness "$work/h" --harness-kind claude -o "$work/p.packet" >/dev/null
.venv/bin/python3 - "$work/p.packet" tests/golden/small.packet <<'PY'
import json, sys, tarfile, copy
from jsonschema import Draft202012Validator
schema = json.load(open("docs/packet.schema.json"))
Draft202012Validator.check_schema(schema)
v = Draft202012Validator(schema)
for path in sys.argv[1:]:
    with tarfile.open(path) as t:
        m = json.load(t.extractfile("packet.json"))
    v.validate(m)
    bad = [
        dict(m, extra=1),
        dict(m, schema="sessionfs.packet/2"),
        dict(m, harness=None),
        dict(m, entries=[dict(m["entries"][0], path="/abs")]),
        dict(m, entries=[dict(m["entries"][0], path="workspace/../x")]),
        dict(m, entries=[{"path": "workspace/f", "type": "file", "size": 1, "mtime_ns": 0, "sha256": "A" * 64}]),
        dict(m, entries=[{"path": "workspace/f", "type": "file", "size": 1, "mtime_ns": 0, "sha256": "a" * 64, "executable": False}]),
        dict(m, entries=[{"path": "workspace", "type": "fifo"}]),
    ]
    for b in bad:
        if v.is_valid(b):
            sys.exit(f"schema accepted an invalid manifest: {json.dumps(b)[:200]}")
    print(f"schema-check: {path}: {len(m['entries'])} entries valid; {len(bad)} invalid variants rejected")
PY
