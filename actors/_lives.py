"""The incarnation table of a node: every spawn under way, every life, every death.

For each address the node has spawned at, the table knows the incarnation numbers given
out, the incarnation living there now (its ref, pid, spawn order, monitors and links),
and the ``Down`` of every incarnation that has exited, so a question about a dead
incarnation is answered with its exact exit long after the fact ("no such process" for
one never seen). A spawn between its order and its READY is a ``Pending``, found by its
token (and, once the forkserver has forked it, by its pid).

Each method does its reading and writing under the table's one lock and returns what
the caller must act on (monitors to resolve, links to notify) outside it: callbacks
never run under the lock, so a monitor's callback may call back into the node.

Races and their answers:
- An exit may be read before its READY (the two travel on different sockets): ``exited``
  records the status on the pending spawn, and the service fails that spawn after a
  short grace unless a FAILED message carrying the exception arrives first; a READY read
  after such an exit fails the spawn instead of recording a life that is already over.
- A ref pinned to an older incarnation never reaches the newer one living at its
  address (``life_of`` compares incarnations).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from ._loop import SpawnOrder
from .messages import Down
from .monitor import Monitor
from .ref import ActorRef


@dataclass
class Pending:
    """A spawn between the order and READY/FAILED."""

    token: int
    order: SpawnOrder
    done: threading.Event = field(default_factory=threading.Event)
    pid: int = 0
    ref: ActorRef | None = None
    error: str | None = None
    exit_status: int | None = None

    def fail(self, error: str) -> None:
        self.error = error
        self.done.set()


@dataclass
class Life:
    """One incarnation that has reported READY."""

    ref: ActorRef
    order: SpawnOrder
    exited: threading.Event = field(default_factory=threading.Event)
    down: Down | None = None
    monitors: list[Monitor] = field(default_factory=list)
    links: list[ActorRef] = field(default_factory=list)


@dataclass(frozen=True)
class Ended:
    """What an exit leaves the node to do: resolve the monitors, notify the links."""

    life: Life
    down: Down
    monitors: list[Monitor]
    links: list[ActorRef]


class Lives:
    """The table described in the module docstring (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[int, Pending] = {}
        self._by_pid: dict[int, Life] = {}
        self._by_address: dict[str, Life] = {}
        self._downs: dict[tuple[str, int], Down] = {}
        self._incarnations: dict[str, int] = {}

    # -- spawns --------------------------------------------------------------------------

    def next_incarnation(self, address: str) -> int:
        """The number of the next incarnation at ``address`` (a tcp address whose port is
        not chosen yet, ``...:*``, is numbered when it reports READY)."""
        with self._lock:
            incarnation = self._incarnations.get(address, 0) + 1
            if not address.endswith(":*"):
                self._incarnations[address] = incarnation
            return incarnation

    def expect(self, token: int, order: SpawnOrder) -> Pending:
        pending = Pending(token, order)
        with self._lock:
            self._pending[token] = pending
        return pending

    def give_up(self, token: int) -> Pending | None:
        """Forget a spawn (it failed, or its caller stopped waiting); it, if still known."""
        with self._lock:
            return self._pending.pop(token, None)

    def forked(self, token: int, pid: int) -> None:
        with self._lock:
            pending = self._pending.get(token)
            if pending is not None:
                pending.pid = pid

    def ready(
        self, token: int, address: str, control: str, pid: int, node_endpoint: str
    ) -> tuple[Pending, Life] | None:
        """Record the life of a spawn that reported READY. ``None`` when nobody waits for
        it any more, or when its process has exited already (the spawn is failed)."""
        with self._lock:
            pending = self._pending.pop(token, None)
            if pending is None:
                return None
            order = pending.order
            if order.address.endswith(":*"):
                self._incarnations[address] = order.incarnation
            if pending.exit_status is not None:
                pending.fail("the process exited right after it was ready")
                return None
            ref = ActorRef(order.name, address, control, order.incarnation, pid, node_endpoint)
            life = Life(ref, order)
            self._by_pid[pid] = life
            self._by_address[address] = life
            return pending, life

    # -- exits ---------------------------------------------------------------------------

    def exited(self, pid: int, status: int) -> Ended | Pending | None:
        """Record the exit of ``pid`` (``status``: its exit code, or minus the signal).

        A life ends: its ``Down`` is recorded and returned with the monitors to resolve
        and the links to notify. A spawn not ready yet: the status is kept on it and the
        spawn returned (the caller fails it after a grace). Otherwise ``None``.
        """
        exitcode, signum = (None, -status) if status < 0 else (status, None)
        with self._lock:
            life = self._by_pid.pop(pid, None)
            if life is None:
                for pending in self._pending.values():
                    if pending.pid == pid:
                        pending.exit_status = status
                        return pending
                return None
            down = Down(life.ref, exitcode, signum)
            life.down = down
            self._downs[(life.ref.address, life.ref.incarnation)] = down
            monitors, life.monitors = life.monitors, []
            return Ended(life, down, monitors, list(life.links))

    def every_pid(self) -> list[int]:
        """The pids of every live incarnation."""
        with self._lock:
            return list(self._by_pid)

    def every_pending(self) -> list[Pending]:
        with self._lock:
            return list(self._pending.values())

    # -- questions -----------------------------------------------------------------------

    def alive(self) -> list[Life]:
        """Every incarnation alive now."""
        with self._lock:
            return list(self._by_pid.values())

    def newest(self) -> list[Life]:
        """The newest incarnation at each address, alive or not."""
        with self._lock:
            return list(self._by_address.values())

    def newest_at(self, address: str) -> Life | None:
        """The newest incarnation at ``address``, alive or not."""
        with self._lock:
            return self._by_address.get(address)

    def to_stop(self, ref: ActorRef) -> Life | Down:
        """The life a stop of ``ref`` concerns, or the ``Down`` to answer at once."""
        with self._lock:
            life = self._by_address.get(ref.address)
            if life is not None and ref.pinned and life.ref.incarnation != ref.incarnation:
                life = None
            if life is None:
                return self._remembered_down(ref)
            return life.down if life.down is not None else life

    def watch(self, target: ActorRef, monitor: Monitor) -> Down | None:
        """Add ``monitor`` to ``target``'s incarnation; its ``Down`` if it is already dead
        (the caller resolves the monitor then)."""
        with self._lock:
            life = self._life_of(target)
            down = self._down_of(target, life)
            if down is None and life is not None:
                life.monitors.append(monitor)
            return down

    def unwatch(self, monitor: Monitor) -> None:
        with self._lock:
            life = self._life_of(monitor.target)
            if life is not None and monitor in life.monitors:
                life.monitors.remove(monitor)

    def monitors_of(self, target: ActorRef) -> list[Monitor]:
        with self._lock:
            life = self._life_of(target)
            return list(life.monitors) if life is not None else []

    def link(self, first: ActorRef, second: ActorRef) -> list[tuple[ActorRef, Down]]:
        """Link two incarnations; for each one already dead, (the other, its ``Down``):
        the caller tells the other at once when that death was abnormal."""
        deaths: list[tuple[ActorRef, Down]] = []
        with self._lock:
            for one, other in ((first, second), (second, first)):
                life = self._life_of(one)
                down = self._down_of(one, life)
                if down is not None:
                    deaths.append((other, down))
                elif life is not None:
                    life.links.append(other)
        return deaths

    def _life_of(self, ref: ActorRef) -> Life | None:
        life = self._by_address.get(ref.address)
        if life is None or life.ref.incarnation != ref.incarnation:
            return None
        return life

    def _down_of(self, ref: ActorRef, life: Life | None) -> Down | None:
        """The incarnation's Down, or None while ``life`` (its record) is alive."""
        if life is not None:
            return life.down
        return self._remembered_down(ref)

    def _remembered_down(self, ref: ActorRef) -> Down:
        """The Down of a past incarnation ("no such process" for one never seen)."""
        return self._downs.get((ref.address, ref.incarnation), Down(ref, None, None))
