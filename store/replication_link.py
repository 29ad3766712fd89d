"""A writer process's link to its node's coordinator, for ``replicated_io``'s commits.

Imported with ``replicated_io.ROOT_VARIABLE`` and ``ENDPOINT_VARIABLE`` in the
environment (a node in a cluster sets them for its forkserver, which imports this
module before it forks), it enables ``replicated_io`` with a committer to that socket.
One DEALER socket a process, made at its first commit (a forked child never uses its
parent's). A commit is one multipart
message: a JSON header ``{"kind": "commit", "pid", "actions": [[kind, path, offset,
target], ...]}`` and each action's bytes as a frame of its own, in order. The answer is
``{"committed": N}`` (the coordinator's number of the last of them, on every in-sync
replica) or ``{"refused": reason}``.

Races it guards against: an answer that comes after its commit gave up must not be taken
for the next commit's: a commit that gave up closes the socket, and the next one makes a
new one. A coordinator that dies with a commit in flight (killed, and restarted by the
node's supervisor at the same address) never answers it: the socket's monitor sees the
connection drop, and the commit is refused at once (in doubt: the writer fails its sync,
as a disk's error) rather than after ``COMMIT_TIMEOUT_S``, which held the writer, and
the node's stop, that long. A drop seen before a commit is sent is over (ZeroMQ has
connected again): it refuses nothing.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Sequence

import zmq

from . import replicated_io
from .errors import ReplicationRefused
from .replicated_io import COMMIT_TIMEOUT_S, RecordedAction

__all__ = ["commit_frames", "committer_to", "recorded_actions"]


def commit_frames(actions: Sequence[RecordedAction]) -> list[bytes]:
    header = {
        "kind": "commit",
        "pid": os.getpid(),
        "actions": [[a.kind, a.path, a.offset, a.target] for a in actions],
    }
    return [json.dumps(header).encode(), *(a.data for a in actions)]


def recorded_actions(frames: Sequence[bytes]) -> list[RecordedAction]:
    """The actions of a commit's frames; ValueError for frames no writer sends."""
    header = json.loads(frames[0])
    listed = header.get("actions") if isinstance(header, dict) else None
    if header.get("kind") != "commit" or not isinstance(listed, list):
        raise ValueError("not a commit")
    if len(listed) != len(frames) - 1:
        raise ValueError("a commit whose actions and data frames do not match")
    return [
        RecordedAction(str(kind), str(path), int(offset), bytes(data), str(target))
        for (kind, path, offset, target), data in zip(listed, frames[1:], strict=True)
    ]


class _Link:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.socket: zmq.Socket[bytes] | None = None
        self.monitor: zmq.Socket[bytes] | None = None
        self.pid = os.getpid()

    def __call__(self, actions: Sequence[RecordedAction]) -> None:
        if self.pid != os.getpid():  # forked: the parent's socket is not this process's
            self.socket, self.monitor, self.pid = None, None, os.getpid()
        if self.socket is None or self.monitor is None:
            self.socket = zmq.Context.instance().socket(zmq.DEALER)
            self.socket.setsockopt(zmq.LINGER, 0)
            self.monitor = self.socket.get_monitor_socket(zmq.EVENT_DISCONNECTED)
            self.socket.connect(self.endpoint)
        socket, monitor = self.socket, self.monitor
        while monitor.poll(0):  # a coordinator gone before this commit: reconnected since
            monitor.recv_multipart()
        socket.send_multipart(commit_frames(actions), copy=False)
        poller = zmq.Poller()
        poller.register(socket, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
        ready = dict(poller.poll(int(COMMIT_TIMEOUT_S * 1000)))
        if socket not in ready:
            self._close()
            why = (
                "went away during a commit"
                if monitor in ready
                else f"did not answer a commit within {COMMIT_TIMEOUT_S:g} s"
            )
            raise ReplicationRefused(errno.EIO, f"the node's coordinator {why}")
        answer = json.loads(socket.recv())
        if "committed" not in answer:
            raise ReplicationRefused(
                errno.EIO, f"the cluster refused a commit: {answer.get('refused')}"
            )

    def _close(self) -> None:
        """Drop the socket: an answer that comes late is never taken for the next's."""
        if self.socket is not None:
            self.socket.disable_monitor()
            self.socket.close()
        if self.monitor is not None:
            self.monitor.close()
        self.socket = self.monitor = None


def committer_to(endpoint: str) -> _Link:
    """A committer for ``replicated_io`` that sends to the coordinator at ``endpoint``."""
    return _Link(endpoint)


def _enable_from_environment() -> None:
    root = os.environ.get(replicated_io.ROOT_VARIABLE)
    endpoint = os.environ.get(replicated_io.ENDPOINT_VARIABLE)
    if root and endpoint:
        replicated_io.enable(root, committer_to(endpoint))


_enable_from_environment()
