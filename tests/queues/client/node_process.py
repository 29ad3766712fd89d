"""A ``warren node`` in a process group of its own, for the client's recovery tests:
``NodeProcess`` kills it whole (SIGKILL), stops it by a signal as a terminal or systemd
would, and starts it again on the same data directory and tcp port; ``Traffic`` runs a
producer and a consumer on recovering connections through all that, and checks that
every confirmed message was consumed, none twice unflagged.

Races: a node started again may not serve yet, so a start waits until a connect over
each transport goes through (and stops what it started if none does); a stop or a kill
waits until every process of the node's group is gone, so the next start never meets
one of the old node's actors still holding a socket or a lock."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

import psutil

from warren import connect
from warren.supervisor.node.node import answers_status

from ...waiting import group_alive, wait_for

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]
TRANSPORTS = ["ipc", "tcp"]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class NodeProcess:
    """``warren node`` on one data directory and one tcp port (and ``options``), killed
    whole or stopped by a signal, and started again there."""

    def __init__(self, data_dir: Path, options: tuple[str, ...] = (), serves: bool = True) -> None:
        """``serves=False``: a node that may not serve clients once started (a follower
        of a cluster): its start waits only until its status answers."""
        self.data_dir = data_dir
        self.options = options
        self.serves = serves
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.process: subprocess.Popen | None = None
        self.start()

    def start(self) -> None:
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        log = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            self.process = subprocess.Popen(
                [
                    *WARREN,
                    "node",
                    "--data-dir",
                    str(self.data_dir),
                    "--listen",
                    self.endpoint,
                    *self.options,
                ],
                cwd=ROOT,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
            )
        finally:
            os.close(log)  # the node holds its own copy
        try:
            if not self.serves:
                process = self.process
                wait_for(lambda: process.poll() is not None or answers_status(self.data_dir), 60)
                assert process.poll() is None, "the node exited"
            for transport in TRANSPORTS if self.serves else ():  # it serves, on both
                connect(self.target(transport), wait=60, recover=False).close()
        except BaseException as exc:
            exited = self.process.poll()
            self.stop()  # it does not serve: no test will stop it
            if not isinstance(exc, Exception):  # an interrupt stays one
                raise
            raise AssertionError(
                f"the node on {self.data_dir} did not start "
                f"({'still ran' if exited is None else f'exit status {exited}'}); "
                f"the end of its log:\n{self.log_tail()}"
            ) from exc

    @property
    def log_path(self) -> Path:
        """Where the node's log (its stderr) goes, every start appended: beside its data
        directory, so a test that lists that directory never meets it."""
        return self.data_dir.with_name(f"{self.data_dir.name}.log")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def kill(self) -> None:
        """SIGKILL every process of the node at once, and reap its main process."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()
        wait_for(lambda: not group_alive(self.process.pid), timeout=30)

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop_by(self, signum: int, to: str) -> None:
        """Send ``signum`` to the node's process (``to="node"``), to its process group
        (``"group"``: a terminal, ``kill -- -PGID``) or to every process of the node at
        once (``"every process"``: systemd's control-group stop), and wait until it
        stopped: cleanly, exit 0."""
        assert self.process is not None
        if to == "group":
            os.killpg(self.process.pid, signum)
        elif to == "every process":
            family = psutil.Process(self.process.pid).children(recursive=True)
            self.process.send_signal(signum)
            for process in family:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signum)
        else:
            assert to == "node", to
            self.process.send_signal(signum)
        assert self.process.wait(timeout=300) == 0
        wait_for(lambda: not group_alive(self.process.pid), timeout=30)

    def queue_pid(self, queue: str) -> int:
        """The pid of the process titled ``warren: queue QUEUE``."""
        assert self.process is not None
        for child in psutil.Process(self.process.pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if child.cmdline()[:1] == [f"warren: queue {queue}"]:
                    return child.pid
        raise AssertionError(f"no process for queue {queue}")

    def target(self, transport: str) -> str:
        return str(self.data_dir) if transport == "ipc" else self.endpoint

    def stop(self) -> None:
        """Stop the node's whole process group (SIGTERM, then SIGKILL), and close the pipes
        a test gave its process."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        wait_for(lambda: not group_alive(self.process.pid), timeout=30)
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # a write its reader never took
                    pipe.close()


class Traffic:
    """A producer (``publish_many`` batches, each confirmed) and a consumer (acks each
    delivery) of queue ``queue``, each on a recovering connection of its own and a thread
    of its own, until ``finish``; then every confirmed message must have been consumed,
    none twice but flagged redelivered."""

    BATCH = 100

    def __init__(self, target: str, queue: str = "orders") -> None:
        self.target, self.queue = target, queue
        setup = connect(target, recover=False)
        setup.declare_queue(queue)
        setup.close()
        self.confirmed: list[bytes] = []
        self.consumed: list[tuple[bytes, bool]] = []
        self.failures: list[str] = []
        self.recoveries = {"producer": 0, "consumer": 0}
        self._produced_all = threading.Event()
        self._producer_done = threading.Event()  # its last batch confirmed (or it failed)
        self._threads = [
            threading.Thread(target=self._produce, name=f"producer of {queue}"),
            threading.Thread(target=self._consume, name=f"consumer of {queue}"),
        ]
        for thread in self._threads:
            thread.start()

    def _recovered(self, who: str) -> None:
        self.recoveries[who] += 1

    def _produce(self) -> None:
        try:
            with connect(
                self.target, idempotent=True, on_recovery=lambda _: self._recovered("producer")
            ) as producer:
                start = 0
                while not self._produced_all.is_set():
                    bodies = [
                        b"%s %d" % (self.queue.encode(), n)
                        for n in range(start, start + self.BATCH)
                    ]
                    producer.publish_many(self.queue, bodies)
                    self.confirmed.extend(bodies)
                    start += self.BATCH
        except BaseException:
            self.failures.append(traceback.format_exc())
        finally:
            self._producer_done.set()

    def _consume(self) -> None:
        try:
            with connect(
                self.target, on_recovery=lambda _: self._recovered("consumer")
            ) as consumer:
                deliveries = consumer.consume(self.queue, prefetch=50)
                bodies: set[bytes] = set()
                while not (  # the producer's batch in flight at the stop counts too
                    self._producer_done.is_set()
                    and len(bodies) >= len(self.confirmed)
                    and bodies.issuperset(self.confirmed)
                ):
                    delivery = deliveries.get(timeout=1)
                    if delivery is not None:
                        self.consumed.append((delivery.body, delivery.redelivered))
                        bodies.add(delivery.body)
                        delivery.ack()
        except BaseException:
            self.failures.append(traceback.format_exc())

    def confirmed_past(self, mark: int) -> Callable[[], object]:
        """A condition: ``mark`` messages confirmed, or a thread failed."""
        return lambda: len(self.confirmed) >= mark or self.failures

    def progressed(self, messages: int = 500, timeout: float = 120) -> None:
        """Wait until ``messages`` more are confirmed (or a thread failed)."""
        wait_for(self.confirmed_past(len(self.confirmed) + messages), timeout=timeout)

    def finish(self) -> int:
        """Stop producing, let the consumer take the rest, and check what it got; how
        many came twice (flagged)."""
        self._produced_all.set()
        for thread in self._threads:
            thread.join(timeout=300)
        assert not self.failures, self.failures[0]
        assert not any(thread.is_alive() for thread in self._threads)
        consumed = {body for body, _ in self.consumed}
        missing, unconfirmed = set(self.confirmed) - consumed, consumed - set(self.confirmed)
        assert not missing and not unconfirmed, (sorted(missing)[:10], sorted(unconfirmed)[:10])
        seen: set[bytes] = set()
        for body, redelivered in self.consumed:
            assert body not in seen or redelivered, f"{body!r} delivered twice, not flagged"
            seen.add(body)
        return len(self.consumed) - len(seen)

    def stop(self) -> None:
        """End the threads however the test went (after ``finish``, nothing to do)."""
        self._produced_all.set()
        for thread in self._threads:
            thread.join(timeout=300)
