"""``TcpNode``: a node reached over tcp through its listener, as a ``Connection`` sees it
(``warren.connect("tcp://host:5673", key_file="me.key")``).

It speaks the listener's protocol (``warren.queues.broker.listener``) over one DEALER socket:
node calls wait for their answer; a queue is a ``RemoteQueue``, which a ``Connection``
uses as it uses a local queue's pinned ref (``ask_async``, ``tell``), plus ``alive``,
which asks the listener whether that incarnation of the queue still lives. Answers are
matched by request id; an answer nobody waits for any more is dropped.

Restarts. The listener's boot id is learnt at connect. Every alive check, every overdue
node call and every node call answered after the socket lost its connection asks for it
again: a new one means the listener (or the whole node) restarted, and this transport is
done (``gone``), as it is once the socket lost its connection and the listener's port
refuses connections (nothing listens: the node was killed or stopped), or once the
listener answered nothing for ``NODE_SILENCE_S`` (a host gone quiet): every request sent
through it from then on is refused by the new listener, and the ``Connection`` recovers
on a new transport (``warren.queues.client.recovery``) or closes. Queue requests carry
the boot they were meant for, so a request left in this socket while the node was down
is refused by the restarted listener rather than done late, after the publisher sent it
again. A connection given up with answers still awaited closes without linger, for the
same reason.

A connection's consumers are kept alive by a beat (``BEAT_S``) sent from a thread of
its own, on a socket of its own, while it has consumed: the listener releases a remote
consumer it has not heard of for 30 s, so a client that dies loses no message for long.

Use from one thread (as a ``Connection``); create it where it is used (in a Spark
partition function, not on the driver). Its sockets linger ``LINGER_MS`` at most, so a
process with unsent frames still exits.

Errors: ``AccessRefused`` at once when the listener fails the handshake (it refuses the
key, wants one, or uses none: a ZeroMQ monitor on the new socket reports it, and a
handshake closed with no detail is told from a listener stopping by the mechanism its
greeting names, ``warren.queues.client.greeting``);
``NodeNotRunning`` when nothing answers at the address within ``connect_timeout_s`` (no
listener there); ``NodeStarting`` when the listener answers but its node is still
starting (a connect asks the node once, ``list_queues``, before it returns: a listener
answers before its node serves); ``KeyFileError`` for a key file that cannot be used.
A "starting" answer later, to a transport whose node served it, comes from a node
started again since: ``NodeLost``. An answer no listener sends (of another kind, or an
error that is not a type name, a message and a traceback) is ``NodeNotRunning``.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message

from warren.actors import wire
from warren.actors.codec import Decoder, Encoder
from warren.actors.errors import ActorDeadError, AskTimeout, CodecError
from warren.actors.ref import Answer

from .. import errors
from ..errors import AccessRefused, InvalidArgument, NodeNotRunning, NodeStarting, local_error
from ..protocol import Fetch, NodeCalls, Subscribe
from .greeting import MECHANISM_CURVE, MECHANISM_NULL, listener_mechanism, nothing_listens
from .keys import ClientKey, load_client_key
from .recovery import NODE_SILENCE_S, NodeLost

__all__ = ["RemoteQueue", "TcpNode"]

CALL_TIMEOUT_S = 60.0
RESTART_CHECK_S = 1.0  # how often a wait looks whether the listener restarted
CONNECT_TIMEOUT_S = 10.0
SERVE_FLOOR_S = 1.0  # the least a connect gives the node to answer once its listener did
HANDSHAKE_CHECK_S = 0.05  # how often a new connection looks whether its handshake failed
BEAT_S = 5.0
LINGER_MS = 1000


class TcpNode(NodeCalls):
    def __init__(
        self,
        endpoint: str,
        *,
        key_file: str | os.PathLike | None = None,
        key: ClientKey | None = None,
        call_timeout_s: float = CALL_TIMEOUT_S,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
    ) -> None:
        if not isinstance(endpoint, str) or not endpoint.startswith("tcp://"):
            raise InvalidArgument(f"a remote node's address is tcp://host:port; got {endpoint!r}")
        self.endpoint = endpoint
        self.call_timeout_s = call_timeout_s
        if key_file is not None and key is not None:
            raise InvalidArgument("give key_file or key, not both: they name the same thing")
        self._key = load_client_key(key_file) if key_file is not None else key
        self._mechanism = MECHANISM_CURVE if self._key is not None else MECHANISM_NULL
        self._context: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        # the socket's monitor: failed handshakes (at connect), lost connections (after)
        self._socket, self._events = self._open_socket(watch=True)
        self._encoder = Encoder()
        self._decoder = Decoder()
        self._ids = iter(range(1, 2**62))
        self._answers: dict[int, tuple[int, Any]] = {}  # arrived before their turn
        self._awaited: set[int] = set()
        self._consumers: set[bytes] = set()
        self._beat: threading.Thread | None = None
        self._closed = threading.Event()
        self._replaced = False  # another listener answers at the address: gone
        # the socket lost its connection, and no boot heard since says whether the
        # listener answering now is the same one
        self._drop_unchecked = False
        # since when it awaits an answer and has heard nothing (None: it heard since)
        self._silent_since: float | None = None
        # Whether the node served a call through this transport: it never starts again,
        # so a "starting" answer from then on comes from another node (``_call``).
        self._served = False
        deadline = time.monotonic() + connect_timeout_s
        try:
            self.boot = self._first_answer(connect_timeout_s)
        except AskTimeout:
            self.close()
            hint = (
                " or it refuses this key (the node logs refusals)"
                if self._key
                else " or it wants a key (connect with key_file=...)"
            )
            raise NodeNotRunning(
                f"no Warren listener answered at {endpoint} within "
                f"{connect_timeout_s:g} s: no node listens there (start one "
                f"with `warren node --listen {endpoint}`),{hint}"
            ) from None
        # As over ipc, fail now, not at the first call: a listener answers before its node
        # serves, and a node still starting (``NodeStarting``) is what connect(wait=...)
        # and a recovery wait for. The node's answer gets what the bound left, but at
        # least ``SERVE_FLOOR_S`` (or the whole bound, if shorter): a listener slow to
        # answer on a loaded machine must not leave a node that serves no time to say so.
        floor = min(connect_timeout_s, SERVE_FLOOR_S)
        try:
            self._call("list_queues", timeout=max(floor, deadline - time.monotonic()))
        except (TimeoutError, errors.ConnectionClosed) as exc:
            self.close()
            raise NodeNotRunning(
                f"the node at {endpoint} did not serve within {connect_timeout_s:g} s ({exc})"
            ) from None
        except BaseException:
            self.close()
            raise
        self._served = True

    def _open_socket(
        self, watch: bool = False
    ) -> tuple[zmq.Socket[bytes], zmq.Socket[bytes] | None]:
        """A DEALER connected to the listener; with ``watch``, also a monitor of its
        failed handshakes and lost connections, attached before it connects so that
        none is missed."""
        socket = self._context.socket(zmq.DEALER)
        socket.linger = LINGER_MS
        if self._key is not None:
            self._key.apply(socket)
        monitor = (
            socket.get_monitor_socket(
                zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
                | zmq.EVENT_HANDSHAKE_FAILED_AUTH
                | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
                | zmq.EVENT_DISCONNECTED
            )
            if watch
            else None
        )
        socket.connect(self.endpoint)
        return socket, monitor

    def _first_answer(self, timeout_s: float) -> Any:
        """The listener's boot; a handshake the listener fails (it does or does not use
        CURVE where this client does not or does, or it refuses this key) is
        ``AccessRefused`` at once, rather than a wait for an answer that cannot come.
        The monitor's events are looked at once more after the last wait, so a refusal
        reported as the time runs out is still a refusal."""
        request_id = self.send("boot")
        deadline = time.monotonic() + timeout_s
        while True:
            refused, dropped = self._handshake_events(deadline)
            if refused is not None:
                self.close()
                raise AccessRefused(refused)
            if dropped:
                # The boot may have gone down with that connection (a listener that
                # stopped before it answered: the node was killed again while this
                # client recovered); ask again over the next one, or wait for ever.
                self._awaited.discard(request_id)
                request_id = self.send("boot")
            left = deadline - time.monotonic()
            if left <= 0:
                raise AskTimeout(f"no answer from {self.endpoint} in time")
            try:
                return self.wait(request_id, min(HANDSHAKE_CHECK_S, left))
            except AskTimeout:
                continue

    def _handshake_events(self, deadline: float) -> tuple[str | None, bool]:
        """Why the listener failed a handshake, if the monitor reported that it did,
        and whether it reported a lost connection (the socket connects again by itself,
        but what it had sent over the lost one is gone).

        A connection closed during the handshake with no detail may be a refusal too:
        each end sends its greeting in parts, and a listener that reads this client's
        version and mechanism in one piece (it was not scheduled in between, as on a
        loaded machine) finds that it uses another mechanism before it has sent its own,
        and closes; this client never learns the mismatch from ZeroMQ. The listener's
        mechanism is then read (``listener_mechanism``) to tell that from a listener
        that stopped."""
        dropped = False
        while self._events is not None and self._events.poll(0):
            event = recv_monitor_message(self._events)["event"]
            if event == zmq.EVENT_DISCONNECTED:
                dropped = True
            elif event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                return self._handshake_failure(event), dropped
            elif listener_mechanism(
                self.endpoint, self._mechanism, max(HANDSHAKE_CHECK_S, deadline - time.monotonic())
            ) not in (None, self._mechanism):
                return self._handshake_failure(zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL), dropped
        return None, dropped

    def _handshake_failure(self, event: int) -> str:
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return f"the node at {self.endpoint} refuses this key (the node logs refusals)"
        if self._key is not None:
            return (
                f"the node at {self.endpoint} does not use keys (it runs without --curve): "
                f"connect without a key file"
            )
        return (
            f"the node at {self.endpoint} wants a key (it runs with --curve): connect with "
            f"key_file=... (the CLI's --key-file), made by `warren keys`"
        )

    # ------------------------------------------------------------------ NodeHandle

    def queue(self, name: str) -> RemoteQueue:
        answer = self._call("queue", name=name)
        return RemoteQueue(self, name, answer["incarnation"], bool(answer.get("stream")))

    def active_alarms(self) -> list[str]:
        return self._call("active_alarms")

    def close(self) -> None:
        """Close the socket; what is queued in it goes within ``LINGER_MS``, unless
        answers are still awaited: the connection is then being given up, and what it
        queued while the node was away must not reach the node later."""
        if not self._closed.is_set():
            self._closed.set()
            if self._events is not None:
                self._socket.disable_monitor()
                self._events.close(linger=0)
            self._socket.close(linger=0 if self._awaited else LINGER_MS)

    # ------------------------------------------------------------------ plumbing

    def _call(self, op: str, timeout: float | None = None, **args: Any) -> Any:
        """A node call's answer. While it waits, it looks every ``RESTART_CHECK_S``
        whether the listener restarted (the call was then lost: ``ConnectionClosed``).
        Calls carry no boot: one that the socket carried to a restarted listener is
        answered by the new node. So an answer that came after the socket lost its
        connection, or a refusal (``NotFound``: an exchange this connection declared
        and the restarted node lacks), is checked against the listener's boot: a new
        one means the node went away under the connection (``NodeLost``), which it
        must learn even from a call that succeeded."""
        request_id = self.send("call", op, args)
        timeout = timeout if timeout is not None else self.call_timeout_s
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    answer = self.wait(
                        request_id, min(RESTART_CHECK_S, max(0.0, deadline - time.monotonic()))
                    )
                except AskTimeout:
                    if time.monotonic() >= deadline:
                        raise TimeoutError(
                            f"the node at {self.endpoint} did not answer {op} within {timeout:g} s"
                        ) from None
                    if self._listener_replaced():
                        raise NodeLost(
                            f"the listener at {self.endpoint} restarted during {op}; the call "
                            f"was lost: make it again"
                        ) from None
                    silence = self.silence()
                    if silence is not None:
                        raise NodeLost(silence) from None
                else:
                    # the listener that answered answers the boot too: wait for it
                    if self._dropped() and self.gone(wait_s=NODE_SILENCE_S):
                        raise NodeLost(f"the node at {self.endpoint} restarted before {op}")
                    return answer
        except (TimeoutError, errors.ConnectionClosed):
            self.forget(request_id)
            raise
        except errors.QueueError as exc:
            if (self._served and isinstance(exc, NodeStarting)) or self.gone():
                raise NodeLost(f"the node at {self.endpoint} restarted ({exc})") from exc
            raise

    def send(self, op: str, *args: Any, answered: bool = True) -> int:
        """Send a request; its id (0 when no answer comes)."""
        if self._closed.is_set():
            raise errors.ConnectionClosed(f"the connection to {self.endpoint} is closed")
        request_id = next(self._ids) if answered else 0
        frames = self._encoder.encode([op, request_id, *args])
        if answered:
            self._awaited.add(request_id)
            if self._silent_since is None:
                self._silent_since = time.monotonic()
        try:
            self._socket.send_multipart(frames, copy=False)
        except zmq.ZMQError as exc:
            self._awaited.discard(request_id)
            raise errors.ConnectionClosed(f"cannot send to {self.endpoint}: {exc}") from None
        return request_id

    def wait(self, request_id: int, timeout: float | None) -> Any:
        """The answer to ``request_id``; the remote error; ``AskTimeout`` after ``timeout``
        (the answer may still be waited for again)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while request_id not in self._answers:
            left = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
            if not self._socket.poll(left):
                if deadline is not None and time.monotonic() >= deadline:
                    raise AskTimeout(f"no answer from {self.endpoint} in time")
                continue
            while True:
                try:
                    frames = self._socket.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                try:
                    kind, answer_id, value = self._decoder.decode(frames)
                except (CodecError, ValueError, TypeError):
                    continue  # nothing a listener sends; not ours to trust
                self._silent_since = None
                if answer_id in self._awaited:
                    self._answers[answer_id] = (kind, value)
        self._awaited.discard(request_id)
        kind, value = self._answers.pop(request_id)
        if kind == wire.REPLY_OK:
            return value
        if not _is_error_answer(kind, value):
            raise NodeNotRunning(
                f"the listener at {self.endpoint} answered with what no Warren listener "
                f"sends ({kind!r}, {value!r:.40}): is another program at that address?"
            )
        type_name, text, _ = value
        if type_name == "ListenerRestarted":  # as a restarted queue's pinned ref
            # Sent to a listener before this one: this transport is gone.
            self._replaced = True
            raise ActorDeadError(str(text))
        if type_name == NodeLost.__name__:  # the node behind the listener went away
            raise NodeLost(str(text))
        raise local_error(str(type_name), str(text))

    def forget(self, request_id: int) -> None:
        self._awaited.discard(request_id)
        self._answers.pop(request_id, None)

    def _listener_replaced(self) -> bool:
        probe = self.send("boot")
        try:
            boot = self.wait(probe, RESTART_CHECK_S)
        except AskTimeout:
            self.forget(probe)
            return False  # away: the caller waits on
        return self.replaced(boot)

    def _dropped(self) -> bool:
        """Whether the socket lost its connection to the listener (or failed a new
        handshake) since a boot was last heard (``replaced``): until one is, a drop is
        not forgotten, so that a probe left unanswered for a moment does not let a
        restarted listener pass for the same one."""
        while self._events is not None and self._events.poll(0):
            self._events.recv_multipart()
            self._drop_unchecked = True
        return self._drop_unchecked

    def silent(self) -> bool:
        """Whether the listener is taken as gone for its silence (``silence``)."""
        return self.silence() is not None

    def silence(self) -> str | None:
        """Why the listener, which has answered nothing while this connection awaited an
        answer, is taken as gone (the node was killed or stopped and has not come back):
        the socket lost its connection and the port now refuses connections (said at
        once), or nothing came for ``NODE_SILENCE_S`` (a host gone quiet is waited for).
        None while neither holds."""
        since = self._silent_since
        if since is None:
            return None
        if time.monotonic() - since >= NODE_SILENCE_S:
            return f"the listener at {self.endpoint} answered nothing for {NODE_SILENCE_S:g} s"
        if self._refused():
            return f"the connection to {self.endpoint} dropped and nothing listens there now"
        return None

    def _refused(self) -> bool:
        """Whether the socket lost its connection and the listener's port now refuses
        new ones (asked only after a drop, at most ``RESTART_CHECK_S``)."""
        return self._dropped() and nothing_listens(self.endpoint, RESTART_CHECK_S)

    def gone(self, wait_s: float = RESTART_CHECK_S) -> bool:
        """Whether the listener this connection was made through went away: the
        connection dropped and nothing listens at its port now, another answers at its
        address (its boot changed: it or the node restarted), or none has answered for
        ``NODE_SILENCE_S``. The listener's boot is waited for ``wait_s``."""
        if self._closed.is_set() or self._replaced:
            return True
        if self._refused():
            return True
        probe = self.send("boot")
        try:
            boot = self.wait(probe, wait_s)
        except AskTimeout:
            self.forget(probe)
            return self.silent()
        self.replaced(boot)
        return self._replaced

    def replaced(self, boot: bytes) -> bool:
        """Whether the listener answering now (``boot``) replaced the one this transport
        was made through: every request since is lost, and the transport gone."""
        if boot != self.boot:
            self._replaced = True
        self._drop_unchecked = False
        return self._replaced

    def consuming(self, consumer: bytes) -> None:
        """Keep ``consumer`` alive at the listener from now on."""
        if consumer in self._consumers:
            return
        self._consumers.add(consumer)
        if self._beat is None:
            self._beat = threading.Thread(target=self._beat_loop, name="warren-beat", daemon=True)
            self._beat.start()

    def _beat_loop(self) -> None:
        socket, _ = self._open_socket()
        encoder = Encoder()
        try:
            while not self._closed.wait(BEAT_S):
                try:
                    socket.send_multipart(
                        encoder.encode(["beat", 0, sorted(self._consumers)]), zmq.NOBLOCK
                    )
                except zmq.ZMQError:
                    pass  # the listener is away; the next beat tries again
        finally:
            socket.close(linger=0)


