"""Running a node under a fault schedule: the harness behind ``warren chaos`` and the
``warren_chaos`` pytest fixture.

``NodeUnderTest`` runs ``warren node`` on a data directory as a child process (its own
children, ``--children module:function``, and any other option of ``warren node``), with
the disk-fault file of ``warren.store.disk_faults`` in its environment. ``run_faults``
then lands each fault of a schedule (``warren.supervisor.chaos.faults.schedule``) at its time:

- ``kill`` / ``stop``: one actor process matching the fault's pattern; a stopped one is
  resumed once its supervisor has killed it (or after twice the heartbeat timeout, or
  later while its supervisor is busy: below). A
  stop lands only on an actor its tree shows running: a supervisor pings a child once it
  is ready, and a start (a recovery) is bounded by the child's ``start_timeout_s``, not
  by its heartbeat, so a stop that lands while its victim starts (a node just started
  again) waits for it to be ready;
- ``node``: SIGKILL every process of the node, then start it again;
- ``torn`` / ``flip``: SIGKILL the node, damage one of its files, start it again;
- ``full`` / ``slow``: the disk is full (the disk alarm goes off) or every group commit
  takes ``SLOW_SYNC_S`` longer, for one to three seconds.

After each crash fault it waits until the node is healthy again (every actor of its tree
running, none of the actors it is expected to have missing, the victim replaced) and notes
how long that took: the recovery time. A stopped actor its supervisor never replaced is
resumed after twice the heartbeat timeout, a problem of the run. A supervisor acts on one
event at a time: one busy starting a sibling of the victim (a recovery) or stopping one
acts on the hang once done. So while the node's status shows the victim's own supervisor
busy so (``_supervisor_busy``: each supervisor's ``busy``, with how long that may take,
its ``bound_s``), and the victim running, the victim may be killed up to twice the
heartbeat timeout after that supervisor was last seen busy; never later than twice the
timeout after that start or stop could have ended (its beginning plus its bound). Another
supervisor busy excuses nothing: it holds up no event of the victim's; nor does a ``busy``
the harness cannot read (a node of another version), taken as none. A late kill that
was waited for is noted on the fault, and the problem of one never made names the
supervisor, what it was busy with and for how long. A node that exits on
its own is started again, as a service manager would: after a kill or stop that struck
one of its actors while it started (a child that dies before it is ready fails its
supervisor's start, and so the node's), noted on that fault; otherwise, a problem of
the run. A full disk whose alarm never goes off, though the node ran on it for
``DISK_ALARM_DUE_S``, is a problem of the run (one the node spent restarting from a
crash fault is a missed fault). Between
faults it samples the caller's counters (``sample``, for the throughput plot) every
``SAMPLE_EVERY_S``. Every fault is logged, with its time, to the ``warren.chaos`` logger
and in the result's events, so a failed run can be read and repeated from its seed.

Nothing is left behind: the node and every process it started are stopped when the run
ends, fails or is interrupted (SIGINT, SIGTERM or SIGHUP to the harness become
``KeyboardInterrupt`` while it runs: the node is stopped and the signal's exit follows);
the node is started with PR_SET_PDEATHSIG (``spawn_with_parent``), so even a SIGKILLed
harness takes it along, and the processes it was seen with are remembered, so those
a node that died on its own left behind are stopped too.

``check_data_dir`` refuses, before anything starts, a directory that holds files but is
not a node's (a run damages files and deletes queues' data: never a stranger's) and one
a running node holds.

Races: a fault is aimed at the processes of the node as they are when it lands (listed
again each time), so a victim restarted since the last fault is found under its new pid;
a victim that exits before the signal makes the fault ``missed``, not a kill of a reused
pid (psutil checks the start time). A node killed while it was starting is started again
like any other. A stop signal that lands while the harness forks (a node, a workload
process) has its KeyboardInterrupt raised in the handlers the fork runs, which ignore
it: ``spawn_with_parent`` notices, kills the process just forked and raises it. One sent
to the whole group also reaches the child before its exec, which runs the harness's
handler until then: there it ends the child as the signal's default would.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeGuard

import psutil

from warren.actors.process import die_with_parent
from warren.queues.client.ipc_node import NODE_FILE
from warren.store.disk_faults import ENVIRONMENT_VARIABLE, write_faults

from ..node.node import LOCK_FILE, check_node_directory, query_status
from . import faults as chaos
from .result import SAMPLE_EVERY_S, ChaosResult, Event

__all__ = [
    "ChaosResult",
    "Event",
    "NodeUnderTest",
    "check_data_dir",
    "harness_signals",
    "run_faults",
    "spawn_with_parent",
]

log = logging.getLogger("warren.chaos")

START_TIMEOUT_S = 120.0  # a node's start, recovery included
HEALTH_TIMEOUT_S = 120.0  # from a crash fault to every actor running again
STOP_TIMEOUT_S = 60.0  # a node's clean stop before it is killed
SLOW_SYNC_S = 0.05  # what a slow disk adds to every group commit
DISK_FAULT_HOLD_S = (1.0, 3.0)  # how long a full or slow disk lasts
DISK_ALARM_GRACE_S = 3.0  # how late a full disk's alarm may be seen
DISK_ALARM_DUE_S = 2.5  # a node up this long on a full disk has raised its alarm
POLL_S = 0.05
CHAOS_HEARTBEAT_TIMEOUT_S = 5.0  # so that a stopped store or queue is replaced in a run
DISK_FAULTS_FILE = "chaos-disk-faults.json"  # in the data directory, while a run lasts
# How long a kill waits for a process to match, and a stop for its victim to be ready: a
# node started again after a crash fault spawns its queues only after its stores have
# recovered, ten seconds and more on a loaded machine.
VICTIM_WAIT_S = 30.0
NODE_LOG = "chaos-node.log"  # run_tree's node log, in the data directory
RUN_DIR = "chaos-run"  # warren chaos's ledgers and logs, in the data directory
HARNESS_FILES = (NODE_LOG, RUN_DIR, DISK_FAULTS_FILE)  # what a run leaves beside a node's


def check_data_dir(path: str | os.PathLike) -> str:
    """The absolute data directory of a run: new, empty, or a node's that no node holds
    now; ValueError otherwise (before anything is made or started)."""
    data_dir = os.path.abspath(os.fspath(path))
    if not os.path.isdir(os.path.dirname(data_dir)):
        raise ValueError(
            f"the parent of the data directory, {os.path.dirname(data_dir)}, does not exist"
        )
    if not os.path.exists(data_dir):
        return data_dir
    if not os.path.isdir(data_dir):
        raise ValueError(f"{data_dir} is not a directory")
    check_node_directory(data_dir, beside=HARNESS_FILES)
    if os.path.exists(os.path.join(data_dir, LOCK_FILE)):
        with open(os.path.join(data_dir, LOCK_FILE), "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise ValueError(
                    f"a node runs on {data_dir}: stop it first, or give another directory"
                ) from None
    return data_dir


def spawn_with_parent(argv: list[str], **popen_options: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv)`` of a process the kernel kills when this one dies (and
    that never starts if this one died while it was being forked)."""
    parent = os.getpid()

    def bind_to_parent() -> None:
        if not die_with_parent(parent):
            os._exit(1)

    stops = _stops_received
    process = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, preexec_fn=bind_to_parent, **popen_options
    )
    if _stops_received != stops:
        # A stop signal came during the fork: its KeyboardInterrupt was raised in the
        # handlers a fork runs (logging's lock release), which ignore exceptions. The
        # process nobody will know of is killed, and the interrupt raised here instead.
        process.kill()
        process.wait()
        raise KeyboardInterrupt("a stop signal, during a fork")
    return process


