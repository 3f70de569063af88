"""Fixtures: the binary built in this repository, temporary trees, and a
real S3 server on loopback (moto, as tests/common/s3.rs starts it)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _binary() -> str:
    named = os.environ.get("SESSIONFS")
    if named:
        return named
    for profile in ("debug", "release"):
        candidate = REPO / "target" / profile / "sessionfs"
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("sessionfs")
    if found:
        return found
    raise RuntimeError("no sessionfs binary: build it (cargo build) or set SESSIONFS")


# Every call in the tests finds the binary as users do: through SESSIONFS.
os.environ["SESSIONFS"] = _binary()


def fuse_available() -> bool:
    return os.path.exists("/dev/fuse") and shutil.which("fusermount3") is not None


needs_fuse = pytest.mark.skipif(
    not fuse_available() and os.environ.get("SESSIONFS_REQUIRE_FUSE") != "1",
    reason="FUSE is not available here",
)


def _python_with_moto() -> str:
    for py in (str(REPO / ".venv" / "bin" / "python3"), sys.executable, "python3"):
        try:
            ok = subprocess.run(
                [py, "-c", "import moto.server"], capture_output=True, timeout=60
            ).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            ok = False
        if ok:
            return py
    raise RuntimeError("moto's server is not installed: run scripts/deps.sh")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class S3:
    """A moto server, its environment for sessionfs and boto3, a bucket."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.env = {
            "AWS_ACCESS_KEY_ID": "AKIDSESSIONFSTESTS",
            "AWS_SECRET_ACCESS_KEY": "sessionfs-python-tests-secret",
            "AWS_REGION": "us-east-1",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        }

    def client(self):  # noqa: ANN201 - boto3's client
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.env["AWS_ENDPOINT_URL"],
            aws_access_key_id=self.env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=self.env["AWS_SECRET_ACCESS_KEY"],
            region_name="us-east-1",
        )

    def bucket(self) -> str:
        name = f"b-{uuid.uuid4().hex[:12]}"
        self.client().create_bucket(Bucket=name)
        return name


@pytest.fixture(scope="session")
def s3() -> Iterator[S3]:
    port = _free_port()
    script = (
        "import os, sys, threading\n"
        "threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()\n"
        "from moto.server import main\n"
        "main(['-H', '127.0.0.1', '-p', sys.argv[1]])\n"
    )
    proc = subprocess.Popen(
        [_python_with_moto(), "-c", script, str(port)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto did not start") from None
            time.sleep(0.05)
    try:
        yield S3(port)
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def sample_tree(root: Path) -> None:
    """Files, an executable, a nested directory, symlinks, an empty dir."""
    (root / "src" / "lib").mkdir(parents=True)
    (root / "emptydir").mkdir()
    (root / "README.md").write_text("# sample\n")
    (root / "src" / "main.py").write_text("print('hi')\n")
    (root / "src" / "lib" / "mod.py").write_text("X = 1\n")
    run = root / "run.sh"
    run.write_text("#!/bin/sh\necho run\n")
    run.chmod(0o755)
    (root / "big.bin").write_bytes(bytes(range(256)) * 20000)
    (root / "link").symlink_to("src/main.py")
    (root / "src" / "up").symlink_to("../README.md")
