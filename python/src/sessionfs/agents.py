"""The OpenAI Agents SDK integration (``pip install 'sessionfs[agents]'``;
tested with ``openai-agents==0.24.0``).

- :class:`SessionfsSnapshot`, a ``SnapshotBase`` for any sandbox client:
  ``persist`` packs the SDK's workspace tar (``pack --workspace-tar``, never
  extracted) into a packet named by its digest under ``location`` (a
  directory or ``s3://bucket/prefix``) and moves the pointer for ``id`` to
  it; ``restore`` returns the verified tar stream of the packet's
  workspace (``unpack --tar``); ``restorable`` checks the pointer and the
  packet's digest. :class:`SessionfsSnapshotSpec` builds one per session,
  for ``SandboxRunConfig(snapshot=…)``.
- :class:`PacketWorkspace`, mount-then-run for the Unix-local client: the
  packet mounted, a ``Manifest`` rooted at the mount, ``seal --rebase`` with
  a receipt at each turn's end, unmounted at the end.

A refused persist never loses the turn's work silently: the SDK's tar is
kept, whole, under ``location/refused/`` before the error is raised, the
pointer still names the previous snapshot, and the error
(:class:`PersistRefused`) names the paths, the reason and the option that
would take them. See docs/orchestrators.md.
"""

from __future__ import annotations

import datetime
import io
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from agents.sandbox.errors import (
    SnapshotNotRestorableError,
    SnapshotPersistError,
    SnapshotRestoreError,
)
from agents.sandbox.manifest import Manifest
from agents.sandbox.snapshot import SnapshotBase, SnapshotSpec
from pydantic import BaseModel, Field

from . import commands
from .errors import SessionfsError
from .results import PackResult, Receipt, SealResult

#: The schema of a snapshot pointer (see :class:`Pointer`).
POINTER_SCHEMA = "sessionfs.snapshot-pointer/1"

#: The schema of the record a refused persist leaves (``<id>.refused.json``).
REFUSAL_SCHEMA = "sessionfs.snapshot-refusal/1"

_log = logging.getLogger("sessionfs.agents")

#: What the SDK's `snapshot_id`s may be: one path segment, no hidden name.
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")

#: The error kinds of a persist that sessionfs refused for what the tree
#: holds, with the option that would take it (docs/orchestrators.md).
REFUSALS: dict[str, str] = {
    "path_collision": "rename one of the two names, or leave one out with exclude=[…]",
    "invalid_path": "rename it, or leave it out with exclude=[…]",
    "non_utf8_name": "rename it, or leave it out with exclude=[…]",
    "non_utf8_target": "change the link, or leave it out with exclude=[…]",
    "invalid_symlink_target": "change the link, or leave it out with exclude=[…]",
    "external_symlink": "reject_external_symlinks=False keeps it (the SDK's extractor refuses "
    "it at restore), or leave it out with exclude=[…]",
    "credential_store": "exclude=[…] leaves it out, keep=[…] packs it knowingly",
    "limit_exceeded": "raise max_bytes / max_entries / max_path_bytes, or leave the bulk out "
    "with exclude=[…]",
    "format_limit": "leave the file out with exclude=[…] (a packet holds files under 8 GiB)",
    "bad_tar": "the SDK's tar was refused as damaged; it is kept as it was",
}


class PersistRefused(SnapshotPersistError):
    """``sessionfs pack`` refused the workspace (or failed): the SDK's tar
    is kept at ``kept`` and the pointer was not moved. ``error`` is the
    sessionfs error (``kind``, ``path``, ``message``); ``option`` says what
    would take the tree."""

    def __init__(
        self, *, snapshot_id: str, location: str, error: SessionfsError, kept: str
    ) -> None:
        option = REFUSALS.get(error.kind, "see the message")
        super().__init__(
            snapshot_id=snapshot_id,
            path=Path(location),
            context={
                "kind": error.kind,
                "path": error.path,
                "sessionfs_message": error.message,
                "option": option,
                "kept": kept,
            },
            cause=error,
        )
        self.error = error
        self.kept = kept
        self.option = option
        self.message = (
            f"sessionfs did not persist snapshot {snapshot_id!r}: {error.message} "
            f"[{error.kind}]; {option}. The workspace's tar is kept whole at {kept}, "
            f"and the snapshot still names its previous packet."
        )
        self.args = (self.message,)


