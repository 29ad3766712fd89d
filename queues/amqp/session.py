"""One AMQP 0-9-1 connection's protocol, without its socket: ``Session``.

Its owner feeds it what the socket read (``receive``), sends what it says
(``take_output``), calls ``tick`` now and then for heartbeats, and closes the socket once
``finished`` (after sending the last output). The session owns:

- the handshake: the protocol header (another version is answered with ours, and the
  connection ends), ``Connection.Start`` with Warren's server properties (its own
  product name, so clients that tune themselves to RabbitMQ 3.x, as kombu does, do not),
  ``StartOk`` with PLAIN or AMQPLAIN checked by ``authenticate``, ``Tune``/``TuneOk``
  (channel_max, frame_max, heartbeat: the client may lower ours, never raise them), and
  ``Open`` of the virtual host ``/``, the only one (another: 530 NOT_ALLOWED, as RabbitMQ
  answers a vhost it does not have);
- ``guest``: let in from loopback only, as RabbitMQ's ``loopback_users``;
- channels: ``Channel.Open`` of any number not in use while fewer than channel_max are
  open (RabbitMQ counts them: a client may number them as it likes), its
  ``Close``/``CloseOk`` both ways, and ``Channel.Flow`` (``active=false`` refused with
  540, as RabbitMQ refuses it);
- errors, as RabbitMQ sends them: a channel error closes that channel (``Channel.Close``
  with the code, text and the method that caused it; what the client sends on it before
  its ``CloseOk`` is dropped), a connection error the connection (``Connection.Close``;
  everything but ``Close``/``CloseOk`` is dropped until the client's ``CloseOk``);
- heartbeats: one is sent when nothing else was for half the interval, and a client not
  heard from for two intervals is dropped (no close handshake: the peer is gone);
- what a client may send before it is trusted: frames of at most 4 KiB until the
  connection is tuned, and ``HANDSHAKE_TIMEOUT_S`` from its connect to ``Open``; a
  publish whose header announces a body over ``MAX_MESSAGE_BYTES`` closes its channel
  (406) before any of the body is kept.

Other methods go to the ``ChannelHandler`` the owner gives (or ``on_open`` makes when
the connection opens), with a publish's content gathered first; a session without one
closes the connection with 540 NOT_IMPLEMENTED.

Races: none inside (one thread drives it). A client that stops reading is the owner's
business (its socket's send buffer fills); a client that sends frames of the wrong kind
in the middle of a content (a method between a publish and its body) gets 505
UNEXPECTED_FRAME, as the spec says.
"""

from __future__ import annotations

import collections
import ipaddress
import platform
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import pamqp.base
import pamqp.commands as commands
from pamqp.common import FieldTable

from ..message import MAX_MESSAGE_BYTES
from . import frames
from .frames import AmqpError, Frame

# RabbitMQ's defaults, which clients expect: 2,047 channels, 128 KiB frames, 60 s beats.
CHANNEL_MAX = 2047
FRAME_MAX = 131072
HEARTBEAT_S = 60
HANDSHAKE_TIMEOUT_S = 10.0  # from the connect to Connection.Open, as RabbitMQ's
CLOSE_TIMEOUT_S = 30.0  # for a client's CloseOk after the server's Close, as RabbitMQ's
# The longest a client's Close waits for its handler to let go before its CloseOk goes
# anyway (a worker held up by the node: its exclusive queues are deleted after it)
RELEASE_TIMEOUT_S = 5.0
MECHANISMS = ("PLAIN", "AMQPLAIN")
VIRTUAL_HOST = "/"
GUEST = "guest"

CAPABILITIES: FieldTable = {
    "publisher_confirms": True,
    "basic.nack": True,
    "consumer_cancel_notify": True,
    "connection.blocked": True,
    "authentication_failure_close": True,
    "per_consumer_qos": True,
    "exchange_exchange_bindings": False,
    "consumer_priorities": False,
    "direct_reply_to": False,
}

