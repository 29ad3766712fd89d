"""Replication's engine without sockets: a follower's directory kept equal to the
leader's by applying its file actions, batch after batch, through a follower killed
mid-batch, a deposed leader's batch, gaps and repeats; and a full sync that brings a
follower level from any state (empty, behind, diverged) by writing only what differs."""

import os
import subprocess
import sys
import textwrap

import pytest

from warren.supervisor.cluster.replication import (
    BLOCK_BYTES,
    REPLICA_FILE,
    ActionLog,
    FileAction,
    OutOfOrder,
    Replica,
    StaleEpoch,
    check_path,
    manifest,
    sync_actions,
)


def tree(root) -> dict[str, bytes]:
    """Every replicated file under ``root`` and its bytes."""
    found = {}
    for path in manifest(str(root)):
        with open(os.path.join(root, path), "rb") as file:
            found[path] = file.read()
    return found


def test_a_follower_applying_the_leaders_actions_ends_with_the_leaders_files(tmp_path):
    log = ActionLog()
    batch = [
        log.record("create", "streams/events/00000000000000000000.segment"),
        log.record("append", "streams/events/00000000000000000000.segment", data=b"chunk one"),
        log.record("append", "streams/events/00000000000000000000.segment", offset=9, data=b"!"),
        log.record("write", "definitions.json", data=b'{"queues": {}}'),
        log.record("write", "definitions.tmp", data=b'{"queues": {"orders": 1}}'),
        log.record("rename", "definitions.tmp", target="definitions.json"),
        log.record("write", "msg_store_persistent/0.rdq", data=b"x" * 100),
        log.record("truncate", "msg_store_persistent/0.rdq", offset=40),
        log.record("write", "gone.log", data=b"soon deleted"),
        log.record("delete", "gone.log"),
    ]
    replica = Replica(str(tmp_path))
    assert replica.apply(1, batch) == 10
    assert tree(tmp_path) == {
        "streams/events/00000000000000000000.segment": b"chunk one!",
        "definitions.json": b'{"queues": {"orders": 1}}',
        "msg_store_persistent/0.rdq": b"x" * 40,
    }
    assert Replica(str(tmp_path)).applied == 10  # durable: a restarted follower knows it
    log.acknowledge("n2", 10)
    assert log.committed(["n2"]) == 10 and log.committed(["n2", "n3"]) == 0


def test_a_follower_killed_mid_batch_applies_it_again_to_the_same_files(tmp_path):
    leader_side = ActionLog()
    first = [
        leader_side.record("write", "a/seg", data=b"0123456789"),
        leader_side.record("write", "b.tmp", data=b"new"),
        leader_side.record("rename", "b.tmp", target="b"),
        leader_side.record("write", "c", data=b"c"),
        leader_side.record("delete", "c"),
    ]
    # Applied in a process killed before it recorded its position: all of the batch's
    # effects may be on disk, the position says nothing was applied.
    script = textwrap.dedent(
        f"""
        import os, signal
        from warren.supervisor.cluster import replication
        from warren.supervisor.cluster.replication import FileAction, Replica
        replication._write_position = lambda *_: os.kill(os.getpid(), signal.SIGKILL)
        Replica({str(tmp_path)!r}).apply(1, {first!r})
        """
    )
    died = subprocess.run([sys.executable, "-c", script], timeout=60)
    assert died.returncode == -9
    replica = Replica(str(tmp_path))
    assert replica.applied == 0
    assert replica.apply(1, first) == 5  # again, from the start: the same end
    assert tree(tmp_path) == {"a/seg": b"0123456789", "b": b"new"}


def test_a_deposed_leaders_batch_and_a_gap_are_refused_with_nothing_applied(tmp_path):
    replica = Replica(str(tmp_path))
    replica.apply(7, [FileAction(1, "write", "f", data=b"epoch 7")])
    with pytest.raises(StaleEpoch, match="batch of epoch 5 came after epoch 7"):
        replica.apply(5, [FileAction(2, "write", "f", data=b"deposed!")])
    with pytest.raises(OutOfOrder, match="from action 3, where the replica has 1") as gap:
        replica.apply(7, [FileAction(3, "write", "f", data=b"skipped")])
    assert gap.value.needed == 2
    with pytest.raises(OutOfOrder, match="a gap after action 2"):
        replica.apply(7, [FileAction(2, "write", "g"), FileAction(4, "write", "g")])
    assert tree(tmp_path) == {"f": b"epoch 7"} and Replica(str(tmp_path)).applied == 1


@pytest.mark.parametrize(
    "path",
    [
        "",
        "/etc/passwd",
        "../outside",
        "a/../../b",
        "a//b",
        "node.lock",
        "cluster.json",
        REPLICA_FILE,
    ],
)
def test_no_action_names_a_path_outside_the_data_directory_or_a_nodes_own_file(path):
    with pytest.raises(ValueError):
        check_path(path)
    with pytest.raises(ValueError):
        FileAction(1, "write", path)


def test_the_log_keeps_what_an_isr_member_lacks_and_a_follower_it_dropped_needs_a_full_sync():
    log = ActionLog()
    for n in range(5):
        log.record("write", "f", offset=n, data=b"x")
    log.acknowledge("n2", 3)
    log.acknowledge("n3", 5)
    assert [a.seq for a in log.batch_for("n2")] == [4, 5]
    assert log.batch_for("n3") == []
    log.release(["n2", "n3"])
    assert [a.seq for a in log.kept] == [4, 5]
    assert log.batch_for("n4") is None  # it joins with nothing: the log begins at 4


def write(root, path: str, data: bytes) -> None:
    full = os.path.join(root, path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "wb") as file:
        file.write(data)


@pytest.mark.parametrize("start", ["empty", "behind", "diverged"])
def test_a_full_sync_brings_a_follower_level_writing_only_the_blocks_that_differ(tmp_path, start):
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    big = os.urandom(3 * BLOCK_BYTES + 123)
    write(leader, "streams/s/0.segment", big)
    write(leader, "definitions.json", b"{}")
    write(leader, "node.lock", b"the leader's own")
    follower.mkdir()
    write(follower, "node.lock", b"the follower's own")
    if start == "behind":
        write(follower, "streams/s/0.segment", big[: 2 * BLOCK_BYTES])
    elif start == "diverged":  # a deposed leader's tail, and a file its successor deleted
        write(follower, "streams/s/0.segment", big[: 2 * BLOCK_BYTES + 5] + b"not theirs" * 9)
        write(follower, "queues/old/0.qi", b"deleted since")
    replica = Replica(str(follower))
    actions = sync_actions(str(leader), manifest(str(leader)), manifest(str(follower)), 1)
    replica.apply(2, actions)
    assert tree(follower) == tree(leader)
    assert (follower / "node.lock").read_bytes() == b"the follower's own"
    written = sum(len(a.data) for a in actions)
    expected = {"empty": len(big), "behind": BLOCK_BYTES + 123, "diverged": BLOCK_BYTES + 123}
    assert written == expected[start] + 2  # and definitions.json's two bytes
