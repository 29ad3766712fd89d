"""Replication's engine without sockets: a follower's directory kept equal to the
leader's by applying its file actions, batch after batch, through a follower killed
after any action of a batch (renames and deletes among them), a deposed leader's batch,
gaps, links and files or directories in the way; and a full sync that brings a follower
level from any state (empty, behind, diverged) by writing only the blocks that differ."""

import os

import pytest

from warren.errors import OutOfOrder, StaleEpoch
from warren.supervisor.cluster import replication
from warren.supervisor.cluster.replication import (
    BLOCK_BYTES,
    REPLICA_FILE,
    ActionLog,
    FileAction,
    Replica,
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
    log = ActionLog("n1")
    segment = "streams/events/00000000000000000000.segment"
    batch = [
        log.record("create", segment),
        log.record("append", segment, data=b"chunk one"),
        log.record("append", segment, offset=9, data=b"!"),
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
        segment: b"chunk one!",
        "definitions.json": b'{"queues": {"orders": 1}}',
        "msg_store_persistent/0.rdq": b"x" * 40,
    }
    assert Replica(str(tmp_path)).applied == 10  # durable: a restarted follower knows it
    log.acknowledge("n2", 10, log.identity)
    assert log.committed(["n1", "n2"]) == 10 and log.committed(["n1", "n2", "n3"]) == 0
    assert log.committed(["n1"]) == 10  # the leader alone has everything


# Sequences a naive replay gets wrong, on files an earlier batch wrote: a rename then a
# write of the old name, a write then a rename over it, two renames in a row, a rename
# then a delete, a delete then a create, a truncate then an append.
EARLIER = [
    ("write", "a", {"data": b"old a"}),
    ("write", "g", {"data": b"GGGG"}),
    ("write", "c1", {"data": b"c"}),
    ("write", "d1", {"data": b"d"}),
    ("write", "e", {"data": b"first e"}),
    ("write", "t", {"data": b"0123456789"}),
]
TRICKY = [
    ("rename", "a", {"target": "b"}),
    ("write", "a", {"data": b"new"}),
    ("write", "f", {"data": b"ab"}),
    ("rename", "g", {"target": "f"}),
    ("rename", "c1", {"target": "c2"}),
    ("rename", "c2", {"target": "dir/c3"}),
    ("rename", "d1", {"target": "d2"}),
    ("delete", "d2", {}),
    ("delete", "e", {}),
    ("create", "e", {}),
    ("write", "e", {"data": b"second"}),
    ("truncate", "t", {"offset": 3}),
    ("append", "t", {"offset": 3, "data": b"xyz"}),
]


def batches() -> tuple[list[FileAction], list[FileAction]]:
    log = ActionLog("n1")
    earlier = [log.record(kind, path, **fields) for kind, path, fields in EARLIER]
    return earlier, [log.record(kind, path, **fields) for kind, path, fields in TRICKY]


class Killed(BaseException):
    """What a kill -9 does to the batch: nothing after the action it came at runs."""


@pytest.mark.parametrize("killed_after", range(len(TRICKY) + 1))
def test_a_follower_killed_after_any_action_of_a_batch_ends_as_the_leader_when_it_goes_on(
    tmp_path, monkeypatch, killed_after
):
    earlier, tricky = batches()
    reference = tmp_path / "reference"
    reference.mkdir()
    Replica(str(reference)).apply(1, earlier)
    Replica(str(reference)).apply(1, tricky)
    follower = tmp_path / "follower"
    follower.mkdir()
    Replica(str(follower)).apply(1, earlier)
    apply_one = replication._apply
    done = []

    def until_killed(*arguments):
        if len(done) == killed_after:
            raise Killed
        done.append(apply_one(*arguments))

    monkeypatch.setattr(replication, "_apply", until_killed)
    if killed_after == len(TRICKY):  # after every action, before the batch's position
        monkeypatch.setattr(replication, "_write_position", _kill_at_the_last(replication))
    with pytest.raises(Killed):
        Replica(str(follower)).apply(1, tricky)
    monkeypatch.undo()
    replica = Replica(str(follower))  # restarted: it goes on from what it recorded
    rest = [action for action in tricky if action.seq > replica.applied]
    assert replica.apply(1, rest) == len(EARLIER) + len(TRICKY)
    assert (
        tree(follower)
        == tree(reference)
        == {
            "a": b"new",
            "b": b"old a",
            "f": b"GGGG",
            "dir/c3": b"c",
            "e": b"second",
            "t": b"012xyz",
        }
    )


def _kill_at_the_last(module):
    write = module._write_position

    def write_until_the_last(data_dir, epoch, applied, level, log):
        if applied == len(EARLIER) + len(TRICKY):
            raise Killed
        write(data_dir, epoch, applied, level, log)

    return write_until_the_last


def test_a_batch_taken_up_again_syncs_every_directory_it_names_even_if_unchanged_now(
    tmp_path, monkeypatch
):
    log = ActionLog("n1")
    batch = [
        log.record("write", "streams/s/0.segment", data=b"chunk"),
        log.record("write", "queues/q/0.qi", data=b"slot"),
    ]
    monkeypatch.setattr(replication, "_write_position", _raise_killed)
    with pytest.raises(Killed):  # every change made, the position not recorded
        Replica(str(tmp_path)).apply(1, batch)
    monkeypatch.undo()
    synced: list[str] = []
    sync_directory = replication.fsync_directory
    monkeypatch.setattr(
        replication, "fsync_directory", lambda path: synced.append(path) or sync_directory(path)
    )
    Replica(str(tmp_path)).apply(1, batch)  # this run creates no entry: it syncs them all
    root = str(tmp_path)
    expected = {
        root,
        *(os.path.join(root, d) for d in ("streams", "streams/s", "queues", "queues/q")),
    }
    assert expected <= set(synced)


def _raise_killed(*_):
    raise Killed


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


def test_a_link_or_the_other_kind_of_entry_in_the_way_is_replaced_never_followed(tmp_path):
    follower, elsewhere = tmp_path / "follower", tmp_path / "elsewhere"
    follower.mkdir()
    elsewhere.mkdir()
    (follower / "streams").symlink_to(elsewhere)  # a link where the leader has a directory
    (follower / "dir-here").mkdir()  # a directory where the leader has a file
    (follower / "dir-here" / "inside").write_bytes(b"old")
    (follower / "file-here").write_bytes(b"a file where the leader has a directory")
    (follower / "link").symlink_to(elsewhere / "target")  # a link where it has a file
    batch = [
        FileAction(1, "write", "streams/s/0.segment", data=b"chunk"),
        FileAction(2, "write", "dir-here", data=b"a file now"),
        FileAction(3, "write", "file-here/x", data=b"under a directory now"),
        FileAction(4, "write", "link", data=b"a file, not a link"),
    ]
    Replica(str(follower)).apply(1, batch)
    assert list(elsewhere.iterdir()) == []  # nothing written through a link
    assert tree(follower) == {
        "streams/s/0.segment": b"chunk",
        "dir-here": b"a file now",
        "file-here/x": b"under a directory now",
        "link": b"a file, not a link",
    }


def test_the_log_keeps_what_a_follower_lacks_and_refuses_an_ack_of_what_it_never_sent():
    log = ActionLog("n1")
    for n in range(5):
        log.record("write", "f", offset=n, data=b"x")
    log.acknowledge("n2", 3, log.identity)
    log.acknowledge("n3", 5, log.identity)
    assert [a.seq for a in log.batch_for("n2")] == [4, 5]
    assert log.batch_for("n3") == []
    log.release()
    assert [a.seq for a in log.kept] == [4, 5]
    assert log.batch_for("n4") is None  # it joins with nothing: the log begins at 4
    with pytest.raises(ValueError, match="n2 acknowledged action 6; the log is at 5"):
        log.acknowledge("n2", 6, log.identity)
    log.resynced("n2", 0, log.identity)  # its disk was replaced: it starts over
    assert log.committed(["n1", "n2"]) == 0


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
    write(leader, "definitions.json.4242.tmp", b"a killed replace's leftover")
    follower.mkdir()
    write(follower, "node.lock", b"the follower's own")
    if start == "behind":
        write(follower, "streams/s/0.segment", big[: 2 * BLOCK_BYTES])
    elif start == "diverged":  # a deposed leader's longer tail, and files since deleted
        write(follower, "streams/s/0.segment", big[: 2 * BLOCK_BYTES + 5] + b"theirs" * 10**6)
        write(follower, "queues/old/0.qi", b"deleted since")
        write(follower, "definitions.json/oops", b"a directory where the leader has a file")
    replica = Replica(str(follower))
    replica.apply(1, [FileAction(1, "write", "seen", data=b"x"), FileAction(2, "delete", "seen")])
    actions = list(sync_actions(str(leader), manifest(str(leader)), manifest(str(follower))))
    assert replica.apply(2, actions, resync_to=40) == 40  # the leader's position at the sync
    assert tree(follower) == tree(leader)
    assert (follower / "node.lock").read_bytes() == b"the follower's own"
    written = sum(len(a.data) for a in actions)
    expected = {"empty": len(big), "behind": BLOCK_BYTES + 123, "diverged": BLOCK_BYTES + 123}
    leftover = len(b"a killed replace's leftover")
    assert written == expected[start] + 2 + leftover  # and definitions.json's two bytes
    assert Replica(str(follower)).applied == 40


def test_a_position_torn_by_a_crash_reads_as_none_so_the_replica_is_synced_whole(tmp_path):
    replica = Replica(str(tmp_path))
    replica.apply(4, [FileAction(1, "write", "f", data=b"kept")], resync_to=9)
    assert (Replica(str(tmp_path)).applied, Replica(str(tmp_path)).level) == (9, True)
    position = tmp_path / REPLICA_FILE
    position.write_bytes(position.read_bytes()[:20])  # the write cut short
    again = Replica(str(tmp_path))
    assert (again.epoch, again.applied, again.level) == (0, 0, False)


def test_a_replace_begun_before_a_full_sync_and_renamed_after_it_lands_whole(tmp_path):
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    write(leader, "definitions.json", b"old")
    follower.mkdir()
    log = ActionLog("n1")
    write(leader, "definitions.json.77.tmp", b"new")  # written, then the sync begins
    log.record("write", "definitions.json.77.tmp", data=b"new")
    at = log.position
    actions = list(sync_actions(str(leader), manifest(str(leader)), manifest(str(follower))))
    os.replace(leader / "definitions.json.77.tmp", leader / "definitions.json")
    rename = log.record("rename", "definitions.json.77.tmp", target="definitions.json")
    replica = Replica(str(follower))
    replica.apply(2, actions, log=log.identity, resync_to=at)
    replica.apply(2, [rename], log=log.identity)
    assert tree(follower) == tree(leader) == {"definitions.json": b"new"}
