"""A real etcd cluster on one machine: three members of the ``etcd`` on the PATH (Debian's
``etcd-server``) on loopback, each on free ports with a data directory of its own, all in
one process group, for the tests and for ``warren chaos --cluster``.

``LocalEtcd(root)`` starts them; ``wait_healthy()`` waits until each answers healthy;
``kill(i)`` SIGKILLs one and ``restart(i)`` starts it again on its data directory (it
rejoins the cluster it was in); ``leader_index()`` says which member leads etcd's raft;
``stop()`` SIGKILLs the group and reaps every member, whatever state it is in. A member's
output goes to ``<root>/<name>.log``. Each member dies with the process that started it
(PR_SET_PDEATHSIG), so a test or a harness killed outright leaves none behind.

Races: the ports are found free by binding and releasing them just before etcd binds them,
so another program may take one in between (etcd then exits and ``wait_healthy`` says so
by timing out); a member restarted joins the process group of the first member, which
must still exist as a group leader's id (a killed leader's group id stays valid while any
member lives: the group outlives its leader process).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from warren.actors.process import die_with_parent, group_alive

from ..errors import EtcdUnavailable
from .etcd import Etcd

__all__ = ["ETCD", "LocalEtcd", "free_ports", "local_etcd"]

ETCD = shutil.which("etcd")
POLL_S = 0.1


def free_ports(count: int) -> list[int]:
    """``count`` loopback ports free now (all bound at once, so they differ)."""
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


class LocalEtcd:
    """``size`` etcd members on loopback; ``endpoints`` their client URLs."""

    def __init__(self, root: Path, size: int = 3) -> None:
        if ETCD is None:
            raise FileNotFoundError("no etcd on the PATH (Debian's etcd-server has it)")
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        ports = free_ports(2 * size)
        self.client_ports, peer_ports = ports[:size], ports[size:]
        self.names = [f"m{i}" for i in range(size)]
        initial = ",".join(
            f"{name}=http://127.0.0.1:{port}"
            for name, port in zip(self.names, peer_ports, strict=True)
        )
        self._argv = [
            [
                ETCD,
                "--name",
                name,
                "--data-dir",
                str(root / name),
                "--listen-client-urls",
                f"http://127.0.0.1:{client}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{client}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                initial,
                "--initial-cluster-token",
                root.name,
                "--initial-cluster-state",
                "new",
            ]
            for name, client, peer in zip(self.names, self.client_ports, peer_ports, strict=True)
        ]
        self.endpoints = tuple(f"http://127.0.0.1:{port}" for port in self.client_ports)
        self.group = 0
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        try:
            for index in range(size):
                self.processes.append(self._spawn(index))
        except BaseException:
            self.stop()  # the members already started
            raise

    def _spawn(self, index: int) -> subprocess.Popen[bytes]:
        log = open(self.root / f"{self.names[index]}.log", "ab")  # noqa: SIM115 (closed in stop)
        self.logs.append(log)
        parent = os.getpid()

        def bind_to_parent() -> None:
            if not die_with_parent(parent):
                os._exit(1)

        process = subprocess.Popen(
            self._argv[index],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            process_group=self.group,
            preexec_fn=bind_to_parent,
        )
        self.group = self.group or process.pid
        return process

    def wait_healthy(self, timeout_s: float = 60) -> None:
        """Until every member answers healthy; TimeoutError naming the ones that do not."""
        etcd = Etcd(self.endpoints)
        deadline = time.monotonic() + timeout_s
        try:
            while sick := [m["endpoint"] for m in etcd.health() if not m["healthy"]]:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"etcd members not healthy in {timeout_s:g} s: {sick}")
                time.sleep(POLL_S)
        finally:
            etcd.close()

    def leader_index(self) -> int | None:
        """The member that leads etcd's raft, as the members that answer say (None when
        none answers, or none names a leader that answered)."""
        ids, leaders = {}, set()
        for index, endpoint in enumerate(self.endpoints):
            member = Etcd((endpoint,))
            try:
                status = member.post("maintenance/status", {})
            except EtcdUnavailable:
                continue
            finally:
                member.close()
            ids[str(status["header"]["member_id"])] = index
            leaders.add(str(status.get("leader")))
        found = [ids[leader] for leader in leaders if leader in ids]
        return found[0] if len(found) == 1 else None

    def kill(self, index: int) -> None:
        self.processes[index].send_signal(signal.SIGKILL)
        self.processes[index].wait(timeout=30)

    def restart(self, index: int) -> None:
        """Start a killed member again on its data directory."""
        if self.processes[index].poll() is None:
            raise RuntimeError(f"etcd member {self.names[index]} still runs")
        self.processes[index] = self._spawn(index)

    def stop(self) -> None:
        if self.group:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.group, signal.SIGKILL)
        for process in self.processes:
            process.wait(timeout=30)
        for log in self.logs:
            log.close()
        deadline = time.monotonic() + 30
        while self.group and group_alive(self.group) and time.monotonic() < deadline:
            time.sleep(POLL_S)


@contextlib.contextmanager
def local_etcd(root: Path, size: int = 3) -> Iterator[LocalEtcd]:
    """``size`` healthy members under ``root``, stopped when the block ends."""
    members = LocalEtcd(root, size)
    try:
        members.wait_healthy()
        yield members
    finally:
        members.stop()
