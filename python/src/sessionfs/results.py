"""Typed results: one dataclass per command, from the one JSON object the
command prints (docs/CLI.md gives each field's meaning).

Every result keeps the object it was read from in ``raw``, and what it did
not map (a field a newer binary added) in ``extra``: the tests hold
``extra`` empty for this repository's binary, so a field the binary gains
is a field these types gain.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, TypeVar

T = TypeVar("T", bound="_Result")


def _convert(tp: Any, value: Any) -> Any:
    """`value` (from JSON) as type hint `tp` says: nested results and lists
    of them are built, everything else is taken as it is."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        inner = [a for a in args if a is not type(None)]
        if value is None or len(inner) != 1:
            return value
        return _convert(inner[0], value)
    if origin is list and args and value is not None:
        return [_convert(args[0], v) for v in value]
    if isinstance(tp, type) and issubclass(tp, _Result) and isinstance(value, dict):
        return tp.from_json(value)
    return value


@dataclass(frozen=True)
class _Result:
    """What every result has: the object as printed, and what no field took."""

    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    extra: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_json(cls: type[T], obj: dict[str, Any]) -> T:
        """The result `obj` (a JSON object the binary printed) holds."""
        hints = typing.get_type_hints(cls)
        names = {f.name for f in dataclasses.fields(cls)} - {"raw", "extra"}
        kwargs: dict[str, Any] = {}
        for f in dataclasses.fields(cls):
            if f.name in ("raw", "extra") or f.name not in obj:
                continue
            kwargs[f.name] = _convert(hints[f.name], obj[f.name])
        extra = {k: v for k, v in obj.items() if k not in names}
        return cls(raw=obj, extra=extra, **kwargs)


@dataclass(frozen=True)
class Reason(_Result):
    """Why an entry was left out: ``rule`` (``credential``, ``excluded``,
    ``machine_state``, ``macos_metadata``, ``sqlite_side_file``,
    ``output_file``, ``hard_link``, ``other_part``) and its details."""

    rule: str = ""
    what: str | None = None
    pattern: str | None = None
    credential: bool | None = None
    database: str | None = None
    of: str | None = None
    part: str | None = None


@dataclass(frozen=True)
class Excluded(_Result):
    """An entry left out by a rule (a directory once, not its contents)."""

    path: str = ""
    type: str = ""
    reason: Reason = field(default_factory=Reason)


@dataclass(frozen=True)
class Dropped(_Result):
    """A socket, FIFO or device, which a packet cannot hold."""

    path: str = ""
    type: str = ""


@dataclass(frozen=True)
class Link(_Result):
    """A symlink whose target leaves its part."""

    path: str = ""
    target: str = ""


@dataclass(frozen=True)
class Rebased(_Result):
    """An absolute symlink into its part, stored relative."""

    path: str = ""
    to: str = ""
    # `from` is a Python keyword.
    from_: str = ""

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Rebased:
        r = super().from_json(obj)
        extra = {k: v for k, v in r.extra.items() if k != "from"}
        return dataclasses.replace(r, from_=str(obj.get("from", "")), extra=extra)


@dataclass(frozen=True)
class Clamped(_Result):
    """A file whose mtime was outside the format's range, recorded clamped."""

    path: str = ""
    mtime_ns: str = ""
    recorded_ns: int = 0


@dataclass(frozen=True)
class _Policy(_Result):
    """What pack and seal report of what the policy did."""

    excluded: list[Excluded] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
    external_symlinks: list[Link] = field(default_factory=list)
    rebased_symlinks: list[Rebased] = field(default_factory=list)
    clamped_mtimes: list[Clamped] = field(default_factory=list)


@dataclass(frozen=True)
class PackResult(_Policy):
    """``sessionfs.pack-result/2``."""

    schema: str = ""
    output: str = ""
    digest: str = ""
    file_sha256: str | None = None
    packet_bytes: int = 0
    entries: int = 0
    files: int = 0
    dirs: int = 0
    symlinks: int = 0
    content_bytes: int = 0
    spooled_bytes: int | None = None
    uploaded_bytes: int | None = None
    copied_bytes: int | None = None
    parts: int | None = None
    already_there: bool = False
    seconds: float = 0.0


@dataclass(frozen=True)
class VerifyResult(_Result):
    """``sessionfs.verify-result/1``."""

    schema: str = ""
    packet: str = ""
    valid: bool = False
    digest: str = ""
    file_sha256: str = ""
    entries: int = 0
    files: int = 0
    content_bytes: int = 0
    packet_bytes: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class Thread(_Result):
    """A Codex rollout of a packet's harness part (``inspect``)."""

    id: str = ""
    rollout: str = ""
    archived: bool = False
    cwd: str | None = None
    history_mode: Any = None
    history_mode_known: bool | None = None
    cli_version: str | None = None
    mtime_ns: int = 0
    rollout_bytes: int = 0
    encrypted_content: bool = False
    problem: str | None = None