def _check_id(snapshot_id: str) -> str:
    if not _ID.match(snapshot_id):
        raise ValueError(
            f"snapshot id {snapshot_id!r}: one path segment of letters, digits, `.`, `_`, `-` "
            "(not starting with `.` or `-`), at most 200 bytes"
        )
    return snapshot_id


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class _Store:
    """Where snapshots live: a directory, or ``s3://bucket/prefix`` (through
    boto3 for the pointers and kept tars; packets are sessionfs's own)."""

    def __init__(self, location: str, env: Mapping[str, str] | None) -> None:
        self.location = location.rstrip("/") or location
        self.env = dict(env or {})
        self.s3 = location.startswith("s3://")
        if self.s3:
            rest = location[len("s3://") :]
            self.bucket, _, prefix = rest.partition("/")
            self.prefix = prefix.strip("/")

    def where(self, name: str) -> str:
        """The location of `name` (a packet, a pointer) in the store."""
        return f"{self.location}/{name}"

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _client(self) -> Any:
        import boto3  # the `s3` extra

        # The settings sessionfs reads (AWS_ENDPOINT_URL, …) are the
        # environment's, with `env` over them, as for the binary.
        saved = {k: os.environ.get(k) for k in self.env}
        os.environ.update(self.env)
        try:
            return boto3.session.Session().client("s3")
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v

    def read(self, name: str) -> bytes | None:
        """The bytes of `name`, or None where there is none."""
        if not self.s3:
            try:
                return Path(self.where(name)).read_bytes()
            except FileNotFoundError:
                return None
        client = self._client()
        try:
            return client.get_object(Bucket=self.bucket, Key=self._key(name))["Body"].read()
        except client.exceptions.NoSuchKey:
            return None

    def write_atomic(self, name: str, data: bytes) -> None:
        """Puts `data` at `name`, replacing what is there at once: readers
        see the old bytes or the new (a rename; an S3 PUT)."""
        if self.s3:
            self._client().put_object(Bucket=self.bucket, Key=self._key(name), Body=data)
            return
        directory = Path(self.location)
        fd, tmp = tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, directory / name)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def remove(self, name: str) -> None:
        """Removes `name`, if it is there."""
        if self.s3:
            self._client().delete_object(Bucket=self.bucket, Key=self._key(name))
            return
        Path(self.where(name)).unlink(missing_ok=True)

    def keep(self, tar: Path, name: str) -> str:
        """Keeps the tar file `tar` as `refused/<name>`; where it went."""
        if self.s3:
            with tar.open("rb") as f:
                self._client().put_object(
                    Bucket=self.bucket, Key=self._key(f"refused/{name}"), Body=f
                )
            tar.unlink(missing_ok=True)
            return self.where(f"refused/{name}")
        refused = Path(self.location) / "refused"
        refused.mkdir(parents=True, exist_ok=True)
        to = refused / name
        shutil.move(tar, to)
        return str(to)


class _Settings(BaseModel):
    """What a sessionfs snapshot is packed and restored with (the
    snapshot's fields, and its spec's)."""

    #: A directory, or ``s3://bucket/prefix``.
    location: str
    #: Every mtime recorded as 0 (recommended: the SDK's extractor restores
    #: no mtimes, so kept mtimes would make every restore → persist cycle of
    #: an unchanged workspace a new packet).
    zero_mtimes: bool = True
    #: Refuse, at persist, symlinks whose targets leave the workspace
    #: (instead of storing and reporting them).
    reject_external_symlinks: bool = False
    #: Restore with ``unpack --strict-symlinks``: a packet whose links leave
    #: the workspace is refused before the sandbox is touched (the SDK's
    #: extractor refuses them too, after clearing the workspace).
    strict_symlinks: bool = True
    exclude: tuple[str, ...] = ()
    keep: tuple[str, ...] = ()
    max_bytes: int | str | None = None
    max_entries: int | None = None
    max_path_bytes: int | None = None
    #: The sessionfs binary (default: ``$SESSIONFS``, else ``PATH``).
    sessionfs: str | None = None
    #: Added to the environment of sessionfs and boto3 (``AWS_*`` for s3).
    env: dict[str, str] = Field(default_factory=dict)
    #: Seconds one sessionfs command may take.
    timeout: float | None = None


