"""The node's end of its forkserver: start it, send it orders, read its reports.

``ForkserverClient`` starts the server (``warren.actors._forkserver``, whose docstring
holds the protocol) with ``subprocess``, hands it the BOOT order and waits for BOOTED;
then ``spawn`` and ``signal`` send orders, and the node's service thread reads the
FORKED/EXITED reports with ``read_reports`` whenever the socket is readable.

Races and their answers:
- Orders come from several threads (spawns, stops, the service thread): one lock keeps
  each order's bytes together on the stream.
- The forkserver may go (it should not): ``read_reports`` returns ``None`` at EOF, the
  service marks the client gone, and every later order raises ``SpawnError`` instead of
  writing to a dead socket.
- Signals are orders too, so the server signals only its own unreaped children: a pid
  recycled after an exit is never hit.
- A process forked from the node's process (a Spark worker, say) closes its inherited
  copy of the socket at once, so the forkserver still sees EOF when the node goes.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import weakref

from . import _forkserver
from .errors import SpawnError

logger = logging.getLogger("warren.actors")

# Modules every forkserver imports before its first fork, so children start warm.
DEFAULT_PRELOAD = (
    "warren.actors",
    "warren.actors._loop",
    "zmq",
    "msgpack",
    "pykka",
    "psutil",
    "setproctitle",
)
# How long the forkserver may take to import its preloads (seconds).
_BOOT_TIMEOUT_S = 60.0
# How long close waits for the forkserver to exit before killing it (seconds).
_EXIT_WAIT_S = 10.0

_live_clients: weakref.WeakSet[ForkserverClient] = weakref.WeakSet()


class ForkserverClient:
    """One node's forkserver process and the socket to it."""

    def __init__(self, node_name: str, preload: tuple[str, ...], log_level: int) -> None:
        self.node_name = node_name
        self._lock = threading.Lock()
        self._gone = False
        self._buffer = bytearray()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        bootstrap = f"from warren.actors._forkserver import serve; serve({theirs.fileno()})"
        self.process = subprocess.Popen(
            [sys.executable, "-c", bootstrap],
            pass_fds=[theirs.fileno()],
            close_fds=True,
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        self._socket = ours
        main_path = getattr(sys.modules.get("__main__"), "__file__", None)
        if main_path is not None and not os.path.isfile(main_path):
            main_path = None
        self._key = os.urandom(32)
        boot = json.dumps(
            {
                "sys_path": list(sys.path),
                "preload": list(DEFAULT_PRELOAD) + list(preload),
                "main": main_path,
                "title": f"warren: forkserver {node_name}",
                "parent_pid": os.getpid(),
                "log_level": log_level,
                "key": self._key.hex(),
            }
        ).encode()
        ours.sendall(_forkserver.HEADER.pack(len(boot), _forkserver.BOOT) + boot)
        ours.settimeout(_BOOT_TIMEOUT_S)
        try:
            report = ours.recv(_forkserver.REPORT.size, socket.MSG_WAITALL)
        except OSError:
            report = b""
        ours.settimeout(None)
        if len(report) != _forkserver.REPORT.size:
            self.process.kill()
            self.process.wait()
            ours.close()
            raise SpawnError(
                f"the forkserver of node {node_name} did not start; its error "
                f"is on stderr (a preload module {list(preload)} failed, or the "
                f"main script starts a node without an "
                f'`if __name__ == "__main__":` guard)'
            )
        _live_clients.add(self)

    @property
    def pid(self) -> int:
        return self.process.pid

    def fileno(self) -> int:
        return self._socket.fileno()

    def spawn(
        self, token: int, node_endpoint: str, pickled_order: bytes, peers: tuple[str, ...] = ()
    ) -> None:
        """Order a fork for the spawn ``token``, whose actor will talk to ``peers`` (the
        endpoints the next spare connects to ahead); OSError or SpawnError if it cannot
        go."""
        self._send(
            _forkserver.SPAWN,
            _forkserver.spawn_head(token, node_endpoint, peers)
            + _forkserver.sign(self._key, pickled_order)
            + pickled_order,
        )

    def signal(self, pid: int, signum: int) -> None:
        """Have the server send ``signum`` to its child ``pid`` (if still its own)."""
        try:
            self._send(_forkserver.KILL, _forkserver.KILL_BODY.pack(pid, signum))
        except (OSError, SpawnError):
            logger.warning("node %s: could not signal pid %d", self.node_name, pid)

    def _send(self, kind: int, payload: bytes) -> None:
        with self._lock:
            if self._gone:
                raise SpawnError(f"the forkserver of node {self.node_name} is gone")
            self._socket.sendall(_forkserver.HEADER.pack(len(payload), kind) + payload)

    def read_reports(self) -> list[tuple[int, int, int, int]] | None:
        """The (kind, token, pid, status) reports that arrived; ``None`` at EOF."""
        data = self._socket.recv(65536)
        if not data:
            return None
        buffer = self._buffer
        buffer += data
        size = _forkserver.REPORT.size
        reports = []
        while len(buffer) >= size:
            reports.append(_forkserver.REPORT.unpack_from(buffer))
            del buffer[:size]
        return reports

    def mark_gone(self) -> None:
        """The server has gone: refuse every later order."""
        with self._lock:
            self._gone = True

    @property
    def gone(self) -> bool:
        return self._gone

    def close(self) -> None:
        """Close our end (the server sees EOF and exits) and wait for the server."""
        try:
            self._socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the forkserver already closed its end
        self._socket.close()
        try:
            self.process.wait(_EXIT_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _forget_inherited_forkservers() -> None:
    for client in list(_live_clients):
        try:
            client._socket.close()
        except OSError:
            pass  # nothing to close in this child


os.register_at_fork(after_in_child=_forget_inherited_forkservers)
