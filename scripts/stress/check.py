#!/usr/bin/env python3
# Checks the writers' invariants on an unpacked packet.
# usage: check.py UNPACKED/workspace ORIGINAL_TREE; prints problems, exits 1 if any
import os, sys, re, hashlib
root, orig = sys.argv[1], sys.argv[2]
probs = []
def P(m): probs.append(m)
def recs_ok(data, tag, consecutive_from0=True, name=""):
    lines = data.split(b"\n")
    if lines and lines[-1] == b"": lines = lines[:-1]
    elif data:
        P(f"{name}: torn last record {lines[-1][:50]!r}"); lines = lines[:-1]
    for i, l in enumerate(lines):
        m = re.match(rb"^([A-Z]\w*):(\d{8}):(x*):([0-9a-f]{8})$", l)
        if not m: P(f"{name}: bad record {i}: {l[:60]!r}"); return
        body = m.group(1)+b":"+m.group(2)+b":"+m.group(3)
        if hashlib.sha1(body).hexdigest()[:8].encode() != m.group(4): P(f"{name}: hash bad rec {i}"); return
        if m.group(1) != tag.encode(): P(f"{name}: tag {m.group(1)} != {tag}"); return
        if consecutive_from0 and int(m.group(2)) != i: P(f"{name}: rec {i} has seq {int(m.group(2))}"); return
for e in sorted(os.listdir(root)):
    d = os.path.join(root, e)
    m = re.match(r"^(app|ren|hl|ul|mm|bw|tree|rd)(\d+)$", e)
    if not m: continue
    k, w = m.groups()
    if k == "app":
        p = os.path.join(d, "log")
        if os.path.exists(p): recs_ok(open(p, "rb").read(), "A"+w, True, p)
    elif k == "ren":
        ta, tb = os.path.exists(os.path.join(d, "a/token")), os.path.exists(os.path.join(d, "b/token"))
        if ta + tb != 1 and os.path.isdir(os.path.join(d,"b")): P(f"{d}: token in a={ta} b={tb}")
        d1, d2 = os.path.join(d, "d1"), os.path.join(d, "b/d2")
        x = [p for p in (d1, d2) if os.path.isdir(p)]
        if len(x) != 1 and os.path.isdir(os.path.join(d,"b")): P(f"{d}: dir copies {x}")
        for p in x:
            names = sorted(os.listdir(p))
            if names != sorted([f"m{i}" for i in range(10)] + ["deep"]): P(f"{p}: names {names}")
            for i in range(10):
                q = os.path.join(p, f"m{i}")
                if os.path.exists(q) and open(q).read() != f"m{i}\n"*100: P(f"{q}: bad content")
            if not os.path.exists(os.path.join(p, "deep/er/z")): P(f"{p}: deep missing")
        v = os.path.join(d, "v")
        if os.path.exists(v):
            c = open(v).read()
            if not re.match(r"^version \d+\ny*$", c): P(f"{v}: bad {c[:40]!r}")
    elif k == "hl":
        cs = {}
        for n in ("orig", "link"):
            p = os.path.join(d, n)
            if os.path.exists(p):
                cs[n] = open(p, "rb").read(); recs_ok(cs[n], "H", False, p)
    elif k == "ul":
        for n in os.listdir(d):
            p = os.path.join(d, n); recs_ok(open(p, "rb").read(), "U", True, p)
    elif k == "mm":
        p = os.path.join(d, "m")
        if os.path.exists(p):
            data = open(p, "rb").read()
            if len(data) not in (0, 1 << 20): P(f"{p}: size {len(data)}")
            for off in range(0, len(data), 4096):
                pg = data[off:off+4096]
                if pg != pg[:1]*4096: P(f"{p}: page {off} not uniform"); break
    elif k == "tree":
        for t in os.listdir(d):
            for dp, dn, fn in os.walk(os.path.join(d, t)):
                for f in fn:
                    p = os.path.join(dp, f)
                    if os.path.islink(p): continue
                    mm = re.match(r"^f(\d+)$", f)
                    if mm:
                        i = int(mm.group(1)); c = open(p).read()
                        if c not in ("", f"{i}\n"*i): P(f"{p}: bad content {c[:30]!r}")
# src
src = os.path.join(root, "src")
for i in range(1, 201):
    p = os.path.join(src, f"f{i}.txt")
    if not os.path.exists(p): P(f"{p} missing"); continue
    c = open(p).read()
    if not re.match(rf"^file {i}\n(edit \d+\n)*$", c): P(f"{p}: bad {c[-40:]!r}")
for p, sz in (("big/blob.bin", 20 << 20), ("big/blob2.bin", 5 << 20)):
    if os.path.getsize(os.path.join(root, p)) != sz: P(f"{p} size")
if hashlib.sha256(open(os.path.join(root, "big/blob.bin"), "rb").read()).hexdigest() != hashlib.sha256(open(os.path.join(orig, "big/blob.bin"),"rb").read()).hexdigest():
    P("blob.bin changed")
for x in probs[:30]: print(x)
sys.exit(1 if probs else 0)