class NodeUnderTest:
    """``warren node`` on ``data_dir`` as a child process, started, killed and started again
    by the harness; ``close()`` stops it and everything it started, whatever its state."""

    def __init__(
        self,
        data_dir: str | os.PathLike,
        *,
        options: tuple[str, ...] = (),
        log_path: str | os.PathLike | None = None,
        heartbeat_timeout_s: float = CHAOS_HEARTBEAT_TIMEOUT_S,
    ) -> None:
        self.data_dir = os.path.abspath(os.fspath(data_dir))
        os.makedirs(self.data_dir, exist_ok=True)
        # the node's lock file first, as a node makes it: the harness's own files below
        # then sit in a node's directory, which the node agrees to start in
        open(os.path.join(self.data_dir, LOCK_FILE), "a").close()
        self.faults_file = os.path.join(self.data_dir, DISK_FAULTS_FILE)
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._argv = [
            sys.executable,
            "-m",
            "warren.supervisor.cli",
            "node",
            "--data-dir",
            self.data_dir,
            "--heartbeat-timeout-s",
            str(heartbeat_timeout_s),
            *options,
        ]
        self._log_path = log_path
        self._process: subprocess.Popen | None = None
        self._restarts_before = 0  # restarts counted by the node's earlier lives
        self._restarts_now = 0  # ... and by this one, when last asked
        self._seen: dict[int, psutil.Process] = {}  # the node's processes, as listed
        self.expected: frozenset[str] = frozenset()  # actors healthy() insists on
        self.starts = 0
        self.starting = False  # started, and not seen healthy since
        # a kill or stop that landed on an actor while the node was starting
        self.struck_while_starting: Event | None = None
        write_faults(self.faults_file)

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the node is not running")
        return self._process.pid

    def start(self, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start the node and (``wait``) wait until it is healthy."""
        log_file = open(self._log_path, "ab") if self._log_path else subprocess.DEVNULL
        try:
            self._process = spawn_with_parent(
                self._argv,
                stdout=log_file,
                stderr=log_file if self._log_path else None,
                env={
                    **os.environ,
                    ENVIRONMENT_VARIABLE: self.faults_file,
                    # the application's modules, as the caller imports them
                    "PYTHONPATH": os.pathsep.join(
                        [os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]
                    ),
                },
            )
        finally:
            if not isinstance(log_file, int):  # a file opened above, not DEVNULL
                log_file.close()
        self.starts += 1
        self.starting, self.struck_while_starting = True, None
        deadline = time.monotonic() + timeout_s
        while wait and not self.healthy():
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"the node on {self.data_dir} exited with "
                    f"{self._process.returncode} while starting"
                )
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the node on {self.data_dir} did not start within {timeout_s:.0f} s"
                )
            time.sleep(POLL_S)
        if wait:
            self.processes()

    def status(self) -> dict | None:
        """The node's status, or None when it does not answer."""
        if self._process is None or self._process.poll() is not None:
            return None
        try:
            status = query_status(self.data_dir, timeout_ms=3000)
        except OSError:
            return None
        if status.get("pid") != self._process.pid:
            return None
        if status.get("tree") is not None:
            self._restarts_now = _restarts(status["tree"])
        return status

    def healthy(self, status: dict | None = None) -> bool:
        """Whether the node runs, every actor of its tree is running, and none of the
        ``expected`` ones is missing (a queue whose supervisor gave up leaves the tree)."""
        status = status or self.status()
        if status is None or status["state"] != "running" or status.get("tree") is None:
            return False
        states = {name: state for name, _, state in _actors(status["tree"])}
        healthy = (
            all(state == "running" for state in states.values()) and self.expected <= states.keys()
        )
        if healthy:  # started: a fault that struck its start excuses nothing any more
            self.starting, self.struck_while_starting = False, None
        return healthy

    def exit_code(self) -> int | None:
        """The exit status of a node that ended on its own (None while it runs, and once
        the harness killed or stopped it)."""
        return None if self._process is None else self._process.poll()

    def expect(self, names: Iterable[str]) -> None:
        """From now on the node is healthy only with every one of these actors running."""
        self.expected = frozenset(names)

    def running_pids(self) -> set[int]:
        """The pids of the actors its tree shows running: started, and so watched by
        their supervisor's heartbeat (empty while the node starts)."""
        status = self.status()
        if status is None or status.get("tree") is None:
            return set()
        return {pid for _, pid, state in _actors(status["tree"]) if state == "running" and pid}

    def actor_pids(self) -> dict[str, int | None]:
        status = self.status()
        # a node still starting answers without its tree
        if status is None or status.get("tree") is None:
            return {}
        return {name: pid for name, pid, _ in _actors(status["tree"])}

    def restarts(self) -> int:
        """Restarts by the node's supervisors over all its lives so far (as last seen)."""
        self.status()
        return self._restarts_before + self._restarts_now

    def processes(self) -> list[psutil.Process]:
        """The node's processes now (remembered, for ``close``)."""
        found = chaos.node_processes(self.pid)
        self._seen.update((p.pid, p) for p in found)
        return found

    def _family(self) -> list[psutil.Process]:
        """Its processes now and those seen before: a node that died on its own no longer
        has its actors below it (psutil tells a pid reused since from them)."""
        return [*{**self._seen, **{p.pid: p for p in self.processes()}}.values()]

    def kill(self) -> None:
        """SIGKILL every process of the node at once, as a power cut."""
        if self._process is None:
            return
        self._restarts_before, self._restarts_now = self._restarts_before + self._restarts_now, 0
        survivors = chaos.kill_processes(self._family())
        self._process.wait()
        self._process = None
        self._seen.clear()
        # Its status address is dead: a status query would wait for its timeout.
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(self.data_dir, NODE_FILE))
        if survivors:
            raise RuntimeError(
                f"processes of the node outlived SIGKILL: {[p.pid for p in survivors]}"
            )

    def close(self) -> None:
        """Stop the node cleanly (SIGTERM), or kill it all when it will not stop."""
        with contextlib.suppress(OSError):
            os.unlink(self.faults_file)
        if self._process is None:
            return
        family = self._family()
        if self._process.poll() is None:
            self.restarts()
            for process in family:  # a stopped actor must run to stop
                with contextlib.suppress(psutil.Error):
                    process.resume()
            self._process.send_signal(signal.SIGTERM)
            try:
                self._process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.error(
                    "the node on %s did not stop within %.0f s: killing it",
                    self.data_dir,
                    STOP_TIMEOUT_S,
                )
        chaos.kill_processes([p for p in family if chaos.is_alive(p)])
        self._process.wait()
        self._process = None
        self._seen.clear()


