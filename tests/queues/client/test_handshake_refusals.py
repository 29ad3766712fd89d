"""A client whose security mechanism the listener does not use is refused with
``AccessRefused``, whatever order the two ends of the ZeroMQ handshake run in.

The order that once made such a client wait out its connect and end in
``NodeNotRunning``: each end sends its greeting in parts (the signature, then the
version, then its mechanism), and a listener that reads the client's version and
mechanism in one piece (it was not scheduled in between, as on a loaded machine) finds
the mismatch before it has sent its own mechanism, and closes. The client then sees the
connection closed during its handshake, with no detail, never the mismatch.
``GreetingInOnePiece`` forces that order on every connection: a relay in front of the
listener that hands it all of a client's greeting after the signature at once."""

import socket
import threading

import pytest

from warren import connect
from warren.queues.client.keys import create_client_key
from warren.queues.errors import AccessRefused
from warren.supervisor import Node

SIGNATURE_BYTES = 10  # of a ZMTP 3 greeting (64 bytes in all)
GREETING_BYTES = 64


class GreetingInOnePiece:
    """A tcp relay on 127.0.0.1 to ``upstream`` (``tcp://127.0.0.1:PORT``): the first
    ``SIGNATURE_BYTES`` a client sends go at once, the rest of its greeting once whole,
    in one piece; everything else as it comes, both ways. It counts what it relays on
    each connection.

    Its accept thread adds each connection's sockets and pump threads under a lock, and
    after ``close`` began it closes a connection accepted meanwhile itself, so that
    ``close`` shuts every connection; a client whose listener is away is closed."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("tcp://").rsplit(":", 1)
        self._upstream = (host, int(port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self._server.getsockname()[1]}"
        self._lock = threading.Lock()
        self._closed = False
        self._sockets: list[socket.socket] = []
        self._pumps: list[threading.Thread] = []
        # per connection: the bytes relayed to the listener, and to the client
        self._relayed: list[list[int]] = []
        self._accepting = threading.Thread(target=self._accept, name="relay", daemon=True)
        self._accepting.start()

    @property
    def refused_mid_greeting(self) -> int:
        """How many connections the listener closed before its greeting went out whole,
        once it had the client's whole greeting (the rest of it in one piece)."""
        with self._lock:
            return sum(
                to_listener >= GREETING_BYTES > to_client
                for to_listener, to_client in self._relayed
            )

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            try:
                listener = socket.create_connection(self._upstream)
            except OSError:
                client.close()  # no listener: the client sees its connection closed
                continue
            relayed = [0, 0]
            pumps = [
                threading.Thread(
                    target=self._pump, args=(source, sink, held, relayed, direction), daemon=True
                )
                for direction, (source, sink, held) in enumerate(
                    ((client, listener, True), (listener, client, False))
                )
            ]
            with self._lock:
                if self._closed:
                    client.close()
                    listener.close()
                    return
                self._sockets += [client, listener]
                self._relayed.append(relayed)
                self._pumps += pumps
                for pump in pumps:
                    pump.start()

    @staticmethod
    def _pump(
        source: socket.socket, sink: socket.socket, held: bool, relayed: list[int], direction: int
    ) -> None:
        pending = b""
        sent = 0 if held else GREETING_BYTES
        try:
            while chunk := source.recv(65536):
                pending += chunk
                if sent < SIGNATURE_BYTES <= len(pending):
                    sink.sendall(pending[:SIGNATURE_BYTES])
                    relayed[direction] += SIGNATURE_BYTES
                    pending, sent = pending[SIGNATURE_BYTES:], SIGNATURE_BYTES
                if sent == SIGNATURE_BYTES and len(pending) >= GREETING_BYTES - SIGNATURE_BYTES:
                    sent = GREETING_BYTES
                if sent == GREETING_BYTES:
                    sink.sendall(pending)
                    relayed[direction] += len(pending)
                    pending = b""
        except OSError:
            pass  # the other end closed
        finally:
            for end in (source, sink):
                try:
                    end.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        with self._lock:  # from now on, the accept thread adds no connection
            self._closed = True
            ends, pumps = list(self._sockets), list(self._pumps)
        self._server.shutdown(socket.SHUT_RDWR)  # wakes its accept
        self._server.close()
        for end in ends:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in [self._accepting, *pumps]:
            thread.join(timeout=60)
        for end in ends:
            end.close()


@pytest.mark.parametrize("curve", [True, False], ids=["a node with keys", "a node without"])
def test_a_mechanism_refused_before_the_listener_sends_its_greeting_whole_is_access_refused(
    tmp_path, curve
):
    data_dir = tmp_path / "data"
    with Node(data_dir, listen="tcp://127.0.0.1:*", curve=curve) as node:
        relay = GreetingInOnePiece(node.listen_endpoint)
        try:
            if curve:
                with pytest.raises(AccessRefused, match="wants a key"):
                    connect(relay.endpoint, connect_timeout_s=60)
            else:
                key = create_client_key(data_dir, "alice", tmp_path)
                with pytest.raises(AccessRefused, match="does not use keys"):
                    connect(relay.endpoint, key_file=key, connect_timeout_s=60)
        finally:
            relay.close()
    # the client's own connection went through the relay, refused as it is on a loaded
    # machine (not once the listener's greeting came whole)
    assert relay.refused_mid_greeting >= 1, relay._relayed
