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
    in one piece; everything else as it comes, both ways."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("tcp://").rsplit(":", 1)
        self._upstream = (host, int(port))
        self._server = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"tcp://127.0.0.1:{self._server.getsockname()[1]}"
        self.connections = 0
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, name="relay")]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return  # closed
            listener = socket.create_connection(self._upstream)
            self._sockets += [client, listener]
            self.connections += 1
            for source, sink, held in ((client, listener, True), (listener, client, False)):
                thread = threading.Thread(target=self._pump, args=(source, sink, held))
                self._threads.append(thread)
                thread.start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket, held: bool) -> None:
        pending = b""
        sent = 0 if held else GREETING_BYTES
        try:
            while chunk := source.recv(65536):
                pending += chunk
                if sent < SIGNATURE_BYTES <= len(pending):
                    sink.sendall(pending[:SIGNATURE_BYTES])
                    pending, sent = pending[SIGNATURE_BYTES:], SIGNATURE_BYTES
                if sent == SIGNATURE_BYTES and len(pending) >= GREETING_BYTES - SIGNATURE_BYTES:
                    sent = GREETING_BYTES
                if sent == GREETING_BYTES:
                    sink.sendall(pending)
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
        self._server.shutdown(socket.SHUT_RDWR)  # wakes its accept
        self._server.close()
        for end in self._sockets:
            try:
                end.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        for thread in self._threads:
            thread.join(timeout=60)
        for end in self._sockets:
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
            # the client's own connection went through the relay, refused as it is on
            # a loaded machine (not once the listener's greeting came whole)
            assert relay.connections >= 1
        finally:
            relay.close()
