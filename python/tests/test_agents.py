"""The Agents SDK integration, offline, with the real SDK (openai-agents
0.24.0): its ScriptedModel drives a real Runner whose agent runs
`exec_command` in real Unix-local sandboxes."""

from __future__ import annotations

import asyncio
import json
import tarfile
from pathlib import Path
from typing import Any

import pytest
from conftest import S3, needs_fuse, sample_tree

agents = pytest.importorskip("agents")

from agents import RunConfig, Runner, set_tracing_disabled  # noqa: E402
from agents.sandbox import SandboxAgent, SandboxRunConfig  # noqa: E402
from agents.sandbox.capabilities import Shell  # noqa: E402
from agents.sandbox.sandboxes import UnixLocalSandboxClient  # noqa: E402
from agents.testing import ScriptedModel, assistant_message, function_call  # noqa: E402

import sessionfs  # noqa: E402
from sessionfs.agents import (  # noqa: E402
    PacketWorkspace,
    PersistRefused,
    SessionfsSnapshot,
    SessionfsSnapshotSpec,
    TurnNotSealed,
)

set_tracing_disabled(True)


def turn(*commands: str) -> tuple[SandboxAgent, ScriptedModel]:
    """An agent whose model runs each shell command, then says done."""
    steps: list[Any] = [
        [function_call("exec_command", {"cmd": c}, call_id=f"call-{k}")]
        for k, c in enumerate(commands)
    ]
    steps.append([assistant_message("done")])
    model = ScriptedModel(steps)
    agent = SandboxAgent(name="agent", model=model, instructions="work", capabilities=[Shell()])
    return agent, model


def outputs(result: Any) -> list[str]:
    """The tool outputs the agent saw, in order."""
    return [
        str(item.output)
        for item in result.new_items
        if getattr(item, "type", "") == "tool_call_output_item"
    ]


def run(agent: SandboxAgent, sandbox: SandboxRunConfig) -> Any:
    return asyncio.run(Runner.run(agent, "go", run_config=RunConfig(sandbox=sandbox)))


TURN_ONE = (
    "mkdir -p sub && echo 'first turn' > notes.txt "
    "&& printf '#!/bin/sh\\necho ran-the-script\\n' > run.sh && chmod +x run.sh "
    "&& ln -s ../notes.txt sub/link && echo exited-$?"
)
TURN_TWO = "cat notes.txt; ./run.sh; readlink sub/link; cat sub/link; test -x run.sh && echo exec-kept"


def two_turns(snapshot: SessionfsSnapshot) -> tuple[str, str]:
    """Turn 1 edits in a fresh sandbox and persists; turn 2, in another
    fresh sandbox, restores and reads; the digests persisted."""
    agent, model = turn(TURN_ONE)
    first = run(agent, SandboxRunConfig(client=UnixLocalSandboxClient(), snapshot=snapshot))
    assert model.remaining_steps == 0
    assert "exited-0" in outputs(first)[0]
    d1 = snapshot.pointer()
    assert d1 is not None
    agent, _ = turn(TURN_TWO)
    second = run(agent, SandboxRunConfig(client=UnixLocalSandboxClient(), snapshot=snapshot))
    seen = outputs(second)[0]
    for expected in ("first turn", "ran-the-script", "../notes.txt", "exec-kept"):
        assert expected in seen, seen
    d2 = snapshot.pointer()
    assert d2 is not None
    return d1["digest"], d2["digest"]


def test_two_turns_in_two_fresh_sandboxes_through_a_directory(tmp_path: Path) -> None:
    store = tmp_path / "snapshots"
    snapshot = SessionfsSnapshot(id="session-1", location=str(store))
    d1, d2 = two_turns(snapshot)
    # Turn 2 changed nothing: the same packet (zero mtimes, the default).
    assert d1 == d2
    pointer = json.loads((store / "session-1.json").read_text())
    assert pointer["schema"] == "sessionfs.snapshot-pointer/1"
    packet = store / pointer["packet"]
    assert sessionfs.verify(packet, digest=d1).valid
    listing = sessionfs.inspect(packet)
    assert listing.parts == ["workspace"] and listing.symlinks == 1
    assert asyncio.run(snapshot.restorable())
    # A damaged packet is not restorable.
    packet.write_bytes(packet.read_bytes()[:1024])
    assert not asyncio.run(snapshot.restorable())