@dataclass(frozen=True)
class _Busy:
    """A victim's own supervisor, seen starting or stopping one of the victim's siblings."""

    supervisor: str
    action: str  # "starting" or "stopping"
    child: str
    for_s: float  # how long it had been at it, when seen
    # how long that may take: a start's start_timeout_s; a stop's twice shutdown_s (none
    # for brutal_kill), then the killed child's exit (EXIT_AFTER_KILL_S)
    bound_s: float

    def __str__(self) -> str:
        return f"{self.supervisor} {self.action} {self.child} for {self.for_s:.1f} s"


def _supervisor_busy(status: dict | None, victim: str | None) -> _Busy | None:
    """What ``victim``'s own supervisor is shown busy with, starting or stopping one of
    its siblings, while the tree shows ``victim`` itself running; else None. Only that
    supervisor's event thread acts on the victim's hang; ``victim`` shown otherwise (being
    stopped, killed) excuses nothing: its supervisor is acting on it."""
    if status is None or status.get("tree") is None:
        return None
    found = _parent_of(status["tree"], victim)
    if found is None:
        return None
    supervisor, entry = found
    busy = _busy_of(supervisor)
    if entry["state"] != "running" or busy is None or busy.child == victim:
        return None
    return busy


def _busy_of(supervisor: dict) -> _Busy | None:
    """The ``busy`` a supervisor's entry shows; None when it shows none, or one this
    harness cannot read (a node of another version, a damaged answer): it then excuses
    nothing, as a supervisor shown idle."""
    busy = supervisor.get("busy")
    if not isinstance(busy, dict):
        return None
    action, child, for_s, bound_s = (busy.get(k) for k in ("action", "child", "for_s", "bound_s"))
    if not (isinstance(action, str) and isinstance(child, str)):
        return None
    if not (_is_seconds(for_s) and _is_seconds(bound_s)):
        return None
    return _Busy(str(supervisor.get("id")), action, child, float(for_s), float(bound_s))


