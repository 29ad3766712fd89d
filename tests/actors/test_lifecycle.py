"""Spawning, stopping, restarting and process hygiene, with real processes and signals."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.actors import failing_warm_up
from tests.actors.conftest import PRELOAD
from tests.actors.sample_actors import (
    Caller,
    FailsToStart,
    IgnoresStop,
    PeerTracker,
    Recorder,
    StopsOnSignal,
    TitledWorker,
)
from tests.waiting import spare_children, the_spare, wait_for
from warren.actors import (
    EXIT_CRASHED,
    EXIT_NORMAL,
    EXIT_STOPPED_ABNORMALLY,
    EXIT_TERMINATED,
    ActorDeadError,
    InvalidSpec,
    Node,
    NotDelivered,
    SpawnError,
    _forkserver,
)
from warren.actors.exitcodes import EXIT_PARENT_GONE


def test_spawn_returns_a_ref_whose_process_is_running_and_answering(node: Node) -> None:
    ref = node.spawn(Recorder, name="alive")
    assert psutil.pid_exists(ref.pid)
    assert ref.ask("pid", timeout=10) == ref.pid
    assert node.actors() == [ref]


def test_an_exception_in_on_start_makes_spawn_raise_with_type_and_message(node: Node) -> None:
    with pytest.raises(SpawnError, match="ValueError: no disk today"):
        node.spawn(FailsToStart)
    assert node.actors() == []


def test_spawn_validates_its_arguments_and_names_the_field(node: Node) -> None:
    with pytest.raises(InvalidSpec, match="transport='udp'"):
        node.spawn(Recorder, transport="udp")
    with pytest.raises(InvalidSpec, match="actor_class"):
        node.spawn(object)  # type: ignore[arg-type]
    with pytest.raises(InvalidSpec, match="mailbox_size=0"):
        node.spawn(Recorder, mailbox_size=0)


def test_a_name_cannot_be_spawned_twice_while_its_actor_lives(node: Node) -> None:
    node.spawn(Recorder, name="only")
    with pytest.raises(InvalidSpec, match="already registered"):
        node.spawn(Recorder, name="only")


def test_each_actor_process_shows_a_readable_title(node: Node) -> None:
    ref = node.spawn(TitledWorker, name="orders")
    assert ref.ask("title", timeout=10) == "warren: orders"
    assert " ".join(psutil.Process(ref.pid).cmdline()).startswith("warren: orders")


def test_stop_runs_on_stop_and_reports_a_normal_exit(node: Node, tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    ref = node.spawn(StopsOnSignal, str(marker))
    down = ref.stop(timeout=10)
    assert (down.exitcode, down.signal) == (EXIT_NORMAL, None)
    assert marker.read_text() == "stopped"
    assert not psutil.pid_exists(ref.pid) or psutil.Process(ref.pid).status() == "zombie"


@pytest.mark.parametrize(
    "abnormal, exitcode", [(False, EXIT_NORMAL), (True, EXIT_STOPPED_ABNORMALLY)]
)
def test_an_actor_stopping_itself_runs_on_stop_and_says_whether_it_failed(
    node: Node, tmp_path: Path, abnormal: bool, exitcode: int
) -> None:
    marker = tmp_path / "marker"
    ref = node.spawn(StopsOnSignal, str(marker))
    monitor = node.monitor(ref)
    assert ref.ask(("stop_self", abnormal), timeout=10) == "stopping"
    down = monitor.wait(10)
    assert down is not None and (down.exitcode, down.signal) == (exitcode, None)
    assert marker.read_text() == "stopped"


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_lets_a_busy_handler_finish_then_runs_on_stop(
    node: Node, tmp_path: Path, signum: int
) -> None:
    marker = tmp_path / "marker"
    release = tmp_path / "release"
    ref = node.spawn(StopsOnSignal, str(marker))
    started = tmp_path / "started"
    answer = ref.ask_async(("busy_until", str(started), str(release)))
    monitor = node.monitor(ref)
    wait_for(started.exists)
    os.kill(ref.pid, signum)
    assert monitor.wait(timeout=0.3) is None  # the handler is not interrupted ...
    release.touch()
    assert answer.get(timeout=10) == "released"  # ... it finishes and answers
    down = monitor.wait(timeout=10)
    assert down.exitcode == EXIT_TERMINATED
    assert marker.read_text() == "stopped"


def test_sigint_leaves_an_actor_running(node: Node) -> None:
    ref = node.spawn(Recorder)
    os.kill(ref.pid, signal.SIGINT)
    assert ref.ask("pid", timeout=10) == ref.pid
    assert ref.ping(timeout=5).incarnation == ref.incarnation


def test_stop_escalates_to_sigkill_when_sigterm_is_ignored(node: Node, tmp_path: Path) -> None:
    marker = tmp_path / "blocked"
    ref = node.spawn(IgnoresStop, str(marker))
    ref.tell("block")
    wait_for(marker.exists)
    down = node.stop(ref, timeout=0.5)
    assert down.signal == signal.SIGKILL


def test_an_ask_to_a_stopped_actor_raises_actor_dead_error(node: Node) -> None:
    ref = node.spawn(Recorder)
    ref.stop(timeout=10)
    with pytest.raises(ActorDeadError):
        ref.ask("label", timeout=10)


def test_asks_queued_when_an_actor_stops_are_answered_not_delivered(node: Node) -> None:
    """An ask still in the mailbox at the stop was never taken: NotDelivered (an
    ActorDeadError) says so, and the asker may send it to the next incarnation."""
    ref = node.spawn(Recorder, max_batch=1)
    ref.tell(("sleep", 1.0))  # long enough for the stop request to arrive meanwhile
    late = ref.ask_async(("nap", 0, "never taken"))
    ref.request_stop(timeout=10)
    with pytest.raises(NotDelivered, match="stopped before it took"):
        late.get(timeout=10)


def test_a_crash_in_a_tell_stops_the_actor_with_exit_crashed(node: Node) -> None:
    ref = node.spawn(Recorder)
    monitor = node.monitor(ref)
    ref.tell(("crash",))
    down = monitor.wait(10)
    assert down is not None and down.exitcode == EXIT_CRASHED


def test_an_old_ref_reaches_the_restarted_actor_at_the_same_address(
    node: Node, transport: str
) -> None:
    old = node.spawn(Recorder, "same args", name="phoenix", transport=transport)
    os.kill(old.pid, signal.SIGKILL)
    assert node.monitor(old).wait(10) is not None
    new = node.restart(old)
    assert (new.address, new.control) == (old.address, old.control)
    assert new.incarnation == old.incarnation + 1 and new.pid != old.pid
    assert old.ask("label", timeout=10) == "same args"
    assert node.whereis("phoenix") == new


def test_a_pinned_ref_to_an_old_incarnation_is_refused_and_its_messages_dropped(node: Node) -> None:
    old = node.spawn(Recorder, name="pinned")
    sender = node.spawn(Recorder, name="sender")
    pinned = old.pin()
    old.stop(timeout=10)
    new = node.restart(old)
    with pytest.raises(ActorDeadError):
        pinned.tell("refused here: this process saw the death")
    # The sender's process never heard of the restart: it sends, the new incarnation drops.
    assert sender.ask(("tell_other", pinned, "stale"), timeout=10) == "told"
    new.pin().tell("fresh")
    # the two senders' messages keep no order between them: the stale one may come last
    wait_for(lambda: new.stats(timeout=10)["dropped_stale"] == 1, timeout=30)
    # An ask is answered at once that nothing of it was taken (not left to time out in
    # doubt): the asker may send it again to the new incarnation.
    with pytest.raises(NotDelivered, match="took nothing"):
        sender.ask(("ask_other", pinned, ("nap", 0, "stale ask")), timeout=30)
    assert new.stats(timeout=10)["dropped_stale"] == 2
    assert new.ask("seen", timeout=10) == ["fresh"]


def test_restart_refuses_an_incarnation_that_is_still_alive(node: Node) -> None:
    ref = node.spawn(Recorder)
    with pytest.raises(InvalidSpec, match="still alive"):
        node.restart(ref)


def test_closing_a_node_stops_its_actors_and_its_forkserver() -> None:
    with Node("closing", preload=("tests.actors.sample_actors",)) as node:
        refs = [node.spawn(Recorder) for _ in range(3)]
        forkserver = psutil.Process(os.getpid()).children()
        assert any("forkserver" in " ".join(p.cmdline()) for p in forkserver)
    for ref in refs:
        assert not psutil.pid_exists(ref.pid)
    assert not os.path.exists(node.runtime_dir)


def test_a_sigkilled_node_process_leaves_no_actor_behind(tmp_path: Path) -> None:
    """Nor the spare its forkserver keeps ready for the next spawn."""
    script = tmp_path / "app.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from warren.actors import Node
        from tests.actors.sample_actors import Recorder

        if __name__ == "__main__":
            node = Node("doomed")
            refs = [node.spawn(Recorder) for _ in range(2)]
            pids = " ".join(str(r.pid) for r in refs)
            print(node.runtime_dir, node.forkserver_pid, pids, flush=True)
            time.sleep(600)
    """)
    )
    app = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    runtime_dir = None
    try:
        runtime_dir, forkserver_pid, *pid_text = app.stdout.readline().split()
        actor_pids = {int(p) for p in pid_text}

        def spare_pids() -> list[int]:
            spares = spare_children(int(forkserver_pid))
            return [p.pid for p in spares if p.pid not in actor_pids]

        wait_for(spare_pids)
        descendants = psutil.Process(app.pid).children(recursive=True)
        assert len(actor_pids) == 2
        assert set(spare_pids()) <= {p.pid for p in descendants}
        app.kill()
        app.wait(10)
        gone, alive = psutil.wait_procs(descendants, timeout=10)
        assert alive == []
    finally:
        app.kill()
        app.wait(10)
        app.stdout.close()
        if runtime_dir is not None:  # a SIGKILLed node cannot remove its own
            shutil.rmtree(runtime_dir, ignore_errors=True)


