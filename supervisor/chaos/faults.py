"""Fault injection for crash-recovery runs: seeded fault schedules, and the faults that
land on a node's processes and files.

A schedule is a list of ``Fault`` (when, which kind, which processes, a seed of its own
for the choices it makes), drawn from one seed: the same seed gives the same schedule,
so a run that failed can be repeated fault for fault. The faults:

- ``kill``: SIGKILL one actor process whose name matches a pattern (``queue *``,
  ``msg_store_persistent``); its supervisor restarts it and it recovers from disk;
- ``stop``: SIGSTOP one such process: it answers nothing, its supervisor's heartbeat
  gives up on it and kills it, and the fault sends SIGCONT when it is released (a
  process the supervisor already killed is gone by then). Only a process that is ready
  is stopped: a supervisor pings a child once its start (its recovery) is done, and
  bounds the start by ``start_timeout_s`` alone, so a process stopped while it starts is
  not a heartbeat's to find;
- ``node``: SIGKILL every process of a node at once (the node's own, its forkserver, its
  actors), as the kernel's OOM killer or a power cut would;
- ``torn``: with the node stopped, cut one of its store, queue or stream files at a random
  byte of its last page (``TORN_TAIL_BYTES``), as a crash in the middle of a write leaves
  it: the disk wrote the start of the write and not the rest. Of a stream, only its
  newest segment and that segment's index: a stream syncs a segment whole before it
  starts the next, so no older one can end in an unfinished write (a quorum queue's
  segments, appended by the WAL's process in index order, the same way). A quorum
  queue's WAL files, segments and snapshot count as its files;
- ``flip``: with the node stopped, flip one bit of one byte of such a file (any of a
  stream's);
- ``full`` and ``slow``: the disk is full, or slow to sync, for a while
  (``warren.store.disk_faults``; ``warren.supervisor.chaos.run`` turns them on and off).

A schedule keeps under the restart intensity of the supervisors it tests when given
``limits`` (at most so many process faults on a pattern in any so many seconds): a
supervisor that gives up is then a finding of the run, not the schedule's doing.

Processes are found from the node's process (its descendants, titled ``warren: <name>``),
never by name across the machine, so a fault never lands on another node's or program's
processes. Only actors are victims: not the forkserver, nor the spare child it forks ahead
of the next spawn (``warren: spare``, no actor until an order makes it one: a kill of it
would take down no actor, and no supervisor acts on a stop of it). A pattern that matches
none of them is an error, said before anything is done.

Races: a process can exit between being listed and being signalled; the signal then
finds no process (or only a zombie, not reaped yet) and the fault is reported as not
landed (``FaultMissed``), named by the title it was listed with, never sent
to a pid the kernel reused, because the victim is signalled through its psutil handle,
which checks the process's start time first.
"""

from __future__ import annotations

import fnmatch
import os
import random
import signal
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import psutil

from warren.actors.process import SPARE_TITLE
from warren.queues.engine.ra_log import (
    LOG_DIRECTORY,
    QUORUM_DIRECTORY,
    SNAPSHOT_FILE,
    WAL_DIRECTORY,
    WAL_SUFFIX,
)
from warren.queues.engine.stream_log import INDEX_SUFFIX, SEGMENT_SUFFIX, numbered_files

from ..errors import FaultMissed

__all__ = [
    "DISK_FAULTS",
    "FAULT_KINDS",
    "FILE_FAULTS",
    "PROCESS_FAULTS",
    "Fault",
    "FaultMissed",
    "actor_name",
    "damage_file",
    "is_alive",
    "kill_process",
    "kill_processes",
    "matching",
    "node_processes",
    "schedule",
    "stop_process",
]

FAULT_KINDS = ("kill", "stop", "node", "torn", "flip", "full", "slow")
FILE_FAULTS = ("torn", "flip")  # these need the node stopped first
PROCESS_FAULTS = ("kill", "stop")  # these take a pattern
DISK_FAULTS = ("full", "slow")  # these last a while, then end
TITLE_PREFIX = "warren: "
# The files a torn write or a flipped byte may hit: the shared stores' data files, the
# queues' segment files (index slots, then the queue's own records), the streams'
# segments and indexes, and the quorum queues' WAL files, segments and snapshots.
DAMAGEABLE = (
    "msg_store_persistent/*.rdq",
    "queues/*/*.qi",
    "queues/*/*" + SEGMENT_SUFFIX,
    "queues/*/*" + INDEX_SUFFIX,
    f"{QUORUM_DIRECTORY}/{WAL_DIRECTORY}/*{WAL_SUFFIX}",
    f"queues/*/{LOG_DIRECTORY}/*{SEGMENT_SUFFIX}",
    f"queues/*/{SNAPSHOT_FILE}*",
)
TORN_TAIL_BYTES = 4096