def _is_seconds(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _parent_of(entry: dict, actor: str | None) -> tuple[dict, dict] | None:
    """The supervisor entry of the tree ``entry`` whose child is the worker ``actor``, and
    that child's entry."""
    for child in entry.get("children", []):
        if child.get("kind") == "supervisor":
            found = _parent_of(child, actor)
            if found is not None:
                return found
        elif child["id"] == actor:
            return entry, child
    return None


def _note_busy(watch: _Watch, busy: _Busy | None, now: float, node: NodeUnderTest) -> None:
    """Note what the stopped victim's supervisor is seen busy with (``busy``, at ``now``):
    it must kill the victim within twice the heartbeat timeout after it was last busy, and
    never later than that after what it was busy with could have ended."""
    if busy is None:
        return
    watch.busy, watch.busy_seen_at = busy, now
    could_end = now - busy.for_s + busy.bound_s
    watch.kill_due = max(watch.kill_due, min(now, could_end) + 2 * node.heartbeat_timeout_s)


def _broken_promise(watch: _Watch, now: float, node: NodeUnderTest) -> str:
    """The promise a victim still alive at its deadline shows broken, with the evidence."""
    hung = f"heartbeat timeout {node.heartbeat_timeout_s:g} s: a hung actor is killed within it"
    busy = watch.busy
    if busy is None:
        return hung
    if busy.for_s > busy.bound_s:
        return (
            f"its supervisor {busy.supervisor} was {busy.action} {busy.child} for "
            f"{busy.for_s:.1f} s, beyond the {busy.bound_s:g} s that may take: a supervisor "
            f"busy with a sibling acts on a hung actor once done, and is done within that"
        )
    return (
        f"{hung}, or once its supervisor is no longer busy: {busy.supervisor} was last seen "
        f"{busy.action} {busy.child} {now - watch.busy_seen_at:.1f} s before, for "
        f"{busy.for_s:.1f} s of the {busy.bound_s:g} s that may take"
    )


def _actors(entry: dict) -> Iterator[tuple[str, int | None, str]]:
    if entry.get("kind") == "supervisor":
        if entry["state"] != "running":
            yield entry["id"], None, entry["state"]
        for child in entry.get("children", []):
            yield from _actors(child)
    else:
        yield entry["id"], entry.get("pid"), entry["state"]


def _restarts(entry: dict) -> int:
    return entry.get("restarts", 0) + sum(_restarts(c) for c in entry.get("children", []))


_stops_received = 0  # stop signals harness_signals has turned into KeyboardInterrupt


@contextlib.contextmanager
def harness_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise KeyboardInterrupt while the harness runs, so its
    ``finally`` stops what it started; the signals that follow are ignored until then
    (systemd signals every process of the group, a user presses Ctrl-C twice: the stop
    must not be cut short and leave processes). The previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    harness = os.getpid()

    def interrupt(signum: int, _frame: object) -> None:
        global _stops_received
        if os.getpid() != harness:
            # A process the harness forked, before its exec (a stop to the whole group
            # lands in its preexec_fn): raising there would fail the spawn with a
            # SubprocessError. It ends as the signal ends any process of the group: the
            # harness then sees a child that died, not one it would not know to stop.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        _stops_received += 1
        for other in signals:
            signal.signal(other, signal.SIG_IGN)
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {s: signal.signal(s, interrupt) for s in signals}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclass
class _Watch:
    """A fault whose end the run is watching for: a crash fault until the node is healthy
    with its victim replaced, a stopped process until it is gone (or given up on)."""

    event: Event
    actor: str | None = None  # None: the whole node
    old_pid: int | None = None
    stopped: psutil.Process | None = None
    stopped_at: float = 0.0  # seconds from the start
    resume_at: float = 0.0
    resumed: bool = False  # its supervisor never replaced it: resumed
    busy: _Busy | None = None  # its supervisor, as last seen busy with a sibling
    busy_seen_at: float = 0.0  # ... when (seconds from the start)
    kill_due: float = 0.0  # when its supervisor must have killed it, by what it was seen doing
    waited: bool = False  # its kill was late, its supervisor busy: waited for
    disk_until: float | None = None  # a full or slow disk: when it ends
    full_since: float | None = None  # the node up on the full disk since
    alarm_due: bool = False  # ... for DISK_ALARM_DUE_S: its alarm must go off


class _Disk:
    """The disk faults in force, written to the node's fault file when they change."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.until = {"full": 0.0, "slow": 0.0}
        self._written = (False, False)

    def hold(self, kind: str, until: float) -> None:
        self.until[kind] = max(self.until[kind], until)

    def update(self, now: float) -> None:
        wanted = (now < self.until["full"], now < self.until["slow"])
        if wanted != self._written:
            write_faults(
                self.path, disk_full=wanted[0], sync_delay_s=SLOW_SYNC_S if wanted[1] else 0.0
            )
            self._written = wanted


def run_faults(
    node: NodeUnderTest,
    faults: list[chaos.Fault],
    duration_s: float,
    *,
    seed: int = 0,
    sample: Callable[[], dict[str, int]] | None = None,
    before_damage: Callable[[str, str, int], None] | None = None,
    files: tuple[str, ...] = chaos.DAMAGEABLE,
) -> ChaosResult:
    """Land ``faults`` on the running ``node`` over ``duration_s``, each at its time (a
    fault may land while the node still recovers from the last: that is part of the
    test), then wait for the node to be healthy; see the module docstring.
    ``before_damage(path, kind, offset)`` is told which file a torn or flipped fault is
    about to damage, and where (so a workload can note what the damage may destroy);
    ``files`` are the patterns of the files it picks from (``faults.damage_file``)."""
    result = ChaosResult(seed=seed, duration_s=duration_s)
    start = time.monotonic()
    watching: list[_Watch] = []
    disk = _Disk(node.faults_file)

    def now() -> float:
        return time.monotonic() - start

    def tick() -> None:
        code = node.exit_code()
        if code is not None:
            struck = node.struck_while_starting
            if struck is not None:
                # A supervisor whose child dies before it is ready fails its start, and so
                # the node's (OTP's semantics): a service manager starts it again.
                struck.detail = (struck.detail + "; " if struck.detail else "") + (
                    f"the node, still starting, gave up (exit {code}) and was started again"
                )
            else:
                result.problems.append(
                    f"the node exited on its own at {now():.2f} s with status {code} "
                    f"(its log says why); started again"
                )
            node.start(wait=False)
        if sample and (not result.samples or now() - result.samples[-1][0] >= SAMPLE_EVERY_S):
            result.samples.append((round(now(), 3), sample()))
        disk.update(now())
        for watch in list(watching):
            disk_until = watch.disk_until
            if disk_until is None:
                continue
            event = watch.event
            if event.kind == "full" and not event.landed:
                status = node.status()
                if status is not None and "disk" in (status.get("alarms") or ()):
                    event.landed, event.detail = True, "the disk alarm went off"
                elif status is not None and now() < disk_until:
                    if watch.full_since is None:
                        watch.full_since = now()
                    watch.alarm_due |= now() - watch.full_since >= DISK_ALARM_DUE_S
                else:
                    watch.full_since = None  # the node is away (a crash fault)
            # The node checks its disk every second: a short full disk may be seen late.
            if now() >= disk_until + (0 if event.landed else DISK_ALARM_GRACE_S):
                if not event.landed and watch.alarm_due:
                    event.detail = "the disk alarm did not go off"
                    result.problems.append(
                        f"full at {event.at_s:.2f} s: the disk read as "
                        f"full, and the disk alarm did not go off"
                    )
                elif not event.landed:
                    event.detail = "the node was away while the disk was full"
                _log(event)
                watching.remove(watch)
        status = node.status() if watching else None  # one question a tick, for all below
        for watch in list(watching):
            stopped = watch.stopped
            if stopped is None:
                continue
            alive = chaos.is_alive(stopped)
            if alive:
                _note_busy(watch, _supervisor_busy(status, watch.actor), now(), node)
            if alive and now() < max(watch.resume_at, watch.kill_due):
                if now() >= watch.resume_at and not watch.waited and watch.busy is not None:
                    watch.waited = True
                    watch.event.detail = (
                        watch.event.detail + "; " if watch.event.detail else ""
                    ) + (
                        f"its supervisor was busy ({watch.busy}) "
                        f"{now() - watch.stopped_at:.1f} s after the stop: waited for it"
                    )
                    log.warning(
                        "chaos %7.2f s: stop %s: its supervisor is busy (%s): waiting for it",
                        watch.event.at_s,
                        watch.actor,
                        watch.busy,
                    )
                continue
            with contextlib.suppress(psutil.Error):
                stopped.resume()
            if chaos.is_alive(stopped):
                watch.resumed = True
                watch.event.detail = (
                    f"resumed after {now() - watch.stopped_at:.1f} s: "
                    f"its supervisor had not replaced it"
                )
                problem = (
                    f"stop at {watch.event.at_s:.2f} s: {watch.actor} (pid "
                    f"{stopped.pid}), stopped while its tree showed it running, "
                    f"answered no heartbeat for {now() - watch.stopped_at:.1f} s and its "
                    f"supervisor did not replace it ({_broken_promise(watch, now(), node)})"
                )
                result.problems.append(problem)
                log.warning("chaos %7.2f s: %s", watch.event.at_s, problem)
            watch.stopped = None
        if watching:
            # healthy(None) asks the node again, and its answer has no tree here: wait for
            # the next tick instead
            if status is not None and node.healthy(status):
                pids = {name: pid for name, pid, _ in _actors(status["tree"])}
                for watch in list(watching):
                    if (
                        watch.disk_until is None
                        and watch.stopped is None
                        and (
                            watch.actor is None
                            or watch.actor in pids
                            and (watch.resumed or pids[watch.actor] != watch.old_pid)
                        )
                    ):
                        watch.event.recovery_s = round(now() - watch.event.at_s, 3)
                        _log(watch.event)
                        watching.remove(watch)
                        node.processes()  # remembered, for close()

    def wait_until(at_s: float) -> None:
        while (left := at_s - now()) > 0:
            tick()
            time.sleep(min(left, POLL_S))

    for fault in faults:
        wait_until(fault.at_s)
        event, watch = _land(node, fault, round(now(), 3), before_damage, files, disk, tick)
        result.events.append(event)
        if watch is None:
            _log(event)
        else:
            watching.append(watch)
    wait_until(max(duration_s, *disk.until.values()))
    deadline = now() + HEALTH_TIMEOUT_S
    while watching and now() < deadline:
        tick()
        time.sleep(POLL_S)
    for watch in watching:
        watch.event.detail = (
            watch.event.detail + "; " if watch.event.detail else ""
        ) + f"not healthy again within {HEALTH_TIMEOUT_S:.0f} s"
        result.problems.append(
            f"{watch.event.kind} at {watch.event.at_s:.2f} s: the node "
            f"was not healthy again within {HEALTH_TIMEOUT_S:.0f} s"
        )
        _log(watch.event)
    if sample:
        result.samples.append((round(now(), 3), sample()))
    return result


def _log(event: Event) -> None:
    log.warning(
        "chaos %7.2f s: %s %s%s%s",
        event.at_s,
        event.kind,
        event.target,
        "" if event.landed else f" (missed: {event.detail})",
        f"; healthy again in {event.recovery_s:.2f} s" if event.recovery_s is not None else "",
    )


def _land(
    node: NodeUnderTest,
    fault: chaos.Fault,
    at: float,
    before_damage: Callable[[str, str, int], None] | None,
    files: tuple[str, ...],
    disk: _Disk,
    tick: Callable[[], None],
) -> tuple[Event, _Watch | None]:
    """Land ``fault`` at ``at`` seconds; ``tick`` keeps the other faults watched while a
    kill or stop waits for its victim."""
    called = time.monotonic()
    rng = random.Random(fault.seed)
    if fault.kind in chaos.DISK_FAULTS:
        hold = round(rng.uniform(*DISK_FAULT_HOLD_S), 1)
        disk.hold(fault.kind, at + hold)
        disk.update(at)
        # A slow disk has landed once the file says so; a full one once the alarm is seen.
        event = Event(
            at,
            fault.kind,
            f"disk for {hold} s",
            fault.kind == "slow",
            f"{SLOW_SYNC_S * 1000:.0f} ms added to every sync" if fault.kind == "slow" else "",
        )
        return event, _Watch(event, disk_until=at + hold)
    if fault.kind in chaos.PROCESS_FAULTS:
        before = node.actor_pids()
        stopped = None
        # A node that is starting again has not spawned its actors yet: a kill waits for
        # one to match (and lands on it while it recovers), a stop for its victim to be
        # ready (see the module docstring), up to VICTIM_WAIT_S.
        deadline = time.monotonic() + VICTIM_WAIT_S
        while True:
            try:
                if fault.kind == "kill":
                    name = chaos.kill_process(node.processes(), fault.pattern, fault.seed)
                else:
                    name, stopped = chaos.stop_process(
                        node.processes(), fault.pattern, fault.seed, ready=node.running_pids()
                    )
                break
            except chaos.FaultMissed as exc:
                if time.monotonic() > deadline:
                    return Event(at, fault.kind, fault.pattern, False, str(exc)), None
                tick()
                time.sleep(POLL_S)
        actor = name[len(chaos.TITLE_PREFIX) :]
        event = Event(at, fault.kind, actor, True)
        if node.starting:
            node.struck_while_starting = event
        if stopped is None:
            return event, _Watch(event, actor, before.get(actor))
        landed = at + time.monotonic() - called
        if landed - at >= 1:
            event.detail = f"landed at {landed:.2f} s, once its victim had started"
        return event, _Watch(
            event, actor, stopped.pid, stopped, landed, landed + 2 * node.heartbeat_timeout_s
        )
    node.kill()
    event = Event(at, fault.kind, "node", True)
    if fault.kind in chaos.FILE_FAULTS:
        try:
            path, offset = chaos.damage_file(
                node.data_dir, fault.kind, fault.seed, before=before_damage, files=files
            )
            event.target, event.detail = os.path.relpath(path, node.data_dir), f"at byte {offset}"
        except chaos.FaultMissed as exc:
            event.landed, event.detail = False, f"the node was killed, but {exc}"
    node.start(wait=False)
    return event, _Watch(event)