def test_a_spawn_leaves_a_spare_child_that_is_none_of_the_nodes_actors(node: Node) -> None:
    first = node.spawn(Recorder, name="first")
    spare = the_spare(node.forkserver_pid)
    assert spare.pid != first.pid
    assert node.actors() == [first]
    # the next spawn is the spare, which becomes that actor; a new spare waits after it
    second = node.spawn(TitledWorker, name="second", title="worker second")
    assert second.pid == spare.pid
    assert second.ask("title", timeout=10) == "warren: worker second"
    assert the_spare(node.forkserver_pid).pid not in (first.pid, second.pid)
    assert sorted(r.name for r in node.actors()) == ["first", "second"]


def test_a_spare_connects_ahead_to_the_ipc_peers_the_last_order_named(node: Node) -> None:
    # A queue's order names its two stores, which the next queue registers with as it
    # starts: the spare forked after an order connects to its peers while it waits, and
    # the actor it becomes keeps those connections only if its own order names them.
    peer = node.spawn(PeerTracker, name="peer")
    node.spawn(Caller, peer, name="first caller")
    spare = the_spare(node.forkserver_pid)
    wait_for(lambda: peer.ask(("connected", spare.pid), timeout=10))
    caller = node.spawn(Caller, peer, name="second caller")  # that spare: it keeps it
    assert caller.pid == spare.pid
    spare = the_spare(node.forkserver_pid)
    wait_for(lambda: peer.ask(("connected", spare.pid), timeout=10))
    bystander = node.spawn(Recorder, name="bystander")  # that spare: it closes it
    assert bystander.pid == spare.pid
    wait_for(lambda: bystander.pid in peer.ask("gone", timeout=10))
    assert peer.ask(("connected", caller.pid), timeout=10)
    assert bystander.ask("pid", timeout=10) == bystander.pid


