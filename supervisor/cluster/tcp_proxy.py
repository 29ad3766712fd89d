"""A TCP proxy that can cut a link as a network partition does: the harness of
``warren chaos --cluster`` puts one in front of every node's peer port and every etcd
member a node talks to, so that a link is cut and healed without root (no network
namespace, no iptables); and a follower's AMQP port is one in front of the leader's
(``warren.supervisor.node.node``: clients of any node reach the leader, as LavinMQ's
followers forward theirs).

``TcpProxy(upstream)`` listens on a free loopback port, or on ``listen`` (host, port),
(``address``) and forwards each connection it accepts to ``upstream`` (host, port), both
ways, one thread a direction; the upstream may be set after the proxy is made (a
connection before then is closed).
``cut()`` stops forwarding: what either side sends is held (read from one socket and
not written to the other, and then not read at all, so the kernel's buffers fill and
the sender's writes block), new connections are accepted and held the same way, as a
partition that drops packets silently holds a TCP connection: neither end is told.
``heal()`` lets everything held through in order, as TCP's retransmissions do once the
network is back: no byte is lost or reordered, so a framed protocol (ZeroMQ's, HTTP)
carries on where it stood. ``close()`` closes the listener and every connection.

Races: a direction's thread waits for the link to be whole between its read and its
write, so a ``cut()`` that lands while a read is under way holds that read's bytes too;
a connection to the upstream is made once the link is whole (a cut link does not reach
the upstream either), and refused or closed upstream closes the client's side, as a
peer that is down does.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["TcpProxy"]

CHUNK_BYTES = 256 * 1024


class TcpProxy:
    """A proxy on ``listen`` (``127.0.0.1``'s free port) in front of ``upstream``; see
    the module docstring."""

    def __init__(
        self,
        upstream: tuple[str, int] | None,
        name: str = "",
        listen: tuple[str, int] = ("127.0.0.1", 0),
    ) -> None:
        # None until set: a proxy's own port is taken first, so that the upstream's,
        # found free afterwards, cannot be the one the kernel gives the proxy
        self.upstream, self.name = upstream, name
        self._whole = threading.Event()
        self._whole.set()
        self._closed = False
        self._lock = threading.Lock()
        self._sockets: set[socket.socket] = set()
        # the local ends of its own upstream connections: one it accepts back (an upstream
        # that is this very listener) is dropped, not forwarded once more
        self._outgoing: set[tuple[str, int]] = set()
        family = socket.AF_INET6 if ":" in listen[0] else socket.AF_INET
        # OSError: the address is taken
        self._listener = socket.create_server(listen, family=family)
        self.port = self._listener.getsockname()[1]
        host = f"[{listen[0]}]" if family == socket.AF_INET6 else listen[0]
        self.address = f"{host}:{self.port}"
        threading.Thread(target=self._accept, name=f"proxy {name}", daemon=True).start()

    @property
    def cut_now(self) -> bool:
        return not self._whole.is_set()

    def cut(self) -> None:
        self._whole.clear()

    def heal(self) -> None:
        self._whole.set()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sockets, self._sockets = [self._listener, *self._sockets], set()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        # every held thread runs on, to its closed socket: nothing held is delivered, and
        # a connection waiting for the link to heal reaches no upstream
        self._whole.set()

    def _keep(self, sock: socket.socket) -> bool:
        with self._lock:
            if self._closed:
                sock.close()
                return False
            self._sockets.add(sock)
            return True

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            if self._keep(client):
                threading.Thread(
                    target=self._connect, args=(client,), name=f"proxy {self.name}", daemon=True
                ).start()

    def _connect(self, client: socket.socket) -> None:
        self._whole.wait()
        if self._closed or self._looped(client):
            self._drop(client)
            return
        try:
            if self.upstream is None:
                raise ConnectionRefusedError("no upstream yet")
            upstream = socket.create_connection(self.upstream, timeout=5)
        except OSError:
            self._drop(client)
            return
        upstream.settimeout(None)
        with self._lock:
            self._outgoing.add(upstream.getsockname()[:2])
        if upstream.getpeername()[:2] == self._listener.getsockname()[:2]:
            self._drop(upstream, client)  # its own listener: it would forward to itself
            return
        for sock in (client, upstream):  # a peer gone without a word is noticed in time
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        if not self._keep(upstream):
            self._drop(client)
            return
        for source, sink in ((client, upstream), (upstream, client)):
            threading.Thread(
                target=self._forward,
                args=(source, sink),
                name=f"proxy {self.name}",
                daemon=True,
            ).start()

    def _forward(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(CHUNK_BYTES):
                self._whole.wait()
                sink.sendall(data)
        except OSError:
            pass  # either end closed or reset: the other end is closed below
        self._drop(source, sink)

    def _looped(self, client: socket.socket) -> bool:
        """Whether ``client`` is one of this proxy's own upstream connections."""
        try:
            peer = client.getpeername()[:2]
        except OSError:
            return True  # gone already
        with self._lock:
            return peer in self._outgoing

    def _drop(self, *sockets: socket.socket) -> None:
        for sock in sockets:
            with self._lock:
                self._sockets.discard(sock)
                with contextlib.suppress(OSError):
                    self._outgoing.discard(sock.getsockname()[:2])
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
