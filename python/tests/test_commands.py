"""Every command as a function, against the binary built here: the typed
result holds every field the command printed (docs/CLI.md), errors carry
kind, exit code, path and hint."""

from __future__ import annotations

import dataclasses
import io
import os
import random
import subprocess
import tarfile
from pathlib import Path

import pytest
from conftest import needs_fuse, sample_tree

import sessionfs
from sessionfs.results import _Result


def complete(result: object) -> None:
    """Every key of the object the binary printed is a field of the typed
    result, in nested results too, and each field holds what was printed."""
    assert isinstance(result, _Result)
    assert result.extra == {}, f"{type(result).__name__} lacks {sorted(result.extra)}"
    for f in dataclasses.fields(result):
        if f.name in ("raw", "extra"):
            continue
        key = "from" if f.name == "from_" else f.name
        value = getattr(result, f.name)
        if key in result.raw:
            printed = result.raw[key]
            if isinstance(value, _Result):
                complete(value)
            elif isinstance(value, list) and value and isinstance(value[0], _Result):
                assert len(value) == len(printed)
                for v in value:
                    complete(v)
            else:
                assert value == printed, f"{type(result).__name__}.{f.name}"


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    ws = tmp_path / "ws"
    sample_tree(ws)
    (ws / ".env").write_text("SECRET=1\n")
    os.mkfifo(ws / "fifo")
    (ws / "abs").symlink_to("/usr/bin/python3")
    return ws