class SessionfsSnapshotSpec(SnapshotSpec, _Settings):
    """Builds a :class:`SessionfsSnapshot` for each session:
    ``SandboxRunConfig(snapshot=SessionfsSnapshotSpec(location=…))``."""

    type: Literal["sessionfs"] = "sessionfs"

    def build(self, snapshot_id: str) -> SessionfsSnapshot:
        return SessionfsSnapshot(id=snapshot_id, **self.model_dump(exclude={"type"}))


class Pointer(dict[str, Any]):
    """A snapshot's pointer, ``<location>/<id>.json``: ``schema``
    (``sessionfs.snapshot-pointer/1``), ``id``, ``digest`` (the packet's),
    ``packet`` (its name beside the pointer, ``sha256-<hex>.packet``),
    ``packet_bytes``, ``zero_mtimes``, ``persisted_at`` (UTC). Replaced
    whole, atomically, by each persist."""


class SessionfsSnapshot(SnapshotBase, _Settings):
    """A workspace snapshot kept as sessionfs packets named by their digest
    under ``location``, with a pointer for ``id``. See the module's doc."""

    type: Literal["sessionfs"] = "sessionfs"

    # -- the pieces -----------------------------------------------------

    def _store(self) -> _Store:
        return _Store(self.location, self.env)

    def _pointer_name(self) -> str:
        return f"{_check_id(self.id)}.json"

    def _refusal_name(self) -> str:
        return f"{_check_id(self.id)}.refused.json"

    def refusal(self) -> dict[str, Any] | None:
        """The last persist's refusal (``<id>.refused.json``), if the last
        persist was refused: kind, path, message, option, and where the
        workspace's tar is kept. A persist that succeeds removes it."""
        raw = self._store().read(self._refusal_name())
        if raw is None:
            return None
        try:
            obj = json.loads(raw)
        except ValueError:
            return None
        return obj if isinstance(obj, dict) and obj.get("schema") == REFUSAL_SCHEMA else None

    def raise_if_refused(self) -> None:
        """Raises :class:`PersistRefused` when the last persist was refused.
        Call it after ``Runner.run``: the SDK's Runner logs an error raised
        by a persist at its cleanup and returns the run all the same."""
        r = self.refusal()
        if r is None:
            return
        error = SessionfsError(
            str(r.get("kind", "")),
            str(r.get("message", "")),
            exit_code=int(r.get("exit_code", 7)),
            path=r.get("path"),
            hint=r.get("hint"),
        )
        raise PersistRefused(
            snapshot_id=self.id, location=self.location, error=error, kept=str(r.get("kept"))
        )

    def _limits(self) -> dict[str, Any]:
        return {
            "max_bytes": self.max_bytes,
            "max_entries": self.max_entries,
            "max_path_bytes": self.max_path_bytes,
        }

    def _run_opts(self) -> dict[str, Any]:
        return {"sessionfs": self.sessionfs, "env": self.env or None, "timeout": self.timeout}

    def pointer(self) -> Pointer | None:
        """The pointer for ``id``, if there is one that parses."""
        raw = self._store().read(self._pointer_name())
        if raw is None:
            return None
        try:
            obj = json.loads(raw)
        except ValueError:
            return None
        ok = (
            isinstance(obj, dict)
            and obj.get("schema") == POINTER_SCHEMA
            and obj.get("id") == self.id
            and isinstance(obj.get("digest"), str)
            and isinstance(obj.get("packet"), str)
            and obj["packet"] == obj["digest"].replace(":", "-", 1) + ".packet"
        )
        return Pointer(obj) if ok else None

    def _pack(self, tar: Path, output: str) -> PackResult:
        return commands.pack(
            output,
            workspace_tar=tar,
            zero_mtimes=self.zero_mtimes,
            reject_external_symlinks=self.reject_external_symlinks,
            exclude=self.exclude,
            keep=self.keep,
            **self._limits(),
            **self._run_opts(),
        )

    def _persist_tar(self, tar: Path, store: _Store) -> PackResult:
        """Packs the tar file `tar` to its digest's name in the store (a
        file, or an object: the digest is known before a byte is written,
        so the upload goes under its name at once; a packet already there
        is success)."""
        if not store.s3:
            Path(self.location).mkdir(parents=True, exist_ok=True)
        return self._pack(tar, store.where("{digest}.packet"))

    # -- SnapshotBase ------------------------------------------------------

    async def persist(self, data: io.IOBase, *, dependencies: Any = None) -> None:
        _ = dependencies
        store = self._store()
        pointer_name = self._pointer_name()
        # The SDK's tar goes to a file first: pack reads it where it is
        # (no spool), and a refused persist keeps it whole.
        incoming = Path(self.location) if not store.s3 else Path(tempfile.gettempdir())
        incoming.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{self.id}.", suffix=".tar", dir=incoming)
        tar = Path(name)
        try:
            with os.fdopen(fd, "wb") as f:
                shutil.copyfileobj(data, f, 1 << 20)  # type: ignore[misc]
        except BaseException:
            tar.unlink(missing_ok=True)
            raise
        try:
            packed = self._persist_tar(tar, store)
        except SessionfsError as e:
            stamp = _now().replace(":", "")
            kept = store.keep(tar, f"{self.id}.{stamp}.tar")
            refused = PersistRefused(
                snapshot_id=self.id, location=self.location, error=e, kept=kept
            )
            # Recorded where the orchestrator finds it: the SDK's Runner
            # logs an error raised by a persist at its cleanup and returns
            # the run as if it had been kept (openai-agents 0.24.0).
            record = {
                "schema": REFUSAL_SCHEMA,
                "id": self.id,
                "kind": e.kind,
                "path": e.path,
                "message": e.message,
                "exit_code": e.exit_code,
                "hint": e.hint,
                "option": refused.option,
                "kept": kept,
                "at": _now(),
            }
            store.write_atomic(
                self._refusal_name(), json.dumps(record, indent=1).encode() + b"\n"
            )
            _log.error("%s", refused.message)
            raise refused from e
        except BaseException:
            tar.unlink(missing_ok=True)
            raise
        tar.unlink(missing_ok=True)
        pointer = {
            "schema": POINTER_SCHEMA,
            "id": self.id,
            "digest": packed.digest,
            "packet": packed.digest.replace(":", "-", 1) + ".packet",
            "packet_bytes": packed.packet_bytes,
            "zero_mtimes": self.zero_mtimes,
            "persisted_at": _now(),
        }
        store.write_atomic(pointer_name, json.dumps(pointer, indent=1).encode() + b"\n")
        store.remove(self._refusal_name())

    async def restore(self, *, dependencies: Any = None) -> io.IOBase:
        _ = dependencies
        store = self._store()
        pointer = self.pointer()
        if pointer is None:
            raise SnapshotNotRestorableError(
                snapshot_id=self.id, path=Path(store.where(self._pointer_name()))
            )
        packet = store.where(pointer["packet"])
        out = tempfile.TemporaryFile(prefix="sessionfs-restore-")
        try:
            commands.unpack(
                packet,
                tar=out,
                part="workspace",
                digest=pointer["digest"],
                strict_symlinks=self.strict_symlinks,
                **self._limits(),
                **self._run_opts(),
            )
        except SessionfsError as e:
            out.close()
            raise SnapshotRestoreError(
                snapshot_id=self.id,
                path=Path(packet),
                context={"kind": e.kind, "sessionfs_message": e.message},
                cause=e,
            ) from e
        except BaseException:
            out.close()
            raise
        out.seek(0)
        return out  # type: ignore[return-value]

    async def restorable(self, *, dependencies: Any = None) -> bool:
        _ = dependencies
        pointer = self.pointer()
        if pointer is None:
            return False
        # The manifest's digest, and the length it implies (a packet cut
        # short is not restorable); every byte is verified by the restore.
        try:
            found = commands.inspect(self._store().where(pointer["packet"]), **self._run_opts())
        except SessionfsError:
            return False
        return bool(found.supported and found.length_matches and found.digest == pointer["digest"])


