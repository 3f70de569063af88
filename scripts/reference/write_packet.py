#!/usr/bin/env python3
"""A second writer of `sessionfs.packet/2` (and `/1`), written from docs/packet-format.md
(and the `pack` section of docs/CLI.md) alone, without reading sessionfs's
source, as a check that the spec suffices to write byte-identical packets.
tests/spec_writer.rs compares its output with `sessionfs pack`.

    write_packet.py --workspace DIR [--harness DIR --harness-kind KIND]
                    [--zero-mtimes] [--packet-version 1|2] -o OUT

Prints the packet's digest. It handles only trees that need no policy
decision: it refuses credentials that pack would exclude, sockets, FIFOs,
devices and absolute symlink targets, instead of deciding about them.
Standard library only.
"""

import argparse
import hashlib
import os
import stat
import sys
import unicodedata

CHUNK = 4 * 1024 * 1024  # §3.1
MAX_MTIME_NS = 8589934591999999999  # §3.1, §7
MAX_SIZE = 8589934591
MAX_PATH_BYTES = 4096  # §7 default
KINDS = ("codex", "claude", "opencode", "generic")


def fail(msg):
    sys.exit(f"write_packet.py: refused: {msg}")


# ---------------------------------------------------------------- policy
# pack's default exclusions (CLI.md "Exclusions"): this writer refuses such
# names rather than excluding them, so its packet is pack's only when no
# exclusion applies.
CRED_NAMES = {".ssh", ".aws", ".gnupg", ".netrc", "_netrc", ".npmrc", ".pypirc",
              ".git-credentials", ".pgpass", "id_rsa", "id_dsa", "id_ecdsa", "id_ed25519"}
HARNESS_NAMES = {"codex": {"auth.json", ".credentials.json", "secrets"},
                 "claude": {".credentials.json"},
                 "opencode": {"auth.json", "mcp-auth.json", "opencode.db"},
                 "generic": set()}


def policy_name(name, kind):
    low = name.lower()
    if name in CRED_NAMES or name in HARNESS_NAMES.get(kind, ()):
        return True
    if low.endswith((".pem", ".key", ".p12", ".pfx")):
        return True
    if name == ".env" or name.startswith(".env."):
        return not name.endswith((".example", ".sample", ".template", ".dist", ".defaults"))
    return False


# ---------------------------------------------------------------- the walk (§2)
def check_path(path):
    b = path.encode()
    if len(b) > MAX_PATH_BYTES:
        fail(f"path over {MAX_PATH_BYTES} bytes: {path!r}")
    for c in path:
        if unicodedata.category(c) == "Cc" or c == "\\":
            fail(f"backslash or control character in {path!r}")
    for comp in path.split("/"):
        if len(comp.encode()) > 255:
            fail(f"component over 255 bytes in {path!r}")


def walk(root, part, kind, zero, entries, other):
    """Appends the entries of the tree at `root` as part `part`; `other` is
    the (device, inode) of the other part's root, which pack would leave out."""
    entries.append({"path": part, "type": "dir"})

    def rec(dirb, prefix):
        for name_b in os.listdir(dirb):
            full = os.path.join(dirb, name_b)
            try:
                name = name_b.decode("utf-8")
            except UnicodeDecodeError:
                fail(f"name not UTF-8: {full!r}")
            path = f"{prefix}/{name}"
            check_path(path)
            if policy_name(name, kind if part == "harness" else None):
                fail(f"{path} would be excluded by pack's policy")
            st = os.lstat(full)
            if (st.st_dev, st.st_ino) == other:
                fail(f"{path} is the other part's root (pack would leave it out)")
            if stat.S_ISDIR(st.st_mode):
                entries.append({"path": path, "type": "dir"})
                rec(full, path)
            elif stat.S_ISREG(st.st_mode):
                if st.st_size > MAX_SIZE:
                    fail(f"{path} is over 8 GiB")
                mt = 0 if zero else min(max(st.st_mtime_ns, 0), MAX_MTIME_NS)  # CLI.md: clamped
                entries.append({"path": path, "type": "file", "mtime_ns": mt,
                                "executable": bool(st.st_mode & 0o111), "src": full})
            elif stat.S_ISLNK(st.st_mode):
                tb = os.readlink(full)
                try:
                    target = tb.decode("utf-8")
                except UnicodeDecodeError:
                    fail(f"symlink target not UTF-8: {path}")
                if target.startswith("/"):
                    fail(f"absolute symlink target (pack would decide about it): {path}")
                if len(tb) > MAX_PATH_BYTES:
                    fail(f"symlink target over {MAX_PATH_BYTES} bytes: {path}")
                entries.append({"path": path, "type": "symlink", "target": target})
            else:
                fail(f"{path} is a socket, FIFO or device (pack would drop it)")

    rec(os.fsencode(root), part)


