"""What SessionfsSnapshot's persist to s3:// costs while a key cannot be named
by a digest in one pack (docs/orchestrators.md): a 215 MB tar packed to a
scratch file and then to s3:// on moto, against one pack to a fixed key.
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
e, r4 = t(lambda: sessionfs.pack(f"s3://{bucket}/p/{r1.digest.replace(':','-')}.packet", workspace_tar=tar, zero_mtimes=True, env=env))
print(f"local digest pack {a:.2f}s; s3 upload pack {b:.2f}s; two together {a+b:.2f}s; one pack to a fixed key {c:.2f}s; again (already_there={r4.already_there}) {e:.2f}s")
proc.kill()
