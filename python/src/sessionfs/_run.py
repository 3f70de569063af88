"""Running the binary: found on ``PATH`` or named by ``SESSIONFS``; its one
JSON object parsed; its error object raised as :class:`SessionfsError`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import IO, Any

from .errors import BinaryNotFoundError, CommandTimeoutError, ProtocolError, SessionfsError

#: Seconds a command stopped by SIGTERM (at its timeout) gets to remove
#: what it half-wrote before it is killed.
TERM_GRACE = 10.0

#: Bytes copied at a time between a file object and the binary.
COPY_CHUNK = 1 << 20


def binary(explicit: str | os.PathLike[str] | None = None) -> str:
    """The sessionfs binary: `explicit`, else ``$SESSIONFS``, else the first
    ``sessionfs`` on ``PATH``."""
    if explicit is not None:
        path = os.fspath(explicit)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
        raise BinaryNotFoundError(f"{path}: not an executable file (the binary asked for)")
    named = os.environ.get("SESSIONFS")
    if named:
        if os.path.isfile(named) and os.access(named, os.X_OK):
            return named
        raise BinaryNotFoundError(f"{named}: not an executable file (SESSIONFS names it)")
    found = shutil.which("sessionfs")
    if found is None:
        raise BinaryNotFoundError(
            "sessionfs is not on PATH; install it, or set SESSIONFS to the binary's path"
        )
    return found


def _object(text: str) -> dict[str, Any] | None:
    """`text` as one JSON object with a sessionfs schema, if it is one."""
    try:
        obj = json.loads(text)
    except ValueError:
        return None
    if isinstance(obj, dict) and str(obj.get("schema", "")).startswith("sessionfs."):
        return obj
    return None


def run(
    args: Sequence[str | os.PathLike[str]],
    *,
    sessionfs: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    stdin: IO[bytes] | bytes | None = None,
    stdout: IO[bytes] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Runs ``sessionfs ARGS…`` and returns its result object; raises
    :class:`SessionfsError` with its error object when it fails.

    `stdin` (bytes or a binary file object) is given to the command (``-``
    arguments read it); with `stdout` (a binary file object), the command's
    stdout is data (``unpack --tar -``) copied there, and its result object
    is the last line of its stderr, as docs/CLI.md says. `env` is added to
    the environment. Past `timeout` seconds the command is sent SIGTERM (it
    removes what it half-wrote), then killed, and
    :class:`~sessionfs.errors.CommandTimeoutError` is raised.
    """
    argv = [binary(sessionfs), *(os.fspath(a) for a in args)]
    environ = dict(os.environ)
    if env:
        environ.update(env)
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=environ,
    )
    threads = []
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []
    failures: list[BaseException] = []

    def feed() -> None:
        assert proc.stdin is not None
        try:
            if isinstance(stdin, bytes | bytearray | memoryview):
                proc.stdin.write(stdin)
            elif stdin is not None:
                while chunk := stdin.read(COPY_CHUNK):
                    proc.stdin.write(chunk)
        except BrokenPipeError:
            pass  # the command stopped reading: its result says why
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)
        finally:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass

    def drain(src: IO[bytes], sink: IO[bytes] | list[bytes]) -> None:
        try:
            while chunk := src.read(COPY_CHUNK):
                if isinstance(sink, list):
                    sink.append(chunk)
                else:
                    sink.write(chunk)
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)
            # Keep reading: a blocked writer would never end.
            while src.read(COPY_CHUNK):
                pass

    feeder = threading.Thread(target=feed, daemon=True) if stdin is not None else None
    assert proc.stdout is not None and proc.stderr is not None
    threads.append(
        threading.Thread(
            target=drain, args=(proc.stdout, stdout if stdout is not None else out_chunks), daemon=True
        )
    )
    threads.append(threading.Thread(target=drain, args=(proc.stderr, err_chunks), daemon=True))
    for t in threads:
        t.start()
    if feeder is not None:
        feeder.start()
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=TERM_GRACE)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # (The feeder may be blocked reading its source: it is left to
        # end with it, or with the process, as a daemon thread.)
        for t in threads:
            t.join()
        raise CommandTimeoutError(
            f"sessionfs {' '.join(argv[1:2])} ran past its timeout of {timeout} s and was stopped"
        ) from None
    for t in threads:
        t.join()
    if feeder is not None:
        # The command has ended: what it did not read is not waited for.
        feeder.join(timeout=1.0)
    if failures:
        raise failures[0]
    err = b"".join(err_chunks).decode("utf-8", "replace")
    if stdout is not None:
        lines = [line for line in err.splitlines() if line.strip()]
        obj = _object(lines[-1]) if lines else None
    else:
        text = b"".join(out_chunks).decode("utf-8", "replace").strip()
        obj = _object(text) if "\n" not in text else None
    if obj is None:
        raise ProtocolError(
            f"sessionfs {' '.join(argv[1:2])} exited {code} without its one JSON object; "
            f"stderr: {err.strip()[-2000:]}",
            code,
        )
    if obj.get("schema") == "sessionfs.error/1" or code != 0:
        raise SessionfsError.from_json(obj, code)
    return obj