class TurnNotSealed(SessionfsError):
    """A turn's seal was refused (or failed): nothing was written and the
    mount serves what it served, its upper directory holding the turn's
    work; fix what the message names and call :meth:`PacketWorkspace.end_turn`
    again."""


class PacketWorkspace:
    """Mount-then-run for the Unix-local sandbox client: the packet (a file or
    ``s3://…``) mounted at `mountpoint` with the copy-on-write directory
    `upper`; the sandbox works in the mount (:meth:`manifest`,
    :meth:`run_config`); :meth:`end_turn` seals the turn (``seal --rebase``,
    named by its digest under `packets`, its receipt under `receipts`) and
    the mount goes on from the new packet; :meth:`close` unmounts.

    A refused seal (:class:`TurnNotSealed`) writes nothing and leaves the
    mount and the upper directory as they were: the turn's work stays there.
    """

    def __init__(
        self,
        packet: str | os.PathLike[str],
        *,
        mountpoint: str | os.PathLike[str],
        upper: str | os.PathLike[str],
        packets: str | os.PathLike[str],
        receipts: str | os.PathLike[str],
        zero_mtimes: bool = False,
        reject_external_symlinks: bool = False,
        exclude: Sequence[str] = (),
        keep: Sequence[str] = (),
        sessionfs: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> None:
        self.packet = os.fspath(packet)
        self.mountpoint = Path(mountpoint)
        self.upper = Path(upper)
        self.packets = Path(packets)
        self.receipts = Path(receipts)
        self.zero_mtimes = zero_mtimes
        self.reject_external_symlinks = reject_external_symlinks
        self.exclude = tuple(exclude)
        self.keep = tuple(keep)
        self._run = {"sessionfs": sessionfs, "env": env, "timeout": timeout}
        self.turn = 0
        self.mounted = None
        self.sealed: list[tuple[SealResult, Receipt]] = []

    def open(self) -> PacketWorkspace:
        """Mounts the packet's workspace part."""
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.packets.mkdir(parents=True, exist_ok=True)
        self.receipts.mkdir(parents=True, exist_ok=True)
        self.mounted = commands.mount(
            self.packet, self.mountpoint, upper=self.upper, part="workspace", **self._run
        )
        return self

    def manifest(self, **fields: Any) -> Manifest:
        """A ``Manifest`` rooted at the mount (`fields` added)."""
        return Manifest(root=str(self.mountpoint), **fields)

    def run_config(self, **fields: Any) -> Any:
        """A ``SandboxRunConfig`` for a fresh Unix-local sandbox in the mount."""
        from agents.sandbox import SandboxRunConfig
        from agents.sandbox.sandboxes import UnixLocalSandboxClient

        return SandboxRunConfig(
            client=UnixLocalSandboxClient(), manifest=self.manifest(), **fields
        )

    def end_turn(self) -> tuple[SealResult, Receipt]:
        """Seals the turn: a new packet named by its digest, its receipt,
        and the mount moved onto it."""
        receipt = self.receipts / f"turn-{self.turn + 1:04d}.json"
        try:
            sealed = commands.seal(
                self.packets / "{digest}.packet",
                mountpoint=self.mountpoint,
                rebase=True,
                receipt=receipt,
                zero_mtimes=self.zero_mtimes,
                reject_external_symlinks=self.reject_external_symlinks,
                exclude=self.exclude,
                keep=self.keep,
                **self._run,
            )
        except SessionfsError as e:
            raise TurnNotSealed(
                e.kind,
                f"turn {self.turn + 1} was not sealed: {e.message}; "
                f"{REFUSALS.get(e.kind, 'see the message')}. Nothing was written; the mount "
                f"at {self.mountpoint} and its upper directory {self.upper} hold the turn's work",
                exit_code=e.exit_code,
                path=e.path,
                hint=e.hint,
                raw=e.raw,
            ) from e
        self.turn += 1
        turn = (sealed, commands.read_receipt(receipt))
        self.sealed.append(turn)
        return turn

    def close(self) -> None:
        """Unmounts (the upper directory stays: it belongs to the last
        packet sealed)."""
        if self.mounted is not None:
            commands.umount(self.mountpoint, **self._run)
            self.mounted = None

    def __enter__(self) -> PacketWorkspace:
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> PacketWorkspace:
        return self.open()

    async def __aexit__(self, *exc: object) -> None:
        self.close()


def persisted_digest(snapshot: SessionfsSnapshot) -> str | None:
    """The digest the snapshot's pointer names, if any."""
    p = snapshot.pointer()
    return None if p is None else str(p["digest"])


__all__ = [
    "POINTER_SCHEMA",
    "REFUSAL_SCHEMA",
    "PacketWorkspace",
    "PersistRefused",
    "Pointer",
    "SessionfsSnapshot",
    "SessionfsSnapshotSpec",
    "TurnNotSealed",
    "persisted_digest",
]
