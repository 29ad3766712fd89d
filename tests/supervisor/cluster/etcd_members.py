"""A real etcd cluster for the tests: three members of Debian's etcd on loopback, each
on free ports with a data directory under the test's temp dir, all in one process
group of their own, stopped (SIGKILL of the group, then reaped) by the test that started
them, whatever happened."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from warren.supervisor.cluster.etcd import Etcd

from ...waiting import group_alive, wait_for

ETCD = shutil.which("etcd")


def free_ports(count: int) -> list[int]:
    sockets = []
    for _ in range(count):
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        sockets.append(sock)
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


class EtcdMembers:
    """``size`` etcd members on loopback; ``endpoints`` their client URLs."""

    def __init__(self, root: Path, size: int = 3) -> None:
        assert ETCD is not None
        ports = free_ports(2 * size)
        self.client_ports, peer_ports = ports[:size], ports[size:]
        names = [f"m{i}" for i in range(size)]
        initial = ",".join(
            f"{name}=http://127.0.0.1:{port}" for name, port in zip(names, peer_ports, strict=True)
        )
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs = []
        group = 0
        for name, client, peer in zip(names, self.client_ports, peer_ports, strict=True):
            log = open(root / f"{name}.log", "wb")  # noqa: SIM115 (closed in stop)
            self.logs.append(log)
            process = subprocess.Popen(
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
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                process_group=group,
            )
            group = group or process.pid
            self.processes.append(process)
        self.group = group
        self.endpoints = tuple(f"http://127.0.0.1:{port}" for port in self.client_ports)

    def wait_healthy(self, timeout: float = 60) -> None:
        etcd = Etcd(self.endpoints)
        try:
            wait_for(lambda: all(m["healthy"] for m in etcd.health()), timeout=timeout)
        finally:
            etcd.close()

    def kill(self, index: int) -> None:
        self.processes[index].send_signal(signal.SIGKILL)
        self.processes[index].wait(timeout=30)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.group, signal.SIGKILL)
        for process in self.processes:
            process.wait(timeout=30)
        for log in self.logs:
            log.close()
        wait_for(lambda: not group_alive(self.group), timeout=30)


@contextlib.contextmanager
def etcd_members(root: Path, size: int = 3):
    root.mkdir(parents=True, exist_ok=True)
    members = EtcdMembers(root, size)
    try:
        members.wait_healthy()
        yield members
    finally:
        members.stop()