@dataclass(frozen=True)
class Fault:
    """One fault of a schedule: ``at_s`` seconds from the start."""

    at_s: float
    kind: str
    pattern: str  # process name pattern (kill, stop), else ""
    seed: int  # for the process, file and byte it picks

    def __str__(self) -> str:
        target = f" {self.pattern!r}" if self.pattern else ""
        return f"{self.at_s:7.2f} s  {self.kind}{target}"


def schedule(
    seed: int,
    duration_s: float,
    kinds: tuple[str, ...] | list[str],
    *,
    patterns: tuple[str, ...] = ("queue *", "msg_store_*"),
    every_s: tuple[float, float] = (1.0, 3.0),
    limits: dict[str, tuple[int, float]] | None = None,
) -> list[Fault]:
    """Faults at random intervals of ``every_s`` (seconds, from, to) over ``duration_s``,
    each of a kind drawn from ``kinds`` and, for kill and stop, a pattern from
    ``patterns`` that has had fewer than ``count`` faults in the last ``period_s`` when
    ``limits`` gives it ``(count, period_s)`` (a slot none may take gets another kind, or
    no fault); ``ValueError`` for a kind that does not exist or a duration of 0."""
    unknown = sorted(set(kinds) - set(FAULT_KINDS))
    if unknown or not kinds:
        raise ValueError(
            f"unknown fault kinds {unknown or list(kinds)}; the kinds are {', '.join(FAULT_KINDS)}"
        )
    if not isinstance(duration_s, (int, float)) or duration_s <= 0:
        raise ValueError(f"the duration must be a positive number of seconds, not {duration_s!r}")
    if not patterns or not 0 < every_s[0] <= every_s[1]:
        raise ValueError("give at least one pattern, and an interval 0 < from <= to")
    limits = limits or {}
    rng = random.Random(seed)
    faults: list[Fault] = []
    at = rng.uniform(*every_s)
    while at < duration_s:
        kind = rng.choice(list(kinds))
        pattern = ""
        if kind in PROCESS_FAULTS:
            free = [
                p
                for p in patterns
                if p not in limits
                or sum(1 for f in faults if f.pattern == p and f.at_s > at - limits[p][1])
                < limits[p][0]
            ]
            others = [k for k in kinds if k not in PROCESS_FAULTS]
            if free:
                pattern = rng.choice(free)
            elif others:
                kind = rng.choice(others)
            else:
                kind = ""
        if kind:
            faults.append(Fault(round(at, 3), kind, pattern, rng.getrandbits(32)))
        at += rng.uniform(*every_s)
    return faults