def fold(path):  # §2 collision folding (with Python's Unicode version, not 16.0)
    return unicodedata.normalize("NFD", unicodedata.normalize("NFD", path).casefold())


def hash_content(path):
    """(size, SHA-256 of the whole content, SHA-256 of each 4 MiB chunk)."""
    whole, chunks, size = hashlib.sha256(), [], 0
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            whole.update(block)
            chunks.append(hashlib.sha256(block).hexdigest())
            size += len(block)
    return size, whole.hexdigest(), chunks


def hash_file(e, version):
    size, whole, chunks = hash_content(e["src"])
    e["size"] = size
    if size > CHUNK:
        e["chunks"] = chunks
    if version == 1 or size <= CHUNK:  # §3.1: /2 files with chunks carry no sha256
        e["sha256"] = whole


# ---------------------------------------------------------------- the manifest (§3)
ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def jstr(s):
    out = []
    for c in s:
        if c in ESCAPES:
            out.append(ESCAPES[c])
        elif ord(c) < 0x20:
            out.append(f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return '"' + "".join(out) + '"'


def jentry(e):
    kv = [("path", jstr(e["path"])), ("type", jstr(e["type"]))]
    if e["type"] == "file":
        kv += [("size", str(e["size"])), ("mtime_ns", str(e["mtime_ns"]))]
        if e["executable"]:
            kv.append(("executable", "true"))
        if "sha256" in e:
            kv.append(("sha256", jstr(e["sha256"])))
        if "chunks" in e:
            kv.append(("chunks", "[" + ",".join(jstr(c) for c in e["chunks"]) + "]"))
    elif e["type"] == "symlink":
        kv.append(("target", jstr(e["target"])))
    return "{" + ",".join(f"{jstr(k)}:{v}" for k, v in kv) + "}"


def manifest(entries, kind, version):
    head = '{"schema":"sessionfs.packet/%d",' % version
    if kind is not None:
        head += f'"harness":{jstr(kind)},'
    return (head + '"entries":[' + ",".join(jentry(e) for e in entries) + "]}").encode()


# ---------------------------------------------------------------- tar (§4, §5)
def pad(n):
    return -n % 512


def octal(n, width):  # width - 1 digits, then NUL
    s = f"{n:0{width - 1}o}".encode()
    assert len(s) == width - 1, (n, width)
    return s + b"\0"


def field(b, width):
    assert len(b) <= width
    return b + b"\0" * (width - len(b))


def cut(b, n=100):
    """The first n bytes of b, cut back to a UTF-8 character boundary."""
    if len(b) <= n:
        return b
    while n > 0 and (b[n] & 0xC0) == 0x80:  # b[n] continues a character
        n -= 1
    return b[:n]


def header(name, mode, size, mtime, typeflag, linkname=b"", prefix=b""):
    h = (field(name, 100) + octal(mode, 8) + octal(0, 8) + octal(0, 8)
         + octal(size, 12) + octal(mtime, 12) + b" " * 8 + typeflag
         + field(linkname, 100) + b"ustar\0" + b"00" + b"\0" * 64
         + octal(0, 8) + octal(0, 8) + field(prefix, 155) + b"\0" * 12)
    assert len(h) == 512
    return h[:148] + octal(sum(h), 8) + h[156:]


def split(p):
    """(prefix, name) for path bytes p, or None if it does not fit (§4.1)."""
    if len(p) <= 100:
        return b"", p
    i = p.rfind(b"/", 0, 156)
    if i < 0 or not 0 < len(p) - i - 1 <= 100:
        return None
    return p[:i], p[i + 1:]


def record(key, value):
    body = b" " + key + b"=" + value + b"\n"
    n = len(body) + 1
    while len(str(n)) + len(body) != n:
        n += 1
    return str(n).encode() + body


def member_headers(e):
    p = e["path"].encode()
    t = e["type"]
    target = e["target"].encode() if t == "symlink" else b""
    records = b""
    fits = split(p)
    if fits is None:
        records += record(b"path", p)
        prefix, name = b"", cut(p)
    else:
        prefix, name = fits
    if len(target) > 100:
        records += record(b"linkpath", target)
    out = b""
    if records:
        out += header(b"././@PaxHeader", 0o644, len(records), 0, b"x")
        out += records + b"\0" * pad(len(records))
    if t == "dir":
        return out + header(name, 0o755, 0, 0, b"5", prefix=prefix)
    if t == "symlink":
        return out + header(name, 0o777, 0, 0, b"2", linkname=cut(target), prefix=prefix)
    mode = 0o755 if e["executable"] else 0o644
    return out + header(name, mode, e["size"], e["mtime_ns"] // 10**9, b"0", prefix=prefix)


def write_packet(out, entries, man):
    with open(out, "wb") as f:
        f.write(header(b"packet.json", 0o644, len(man), 0, b"0"))
        f.write(man + b"\0" * pad(len(man)))
        for e in entries:
            f.write(member_headers(e))
            if e["type"] == "file":
                h, chunks, n = hashlib.sha256(), [], 0
                with open(e["src"], "rb") as src:
                    while block := src.read(CHUNK):
                        h.update(block)
                        chunks.append(hashlib.sha256(block).hexdigest())
                        n += len(block)
                        f.write(block)
                if (n, h.hexdigest() if "sha256" in e else None, chunks if "chunks" in e else None) \
                        != (e["size"], e.get("sha256"), e.get("chunks")):
                    fail(f"{e['path']} changed while packing")
                f.write(b"\0" * pad(n))
        f.write(b"\0" * 1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workspace", required=True)
    ap.add_argument("--harness")
    ap.add_argument("--harness-kind", choices=KINDS)
    ap.add_argument("--zero-mtimes", action="store_true")
    ap.add_argument("--packet-version", type=int, choices=(1, 2), default=2)
    ap.add_argument("-o", dest="out", required=True)
    a = ap.parse_args()
    if (a.harness is None) != (a.harness_kind is None):
        ap.error("--harness and --harness-kind go together")
    roots = [("workspace", a.workspace, None)]
    if a.harness is not None:
        roots.append(("harness", a.harness, a.harness_kind))
    ids = [(st.st_dev, st.st_ino) for st in (os.stat(r) for _, r, _ in roots)]
    if len(ids) == 2 and ids[0] == ids[1]:
        fail("--workspace and --harness are the same directory")
    out_dir = os.path.realpath(os.path.dirname(os.path.abspath(a.out)))
    entries = []
    for i, (part, root, kind) in enumerate(roots):
        real = os.path.realpath(root)
        if os.path.commonpath([real, out_dir]) == real:
            fail(f"the output lies inside the {part} tree")
        other = ids[1 - i] if len(ids) == 2 else None
        walk(root, part, kind, a.zero_mtimes, entries, other)
    entries.sort(key=lambda e: e["path"].encode())
    seen = {}
    for e in entries:
        k = fold(e["path"])
        if k in seen:
            fail(f"{seen[k]} and {e['path']} collide (§2)")
        seen[k] = e["path"]
        if e["type"] == "file":
            hash_file(e, a.packet_version)
    man = manifest(entries, a.harness_kind, a.packet_version)
    write_packet(a.out, entries, man)
    print("sha256:" + hashlib.sha256(man).hexdigest())


if __name__ == "__main__":
    main()
