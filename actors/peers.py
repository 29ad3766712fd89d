"""``PeerWatch``: which processes hold a connection to an actor's data mailbox, learned
from the mailbox's own connections, so that an actor hears of a peer process's end from
the kernel closing its sockets (``ProcessActor.on_peer_gone``) rather than by polling
its pid.

Protocol: a ZeroMQ monitor on the data ROUTER reports each accepted connection and each
disconnection by file descriptor. On acceptance the descriptor's peer credentials
(``SO_PEERCRED``, Unix-domain sockets only: ``ipc://`` endpoints) name the connecting
process; a process whose last connection closed is *gone*. A process that exits for any
reason (SIGKILL included) has its sockets closed by the kernel at once, so a process that
is dead but not yet reaped (a zombie), or whose pid was handed to a new process since, is
gone as soon as it died.

Races, and how each is met:
- Everything a peer sent before its end is read before its end is reported: ZeroMQ reads
  a connection up to its end of file, queueing what it read for the mailbox, before it
  reports the disconnection; the loop hands ``gone`` pids to the actor only after a
  drain of the data socket found it empty, so an ack sent just before a consumer died is
  applied before that consumer's deliveries are requeued.
- A peer may connect while the actor is being made (one reconnecting to a restarted
  actor): the monitor watches the mailbox from before its bind, so that connection is
  reported too, read once the loop runs.
- A descriptor may be closed, or even reused, by the time its acceptance is read (the
  loop reads events between handler calls, and first once the actor has started). A
  closed or non-socket descriptor is skipped;
  a reused one can name the wrong process. So ``gone`` is a hint to look at that process
  (alive, a zombie, or a new process under the old pid), never a verdict on its own.
- A tcp connection has no peer credentials; its peers are never reported (an actor that
  serves tcp peers must watch them its own way, as the listener does with heartbeats).
"""

from __future__ import annotations

import collections
import socket
import struct

import zmq
from zmq.utils.monitor import recv_monitor_message

__all__ = ["PeerWatch", "watch_connections"]

_UCRED = struct.Struct("3i")  # pid, uid, gid


class PeerWatch:
    """The peer processes of one data socket (see the module docstring)."""

    def __init__(self, data: zmq.Socket, events: zmq.Socket) -> None:
        """Watch ``data`` through ``events``, its monitor (``watch_connections``)."""
        self._data = data
        self.events = events
        self._pid_of_fd: dict[int, int] = {}
        self._connections: collections.Counter[int] = collections.Counter()
        self._gone: list[int] = []

    def read_events(self) -> None:
        """Take every event the monitor has queued."""
        while True:
            try:
                event = recv_monitor_message(self.events, zmq.NOBLOCK)
            except zmq.Again:
                return
            fd = event["value"]
            if event["event"] == zmq.EVENT_ACCEPTED:
                pid = _peer_pid(fd)
                if pid is not None:
                    self._pid_of_fd[fd] = pid
                    self._connections[pid] += 1
                continue
            pid = self._pid_of_fd.pop(fd, None)
            if pid is None:
                continue
            self._connections[pid] -= 1
            if self._connections[pid] <= 0:
                del self._connections[pid]
                self._gone.append(pid)

    @property
    def has_gone(self) -> bool:
        return bool(self._gone)

    def take_gone(self) -> list[int]:
        """The pids whose last connection closed since the last call."""
        gone, self._gone = self._gone, []
        return gone

    def connected(self, pid: int) -> bool:
        """Whether ``pid`` still has a connection open to the mailbox (so what it sent
        may still be on its way in)."""
        return pid in self._connections

    def close(self) -> None:
        self._data.disable_monitor()
        self.events.close(linger=0)


def watch_connections(data: zmq.Socket) -> zmq.Socket:
    """A monitor of ``data``'s accepted and closed connections (before its bind, it misses
    none)."""
    return data.get_monitor_socket(zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED)


def _peer_pid(fd: int) -> int | None:
    """The pid at the other end of Unix-domain socket ``fd``, or None (closed since, not
    a socket, or not a Unix-domain one)."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return None
    try:
        if sock.family != socket.AF_UNIX:
            return None
        pid, _uid, _gid = _UCRED.unpack(
            sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
        )
    except OSError:
        return None
    finally:
        sock.detach()  # the descriptor is ZeroMQ's: never close it here
    return pid if pid > 0 else None
