"""Actors the supervision tests run under supervisors."""

import ctypes
import os
import time

from warren.actors import ProcessActor
from warren.supervisor import ChildSpec, SupervisorSpec


class Worker(ProcessActor):
    """Answers "pid"; crashes on the tell "crash"; exits normally on "quit"; segfaults on
    "segfault"; exits with code 3 on "exit 3"; keeps the alarms it is told of ("alarms");
    appends its name to ``journal`` (a file) when it stops."""

    def __init__(
        self, name: str = "", journal: str | None = None, stop_delay_s: float = 0.0
    ) -> None:
        self.name = name
        self.journal = journal
        self.stop_delay_s = stop_delay_s
        self.alarms: list[tuple[str, bool]] = []

    def on_alarm(self, resource: str, raised: bool) -> None:
        self.alarms.append((resource, raised))

    def on_receive(self, message):
        if message == "pid":
            return os.getpid()
        if message == "alarms":
            return self.alarms
        if message == "crash":
            raise RuntimeError("asked to crash")
        if message == "quit":
            self.stop()
        if message == "fail":
            self.stop(abnormal=True)
        if message == "segfault":
            ctypes.string_at(0)  # a real SIGSEGV, as a broken C extension would
        if message == "exit 3":
            os._exit(3)
        return None

    def on_stop(self) -> None:
        if self.journal:
            with open(self.journal, "a") as f:
                f.write(f"{self.name}\n")
        time.sleep(self.stop_delay_s)


class OneAtATime(Worker):
    """Takes one message a pass (``max_batch`` 1) and naps 10 ms on "nap": a burst of
    naps leaves messages waiting after each pass."""

    max_batch = 1

    def on_receive(self, message):
        if message == "nap":
            time.sleep(0.01)
            return None
        return super().on_receive(message)


class SlowStarter(Worker):
    """Takes ``start_s`` seconds in on_start, like a store recovering from disk."""

    def __init__(self, start_s: float) -> None:
        super().__init__()
        self.start_s = start_s

    def on_start(self) -> None:
        time.sleep(self.start_s)


class GatedStarter(Worker):
    """Starts only once the file ``gate`` exists, like a store with much to recover."""

    def __init__(self, gate: str) -> None:
        super().__init__()
        self.gate = gate

    def on_start(self) -> None:
        while not os.path.exists(self.gate):
            time.sleep(0.02)


class MeetsAtStart(Worker):
    """Creates the file ``mine`` in on_start, then waits there until ``theirs`` exists:
    two of them, each the other's ``theirs``, start only when they start side by side."""

    def __init__(self, mine: str, theirs: str) -> None:
        super().__init__()
        self.mine, self.theirs = mine, theirs

    def on_start(self) -> None:
        open(self.mine, "w").close()
        while not os.path.exists(self.theirs):
            time.sleep(0.02)


class SlowToStop(Worker):
    """Takes ``stop_s`` seconds in on_stop, then appends its name to ``journal``, like a
    store writing its recovery files (it answers no ping meanwhile); creates the file
    ``began``, if given, as its on_stop begins."""

    def __init__(self, name: str, journal: str, stop_s: float, began: str | None = None) -> None:
        super().__init__(name)
        self.stopped_journal, self.stop_s, self.began = journal, stop_s, began

    def on_stop(self) -> None:
        if self.began is not None:
            open(self.began, "w").close()
        time.sleep(self.stop_s)
        with open(self.stopped_journal, "a") as f:
            f.write(f"{self.name}\n")


class FailsToStart(ProcessActor):
    def on_start(self) -> None:
        raise ValueError("cannot start")


class FailsWhileBlocked(Worker):
    """Fails to start while the file ``blocker`` exists, like a store whose disk is gone."""

    def __init__(self, blocker: str) -> None:
        super().__init__()
        self.blocker = blocker

    def on_start(self) -> None:
        if os.path.exists(self.blocker):
            raise OSError(f"{self.blocker} is in the way")


def unwatched_worker(data_dir):
    """A tree of one worker with no heartbeat: frozen, it is never replaced."""
    return (ChildSpec("worker", Worker, heartbeat_interval_s=None, heartbeat_timeout_s=None),)


def gated_worker(data_dir):
    """A tree of one worker that starts once ``<data_dir>.gate`` exists."""
    return (ChildSpec("worker", GatedStarter, (f"{data_dir}.gate",), start_timeout_s=120),)


def worker_beside_gated_starter(data_dir):
    """A tree of two workers under one supervisor: ``idle``, and ``gated``, which starts
    once ``<data_dir>.gate`` exists; while ``gated`` starts, their supervisor acts on
    nothing else."""
    return (
        ChildSpec("idle", Worker),
        ChildSpec("gated", GatedStarter, (f"{data_dir}.gate",), start_timeout_s=120),
    )


def unwatched_worker_beside_gated_supervisor(data_dir):
    """A tree of ``idle``, a worker with no heartbeat (frozen, it is never replaced), and
    ``gated_sup``, a supervisor of its own whose ``gated`` starts once ``<data_dir>.gate``
    exists: while it starts, ``gated_sup`` is busy, and ``idle``'s supervisor is not."""
    return (
        ChildSpec("idle", Worker, heartbeat_interval_s=None, heartbeat_timeout_s=None),
        SupervisorSpec(
            "gated_sup",
            children=(
                ChildSpec("gated", GatedStarter, (f"{data_dir}.gate",), start_timeout_s=120),
            ),
        ),
    )