@dataclass(frozen=True)
class InspectResult(_Result):
    """``sessionfs.inspect-result/2``; for a packet of a schema this build
    does not support, only ``packet_schema``, ``supported``, ``digest``,
    ``manifest_bytes`` and ``packet_bytes`` are set."""

    schema: str = ""
    packet: str = ""
    packet_schema: str = ""
    packet_version: int | None = None
    supported: bool = False
    digest: str = ""
    manifest_bytes: int = 0
    packet_bytes: int = 0
    harness: str | None = None
    parts: list[str] | None = None
    entries: int | None = None
    files: int | None = None
    dirs: int | None = None
    symlinks: int | None = None
    content_bytes: int | None = None
    length_matches: bool | None = None
    threads: list[Thread] | None = None


@dataclass(frozen=True)
class DigestResult(_Result):
    """``sessionfs.digest-result/1``."""

    schema: str = ""
    packet: str = ""
    digest: str = ""


@dataclass(frozen=True)
class UnpackResult(_Result):
    """``sessionfs.unpack-result/1``: ``into`` for a tree, ``tar`` and
    ``tar_bytes`` for a stream (``tar`` is ``-`` for one written to a file
    object)."""

    schema: str = ""
    digest: str = ""
    entries: int = 0
    files: int = 0
    content_bytes: int = 0
    into: str | None = None
    tar: str | None = None
    tar_bytes: int | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class MountResult(_Result):
    """``sessionfs.mount-result/1``."""

    schema: str = ""
    mountpoint: str = ""
    packet: str = ""
    digest: str = ""
    upper: str = ""
    part: str | None = None
    pid: int = 0
    control_socket: str = ""
    log: str | None = None
    uid: int = 0
    gid: int = 0
    entries: int = 0
    replayed_records: int = 0
    remote: dict[str, Any] | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class UmountResult(_Result):
    """``sessionfs.umount-result/1``."""

    schema: str = ""
    mountpoint: str = ""
    unmounted: bool = False
    via: str = ""


@dataclass(frozen=True)
class Secret(_Result):
    """A file shown from the host on a mount (``mount --secret``)."""

    path: str = ""
    host: str = ""


@dataclass(frozen=True)
class StatusResult(_Result):
    """``sessionfs.status-result/2``."""

    schema: str = ""
    mountpoint: str = ""
    packet: str = ""
    digest: str = ""
    upper: str = ""
    pid: int = 0
    records: int = 0
    lookups: int = 0
    reads: int = 0
    read_bytes: int = 0
    writes: int = 0
    copy_ups: int = 0
    chunks_held: int = 0
    verified_bytes: int = 0
    read_inodes: list[int] = field(default_factory=list)
    secrets: list[Secret] = field(default_factory=list)
    remote: dict[str, Any] | None = None


@dataclass(frozen=True)
class SealResult(_Policy):
    """``sessionfs.seal-result/2``."""

    schema: str = ""
    output: str = ""
    digest: str = ""
    parent: str = ""
    file_sha256: str | None = None
    packet_bytes: int = 0
    entries: int = 0
    added: int = 0
    modified: int = 0
    deleted: int = 0
    renamed: int = 0
    reused: int = 0
    bytes_hashed: int = 0
    bytes_verified: int = 0
    bytes_copied: int = 0
    unverified_copied_bytes: int | None = None
    uploaded_bytes: int | None = None
    copied_bytes: int | None = None
    parts: int | None = None
    already_there: bool = False
    rebased: bool = False
    receipt: str | None = None
    trace: str | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Change(_Result):
    """One change of a receipt: ``op`` is ``added``, ``modified``,
    ``deleted`` or ``renamed``."""

    op: str = ""
    path: str | None = None
    type: str | None = None
    sha256: str | None = None
    old_sha256: str | None = None
    new_sha256: str | None = None
    # `from` is a Python keyword; `to` is the new path of a rename.
    from_: str | None = None
    to: str | None = None

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> Change:
        r = super().from_json(obj)
        extra = {k: v for k, v in r.extra.items() if k != "from"}
        return dataclasses.replace(r, from_=obj.get("from"), extra=extra)

    @property
    def where(self) -> str:
        """The path the change is at (a rename's new path)."""
        return self.to if self.op == "renamed" and self.to else (self.path or "")


@dataclass(frozen=True)
class Receipt(_Result):
    """``sessionfs.receipt/1``, the audit trail of a seal (``--receipt``)."""

    schema: str = ""
    parent: str = ""
    digest: str = ""
    output: str = ""
    changes: list[Change] = field(default_factory=list)
    excluded: list[Excluded] = field(default_factory=list)
    dropped: list[Dropped] = field(default_factory=list)
