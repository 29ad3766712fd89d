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

Races it guards against: an answer that comes after its commit gave up (the timeout)
must not be taken for the next commit's: a commit that timed out closes the socket, and
the next one makes a new one.
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
        self.pid = os.getpid()

    def __call__(self, actions: Sequence[RecordedAction]) -> None:
        if self.pid != os.getpid():  # forked: the parent's socket is not this process's
            self.socket, self.pid = None, os.getpid()
        socket = self.socket
        if socket is None:
            socket = self.socket = zmq.Context.instance().socket(zmq.DEALER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.connect(self.endpoint)
        socket.send_multipart(commit_frames(actions), copy=False)
        if not socket.poll(int(COMMIT_TIMEOUT_S * 1000)):
            socket.close()
            self.socket = None
            raise ReplicationRefused(
                errno.EIO,
                f"the node's coordinator did not answer a commit within {COMMIT_TIMEOUT_S:g} s",
            )
        answer = json.loads(socket.recv())
        if "committed" not in answer:
            raise ReplicationRefused(
                errno.EIO, f"the cluster refused a commit: {answer.get('refused')}"
            )


def committer_to(endpoint: str) -> _Link:
    """A committer for ``replicated_io`` that sends to the coordinator at ``endpoint``."""
    return _Link(endpoint)


def _enable_from_environment() -> None:
    root = os.environ.get(replicated_io.ROOT_VARIABLE)
    endpoint = os.environ.get(replicated_io.ENDPOINT_VARIABLE)
    if root and endpoint:
        replicated_io.enable(root, committer_to(endpoint))


_enable_from_environment()