def test_offline_commands_return_complete_typed_results(tree: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    p = sessionfs.pack(out / "{digest}.packet", workspace=tree, file_sha256=True)
    complete(p)
    assert p.output == str(out / (p.digest.replace(":", "-") + ".packet"))
    assert [e.path for e in p.excluded] == ["workspace/.env"]
    assert p.excluded[0].reason.rule == "credential"
    assert [d.type for d in p.dropped] == ["fifo"]
    assert p.external_symlinks[0].target == "/usr/bin/python3"
    again = sessionfs.pack(out / "{digest}.packet", workspace=tree)
    assert again.already_there and again.digest == p.digest

    v = sessionfs.verify(p.output, digest=p.digest)
    complete(v)
    assert v.valid and v.file_sha256 == p.file_sha256
    i = sessionfs.inspect(p.output)
    complete(i)
    assert i.parts == ["workspace"] and i.entries == p.entries
    d = sessionfs.digest(p.output)
    complete(d)
    assert d.digest == p.digest

    u = sessionfs.unpack(p.output, into=tmp_path / "into", part="workspace")
    complete(u)
    assert (tmp_path / "into" / "run.sh").stat().st_mode & 0o111
    t = sessionfs.unpack(p.output, tar=tmp_path / "ws.tar", part="workspace")
    complete(t)
    assert t.tar_bytes == (tmp_path / "ws.tar").stat().st_size
    buf = io.BytesIO()
    s = sessionfs.unpack(p.output, tar=buf, part="workspace")
    complete(s)
    assert s.tar == "-" and buf.getvalue() == (tmp_path / "ws.tar").read_bytes()

    # The stream packs back to the same packet (workspace_tar as bytes, a
    # file object, a path).
    for source in (buf.getvalue(), io.BytesIO(buf.getvalue()), tmp_path / "ws.tar"):
        back = sessionfs.pack(tmp_path / "back.packet", workspace_tar=source)
        assert back.digest == p.digest
        complete(back)


def test_errors_carry_kind_exit_code_path_and_hint(tmp_path: Path) -> None:
    with pytest.raises(sessionfs.SessionfsError) as e:
        sessionfs.verify(tmp_path / "missing.packet")
    assert (e.value.kind, e.value.exit_code) == ("io", 6)
    assert e.value.path == str(tmp_path / "missing.packet")
    assert e.value.hint
    bad = tmp_path / "bad.packet"
    bad.write_bytes(b"\0" * 4096)
    with pytest.raises(sessionfs.SessionfsError) as e:
        sessionfs.verify(bad)
    assert e.value.exit_code == 3
    with pytest.raises(sessionfs.SessionfsError) as e:
        sessionfs.pack(tmp_path / "x.packet", workspace=tmp_path, exclude=["a/b"])
    assert (e.value.kind, e.value.exit_code, e.value.path) == ("bad_pattern", 2, None)
    with pytest.raises(sessionfs.SessionfsError) as e:
        sessionfs.pack(tmp_path / "x.packet", workspace_tar=b"not a tar" * 100)
    assert (e.value.kind, e.value.exit_code) == ("bad_tar", 7)
    with pytest.raises(sessionfs.BinaryNotFoundError):
        sessionfs.digest(bad, sessionfs=tmp_path / "nowhere")


def test_a_timeout_stops_the_command_and_it_leaves_nothing(tmp_path: Path) -> None:
    # A stream that never ends: pack waits on it until stopped.
    r, w = os.pipe()
    reader = os.fdopen(r, "rb")
    try:
        with pytest.raises(sessionfs.CommandTimeoutError):
            sessionfs.pack(tmp_path / "t.packet", workspace_tar=reader, timeout=1.5)
    finally:
        os.close(w)
        reader.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


@needs_fuse
def test_mount_status_seal_and_umount(tree: Path, tmp_path: Path) -> None:
    packet = tmp_path / "base.packet"
    base = sessionfs.pack(packet, workspace=tree)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    m = sessionfs.mount(packet, mnt, upper=tmp_path / "upper", part="workspace")
    try:
        complete(m)
        assert m.digest == base.digest
        (mnt / "new.txt").write_text("new\n")
        (mnt / "README.md").write_text("changed\n")
        st = sessionfs.status(mnt)
        complete(st)
        assert st.writes >= 2
        out = tmp_path / "sealed"
        out.mkdir()
        s = sessionfs.seal(
            out / "{digest}.packet", mountpoint=mnt, rebase=True, receipt=tmp_path / "r.json"
        )
        complete(s)
        assert (s.added, s.modified, s.parent, s.rebased) == (1, 1, base.digest, True)
        r = sessionfs.read_receipt(tmp_path / "r.json")
        complete(r)
        assert [(c.op, c.where) for c in r.changes] == [
            ("modified", "workspace/README.md"),
            ("added", "workspace/new.txt"),
        ]
        assert r.output == s.output
    finally:
        um = sessionfs.umount(mnt)
    complete(um)
    assert um.unmounted
    # Offline, over the upper directory the mount left (nothing changed
    # since the rebase): the same packet as the one it now belongs to.
    off = sessionfs.seal(
        tmp_path / "off.packet", packet=s.output, upper=tmp_path / "upper"
    )
    complete(off)
    assert off.digest == s.digest


def _random_tree(root: Path, rng: random.Random) -> None:
    """A tree of files, directories and symlinks whose targets are random
    relative paths (some leave the tree, some pass through other links)."""
    names = ["a", "b", "c", "d.txt", "e", "sub", "x y", "é"]
    dirs = [root]
    root.mkdir()
    for _ in range(rng.randint(1, 25)):
        parent = rng.choice(dirs)
        name = rng.choice(names) + str(rng.randint(0, 3))
        p = parent / name
        if p.exists() or p.is_symlink():
            continue
        kind = rng.random()
        if kind < 0.3:
            p.mkdir()
            dirs.append(p)
        elif kind < 0.7:
            p.write_bytes(rng.randbytes(rng.randint(0, 3000)))
            if rng.random() < 0.3:
                p.chmod(0o755)
        else:
            parts = [rng.choice(["..", ".", "a0", "sub1", "d.txt2", "e1"]) for _ in range(rng.randint(1, 4))]
            p.symlink_to("/".join(parts))


def test_a_stream_of_any_packet_strict_unpack_takes_passes_the_sdks_strict_extractor(
    tmp_path: Path,
) -> None:
    tar_utils = pytest.importorskip("agents.sandbox.util.tar_utils")
    rng = random.Random(35)
    accepted = refused = 0
    for k in range(60):
        case = tmp_path / f"c{k}"
        case.mkdir()
        ws = case / "ws"
        _random_tree(ws, rng)
        packet = case / "p.packet"
        sessionfs.pack(packet, workspace=ws)
        try:
            sessionfs.unpack(packet, into=case / "into", part="workspace", strict_symlinks=True)
        except sessionfs.SessionfsError as e:
            assert e.kind == "symlink_escapes", e
            refused += 1
            with pytest.raises(sessionfs.SessionfsError):
                sessionfs.unpack(packet, tar=case / "t.tar", part="workspace", strict_symlinks=True)
            continue
        accepted += 1
        sessionfs.unpack(packet, tar=case / "t.tar", part="workspace", strict_symlinks=True)
        with tarfile.open(case / "t.tar", "r:*") as t:
            tar_utils.validate_tarfile(t, allow_external_symlink_targets=False)
        with tarfile.open(case / "t.tar", "r:*") as t:
            tar_utils.safe_extract_tarfile(
                t, root=case / "sdk", allow_external_symlink_targets=False
            )
        listing = subprocess.run(
            ["diff", "-r", "--no-dereference", case / "into", case / "sdk"],
            capture_output=True,
            text=True,
        )
        assert listing.returncode == 0, listing.stdout
        for path in (case / "into").rglob("*"):
            if path.is_file() and not path.is_symlink():
                twin = case / "sdk" / path.relative_to(case / "into")
                assert (path.stat().st_mode & 0o111 != 0) == (twin.stat().st_mode & 0o111 != 0)
    # The generator reaches both sides.
    assert accepted > 10 and refused > 5, (accepted, refused)