def node_processes(node_pid: int) -> list[psutil.Process]:
    """The node's process and every process under it (forkserver, actors)."""
    try:
        node = psutil.Process(node_pid)
        return [node, *node.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def actor_name(process: psutil.Process) -> str:
    """The actor name in a process's title (``warren: queue orders``: ``queue orders``)."""
    return _title(process)[len(TITLE_PREFIX) :]


def _title(process: psutil.Process) -> str:
    try:
        cmdline = process.cmdline()
    except psutil.Error:
        return ""
    return cmdline[0] if cmdline else ""


def _actor_title_name(process: psutil.Process) -> str | None:
    """The actor name in ``process``'s title; None for a process that is no actor: not
    titled ``warren: <name>``, the forkserver, or its spare child awaiting an order."""
    title = _title(process)
    if not title.startswith(TITLE_PREFIX) or title == SPARE_TITLE:
        return None
    name = title[len(TITLE_PREFIX) :]
    return None if name.startswith("forkserver") else name


def matching(processes: list[psutil.Process], pattern: str) -> list[psutil.Process]:
    """The actor processes (titled ``warren: <name>``) whose name matches ``pattern``
    (shell-style: ``queue *``); the forkserver and its spare are never among them."""
    return [process for _, process in _named_matching(processes, pattern)]


def _named_matching(
    processes: list[psutil.Process], pattern: str
) -> list[tuple[str, psutil.Process]]:
    """``matching``, each with its title as it was read then (a process that exits later
    has none to read)."""
    found = []
    for process in processes:
        name = _actor_title_name(process)
        if name is not None and fnmatch.fnmatchcase(name, pattern):
            found.append((TITLE_PREFIX + name, process))
    return found


def _pick(processes: list[psutil.Process], pattern: str, seed: int) -> tuple[str, psutil.Process]:
    """One actor matching ``pattern``, drawn by ``seed``, and its title as listed."""
    found = sorted(_named_matching(processes, pattern), key=lambda named: named[0])
    if not found:
        names = sorted({name for p in processes if (name := _actor_title_name(p)) is not None})
        raise FaultMissed(
            f"no process of the node matches {pattern!r}; its processes are "
            f"{', '.join(names) or 'none'}"
        )
    return random.Random(seed).choice(found)


def _signal_one(
    processes: list[psutil.Process],
    pattern: str,
    seed: int,
    signum: signal.Signals,
    ready: Collection[int] | None = None,
) -> tuple[str, psutil.Process]:
    name, victim = _pick(processes, pattern, seed)
    if ready is not None and victim.pid not in ready:
        raise FaultMissed(
            f"{name} (pid {victim.pid}) is still starting: no heartbeat watches it yet"
        )
    try:
        if victim.status() == psutil.STATUS_ZOMBIE:  # ended since it was listed
            raise psutil.NoSuchProcess(victim.pid)
        victim.send_signal(signum)
    except psutil.NoSuchProcess:
        raise FaultMissed(f"{name} exited before the {signum.name}") from None
    return name, victim


def kill_process(processes: list[psutil.Process], pattern: str, seed: int) -> str:
    """SIGKILL one process matching ``pattern``; the name of the one killed."""
    return _signal_one(processes, pattern, seed, signal.SIGKILL)[0]


def stop_process(
    processes: list[psutil.Process],
    pattern: str,
    seed: int,
    ready: Collection[int] | None = None,
) -> tuple[str, psutil.Process]:
    """SIGSTOP one process matching ``pattern``; its name and handle (for ``SIGCONT``).
    With ``ready`` (the pids of the actors that are ready), a victim not among them (an
    actor still starting: its supervisor pings it only once it is ready) is not stopped:
    ``FaultMissed``, and the caller asks again later (the same seed picks the same
    actor)."""
    return _signal_one(processes, pattern, seed, signal.SIGSTOP, ready)


def kill_processes(
    processes: list[psutil.Process], timeout_s: float = 10.0
) -> list[psutil.Process]:
    """SIGKILL them all at once (a whole node) and wait for their end; those still
    alive after ``timeout_s`` (none, unless the kernel is stuck). A zombie is dead: it
    holds no file, lock or socket any more, only its exit status for a parent to read."""
    for process in processes:
        try:
            process.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass  # gone already: its parent's death took it
    deadline = time.monotonic() + timeout_s
    alive = [p for p in processes if is_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.005)
        alive = [p for p in alive if is_alive(p)]
    return alive


def is_alive(process: psutil.Process) -> bool:
    """Whether it runs (a zombie does not; a pid reused since is another process)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def damage_file(
    data_dir: str | os.PathLike,
    kind: str,
    seed: int,
    *,
    before: Callable[[str, str, int], None] | None = None,
    files: tuple[str, ...] = DAMAGEABLE,
) -> tuple[str, int]:
    """Tear (cut in the last page) or flip (one bit of one byte anywhere) one of a stopped
    node's store, queue and stream files (``files``: patterns under the data directory,
    by default ``DAMAGEABLE``), picked with ``seed``; (its path, the offset).
    ``before(path, kind, offset)`` is called before the file is damaged (a harness notes
    what the damage may destroy). ``FaultMissed`` when the node has no such file yet."""
    if kind not in FILE_FAULTS:
        raise ValueError(f"damage_file does {' and '.join(FILE_FAULTS)}, not {kind!r}")
    root = os.fspath(data_dir)
    candidates = []
    for pattern in files:
        directory, _, name_pattern = pattern.rpartition("/")
        for parent in sorted(_expand(root, directory)):
            for name in sorted(os.listdir(parent)):
                path = os.path.join(parent, name)
                if (
                    fnmatch.fnmatchcase(name, name_pattern)
                    and os.path.getsize(path) > 0
                    and (kind != "torn" or _may_end_unfinished(path))
                ):
                    candidates.append(path)
    if not candidates:
        raise FaultMissed(f"{root} has no store or queue file to damage yet")
    rng = random.Random(seed)
    path = rng.choice(candidates)
    size = os.path.getsize(path)
    offset = rng.randrange(max(0, size - TORN_TAIL_BYTES) if kind == "torn" else 0, size)
    if before is not None:
        before(path, kind, offset)
    with open(path, "r+b") as file:
        if kind == "torn":
            file.truncate(offset)
        else:
            file.seek(offset)
            byte = file.read(1)[0]
            file.seek(offset)
            file.write(bytes([byte ^ (1 << rng.randrange(8))]))
        file.flush()
        os.fsync(file.fileno())
    return path, offset


def _may_end_unfinished(path: str) -> bool:
    """Whether a crash can leave ``path`` ending in a write the disk did not finish: any
    store or queue file, a stream's newest segment and index only."""
    directory, name = os.path.split(path)
    for suffix in (SEGMENT_SUFFIX, INDEX_SUFFIX):
        if name.endswith(suffix):
            stem, numbered = name[: -len(suffix)], numbered_files(directory, suffix)
            return bool(numbered) and stem.isdigit() and int(stem) == numbered[-1]
    return True


def _expand(root: str, directory: str) -> list[str]:
    """The directories ``directory`` (a path with ``*`` parts) names under ``root``."""
    found = [root]
    for part in directory.split("/"):
        found = [
            os.path.join(base, name)
            for base in found
            if os.path.isdir(base)
            for name in sorted(os.listdir(base))
            if fnmatch.fnmatchcase(name, part) and os.path.isdir(os.path.join(base, name))
        ]
    return found
