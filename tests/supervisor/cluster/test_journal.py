"""What a leader's engines write, as ``warren.store.replicated_io`` records it: replayed
in order by a follower's ``Replica`` on an empty directory, it makes the same files, and
a stream opened there reads what the leader's did; writes outside the data directory,
to the node's own files and to the transient store are not recorded; a commit the
cluster refuses fails the writer's sync as an ``OSError``, as a failed fdatasync."""

import os

import pytest

from warren.errors import ReplicationRefused
from warren.queues.broker.definitions import Definitions
from warren.queues.durable_files import write_atomically
from warren.queues.engine.stream_log import StreamLog
from warren.queues.protocol import QueueDefinition
from warren.store import replicated_io
from warren.supervisor.cluster.replication import FileAction, Replica, manifest


@pytest.fixture
def journal(tmp_path):
    """The commits of a leader whose data directory is ``tmp_path / "leader"``."""
    commits: list[list[replicated_io.RecordedAction]] = []
    (tmp_path / "leader").mkdir()
    replicated_io.enable(str(tmp_path / "leader"), committer=lambda a: commits.append(list(a)))
    try:
        yield commits
    finally:
        replicated_io.disable()


def replay(commits, directory) -> None:
    """Apply each commit as the leader's coordinator numbers it, one batch each."""
    directory.mkdir(exist_ok=True)
    replica = Replica(str(directory))
    for actions in commits:
        first = replica.applied + 1
        numbered = [
            FileAction(first + i, a.kind, a.path, a.offset, a.data, a.target)
            for i, a in enumerate(actions)
        ]
        replica.apply(1, numbered)


def records(directory) -> list[bytes]:
    log = StreamLog(directory)
    reader = log.reader("first")
    read = []
    while (chunk := reader.read_raw_chunk()) is not None:
        read.append(chunk)
    reader.close()
    log.close()
    return read


def test_a_streams_writes_replayed_on_an_empty_directory_read_the_same(journal, tmp_path):
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    log = StreamLog(leader / "streams" / "events", max_segment_chunks=3)
    for n in range(10):
        log.append([b"record %d" % n, b"x" * n])
        log.sync()
    assert log.apply_retention(max_bytes=1)  # whole segments deleted, the newest kept
    log.append([b"last"])
    log.sync()
    log.close()
    assert journal and all(journal)
    replay(journal, follower)
    assert manifest(str(follower)) == manifest(str(leader))
    assert records(follower / "streams" / "events") == records(leader / "streams" / "events")


def test_definitions_saved_replaced_and_a_queue_directory_removed_are_replayed(journal, tmp_path):
    leader, follower = tmp_path / "leader", tmp_path / "follower"
    definitions = Definitions(str(leader))
    definitions.add_queue(QueueDefinition("orders"))
    definitions.save()
    (leader / "queues" / "gone").mkdir(parents=True)
    fd = replicated_io.open(leader / "queues" / "gone" / "x", os.O_WRONLY | os.O_CREAT, 0o644)
    replicated_io.write(fd, b"to be removed")
    replicated_io.fsync(fd)
    os.close(fd)
    replicated_io.remove_tree(leader / "queues" / "gone")
    write_atomically(leader / "settings.json", b'{"a": 1}')
    write_atomically(leader / "settings.json", b'{"a": 2}')
    definitions.close()
    replay(journal, follower)
    assert manifest(str(follower)) == manifest(str(leader))
    assert (follower / "settings.json").read_bytes() == b'{"a": 2}'
    assert not (follower / "queues" / "gone").exists()
    assert set(Definitions(str(follower)).queues) == {"orders"}


def test_writes_elsewhere_to_the_nodes_own_files_and_to_the_transient_store_are_not_sent(
    journal, tmp_path
):
    leader = tmp_path / "leader"
    (tmp_path / "elsewhere").mkdir()
    (leader / "msg_store_transient").mkdir()
    write_atomically(tmp_path / "elsewhere" / "file", b"not the node's")
    write_atomically(leader / "node.json", b"{}")
    write_atomically(leader / "msg_store_transient" / "0.rdq", b"paged out")
    assert journal == []


def test_a_refused_commit_fails_the_sync_as_an_os_error_and_nothing_is_taken_back(tmp_path):
    def refuse(actions):
        raise ReplicationRefused(5, "the node does not lead its cluster")

    replicated_io.enable(str(tmp_path), committer=refuse)
    try:
        with pytest.raises(OSError, match="does not lead"):
            write_atomically(tmp_path / "definitions.json", b"{}")
    finally:
        replicated_io.disable()


def test_a_coordinator_that_dies_under_a_commit_refuses_it_at_once_and_the_next_goes_on(
    tmp_path,
):
    # A commit the coordinator took and never answered (killed, and started again at the
    # same address by the node's supervisor) held its writer for the whole commit
    # timeout, two minutes, and the node's stop with it.
    import threading
    import time

    import zmq

    from warren.store.replication_link import committer_to, recorded_actions

    endpoint = f"ipc://{tmp_path}/commits"
    context = zmq.Context.instance()
    link = committer_to(endpoint)
    action = replicated_io.RecordedAction("write", "a", 0, b"x", "")

    def coordinator(answer: bool) -> threading.Thread:
        router = context.socket(zmq.ROUTER)
        router.linger = 0
        router.bind(endpoint)

        def serve() -> None:
            identity, *frames = router.recv_multipart()
            assert recorded_actions(frames) == [action]
            if answer:
                router.send_multipart([identity, b'{"committed": 1}'])
            router.close()  # answered, or dead with the commit in hand

        thread = threading.Thread(target=serve)
        thread.start()
        return thread

    dying = coordinator(answer=False)
    started = time.monotonic()
    with pytest.raises(ReplicationRefused, match="coordinator went away during a commit"):
        link([action])
    assert time.monotonic() - started < 30
    dying.join()
    again = coordinator(answer=True)  # its successor, at the same address
    link([action])  # answered: committed
    again.join()
