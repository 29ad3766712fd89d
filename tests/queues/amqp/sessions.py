"""A test server for ``Session``: a thread serving AMQP connections on 127.0.0.1, one
session each, so that a real client (pika) can drive the protocol without a node."""

from __future__ import annotations

import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pamqp.commands as commands

from warren.queues.amqp import frames
from warren.queues.amqp.session import ChannelHandler, Session


def guest_only(user: str, password: str) -> bool:
    return (user, password) == ("guest", "guest")


def start_ok(mechanism: str, response: bytes) -> bytes:
    """A client's ``Connection.StartOk`` frame, logging in with ``response``."""
    method = commands.Connection.StartOk(
        client_properties={"capabilities": {"authentication_failure_close": True}},
        mechanism=mechanism,
        response=response.decode("latin-1"),
    )
    return frames.method_frame(0, method)


@dataclass
class Served:
    """The server's address and every session it made, in order."""

    port: int
    sessions: list[Session] = field(default_factory=list)


@contextlib.contextmanager
def serving(
    handler: Callable[[], ChannelHandler | None] = lambda: None, **options: Any
) -> Iterator[Served]:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    served = Served(listener.getsockname()[1])
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    stop = threading.Event()

    def flush(sock: socket.socket, session: Session) -> None:
        out = session.take_output()
        if out:
            sock.sendall(out)
        if session.finished:
            selector.unregister(sock)
            sock.close()

    failures: list[BaseException] = []

    def run() -> None:
        try:
            serve()
        except BaseException as exc:  # surfaced when the test leaves ``serving``
            failures.append(exc)

    def serve() -> None:
        while not stop.is_set():
            for key, _ in selector.select(0.05):
                if key.fileobj is listener:
                    sock, (host, _) = listener.accept()
                    session = Session(host, guest_only, handler(), now=time.monotonic(), **options)
                    served.sessions.append(session)
                    selector.register(sock, selectors.EVENT_READ, session)
                    continue
                sock, session = key.fileobj, key.data
                assert isinstance(sock, socket.socket)
                data = sock.recv(65536)
                if not data:
                    selector.unregister(sock)
                    sock.close()
                    continue
                session.receive(data, time.monotonic())
                flush(sock, session)
            for key in list(selector.get_map().values()):
                if key.data is not None:
                    key.data.tick(time.monotonic())
                    assert isinstance(key.fileobj, socket.socket)
                    flush(key.fileobj, key.data)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        yield served
    finally:
        stop.set()
        thread.join(5)
        for key in list(selector.get_map().values()):
            key.fileobj.close()  # type: ignore[union-attr]
        selector.close()
    if failures:
        raise AssertionError("the test server failed") from failures[0]