# The states of a connection, in the order a client goes through them.
(
    AWAIT_HEADER,
    AWAIT_START_OK,
    AWAIT_LOGIN_CHECK,
    AWAIT_TUNE_OK,
    AWAIT_OPEN,
    OPEN,
    CLOSING,
    RELEASING,  # the client closed: its CloseOk waits for its handler to let go
    FINISHED,
) = range(9)

# Whether the user may log in with the password; None: the answer comes later, through
# ``Session.login_checked`` (a check too slow for the caller's thread).
Authenticate = Callable[[str, str], bool | None]


class ChannelHandler(Protocol):
    """What serves a channel's methods once it is open (the translator to Warren)."""

    def method(self, channel: int, method: Frame) -> None:
        """A method other than Connection's and Channel's; raise ``AmqpError`` to close
        the channel (a code below 500) or the connection."""

    def content(
        self, channel: int, publish: Frame, header: frames.ContentHeader, body: bytes
    ) -> None:
        """A ``Basic.Publish`` with its whole content."""

    def channel_closed(self, channel: int) -> None:
        """The channel is gone (closed by either side, or with the connection)."""

    def connection_closing(self, then: Callable[[], None]) -> None:
        """The client closes the connection: let go of what it held that another may
        want at once (its exclusive queues), then run ``then`` on the session's thread
        (it answers the client's ``Close``)."""


@dataclass
class _Content:
    """A publish whose content is being gathered."""

    publish: Frame
    header: frames.ContentHeader | None = None
    body: list[bytes] = field(default_factory=list)
    received: int = 0


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an address) is loopback, an IPv4 one mapped into IPv6 too."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


def reply_text(text: str) -> str:
    """``text`` cut to a short string's 255 bytes, on a character's boundary."""
    return text.encode()[:255].decode(errors="ignore")


