#!/usr/bin/env python3
# Prints a listing of a tree: path type x-bit size sha256/target [mtime_ns].
# usage: treehash.py DIR [m]  (m: with file mtimes, except under mm*/: the
# kernel writes back a stopped process's dirty mmap pages when it likes,
# which moves the file's mtime between two listings)
import os, sys, hashlib, stat
root = sys.argv[1]; with_mtime = len(sys.argv) > 2
out = []
for dp, dn, fn in os.walk(root):
    dn.sort()
    for n in sorted(dn + fn):
        p = os.path.join(dp, n); r = os.path.relpath(p, root)
        st = os.lstat(p)
        if stat.S_ISLNK(st.st_mode): out.append(f"{r} L {os.readlink(p)}")
        elif stat.S_ISDIR(st.st_mode): out.append(f"{r} D")
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.sha256(open(p, "rb").read()).hexdigest()[:16]
            out.append(f"{r} F {1 if st.st_mode & 0o100 else 0} {st.st_size} {h}" + (f" {st.st_mtime_ns}" if with_mtime and not r.startswith("mm") else ""))
        else: out.append(f"{r} ? {st.st_mode:o}")
print("\n".join(sorted(out)))
