"""How an actor process (or any process) reaches the node service that spawned an actor.

The node service is a ROUTER at ``ipc://<runtime dir>/node`` served by the node's own
thread. Requests are ``[kind, request_id, body]`` (see ``warren.actors.wire``); answers use the
ordinary reply frames, so ``Channel.request`` serves both. READY and FAILED are one-way:
an actor process sends one of them once, when it has started (or failed to).

In the node's own process ``node_for`` returns the ``Node`` object itself, so a ref's
``stop`` is a direct call there and a request here.

Race: the node may be gone (killed) while an actor process asks it something; its
forkserver then asks every actor to stop. An actor's client is given ``abandon`` (true
once the actor is stopping): a request waiting for an answer gives up at once with
``ActorDeadError`` instead of holding the actor's stop for the whole request timeout.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from . import wire
from ._runtime import Channel, NodeOps, runtime

if TYPE_CHECKING:
    from .messages import Down
    from .ref import ActorRef

# Extra time a remote stop request waits beyond the stop's own timeouts (seconds): the
# node escalates to SIGTERM after ``timeout``, then SIGKILL after as long again at most.
_STOP_REQUEST_SLACK_S = 10.0
_REQUEST_TIMEOUT_S = 10.0


class NodeClient:
    """Requests to a node service from outside the node's process."""

    def __init__(self, endpoint: str, abandon: Callable[[], bool] | None = None) -> None:
        self.endpoint = endpoint
        self._abandon = abandon

    def _request(self, kind: int, body: Any, timeout: float = _REQUEST_TIMEOUT_S) -> Any:
        rt = runtime()
        channel = rt.channel(self.endpoint)
        request_id = next(rt.request_ids)
        return channel.request([kind, request_id, body], request_id, timeout, None, self._abandon)

    def _send_request(self, kind: int, body: Any) -> tuple[Channel, int]:
        """Send a request now: the channel and request id its answer comes back by (a
        ``Future`` of them takes it)."""
        rt = runtime()
        channel = rt.channel(self.endpoint)
        request_id = next(rt.request_ids)
        channel.expect(request_id)
        channel.send([kind, request_id, body], _REQUEST_TIMEOUT_S)
        return channel, request_id

    def _notify(self, kind: int, body: Any) -> None:
        channel = runtime().channel(self.endpoint)
        channel.send([kind, 0, body], _REQUEST_TIMEOUT_S)

    def ready(self, token: int, address: str, control: str, pid: int) -> None:
        self._notify(wire.READY, [token, address, control, pid])

    def failed(self, token: int, type_name: str, message: str, remote_traceback: str) -> None:
        self._notify(wire.FAILED, [token, type_name, message, remote_traceback])

    def monitor(self, watcher: ActorRef, target: ActorRef) -> None:
        self._request(wire.MONITOR, [watcher, target])

    def demonitor(self, watcher: ActorRef, target: ActorRef) -> None:
        self._request(wire.DEMONITOR, [watcher, target])

    def link(self, first: ActorRef, second: ActorRef) -> None:
        self._request(wire.LINK, [first, second])

    def whereis(self, name: str) -> ActorRef | None:
        return self._request(wire.WHEREIS, name)

    def monitor_named(self, watcher: ActorRef, names: list[str]) -> list[ActorRef | None]:
        return self._request(wire.MONITOR_NAMED, [watcher, names])

    def send_monitor_named(self, watcher: ActorRef, names: list[str]) -> tuple[Channel, int]:
        return self._send_request(wire.MONITOR_NAMED, [watcher, names])

    def register(self, name: str, ref: ActorRef) -> None:
        self._request(wire.REGISTER, [name, ref])

    def stop(self, ref: ActorRef, timeout: float = 5.0) -> Down:
        return self._request(
            wire.STOP_ACTOR, [ref, timeout], timeout=2 * timeout + _STOP_REQUEST_SLACK_S
        )


def node_for(endpoint: str) -> NodeOps:
    """The node serving ``endpoint``: the in-process ``Node`` or a client of it."""
    local = runtime().nodes.get(endpoint)
    return local if local is not None else NodeClient(endpoint)