def test_a_spec_builds_a_snapshot_per_session(tmp_path: Path) -> None:
    spec = SessionfsSnapshotSpec(location=str(tmp_path / "s"), zero_mtimes=True)
    agent, _ = turn("echo spec > spec.txt")
    run(agent, SandboxRunConfig(client=UnixLocalSandboxClient(), snapshot=spec))
    pointers = sorted((tmp_path / "s").glob("*.json"))
    assert len(pointers) == 1
    digest = json.loads(pointers[0].read_text())["digest"]
    assert sessionfs.verify(tmp_path / "s" / (digest.replace(":", "-") + ".packet")).valid


def test_two_turns_through_s3(s3: S3, tmp_path: Path) -> None:
    bucket = s3.bucket()
    snapshot = SessionfsSnapshot(
        id="session-s3", location=f"s3://{bucket}/sessions/a", env=s3.env
    )
    d1, d2 = two_turns(snapshot)
    assert d1 == d2
    keys = sorted(
        o["Key"] for o in s3.client().list_objects_v2(Bucket=bucket)["Contents"]
    )
    packet_key = "sessions/a/" + d1.replace(":", "-") + ".packet"
    assert keys == sorted([packet_key, "sessions/a/session-s3.json"]), keys
    got = sessionfs.verify(f"s3://{bucket}/{packet_key}", digest=d1, env=s3.env)
    assert got.valid


def test_digests_are_stable_across_restore_persist_cycles(tmp_path: Path) -> None:
    snapshot = SessionfsSnapshot(id="cycles", location=str(tmp_path / "s"))
    agent, _ = turn(TURN_ONE)
    run(agent, SandboxRunConfig(client=UnixLocalSandboxClient(), snapshot=snapshot))
    digests = []
    for _ in range(3):
        agent, _ = turn("true")
        run(agent, SandboxRunConfig(client=UnixLocalSandboxClient(), snapshot=snapshot))
        pointer = snapshot.pointer()
        assert pointer is not None
        digests.append(pointer["digest"])
    assert len(set(digests)) == 1, digests
    # Kept mtimes (not the recommended mode) would churn: the SDK restores
    # none, so each cycle dates the files anew.
    kept = SessionfsSnapshot(id="kept", location=str(tmp_path / "k"), zero_mtimes=False)
    agent, _ = turn(TURN_ONE)
    run(agent, SandboxRunConfig(client=UnixLocalSandboxClient(), snapshot=kept))
    before = kept.pointer()
    agent, _ = turn("sleep 0.01")
    run(agent, SandboxRunConfig(client=UnixLocalSandboxClient(), snapshot=kept))
    after = kept.pointer()
    assert before is not None and after is not None
    assert before["digest"] != after["digest"]


def test_a_refused_persist_keeps_the_turns_work_and_says_why(tmp_path: Path) -> None:
    store = tmp_path / "s"
    snapshot = SessionfsSnapshot(id="refused", location=str(store))
    agent, _ = turn("echo kept > a.txt")
    run(agent, SandboxRunConfig(client=UnixLocalSandboxClient(), snapshot=snapshot))
    before = snapshot.pointer()
    assert before is not None
    # Turn 2 makes two names macOS would fold together: pack refuses them.
    # The SDK's Runner logs the error its cleanup met and returns the run;
    # the refusal is recorded, for the orchestrator to raise.
    agent, _ = turn("echo upper > A.txt && echo work > work.txt")
    run(agent, SandboxRunConfig(client=UnixLocalSandboxClient(), snapshot=snapshot))
    with pytest.raises(PersistRefused) as caught:
        snapshot.raise_if_refused()
    refused = caught.value
    assert refused.error.kind == "path_collision"
    assert "A.txt" in refused.message or "a.txt" in refused.message
    assert "exclude" in refused.option
    # The pointer still names turn 1's packet; the turn's work is kept.
    assert snapshot.pointer() == before
    kept = Path(refused.kept)
    assert kept.parent == store / "refused"
    with tarfile.open(kept) as t:
        names = {m.name for m in t.getmembers()}
        assert {"./A.txt", "./a.txt", "./work.txt"} <= names
        member = t.extractfile("./work.txt")
        assert member is not None and member.read() == b"work\n"
    # A session stopped by the orchestrator itself raises at once.
    async def direct() -> None:
        session = await UnixLocalSandboxClient().create(snapshot=snapshot)
        await session.start()
        await session.exec("echo upper > A.txt", shell=True)
        try:
            await session.stop()
        finally:
            await session.shutdown()

    with pytest.raises(Exception) as stopped:
        asyncio.run(direct())
    chain, e = [], stopped.value
    while e is not None:
        chain.append(e)
        e = e.__cause__
    assert any(isinstance(e, PersistRefused) for e in chain), chain
    # With one of the names left out, the same tree persists, and the
    # refusal record goes.
    lenient = snapshot.model_copy(update={"exclude": ("A.txt",)})
    agent, _ = turn("echo upper > A.txt && echo work > work.txt")
    run(agent, SandboxRunConfig(client=UnixLocalSandboxClient(), snapshot=lenient))
    lenient.raise_if_refused()
    after = lenient.pointer()
    assert after is not None and after["digest"] != before["digest"]


