#!/usr/bin/env python3
# One writer process with invariants checked as it goes (and by check.py on
# every sealed packet). usage: writers.py MOUNT/workspace KIND ID ERRLOG ORIGINAL_TREE
# KIND: app (appender, one write per record), ren (renames of files and
# directories), hl (hard links), ul (files unlinked while open), mm (shared
# mmap writes), rd (reads of lower files), bw (in-place writes into a lower
# file), tree (trees made and removed, symlinks).
import os, sys, time, random, hashlib, mmap, errno
root, kind, wid, errlog, orig = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
rnd = random.Random(hash((kind, wid)) & 0xffffffff)
def err(msg):
    with open(errlog, "a") as f: f.write(f"{time.strftime('%T')} {kind}{wid}: {msg}\n")
def rec(seq, tag):
    body = f"{tag}:{seq:08d}:"
    pad = "x" * (rnd.randint(0, 200))
    h = hashlib.sha1((body+pad).encode()).hexdigest()[:8]
    return f"{body}{pad}:{h}\n".encode()
d = os.path.join(root, f"{kind}{wid}")
os.makedirs(d, exist_ok=True)
it = 0
while True:
    it += 1
    try:
        if kind == "app":   # appender with occasional truncate
            p = os.path.join(d, "log")
            seq = 0
            fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_TRUNC, 0o644)
            for _ in range(rnd.randint(50, 2000)):
                os.write(fd, rec(seq, "A" + wid)); seq += 1
                if rnd.random() < 0.002: os.fsync(fd)
            if rnd.random() < 0.3:
                # truncate to a record boundary via ftruncate to 0
                os.ftruncate(fd, 0)
            os.close(fd)
            # readback check
            data = open(p, "rb").read()
            for i, line in enumerate(data.splitlines(True)):
                if not line.endswith(b"\n") or not line.startswith(f"A{wid}:{i:08d}:".encode()):
                    err(f"readback bad line {i}: {line[:60]!r}"); break
        elif kind == "ren":  # rename file and dir back and forth
            a, b = os.path.join(d, "a"), os.path.join(d, "b")
            os.makedirs(a, exist_ok=True); os.makedirs(b, exist_ok=True)
            if it == 1:
                with open(os.path.join(a, "token"), "w") as f: f.write("token\n")
                os.makedirs(os.path.join(d, "d1"), exist_ok=True)
                for i in range(10):
                    with open(os.path.join(d, "d1", f"m{i}"), "w") as f: f.write(f"m{i}\n" * 100)
                os.makedirs(os.path.join(d, "d1", "deep", "er"), exist_ok=True)
                with open(os.path.join(d, "d1", "deep", "er", "z"), "w") as f: f.write("z\n")
            for _ in range(200):
                if os.path.exists(os.path.join(a, "token")): os.rename(os.path.join(a, "token"), os.path.join(b, "token"))
                else: os.rename(os.path.join(b, "token"), os.path.join(a, "token"))
                if os.path.exists(os.path.join(d, "d1")): os.rename(os.path.join(d, "d1"), os.path.join(b, "d2"))
                else: os.rename(os.path.join(b, "d2"), os.path.join(d, "d1"))
            # exchange-like: rename over existing
            t = os.path.join(d, "v.tmp")
            with open(t, "w") as f: f.write(f"version {it}\n" + "y" * rnd.randint(0, 5000))
            os.rename(t, os.path.join(d, "v"))
        elif kind == "hl":  # hard links
            p = os.path.join(d, "orig"); q = os.path.join(d, "link")
            with open(p, "wb") as f: f.write(rec(it, "H"))
            try: os.unlink(q)
            except FileNotFoundError: pass
            os.link(p, q)
            with open(q, "ab") as f: f.write(rec(it+1, "H"))
            if open(p, "rb").read() != open(q, "rb").read(): err("hardlink mismatch")
            if rnd.random() < 0.5: os.unlink(p)
            else: os.rename(q, p)
        elif kind == "ul":  # unlink open file, keep using it across rebases
            p = os.path.join(d, f"u{it%3}")
            fd = os.open(p, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            content = b""
            for i in range(20):
                r = rec(i, "U"); os.write(fd, r); content += r
            os.unlink(p)
            for i in range(20, 60):
                r = rec(i, "U"); os.write(fd, r); content += r
                time.sleep(0.05)
            os.lseek(fd, 0, 0)
            got = b""
            while True:
                c = os.read(fd, 65536)
                if not c: break
                got += c
            if got != content: err(f"unlinked-open fd content mismatch {len(got)} vs {len(content)}")
            os.close(fd)
        elif kind == "mm":  # mmap writes
            p = os.path.join(d, "m")
            sz = 1 << 20
            fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
            os.ftruncate(fd, sz)
            m = mmap.mmap(fd, sz)
            val = it % 251
            for off in range(0, sz, 4096):
                m[off:off+4096] = bytes([val]) * 4096
            m.flush(); m.close()
            os.close(fd)
            data = open(p, "rb").read()
            if data != bytes([val]) * sz: err("mmap readback mismatch")
            with open(os.path.join(d, "m.val"), "w") as f: f.write(str(val))
        elif kind == "rd":  # read lower files with long-open fds and fresh opens
            want = wid  # unused
            p = os.path.join(root, "big", "blob.bin")
            exp = open(os.path.join(orig, "big", "blob.bin"), "rb").read()
            fd = os.open(p, os.O_RDONLY)
            for _ in range(30):
                off = rnd.randrange(0, len(exp) - 65536)
                got = os.pread(fd, 65536, off)
                if got != exp[off:off+65536]: err(f"lower pread mismatch at {off}")
                time.sleep(0.05)
            os.close(fd)
            for i in rnd.sample(range(1, 201), 10):
                q = os.path.join(root, "src", f"f{i}.txt")
                try:
                    c = open(q).read()
                    if not c.startswith(f"file {i}\n"): err(f"src f{i} content {c[:40]!r}")
                except FileNotFoundError: pass
        elif kind == "bw":  # in-place pwrite into a big lower file (copy-up) + src edits
            p = os.path.join(root, "big", "blob2.bin")
            fd = os.open(p, os.O_RDWR)
            off = rnd.randrange(0, 5 << 20, 512)
            os.pwrite(fd, b"%08d" % it * 64, off)
            os.close(fd)
            i = rnd.randint(1, 200)
            q = os.path.join(root, "src", f"f{i}.txt")
            with open(q, "a") as f: f.write(f"edit {it}\n")
            time.sleep(0.02)
        elif kind == "tree":  # create/remove trees, chmod, symlinks
            t = os.path.join(d, f"t{it%5}")
            if os.path.exists(t):
                for dp, dn, fn in os.walk(t, topdown=False):
                    for x in fn: os.unlink(os.path.join(dp, x))
                    for x in dn:
                        pp = os.path.join(dp, x)
                        if os.path.islink(pp): os.unlink(pp)
                        else: os.rmdir(pp)
                os.rmdir(t)
            else:
                os.makedirs(os.path.join(t, "a", "b"))
                for i in range(20):
                    fp = os.path.join(t, "a", f"f{i}")
                    with open(fp, "w") as f: f.write(f"{i}\n" * i)
                    if i % 3 == 0: os.chmod(fp, 0o755)
                os.symlink("../a/f1", os.path.join(t, "a", "b", "ln"))
                os.symlink(os.path.join(root, "src"), os.path.join(t, "abs"))
        else:
            err("unknown kind"); sys.exit(1)
    except Exception as e:
        import traceback; err(f"exception {type(e).__name__}: {e} @ " + traceback.format_exc().strip().splitlines()[-3].strip())
        time.sleep(0.5)
