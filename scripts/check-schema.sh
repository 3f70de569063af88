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
for v in 1 2; do
  "$bin" pack --workspace "$work/ws" --harness "$work/h" --harness-kind claude --packet-version $v \
    -o "$work/p$v.packet" >/dev/null
done
.venv/bin/python3 - "$work/p2.packet" "$work/p1.packet" tests/golden/small.packet tests/golden/small.v1.packet <<'PY'
import json, sys, tarfile, copy
from jsonschema import Draft202012Validator
schema = json.load(open("docs/packet.schema.json"))
Draft202012Validator.check_schema(schema)
v = Draft202012Validator(schema)
for path in sys.argv[1:]:
    with tarfile.open(path) as t:
        m = json.load(t.extractfile("packet.json"))
    v.validate(m)
    # Each invalid variant is the real manifest with one thing wrong.
    v1 = m["schema"] == "sessionfs.packet/1"
    plus = lambda e: dict(m, entries=m["entries"] + [e])
    f = lambda size, **kw: dict({"path": "workspace/zz", "type": "file", "size": size, "mtime_ns": 0, "sha256": "a" * 64}, **kw)
    # A file with chunks: with its whole-file hash in /1 only.
    big = lambda **kw: {k: x for k, x in f(10 << 20, chunks=["a" * 64] * 3, **kw).items()
                        if v1 or k != "sha256"}
    without = lambda key: {k: v for k, v in m.items() if k != key}
    bad = [
        dict(m, extra=1),
        dict(m, schema="sessionfs.packet/3"),
        plus({k: x for k, x in f(10).items() if k != "sha256"}),  # a small file without sha256
        dict(m, harness=None),
        plus(dict(m["entries"][0], path="/abs")),
        plus(dict(m["entries"][0], path="workspace/../x")),
        plus(f(1, sha256="A" * 64)),
        plus(f(1, executable=False)),
        plus({"path": "workspace/zz", "type": "fifo"}),
        plus(f(10 << 20)),                        # over 4 MiB without chunks
        plus(f(10, chunks=["a" * 64] * 2)),       # chunks on a small file
        plus(f(4 << 20, chunks=["a" * 64] * 2)),  # exactly 4 MiB: no chunks
        dict(m, entries=[e for e in m["entries"] if not e["path"].startswith("workspace")]),
        dict(m, harness="codex") if "harness" not in m else without("harness"),
    ]
    if any("chunks" in e for e in m["entries"]):  # the other version's file with chunks
        bad.append(dict(m, schema="sessionfs.packet/2" if v1 else "sessionfs.packet/1"))
    if "harness" in m:
        bad.append(dict(m, entries=[e for e in m["entries"] if not e["path"].startswith("harness")]))
        # The harness root as a file: no harness part, as every reader says.
        bad.append(dict(m, entries=[{"path": "harness", "type": "file", "size": 0, "mtime_ns": 0, "sha256": "a" * 64}]
                        + [e for e in m["entries"] if not e["path"].startswith("harness")]))
    assert v.is_valid(plus(big()))
    assert not v.is_valid(plus(dict(big(), sha256="a" * 64) if not v1 else {k: x for k, x in big().items() if k != "sha256"}))
    assert v.is_valid(plus(f(4 << 20)))
    for b in bad:
        if v.is_valid(b):
            sys.exit(f"schema accepted an invalid manifest: {json.dumps(b)[:200]}")
    print(f"schema-check: {path}: {len(m['entries'])} entries valid; {len(bad)} invalid variants rejected")
PY