def test_a_spawn_names_to_the_forkserver_at_most_a_few_peers(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each peer named costs the next spare, and the actor it becomes if its order names
    # them too, two descriptors: an order naming hundreds would leave the next actor
    # none.
    workers = [node.spawn(Recorder, name=f"worker {n}") for n in range(_forkserver.SPARE_PEERS + 2)]
    heads: list[bytes] = []
    spawn_head = _forkserver.spawn_head

    def recording_head(token: int, endpoint: str, peers: tuple[str, ...]) -> bytes:
        heads.append(spawn_head(token, endpoint, peers))
        return heads[-1]

    monkeypatch.setattr(_forkserver, "spawn_head", recording_head)
    node.spawn(Caller, workers, name="router")
    assert _forkserver._endpoints(heads[-1]) == [
        node.endpoint,
        *(worker.address for worker in workers[: _forkserver.SPARE_PEERS]),
    ]


def test_an_actor_started_from_a_spare_hears_of_a_peers_end(node: Node) -> None:
    # A spare makes its mailboxes, and a monitor of their connections, ahead of its order.
    node.spawn(Recorder, name="first")  # forked directly: a spare waits after it
    spare = the_spare(node.forkserver_pid)
    tracker = node.spawn(PeerTracker, name="tracker")
    assert tracker.pid == spare.pid
    talker = node.spawn(Recorder, name="talker")
    assert talker.ask(("ask_other", tracker, "label"), timeout=10) == "peer tracker"
    wait_for(lambda: tracker.ask(("connected", talker.pid), timeout=10))
    os.kill(talker.pid, signal.SIGKILL)
    wait_for(lambda: talker.pid in tracker.ask("gone", timeout=10))


@pytest.mark.parametrize("started", ["from a spare", "forked directly"])
def test_a_peer_that_reconnects_while_a_restarted_actor_is_made_is_heard_of(
    node: Node, started: str
) -> None:
    # The talker's connection comes back by itself once the restarted tracker binds its
    # mailbox, while its constructor still runs: watched from before the bind, it counts.
    tracker = node.spawn(PeerTracker, 1.0, name="tracker")
    talker = node.spawn(Recorder, name="talker")
    assert talker.ask(("ask_other", tracker, "label"), timeout=10) == "peer tracker"
    node.stop(tracker)
    if started == "forked directly":  # no spare: the next spawn is forked
        spare = the_spare(node.forkserver_pid)
        spare.kill()
        psutil.wait_procs([spare], timeout=10)
    tracker = node.restart(tracker)
    wait_for(lambda: tracker.ask(("connected", talker.pid), timeout=10))
    os.kill(talker.pid, signal.SIGKILL)
    wait_for(lambda: talker.pid in tracker.ask("gone", timeout=10))


def test_a_spawn_names_to_the_forkserver_only_the_live_peers_of_its_order(
    node: Node, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A dead actor's endpoint would have the next spare, and the actor it becomes, try to
    # connect again and again for nothing: only the node's live actors are named.
    live = node.spawn(Recorder, name="live")
    dead = node.spawn(Recorder, name="dead")
    node.stop(dead)
    named: list[tuple[str, ...]] = []
    spawn = node._forkserver.spawn

    def recording_spawn(token: int, endpoint: str, order: bytes, peers: tuple[str, ...]) -> None:
        named.append(peers)
        spawn(token, endpoint, order, peers)

    monkeypatch.setattr(node._forkserver, "spawn", recording_spawn)
    node.spawn(Caller, (dead, live, live), name="caller")
    assert named == [(live.address,)]


def test_an_actors_full_collection_copies_none_of_the_forkservers_objects() -> None:
    # An actor shares the forkserver's pages until it writes to one, and a full garbage
    # collection writes to every object it walks: those the forkserver imported are
    # frozen before its first fork, or each actor's first full collection copied them.
    preload = (*PRELOAD, "warren.queues.broker.queue_actor")  # the node's heaviest
    with Node("collect", preload=preload) as node:
        first = node.spawn(Recorder, name="first")  # forked directly
        second = node.spawn(Recorder, name="second")  # a spare
        for ref in (first, second):
            assert ref.ask("full_collection_faults", timeout=30) < 100


def test_a_killed_spare_is_replaced_unnoticed_and_spawns_go_on(node: Node) -> None:
    first = node.spawn(Recorder, name="first")
    down = node.monitor(first)
    spare = the_spare(node.forkserver_pid)
    spare.kill()
    psutil.wait_procs([spare], timeout=10)
    second = node.spawn(Recorder, name="second")  # forked at once, then a new spare
    assert second.pid != spare.pid
    assert second.ask("pid", timeout=10) == second.pid
    assert the_spare(node.forkserver_pid).pid not in (spare.pid, first.pid, second.pid)
    assert sorted(r.name for r in node.actors()) == ["first", "second"]
    assert down.down is None  # the spare's death is nobody's Down
    assert first.ask("pid", timeout=10) == first.pid


def test_a_spare_whose_warm_up_fails_after_it_took_its_order_still_runs_it(
    runtime_dir: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The warm-up (the spare's connection to the node) only saves its actor time: failing
    # (out of descriptors) once the order is down the spare's pipe, it must lose no spawn.
    gate = tmp_path / "gate"
    monkeypatch.setenv(failing_warm_up.GATE_VARIABLE, str(gate))
    preload = (*PRELOAD, "tests.actors.failing_warm_up")
    with Node("warm-up", runtime_dir=runtime_dir, preload=preload) as node:
        node.spawn(Recorder, name="first")
        spare = the_spare(node.forkserver_pid)  # held in its warm-up until the gate opens
        after: list[psutil.Process] = []

        def next_spare_forked() -> bool:
            after[:] = [p for p in spare_children(node.forkserver_pid) if p.pid != spare.pid]
            return len(after) == 1

        with concurrent.futures.ThreadPoolExecutor(1) as spawner:
            spawning = spawner.submit(node.spawn, Recorder, "second", name="second")
            try:
                # the order went down the spare's pipe: the server forked the next spare
                wait_for(next_spare_forked)
            finally:
                gate.touch()  # the warm-ups fail now (and the spawn is not held, if it failed)
            (next_spare,) = after
            second = spawning.result(timeout=30)
        assert second.pid == spare.pid
        assert second.ask("label", timeout=10) == "second"
        # the next spare's warm-up failed before any order: it still takes the next one
        third = node.spawn(Recorder, "third", name="third")
        assert third.pid == next_spare.pid
        assert third.ask("label", timeout=10) == "third"
        assert sorted(r.name for r in node.actors()) == ["first", "second", "third"]


def test_an_order_larger_than_the_spares_pipe_is_forked_directly(node: Node) -> None:
    node.spawn(Recorder, name="first")
    spare = the_spare(node.forkserver_pid)
    label = "x" * (1024 * 1024)  # a pipe holds 64 KiB: the spare cannot take it at once
    big = node.spawn(Recorder, label, name="big")
    assert big.pid != spare.pid
    assert big.ask("label", timeout=10) == label
    psutil.wait_procs([spare], timeout=10)  # given up: killed, reaped unreported
    assert not spare.is_running()
    assert the_spare(node.forkserver_pid).pid not in (spare.pid, big.pid)
    assert sorted(r.name for r in node.actors()) == ["big", "first"]


def test_a_spare_stops_with_its_node() -> None:
    with Node("spare", preload=("tests.actors.sample_actors",)) as node:
        node.spawn(Recorder)
        spare = the_spare(node.forkserver_pid)
    gone, alive = psutil.wait_procs([spare], timeout=10)
    assert alive == []


def test_a_script_that_starts_a_node_without_a_main_guard_fails_instead_of_recursing(
    tmp_path: Path,
) -> None:
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[2])!r})
        from warren.actors import Node, SpawnError

        try:
            Node("unguarded").close()
        except SpawnError as error:
            print("refused:", error)
    """)
    )
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)
    # The forkserver's import of the script is where the node is refused; the script's
    # own run then goes on, so the whole thing ends instead of forking without end.
    assert run.returncode == 0
    assert run.stdout.count("refused: a Node was started while the forkserver imported") == 1


def test_a_child_forked_as_its_forkserver_dies_exits_rather_than_live_on_adopted() -> None:
    # A node killed while its forkserver forks an actor: the child starts after the
    # server is gone, adopted by another process. Seed 1683702795 left such a stream
    # process holding its stream's lock: no later start of the node got past it.
    ended = subprocess.Popen(["true"])
    ended.wait()  # the server that forked the child, gone before it starts
    pid = os.fork()
    if pid == 0:
        code = 99
        try:
            code = _forkserver._run_child(b"", b"", logging.WARNING, ended.pid)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == EXIT_PARENT_GONE


def test_a_node_whose_forkserver_cannot_start_leaves_no_directory_and_frees_its_keys(
    short_tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A node that keeps its tcp actors to itself (curve) takes the process's one slot
    # for CURVE keys, and every node makes a runtime directory: one whose start fails
    # (here its forkserver cannot import a module it was asked to preload) must give
    # both back, or the next node of the process is refused and the directory stays.
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(short_tmp_path))
    with pytest.raises(SpawnError, match="forkserver"):
        Node("broken", preload=("tests.actors.no_such_module",), curve=True)
    assert os.listdir(short_tmp_path) == []
    with Node("next", preload=PRELOAD, curve=True) as node:
        assert node.spawn(Recorder, "served", name="served").ask("label", timeout=20) == "served"
    assert os.listdir(short_tmp_path) == []
