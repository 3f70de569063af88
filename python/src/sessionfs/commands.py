"""Every command as a function returning its typed result.

Each takes the command's options as keyword arguments (docs/CLI.md says what
each does), and three of its own: ``sessionfs`` (the binary; default
``$SESSIONFS``, else ``sessionfs`` on ``PATH``), ``env`` (added to the
environment: ``AWS_*`` for ``s3://`` packets, ``SESSIONFS_*``), and
``timeout`` (seconds; past it the command is stopped and
:class:`~sessionfs.errors.CommandTimeoutError` raised). A failure raises
:class:`~sessionfs.errors.SessionfsError` with the error object's ``kind``,
``exit_code``, ``path`` and ``hint``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from typing import IO, Literal

from ._run import run
from .results import (
    DigestResult,
    InspectResult,
    MountResult,
    PackResult,
    Receipt,
    SealResult,
    StatusResult,
    UmountResult,
    UnpackResult,
    VerifyResult,
)

PathLike = str | os.PathLike[str]
#: A tar stream's source: a path, ``-`` (then ``stdin``), bytes, or a
#: binary file object.
TarSource = PathLike | bytes | IO[bytes]
HarnessKind = Literal["codex", "claude", "opencode", "generic"]
Part = Literal["workspace", "harness"]


def _limits(
    max_bytes: int | str | None, max_entries: int | None, max_path_bytes: int | None
) -> list[str]:
    out: list[str] = []
    if max_bytes is not None:
        out += ["--max-bytes", str(max_bytes)]
    if max_entries is not None:
        out += ["--max-entries", str(max_entries)]
    if max_path_bytes is not None:
        out += ["--max-path-bytes", str(max_path_bytes)]
    return out


def _policy(
    zero_mtimes: bool,
    reject_external_symlinks: bool,
    exclude: Iterable[str],
    keep: Iterable[str],
    file_sha256: bool,
) -> list[str]:
    out: list[str] = []
    if zero_mtimes:
        out.append("--zero-mtimes")
    if reject_external_symlinks:
        out.append("--reject-external-symlinks")
    for g in exclude:
        out += ["--exclude", g]
    for g in keep:
        out += ["--keep", g]
    if file_sha256:
        out.append("--file-sha256")
    return out


def _tar_arg(source: TarSource) -> tuple[str, bytes | IO[bytes] | None]:
    """A tar source as an argument, and what goes to stdin for it."""
    if isinstance(source, bytes | bytearray):
        return "-", bytes(source)
    if hasattr(source, "read"):
        return "-", source  # type: ignore[return-value]
    return os.fspath(source), None  # type: ignore[arg-type]


def pack(
    output: PathLike,
    *,
    workspace: PathLike | None = None,
    workspace_tar: TarSource | None = None,
    harness: PathLike | None = None,
    harness_tar: TarSource | None = None,
    harness_kind: HarnessKind | None = None,
    zero_mtimes: bool = False,
    reject_external_symlinks: bool = False,
    exclude: Iterable[str] = (),
    keep: Iterable[str] = (),
    hold_memory: int | str | None = None,
    file_sha256: bool = False,
    max_bytes: int | str | None = None,
    max_entries: int | None = None,
    max_path_bytes: int | None = None,
    sessionfs: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> PackResult:
    """``sessionfs pack``: a workspace (a directory, or a tar stream: a
    path, bytes or a binary file object, never extracted), and optionally a
    harness home, into a packet at `output` (a file, ``DIR/{digest}.packet``
    to name it by its digest, or ``s3://BUCKET/KEY``)."""
    args: list[str] = ["pack"]
    stdin: bytes | IO[bytes] | None = None
    if workspace is not None:
        args += ["--workspace", os.fspath(workspace)]
    if workspace_tar is not None:
        arg, stdin = _tar_arg(workspace_tar)
        args += ["--workspace-tar", arg]
    if harness is not None:
        args += ["--harness", os.fspath(harness)]
    if harness_tar is not None:
        arg, fed = _tar_arg(harness_tar)
        if fed is not None and stdin is not None:
            raise ValueError("only one of workspace_tar and harness_tar can be a stream")
        stdin = fed if fed is not None else stdin
        args += ["--harness-tar", arg]
    if harness_kind is not None:
        args += ["--harness-kind", harness_kind]
    args += ["-o", os.fspath(output)]
    args += _policy(zero_mtimes, reject_external_symlinks, exclude, keep, file_sha256)
    if hold_memory is not None:
        args += ["--hold-memory", str(hold_memory)]
    args += _limits(max_bytes, max_entries, max_path_bytes)
    obj = run(args, sessionfs=sessionfs, env=env, stdin=stdin, timeout=timeout)
    return PackResult.from_json(obj)


def verify(
    packet: PathLike,
    *,
    digest: str | None = None,
    max_bytes: int | str | None = None,
    max_entries: int | None = None,
    max_path_bytes: int | None = None,
    sessionfs: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> VerifyResult:
    """``sessionfs verify``: every byte of the packet (a file, ``s3://``,
    ``http(s)://``) checked; with `digest`, that it is that packet."""
    args = ["verify", os.fspath(packet)]
    if digest is not None:
        args += ["--digest", digest]
    args += _limits(max_bytes, max_entries, max_path_bytes)
    return VerifyResult.from_json(run(args, sessionfs=sessionfs, env=env, timeout=timeout))


def inspect(
    packet: PathLike,
    *,
    max_bytes: int | str | None = None,
    max_entries: int | None = None,
    max_path_bytes: int | None = None,
    sessionfs: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> InspectResult:
    """``sessionfs inspect``: the packet's metadata, from its manifest."""
    args = ["inspect", os.fspath(packet), *_limits(max_bytes, max_entries, max_path_bytes)]
    return InspectResult.from_json(run(args, sessionfs=sessionfs, env=env, timeout=timeout))


def digest(
    packet: PathLike,
    *,
    max_bytes: int | str | None = None,
    max_entries: int | None = None,
    max_path_bytes: int | None = None,
    sessionfs: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> DigestResult:
    """``sessionfs digest``: the packet's digest, from its first member."""
    args = ["digest", os.fspath(packet), *_limits(max_bytes, max_entries, max_path_bytes)]
    return DigestResult.from_json(run(args, sessionfs=sessionfs, env=env, timeout=timeout))


def unpack(
    packet: PathLike,
    *,
    into: PathLike | None = None,
    tar: PathLike | IO[bytes] | None = None,
    digest: str | None = None,
    part: Part | None = None,
    strict_symlinks: bool = False,
    uid: int | None = None,
    gid: int | None = None,
    max_bytes: int | str | None = None,
    max_entries: int | None = None,
    max_path_bytes: int | None = None,
    sessionfs: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> UnpackResult:
    """``sessionfs unpack``: the packet's tree `into` a new or empty
    directory, or as a ``.``-rooted `tar` stream (a path, or a binary file
    object the verified stream is written to; a refused packet raises, the
    stream then having no valid end)."""
    if (into is None) == (tar is None):
        raise ValueError("give exactly one of into and tar")
    args = ["unpack", os.fspath(packet)]
    out: IO[bytes] | None = None
    if into is not None:
        args += ["--into", os.fspath(into)]
    elif hasattr(tar, "write"):
        args += ["--tar", "-"]
        out = tar  # type: ignore[assignment]
    else:
        args += ["--tar", os.fspath(tar)]  # type: ignore[arg-type]
    if digest is not None:
        args += ["--digest", digest]
    if part is not None:
        args += ["--part", part]
    if strict_symlinks:
        args.append("--strict-symlinks")
    if uid is not None:
        args += ["--uid", str(uid)]
    if gid is not None:
        args += ["--gid", str(gid)]
    args += _limits(max_bytes, max_entries, max_path_bytes)
    obj = run(args, sessionfs=sessionfs, env=env, stdout=out, timeout=timeout)
    return UnpackResult.from_json(obj)


def mount(
    packet: PathLike,
    mountpoint: PathLike,
    *,
    upper: PathLike,
    digest: str | None = None,
    part: Part | None = None,
    uid: int | None = None,
    gid: int | None = None,
    allow_other: bool = False,
    threads: int | None = None,
    secrets: Mapping[str, PathLike] | None = None,
    cache: PathLike | None = None,
    cache_size: int | str | None = None,
    max_memory: int | str | None = None,
    block_size: int | str | None = None,
    prefetch: Literal["trace", "all", "none"] | None = None,
    max_bytes: int | str | None = None,
    max_entries: int | None = None,
    max_path_bytes: int | None = None,
    sessionfs: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> MountResult:
    """``sessionfs mount``: serves the packet at `mountpoint` with the
    copy-on-write directory `upper`; returns once the mount is ready (its
    daemon keeps serving). `secrets` maps a path in the view to a host file
    shown read-only there."""
    args = ["mount", os.fspath(packet), os.fspath(mountpoint), "--upper", os.fspath(upper)]
    if digest is not None:
        args += ["--digest", digest]
    if part is not None:
        args += ["--part", part]
    if uid is not None:
        args += ["--uid", str(uid)]
    if gid is not None:
        args += ["--gid", str(gid)]
    if allow_other:
        args.append("--allow-other")
    if threads is not None:
        args += ["--threads", str(threads)]
    for view, host in (secrets or {}).items():
        args += ["--secret", f"{view}={os.fspath(host)}"]
    if cache is not None:
        args += ["--cache", os.fspath(cache)]
    if cache_size is not None:
        args += ["--cache-size", str(cache_size)]
    if max_memory is not None:
        args += ["--max-memory", str(max_memory)]
    if block_size is not None:
        args += ["--block-size", str(block_size)]
    if prefetch is not None:
        args += ["--prefetch", prefetch]
    args += _limits(max_bytes, max_entries, max_path_bytes)
    return MountResult.from_json(run(args, sessionfs=sessionfs, env=env, timeout=timeout))


def umount(
    mountpoint: PathLike,
    *,
    lazy: bool = False,
    sessionfs: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> UmountResult:
    """``sessionfs umount``: asks the mount's daemon to unmount, and waits."""
    args = ["umount", os.fspath(mountpoint)]
    if lazy:
        args.append("--lazy")
    return UmountResult.from_json(run(args, sessionfs=sessionfs, env=env, timeout=timeout))


def status(
    mountpoint: PathLike,
    *,
    sessionfs: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> StatusResult:
    """``sessionfs status``: what a running mount serves, and its counters."""
    args = ["status", os.fspath(mountpoint)]
    return StatusResult.from_json(run(args, sessionfs=sessionfs, env=env, timeout=timeout))


def seal(
    output: PathLike,
    *,
    mountpoint: PathLike | None = None,
    packet: PathLike | None = None,
    upper: PathLike | None = None,
    rebase: bool = False,
    receipt: PathLike | None = None,
    zero_mtimes: bool = False,
    reject_external_symlinks: bool = False,
    exclude: Iterable[str] = (),
    keep: Iterable[str] = (),
    file_sha256: bool = False,
    max_bytes: int | str | None = None,
    max_entries: int | None = None,
    max_path_bytes: int | None = None,
    sessionfs: PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> SealResult:
    """``sessionfs seal``: the merged view of a mount (`mountpoint`), or,
    offline, of `packet` and its `upper` directory, as a new packet at
    `output` (a file, ``DIR/{digest}.packet``, or ``s3://BUCKET/KEY``); with
    `rebase`, the mount goes on from it; `receipt` writes the change
    receipt (read it with :func:`read_receipt`)."""
    if (mountpoint is None) == (packet is None):
        raise ValueError("give a mountpoint, or a packet and its upper directory")
    args = ["seal"]
    if mountpoint is not None:
        args.append(os.fspath(mountpoint))
    else:
        if upper is None:
            raise ValueError("an offline seal needs the upper directory")
        args += ["--packet", os.fspath(packet), "--upper", os.fspath(upper)]  # type: ignore[arg-type]
    args += ["-o", os.fspath(output)]
    if rebase:
        args.append("--rebase")
    if receipt is not None:
        args += ["--receipt", os.fspath(receipt)]
    args += _policy(zero_mtimes, reject_external_symlinks, exclude, keep, file_sha256)
    args += _limits(max_bytes, max_entries, max_path_bytes)
    return SealResult.from_json(run(args, sessionfs=sessionfs, env=env, timeout=timeout))


def read_receipt(path: PathLike) -> Receipt:
    """The receipt a seal wrote (``sessionfs.receipt/1``)."""
    with open(path, "rb") as f:
        obj = json.load(f)
    if not isinstance(obj, dict) or not str(obj.get("schema", "")).startswith("sessionfs.receipt/"):
        raise ValueError(f"{os.fspath(path)}: not a sessionfs receipt")
    return Receipt.from_json(obj)
