"""``RemoteNode``: a node running in another process on this machine, as a connection
sees it (``warren.connect(data_dir)``).

The node writes ``<data_dir>/node.json`` naming its control socket (an ipc path in its
private runtime directory). A call is one request there: ``[b"call", JSON {"op", "args"}]``,
answered ``{"ok": result}`` or ``{"error": type name, "message": text}``; the error comes
back as the class of ``warren.queues.errors`` it names (``NotFound``,
``PreconditionFailed`` ...), or as a ``QueueError``. Messages then go from the
connection straight to the queue's process: the node is asked only for declarations and
for where a queue lives. The resource alarms raised now are in ``<data_dir>/alarms.json``,
which publishers read (at most every 100 ms) instead of asking.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from typing import Any

import zmq

from warren.actors import ActorRef
from warren.actors.process import process_exists

from ..errors import NodeNotRunning, local_error
from ..protocol import NodeCalls

__all__ = [
    "ALARMS_FILE",
    "NODE_FILE",
    "NodeNotRunning",
    "RemoteNode",
    "read_alarms",
    "write_alarms",
]

NODE_FILE = "node.json"  # in the data directory: the node's control socket
ALARMS_FILE = "alarms.json"  # in the data directory: the resource alarms raised now
CALL_TIMEOUT_MS = 60_000
CONNECT_TIMEOUT_MS = 5_000  # how long a new connection waits for the node's first answer
LIVENESS_CHECK_S = 0.25  # how often a call waiting for its answer looks whether the node lives


class RemoteNode(NodeCalls):
    def __init__(
        self,
        data_dir: str | os.PathLike,
        *,
        timeout_ms: int = CALL_TIMEOUT_MS,
        endpoint: str | None = None,
        pid: int | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_MS / 1000,
    ) -> None:
        """``endpoint``: the node's control socket, when the caller knows it already (a
        process of the node itself, started before the node file is written), and
        ``pid`` the node's process (without it, only the timeout ends a call to a node
        that died). ``connect_timeout_s``: how long the first call waits for the node's
        answer."""
        self.data_dir = os.fspath(data_dir)
        self.timeout_ms = timeout_ms
        self.pid: int | None = pid
        if endpoint is not None:
            self.endpoint = endpoint
            return
        try:
            with open(os.path.join(self.data_dir, NODE_FILE)) as file:
                found = json.load(file)
            self.endpoint = found["status_endpoint"]
            self.pid = found.get("pid")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise NodeNotRunning(
                f"no node is running on {self.data_dir} ({exc}); start "
                f"one with `warren node --data-dir {self.data_dir}`"
            ) from None
        # Fail now, not at the first publish; and within seconds: a node that is alive but
        # does not answer yet is starting (recovering), which connect(wait=...) waits for.
        self.timeout_ms = max(1, min(timeout_ms, int(connect_timeout_s * 1000)))
        try:
            self.list_queues()
        finally:
            self.timeout_ms = timeout_ms

    def queue(self, name: str) -> ActorRef:
        return ActorRef(**self._call("queue", name=name))

    def active_alarms(self) -> list[str]:
        return read_alarms(self.data_dir)

    def _call(self, op: str, **args: Any) -> Any:
        """One request on the node's control socket. While it waits, it looks every
        ``LIVENESS_CHECK_S`` whether the node is gone (``gone``): a node killed before or
        during the call (a node file left by a SIGKILLed node names a dead pid), or
        stopping (its control socket answers no more), is ``NodeNotRunning`` at once, not
        after the call's whole timeout."""
        socket: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.REQ)
        socket.linger = 0
        socket.sndtimeo = self.timeout_ms
        deadline = time.monotonic() + self.timeout_ms / 1000
        try:
            socket.connect(self.endpoint)
            socket.send_multipart([b"call", json.dumps({"op": op, "args": args}).encode()])
            while not socket.poll(int(LIVENESS_CHECK_S * 1000)):
                if self.gone():
                    how = "is gone" if not process_exists(self.pid or 0) else "is stopping"
                    raise NodeNotRunning(
                        f"the node on {self.data_dir} is not running (its pid {self.pid} "
                        f"{how}); start it with `warren node --data-dir {self.data_dir}`"
                    )
                if time.monotonic() >= deadline:
                    raise NodeNotRunning(
                        f"the node on {self.data_dir} (pid {self.pid}) did not answer "
                        f"{op} within {self.timeout_ms / 1000:g} s"
                    )
            reply = socket.recv()
        except zmq.ZMQError as exc:
            raise NodeNotRunning(f"the node on {self.data_dir} does not answer ({exc})") from None
        finally:
            socket.close()
        answer = _node_answer(reply)
        if answer is None:
            raise NodeNotRunning(
                f"the node on {self.data_dir} answered {op} with what no Warren node sends "
                f"({reply[:40]!r}): is another program on its control socket {self.endpoint}?"
            )
        if "error" in answer:
            raise local_error(str(answer["error"]), str(answer.get("message", "")))
        return answer["ok"]

    def gone(self) -> bool:
        """Whether the node this handle reached stopped running or is stopping: its
        process is gone, or the data directory's node file is gone (a node's orderly stop
        removes it first, before it stops any queue) or names another (it was
        restarted). The file is replaced by a rename, never left missing while a node
        runs."""
        if self.pid is None:
            return False
        if not process_exists(self.pid):
            return True
        try:
            with open(os.path.join(self.data_dir, NODE_FILE)) as file:
                return json.load(file).get("pid") != self.pid
        except FileNotFoundError:
            return True  # stopping: its queues are going, and it answers no more calls
        except (OSError, ValueError, AttributeError):
            return False  # unreadable for a moment: the process's exit decides


def _node_answer(reply: bytes) -> dict[str, Any] | None:
    """A control socket's reply as a node answers, ``{"ok": ...}`` or ``{"error": ...}``;
    None for anything else."""
    try:
        answer = json.loads(reply)
    except ValueError:
        return None
    if isinstance(answer, dict) and ("ok" in answer or "error" in answer):
        return answer
    return None


def write_alarms(data_dir: str, active: Iterable[str]) -> None:
    """Publish the alarms raised now where every publisher on this machine reads them
    (replaced whole: a reader sees the old list or the new one)."""
    path = os.path.join(data_dir, ALARMS_FILE)
    with open(path + ".tmp", "w") as file:
        json.dump(sorted(active), file)
    os.replace(path + ".tmp", path)


def read_alarms(data_dir: str) -> list[str]:
    try:
        with open(os.path.join(data_dir, ALARMS_FILE)) as file:
            return json.load(file)
    except (OSError, ValueError):
        return []  # no node, or none yet: nothing holds a publisher back
