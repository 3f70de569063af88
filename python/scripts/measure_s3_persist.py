"""What naming an s3:// key by the packet's digest costs (docs/orchestrators.md):
a 215 MB tar packed to s3://…/{digest}.packet on moto, against one pack to a
fixed key and against packing twice (to a scratch file to learn the digest,
then to the key).
Run with the venv of scripts/python-tests.sh and SESSIONFS set."""

import os, sys, time, tempfile, subprocess, socket, io, tarfile, random
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from conftest import S3, _free_port, _python_with_moto
import sessionfs
port = _free_port()
proc = subprocess.Popen([_python_with_moto(), "-c", "from moto.server import main; import sys; main(['-H','127.0.0.1','-p',sys.argv[1]])", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
for _ in range(600):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close(); break
    except OSError: time.sleep(0.1)
s3 = S3(port)
bucket = s3.bucket()
ws = tempfile.mkdtemp()
rng = random.Random(1)
# 200 MB: 40 files of 5 MB, 2000 small files
for k in range(40):
    with open(f"{ws}/big{k}", "wb") as f: f.write(os.urandom(5 << 20))
os.makedirs(f"{ws}/src")
for k in range(2000):
    with open(f"{ws}/src/f{k}.txt", "w") as f: f.write("x" * rng.randint(10, 4000))
tar = tempfile.mktemp(suffix=".tar")
subprocess.run(["tar", "-C", ws, "-cf", tar, "."], check=True)
print("tar bytes", os.path.getsize(tar))
env = s3.env
def t(f):
    t0 = time.monotonic(); r = f(); return time.monotonic() - t0, r
d = tempfile.mkdtemp()
a, r1 = t(lambda: sessionfs.pack(f"{d}/{{digest}}.packet", workspace_tar=tar, zero_mtimes=True))
b, r2 = t(lambda: sessionfs.pack(f"s3://{bucket}/p/{r1.digest.replace(':','-')}.packet", workspace_tar=tar, zero_mtimes=True, env=env))
c, r3 = t(lambda: sessionfs.pack(f"s3://{bucket}/q/fixed.packet", workspace_tar=tar, zero_mtimes=True, env=env))
e, r4 = t(lambda: sessionfs.pack(f"s3://{bucket}/n/{{digest}}.packet", workspace_tar=tar, zero_mtimes=True, env=env))
g, r5 = t(lambda: sessionfs.pack(f"s3://{bucket}/n/{{digest}}.packet", workspace_tar=tar, zero_mtimes=True, env=env))
print(f"two packs (scratch file {a:.2f}s, then the key {b:.2f}s): {a+b:.2f}s; one pack to a fixed key {c:.2f}s; "
      f"one pack to s3://…/{{digest}}.packet {e:.2f}s; again (already_there={r5.already_there}) {g:.2f}s")
proc.kill()