def _is_error_answer(kind: Any, value: Any) -> bool:
    """Whether an answer is a listener's error: its kind, and a value of the error's type
    name, its message and a traceback."""
    return (
        kind == wire.REPLY_ERROR
        and isinstance(value, (list, tuple))
        and len(value) == 3
        and isinstance(value[0], str)
        and isinstance(value[1], str)
    )


class RemoteQueue:
    """One incarnation of a queue behind a listener, used as a pinned ref is."""

    def __init__(self, node: TcpNode, name: str, incarnation: int, stream: bool = False) -> None:
        self.node, self.name, self.incarnation = node, name, incarnation
        self.stream = stream  # a stream's process, not a classic queue's

    def pin(self) -> RemoteQueue:
        return self

    def ask_async(
        self, message: Any, timeout: float | None = None, channel: None = None
    ) -> _RemoteAnswer:
        """``channel`` is an ``ActorRef``'s: a connection through a listener has one
        socket, whichever thread sends."""
        self._note_consumer(message)
        return _RemoteAnswer(
            self.node, self.node.send("ask", self.node.boot, self.name, self.incarnation, message)
        )

    def tell(self, message: Any, timeout: float | None = None, channel: None = None) -> None:
        self._note_consumer(message)
        self.node.send("tell", self.node.boot, self.name, self.incarnation, message, answered=False)

    def alive(self, answer: _RemoteAnswer) -> bool:
        """Whether the ask behind ``answer`` may still be answered: this incarnation of
        the queue lives, and the listener it went through has not restarted since."""
        request_id = self.node.send("alive", self.name, self.incarnation)
        try:
            alive, boot = self.node.wait(request_id, RESTART_CHECK_S)
        except AskTimeout:
            self.node.forget(request_id)
            return not self.node.silent()  # busy or away: wait on, for a while
        # The boot first, whatever the answer: a listener that restarted says "not
        # alive" too, and the transport must know it is gone, not a queue restarted.
        replaced = self.node.replaced(boot)
        return alive and not replaced

    def _note_consumer(self, message: Any) -> None:
        if isinstance(message, (Fetch, Subscribe)):
            self.node.consuming(message.consumer)

    def __repr__(self) -> str:
        return f"<RemoteQueue {self.name} #{self.incarnation} at {self.node.endpoint}>"


class _RemoteAnswer(Answer):
    """The answer to one ask through the listener, as an ``ActorRef``'s ``Future``."""

    def __init__(self, node: TcpNode, request_id: int) -> None:
        super().__init__()
        self._node, self.request_id = node, request_id

    def _wait(self, timeout: float | None) -> Any:
        return self._node.wait(self.request_id, timeout)