@needs_fuse
def test_mount_then_run_two_turns_with_receipts_of_exactly_the_agents_changes(
    tmp_path: Path,
) -> None:
    ws = tmp_path / "ws"
    sample_tree(ws)
    base = sessionfs.pack(tmp_path / "base.packet", workspace=ws)
    with PacketWorkspace(
        base.output,
        mountpoint=tmp_path / "mnt",
        upper=tmp_path / "upper",
        packets=tmp_path / "packets",
        receipts=tmp_path / "receipts",
    ) as pw:
        agent, _ = turn(
            "echo added > added.txt && echo edited >> README.md && chmod -x run.sh "
            "&& rm src/lib/mod.py && ln -s README.md readme-link"
        )
        run(agent, pw.run_config())
        sealed, receipt = pw.end_turn()
        assert sealed.parent == base.digest and sealed.rebased
        assert sorted((c.op, c.where) for c in receipt.changes) == [
            ("added", "workspace/added.txt"),
            ("added", "workspace/readme-link"),
            ("deleted", "workspace/src/lib/mod.py"),
            ("modified", "workspace/README.md"),
            ("modified", "workspace/run.sh"),
        ]
        # Turn 2, a fresh sandbox in the same mount: it sees turn 1.
        agent, _ = turn("cat added.txt && mv added.txt moved.txt && test ! -x run.sh && echo ok")
        second = run(agent, pw.run_config())
        assert "added" in outputs(second)[0] and "ok" in outputs(second)[0]
        sealed2, receipt2 = pw.end_turn()
        assert sealed2.parent == sealed.digest
        assert [(c.op, c.from_, c.to) for c in receipt2.changes] == [
            ("renamed", "workspace/added.txt", "workspace/moved.txt")
        ]
        # A turn whose tree a packet cannot hold: refused, nothing lost.
        agent, _ = turn("echo x > Moved.txt")
        run(agent, pw.run_config())
        with pytest.raises(TurnNotSealed) as e:
            pw.end_turn()
        assert e.value.kind == "path_collision"
        assert (tmp_path / "mnt" / "Moved.txt").read_text() == "x\n"
        (tmp_path / "mnt" / "Moved.txt").unlink()
        sealed3, receipt3 = pw.end_turn()
        assert sealed3.digest == sealed2.digest and receipt3.changes == []
    assert not any((tmp_path / "mnt").iterdir())
    # Every packet sealed verifies; the last is the workspace as it ended.
    for s, _ in pw.sealed:
        assert sessionfs.verify(s.output, digest=s.digest).valid


@needs_fuse
def test_mount_then_run_from_an_s3_packet(s3: S3, tmp_path: Path) -> None:
    """The mount route from ``s3://`` (read lazily, the node cache in
    `tmp_path`): the agent reads the remote packet's files, and the turn is
    sealed locally onto it with a receipt of exactly its change."""
    bucket = s3.bucket()
    ws = tmp_path / "ws"
    sample_tree(ws)
    env = {**s3.env, "SESSIONFS_CACHE_DIR": str(tmp_path / "cache")}
    base = sessionfs.pack(f"s3://{bucket}/p/{{digest}}.packet", workspace=ws, env=env)
    assert base.output.startswith(f"s3://{bucket}/p/sha256-"), base.output
    with PacketWorkspace(
        base.output,
        mountpoint=tmp_path / "mnt",
        upper=tmp_path / "upper",
        packets=tmp_path / "packets",
        receipts=tmp_path / "receipts",
        env=env,
    ) as pw:
        agent, _ = turn("cat README.md && ./run.sh && echo remote > from-s3.txt")
        out = outputs(run(agent, pw.run_config()))[0]
        assert "# sample" in out and "run" in out, out
        sealed, receipt = pw.end_turn()
        assert sealed.parent == base.digest and sealed.rebased
        assert [(c.op, c.where) for c in receipt.changes] == [("added", "workspace/from-s3.txt")]
    assert not any((tmp_path / "mnt").iterdir())
    assert sessionfs.verify(sealed.output, digest=sealed.digest).valid
    back = tmp_path / "back"
    sessionfs.unpack(sealed.output, into=back, part="workspace")
    assert (back / "from-s3.txt").read_text() == "remote\n"
    assert (back / "big.bin").read_bytes() == (ws / "big.bin").read_bytes()