class Session:
    """The protocol of one connection (see the module docstring)."""

    def __init__(
        self,
        peer_host: str,
        authenticate: Authenticate,
        handler: ChannelHandler | None = None,
        *,
        channel_max: int = CHANNEL_MAX,
        frame_max: int = FRAME_MAX,
        heartbeat_s: int = HEARTBEAT_S,
        version: str = "",
        now: float = 0.0,
    ) -> None:
        """``version``: Warren's, announced in the server properties."""
        self.peer_host = peer_host
        self.version = version
        self.user: str | None = None
        self.client_properties: dict[str, object] = {}
        self.channel_max = channel_max
        self.frame_max = frame_max
        self.heartbeat_s = heartbeat_s
        self.state = AWAIT_HEADER
        self.channels: set[int] = set()
        self.publishes = 0  # how many publishes the client began
        # How many times each channel number was closed: what a handler sends for a
        # channel names the count it knew, and is dropped once the channel closed since.
        self.closes: collections.Counter[int] = collections.Counter()
        self._authenticate = authenticate
        self._login = ("", "")  # the user and mechanism of the StartOk being answered
        # Set by the owner once the connection is open, if not given here: nothing
        # reaches it before (a client's channels open only after the connection).
        self.handler = handler
        # Called when the connection opens, for the handler if none was given.
        self.on_open: Callable[[], ChannelHandler] | None = None
        self.peer_gone = False  # silent past its heartbeats: nothing more goes to it
        self.gathering_bytes = 0  # the bodies of the publishes being gathered
        self._opened_at = now
        self._closing_at = now
        self._closing_channels: set[int] = set()  # sent Channel.Close, awaiting CloseOk
        self._contents: dict[int, _Content] = {}
        self._input = bytearray()
        self._output: list[bytes] = []
        self._heard_at = self._sent_at = now

    # ------------------------------------------------------------------ the owner's side

    @property
    def finished(self) -> bool:
        """True once the socket should be closed (after sending ``take_output``)."""
        return self.state == FINISHED

    def take_output(self, now: float | None = None) -> bytes:
        """What to send the client now; ``now``: when it goes (heartbeats wait for a
        quiet half interval after it)."""
        out = b"".join(self._output)
        self._output.clear()
        if out and now is not None:
            self._sent_at = now
        return out

    @property
    def hears_of_blocks(self) -> bool:
        """Whether the connection is open and its client asked (in its capabilities) to
        be told when the node blocks publishers."""
        capabilities = self.client_properties.get("capabilities")
        return (
            self.state == OPEN
            and isinstance(capabilities, dict)
            and bool(capabilities.get("connection.blocked"))
        )

    def blocked(self, reason: str | None) -> None:
        """Tell the client the node blocks publishers (``reason``), or no longer (None)."""
        method = (
            commands.Connection.Unblocked()
            if reason is None
            else commands.Connection.Blocked(reason)
        )
        self._output.append(frames.method_frame(0, method))

    def send_on(self, channel: int, closes: int, data: bytes) -> bool:
        """Send ``data`` on ``channel`` unless it closed since the sender last knew it
        open (``closes``: ``self.closes[channel]`` then); whether it was sent."""
        if channel in self.channels and self.closes[channel] == closes:
            self._output.append(data)
            return True
        return False

    def close_channel_if(self, channel: int, closes: int, error: AmqpError) -> None:
        """``close_channel`` unless it closed since the sender knew it (``send_on``)."""
        if self.closes[channel] == closes:
            self.close_channel(channel, error)

    def receive(self, data: bytes, now: float = 0.0) -> None:
        """Take what the socket read."""
        if self.state == FINISHED or not data:
            return
        self._heard_at = now
        self._input += data
        try:
            if self.state == AWAIT_HEADER:
                if not self._read_header():
                    return
            # Until tuned, a frame is at most the spec's minimum, as RabbitMQ holds it.
            limit = self.frame_max if self.state >= AWAIT_OPEN else frames.FRAME_MIN_SIZE
            frames_read, used = frames.split_frames(self._input, limit)
            del self._input[:used]
            for frame in frames_read:
                if self.state == FINISHED:
                    return
                self._frame(frame)
        except AmqpError as error:
            self.close_connection(error)
        except RecursionError:  # a field table nested thousands deep
            self.close_connection(AmqpError(frames.SYNTAX_ERROR, "a field table nests too deep"))

    def tick(self, now: float) -> None:
        """Send a heartbeat when due; drop a client not heard from for two intervals,
        and one that has not opened the connection ``HANDSHAKE_TIMEOUT_S`` after it
        connected (RabbitMQ's ``handshake_timeout``)."""
        if self.state < OPEN and now - self._opened_at > HANDSHAKE_TIMEOUT_S:
            self._gone()
            return
        if self.state == CLOSING and now - self._closing_at > CLOSE_TIMEOUT_S:
            self._gone()  # it never answered the server's Close
            return
        if self.state == RELEASING and now - self._closing_at > RELEASE_TIMEOUT_S:
            self._close_ok()
        if self.heartbeat_s == 0 or self.state in (AWAIT_HEADER, FINISHED):
            return
        if now - self._heard_at > 2 * self.heartbeat_s:
            self._gone()
            return
        if now - self._sent_at >= self.heartbeat_s / 2:
            self._output.append(frames.heartbeat_frame())
            self._sent_at = now

    def heard(self, now: float) -> None:
        """Count the client as heard from at ``now``: its owner stopped reading it (it
        sent more than the server takes yet), so its heartbeats wait in its socket."""
        self._heard_at = now

    def _gone(self) -> None:
        """The peer is gone, or never came: no close handshake, nothing more sent."""
        self.state = FINISHED
        self.peer_gone = True
        self._output.clear()
        self._closed_all_channels()

    def close_connection(self, error: AmqpError) -> None:
        """Close the connection with ``error``'s code (the server's side of the close)."""
        if self.state in (CLOSING, FINISHED):
            return
        if self.state == RELEASING:  # the client closed first: it is answered, no more
            self._close_ok()
            return
        if self.state in (AWAIT_HEADER, AWAIT_START_OK, AWAIT_LOGIN_CHECK):
            self.state = FINISHED  # nothing tuned yet: the socket just closes
            return
        close = commands.Connection.Close(
            error.code, reply_text(error.text), error.class_id, error.method_id
        )
        self._output.append(frames.method_frame(0, close))
        self.state = CLOSING
        self._closing_at = self._heard_at
        self._closed_all_channels()

    def close_channel(self, channel: int, error: AmqpError) -> None:
        """Close ``channel`` with ``error``'s code; the client answers ``CloseOk``."""
        if channel not in self.channels:
            return
        close = commands.Channel.Close(
            error.code, reply_text(error.text), error.class_id, error.method_id
        )
        self._output.append(frames.method_frame(channel, close))
        self._forget_channel(channel)
        self._closing_channels.add(channel)

    # ------------------------------------------------------------------ the handshake

    def _read_header(self) -> bool:
        if len(self._input) < len(frames.PROTOCOL_HEADER):
            if not frames.PROTOCOL_HEADER.startswith(bytes(self._input)):
                self._refuse_protocol()
            return False
        if bytes(self._input[:8]) != frames.PROTOCOL_HEADER:
            self._refuse_protocol()
            return False
        del self._input[:8]
        start = commands.Connection.Start(
            version_major=0,
            version_minor=9,
            server_properties={
                "product": "Warren",
                "version": self.version,
                "platform": f"Python {platform.python_version()}",
                "information": "Warren's AMQP 0-9-1 port",
                "capabilities": CAPABILITIES,
            },
            mechanisms=" ".join(MECHANISMS),
            locales="en_US",
        )
        self._output.append(frames.method_frame(0, start))
        self.state = AWAIT_START_OK
        return True

    def _refuse_protocol(self) -> None:
        """Another protocol or version: answer with ours, as the spec says, and end."""
        self._output.append(frames.PROTOCOL_HEADER)
        self.state = FINISHED

    def _start_ok(self, method: pamqp.base.Frame) -> None:
        assert isinstance(method, commands.Connection.StartOk)
        self.client_properties = dict(method.client_properties or {})
        user, password = _credentials(method.mechanism, method.response)
        self._login = (user, method.mechanism)
        if user == GUEST and not is_loopback(self.peer_host):
            self._refuse_login(f"user '{GUEST}' may connect from loopback only")
            return
        verdict = self._authenticate(user, password)
        if verdict is None:
            self.state = AWAIT_LOGIN_CHECK  # the client sends nothing until it is tuned
        else:
            self.login_checked(verdict)

    def login_checked(self, let_in: bool) -> None:
        """The answer to the login an ``authenticate`` left pending (or gave at once):
        the connection is tuned, or refused. Nothing happens if the client went since."""
        if self.state not in (AWAIT_START_OK, AWAIT_LOGIN_CHECK):
            return
        user, mechanism = self._login
        if not let_in:
            self._refuse_login(
                f"Login was refused using authentication mechanism {mechanism}: "
                f"no user '{user}' with that password"
            )
            return
        self.user = user
        tune = commands.Connection.Tune(self.channel_max, self.frame_max, self.heartbeat_s)
        self._output.append(frames.method_frame(0, tune))
        self.state = AWAIT_TUNE_OK

    def _refuse_login(self, refused: str) -> None:
        capabilities = self.client_properties.get("capabilities")
        if isinstance(capabilities, dict) and capabilities.get("authentication_failure_close"):
            close = commands.Connection.Close(
                frames.ACCESS_REFUSED,
                reply_text(f"ACCESS_REFUSED - {refused}"),
                *frames.ids_of(commands.Connection.StartOk),
            )
            self._output.append(frames.method_frame(0, close))
            self.state = CLOSING
        else:
            self.state = FINISHED

    def _tune_ok(self, method: pamqp.base.Frame) -> None:
        assert isinstance(method, commands.Connection.TuneOk)
        channel_max = method.channel_max or 65535
        if channel_max > (self.channel_max or 65535):
            raise AmqpError(
                frames.NOT_ALLOWED,
                f"NOT_ALLOWED - negotiated channel_max = {channel_max} is higher than the "
                f"maximum allowed value ({self.channel_max})",
            )
        frame_max = method.frame_max or 2**32 - 1
        if frame_max > self.frame_max or frame_max < frames.FRAME_MIN_SIZE:
            raise AmqpError(
                frames.NOT_ALLOWED,
                f"NOT_ALLOWED - frame_max = {method.frame_max} is outside "
                f"{frames.FRAME_MIN_SIZE}..{self.frame_max}",
            )
        self.channel_max, self.frame_max, self.heartbeat_s = (
            channel_max,
            frame_max,
            method.heartbeat,
        )
        self.state = AWAIT_OPEN

    def _open(self, method: pamqp.base.Frame) -> None:
        assert isinstance(method, commands.Connection.Open)
        if method.virtual_host != VIRTUAL_HOST:
            raise AmqpError(
                frames.NOT_ALLOWED,
                f"NOT_ALLOWED - vhost {method.virtual_host} not found (Warren has only "
                f"{VIRTUAL_HOST})",
                *frames.ids_of(commands.Connection.Open),
            )
        if self.handler is None and self.on_open is not None:
            self.handler = self.on_open()
        self._output.append(frames.method_frame(0, commands.Connection.OpenOk()))
        self.state = OPEN

    # ------------------------------------------------------------------ frames

    def _frame(self, frame: Frame) -> None:
        if frame.kind == frames.FRAME_HEARTBEAT:
            if frame.channel != 0:
                raise AmqpError(frames.FRAME_ERROR, "a heartbeat on a channel other than 0")
            return
        if self.state == CLOSING:
            self._while_closing(frame)
        elif self.state == RELEASING:
            return  # nothing may follow a client's Close
        elif frame.channel == 0:
            self._connection_frame(frame)
        elif self.state != OPEN:
            raise AmqpError(frames.CHANNEL_ERROR, "a channel frame before the connection opened")
        elif frame.channel in self._closing_channels:
            self._while_channel_closing(frame)
        elif frame.kind == frames.FRAME_METHOD:
            self._channel_method(frame)
        else:
            self._content_frame(frame)

    def _while_closing(self, frame: Frame) -> None:
        if frame.kind != frames.FRAME_METHOD or frame.channel != 0:
            return
        method = frames.decode_method(frame)
        if isinstance(method, commands.Connection.CloseOk):
            self.state = FINISHED
        elif isinstance(method, commands.Connection.Close):
            self._output.append(frames.method_frame(0, commands.Connection.CloseOk()))
            self.state = FINISHED

    def _while_channel_closing(self, frame: Frame) -> None:
        if frame.kind != frames.FRAME_METHOD:
            return
        method = frames.decode_method(frame)
        if isinstance(method, commands.Channel.CloseOk | commands.Channel.Close):
            self._closing_channels.discard(frame.channel)
            if isinstance(method, commands.Channel.Close):
                self._output.append(frames.method_frame(frame.channel, commands.Channel.CloseOk()))

    def _connection_frame(self, frame: Frame) -> None:
        if frame.kind != frames.FRAME_METHOD:
            raise AmqpError(frames.UNEXPECTED_FRAME, f"a frame of type {frame.kind} on channel 0")
        method = frames.decode_method(frame)
        expected = {
            AWAIT_START_OK: (commands.Connection.StartOk, self._start_ok),
            AWAIT_TUNE_OK: (commands.Connection.TuneOk, self._tune_ok),
            AWAIT_OPEN: (commands.Connection.Open, self._open),
            OPEN: (commands.Connection.UpdateSecret, self._update_secret),
        }.get(self.state)
        if isinstance(method, commands.Connection.Close):
            opened = self.state == OPEN and self.handler is not None
            self.state = RELEASING
            self._closing_at = self._heard_at
            self._closed_all_channels()
            if opened:
                assert self.handler is not None
                # as RabbitMQ: its exclusive queues are gone by the time it hears CloseOk,
                # so it may declare them again on its next connection
                self.handler.connection_closing(self._close_ok)
            else:
                self._close_ok()
        elif expected is not None and isinstance(method, expected[0]):
            expected[1](method)
        elif self.state == OPEN and isinstance(method, commands.Connection.CloseOk):
            raise AmqpError(frames.COMMAND_INVALID, "Connection.CloseOk without a Close")
        else:
            raise AmqpError(
                frames.COMMAND_INVALID if expected is None else frames.UNEXPECTED_FRAME,
                f"{method.name} is not expected on channel 0 now",
                *frames.ids_of(method),
            )

    def _update_secret(self, method: pamqp.base.Frame) -> None:
        """A client's new secret for the connection (an expiring token, with RabbitMQ's
        OAuth 2 backend): the port's users have passwords, checked at login alone, so
        it is taken as RabbitMQ's own users backend takes it."""
        self._output.append(frames.method_frame(0, commands.Connection.UpdateSecretOk()))

    def _channel_method(self, frame: Frame) -> None:
        channel = frame.channel
        ids = frames.method_id(frame.payload)
        if channel in self._contents:
            raise AmqpError(
                frames.UNEXPECTED_FRAME,
                f"a method on channel {channel} in the middle of a publish's content",
                *ids,
            )
        if ids == frames.PUBLISH:
            if channel not in self.channels:
                raise AmqpError(frames.CHANNEL_ERROR, f"channel {channel} is not open", *ids)
            frames.decode_publish(frame.payload)  # refused here when malformed
            self.publishes += 1
            self._contents[channel] = _Content(frame)
            return
        if ids[0] == frames.ids_of(commands.Channel.Open)[0]:
            self._channel_class(channel, frames.decode_method(frame))
            return
        if channel not in self.channels:
            raise AmqpError(frames.CHANNEL_ERROR, f"channel {channel} is not open", *ids)
        if self.handler is None:
            raise AmqpError(frames.NOT_IMPLEMENTED, "NOT_IMPLEMENTED - not served yet", *ids)
        try:
            self.handler.method(channel, frame)
        except AmqpError as error:
            if error.code >= 500:
                raise
            self.close_channel(channel, error)

    def _channel_class(self, channel: int, method: pamqp.base.Frame) -> None:
        ids = frames.ids_of(method)
        if isinstance(method, commands.Channel.Open):
            if channel in self.channels:
                raise AmqpError(
                    frames.CHANNEL_ERROR, f"CHANNEL_ERROR - channel {channel} is open", *ids
                )
            if self.channel_max and len(self.channels) >= self.channel_max:
                raise AmqpError(
                    frames.NOT_ALLOWED,
                    f"NOT_ALLOWED - number of channels opened ({len(self.channels)}) has "
                    f"reached the negotiated channel_max ({self.channel_max})",
                    *ids,
                )
            self.channels.add(channel)
            self._output.append(frames.method_frame(channel, commands.Channel.OpenOk()))
        elif channel not in self.channels:
            raise AmqpError(frames.CHANNEL_ERROR, f"channel {channel} is not open", *ids)
        elif isinstance(method, commands.Channel.Close):
            self._forget_channel(channel)
            self._output.append(frames.method_frame(channel, commands.Channel.CloseOk()))
        elif isinstance(method, commands.Channel.Flow):
            if not method.active:  # as RabbitMQ: consumers are paused with basic.qos
                raise AmqpError(frames.NOT_IMPLEMENTED, "NOT_IMPLEMENTED - active=false", *ids)
            self._output.append(frames.method_frame(channel, commands.Channel.FlowOk(True)))
        else:
            raise AmqpError(frames.COMMAND_INVALID, f"{method.name} is not expected now", *ids)

    def _content_frame(self, frame: Frame) -> None:
        content = self._contents.get(frame.channel)
        if content is None:
            raise AmqpError(
                frames.UNEXPECTED_FRAME, f"content on channel {frame.channel} without a publish"
            )
        if frame.kind == frames.FRAME_HEADER:
            if content.header is not None:
                raise AmqpError(frames.UNEXPECTED_FRAME, "a second content header for a publish")
            content.header = frames.decode_content_header(frame.payload)
            if content.header.body_size > MAX_MESSAGE_BYTES:
                del self._contents[frame.channel]  # its body frames are dropped
                self.close_channel(
                    frame.channel,
                    AmqpError(
                        frames.PRECONDITION_FAILED,
                        f"PRECONDITION_FAILED - message size {content.header.body_size} is "
                        f"larger than configured max size {MAX_MESSAGE_BYTES}",
                        *frames.PUBLISH,
                    ),
                )
                return
        elif frame.kind == frames.FRAME_BODY and content.header is not None:
            content.body.append(frame.payload)
            content.received += len(frame.payload)
            self.gathering_bytes += len(frame.payload)
            if self.gathering_bytes > MAX_MESSAGE_BYTES:  # bodies begun on many channels
                raise AmqpError(
                    frames.RESOURCE_ERROR,
                    f"RESOURCE_ERROR - the bodies being sent on this connection's channels "
                    f"add up to more than {MAX_MESSAGE_BYTES} bytes",
                    *frames.PUBLISH,
                )
            if content.received > content.header.body_size:
                raise AmqpError(
                    frames.FRAME_ERROR,
                    f"a body of more than the {content.header.body_size} bytes its header said",
                )
        else:
            raise AmqpError(
                frames.UNEXPECTED_FRAME, f"a frame of type {frame.kind} where content was due"
            )
        if content.header.body_size == content.received:
            del self._contents[frame.channel]
            self.gathering_bytes -= content.received
            if self.handler is None:
                raise AmqpError(
                    frames.NOT_IMPLEMENTED, "NOT_IMPLEMENTED - not served yet", *frames.PUBLISH
                )
            try:
                self.handler.content(
                    frame.channel, content.publish, content.header, b"".join(content.body)
                )
            except AmqpError as error:
                if error.code >= 500:
                    raise
                self.close_channel(frame.channel, error)

    def _forget_channel(self, channel: int) -> None:
        if channel in self.channels:
            self.closes[channel] += 1
        self.channels.discard(channel)
        dropped = self._contents.pop(channel, None)
        if dropped is not None:
            self.gathering_bytes -= dropped.received
        if self.handler is not None:
            self.handler.channel_closed(channel)

    def _close_ok(self) -> None:
        if self.state == RELEASING:
            self._output.append(frames.method_frame(0, commands.Connection.CloseOk()))
            self.state = FINISHED

    def _closed_all_channels(self) -> None:
        for channel in sorted(self.channels):
            self._forget_channel(channel)


def _credentials(mechanism: str, response: bytes | str) -> tuple[str, str]:
    """The user and password of a ``StartOk``'s response."""
    data = response.encode() if isinstance(response, str) else bytes(response)
    if mechanism == "PLAIN":
        parts = data.split(b"\x00")
        if len(parts) != 3:
            raise AmqpError(frames.ACCESS_REFUSED, "ACCESS_REFUSED - a malformed PLAIN response")
        return parts[1].decode(errors="replace"), parts[2].decode(errors="replace")
    if mechanism == "AMQPLAIN":
        table = frames.decode_table(data)
        return str(table.get("LOGIN", "")), str(table.get("PASSWORD", ""))
    raise AmqpError(
        frames.ACCESS_REFUSED,
        f"ACCESS_REFUSED - mechanism {mechanism} is not one of {', '.join(MECHANISMS)}",
    )
