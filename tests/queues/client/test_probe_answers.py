"""A connect asks its node once (``list_queues``) before it returns: an answer to that probe
that no node sends (another program on the node's control socket or its tcp address, a
damaged frame) is ``NodeNotRunning`` naming what answered, never a stray ``ValueError``,
``KeyError`` or ``TypeError`` out of the client's plumbing. The fake node answers one
probe and stops.

A listener that restarted while a queue was waited on answers the client's check of that
queue "not alive" with its new boot: the connection must take its node as gone (and
recover, sending again what was in doubt), not the queue as restarted (a nack)."""

import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq

from warren import connect
from warren.actors import wire
from warren.actors.codec import Decoder, Encoder
from warren.queues.broker.listener import with_free_port
from warren.queues.client.ipc_node import NODE_FILE
from warren.queues.client.tcp_node import RemoteQueue, TcpNode
from warren.queues.errors import NodeNotRunning, NodeStarting

ANSWER_WAIT_MS = 60_000  # the client asks long before: the bound never decides


@contextmanager
def answering(socket: zmq.Socket, answer: Callable[[zmq.Socket], bool]) -> Iterator[None]:
    """Serve ``socket`` from a thread with ``answer`` (True once it answered the probe)
    while the block runs; the thread and the socket end with it."""
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            if socket.poll(100) and answer(socket):
                return

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(ANSWER_WAIT_MS / 1000)
        socket.close(linger=0)


@contextmanager
def node_file_answering(data: Path, reply: bytes) -> Iterator[None]:
    """A data directory ``data`` whose node file names an ipc socket (beside it) that
    answers the client's probe with ``reply``, while the block runs."""
    data.mkdir()
    endpoint = f"ipc://{data.parent}/control"
    (data / NODE_FILE).write_text(json.dumps({"status_endpoint": endpoint, "pid": os.getpid()}))
    socket = zmq.Context.instance().socket(zmq.REP)
    socket.bind(endpoint)

    def answer(socket: zmq.Socket) -> bool:
        socket.recv_multipart()
        socket.send(reply)
        return True

    with answering(socket, answer):
        yield


IPC_ANSWERS = {
    "not json": b"\xff\x00 node?",
    "a list": b"[1, 2]",
    "neither ok nor error": b'{"status": "fine"}',
}


@pytest.mark.parametrize("reply", IPC_ANSWERS.values(), ids=IPC_ANSWERS.keys())
def test_a_node_file_whose_socket_answers_no_node_answer_is_no_node(short_tmp_path, reply):
    data = short_tmp_path / "data"
    with node_file_answering(data, reply), pytest.raises(NodeNotRunning) as refused:
        connect(data)
    assert f"the node on {data} answered list_queues with what no Warren node sends" in str(
        refused.value
    )
    assert repr(reply[:20])[2:-1] in str(refused.value)


def test_a_node_still_starting_is_still_node_starting(short_tmp_path):
    data = short_tmp_path / "data"
    starting = json.dumps({"error": "NodeStarting", "message": "recovering"}).encode()
    with (
        node_file_answering(data, starting),
        pytest.raises(NodeStarting, match="recovering"),
    ):
        connect(data)


TCP_ANSWERS = {
    "an error that is a word": (wire.REPLY_ERROR, "refused"),
    "an error of one part": (wire.REPLY_ERROR, ["NotFound"]),
    "an error named by a number": (wire.REPLY_ERROR, [7, "text", ""]),
    "a kind of answer no listener sends": (9, None),
}


@pytest.mark.parametrize("kind,value", TCP_ANSWERS.values(), ids=TCP_ANSWERS.keys())
def test_a_listener_whose_probe_answer_is_no_listener_answer_is_no_node(kind, value):
    endpoint = with_free_port("tcp://127.0.0.1:*")
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.bind(endpoint)
    encoder, decoder = Encoder(), Decoder()

    def answer(socket: zmq.Socket) -> bool:
        client, *frames = socket.recv_multipart(copy=False)
        op, request_id, *_ = decoder.decode(frames)
        if op == "boot":
            socket.send_multipart([client, *encoder.encode([wire.REPLY_OK, request_id, b"b"])])
            return False
        socket.send_multipart([client, *encoder.encode([kind, request_id, value])])
        return True

    with answering(socket, answer), pytest.raises(NodeNotRunning) as refused:
        connect(endpoint, connect_timeout_s=ANSWER_WAIT_MS / 1000)
    assert f"the listener at {endpoint} answered with what no Warren listener sends" in str(
        refused.value
    )


def test_a_queue_check_answered_by_a_restarted_listener_leaves_its_node_gone():
    endpoint = with_free_port("tcp://127.0.0.1:*")
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.bind(endpoint)
    encoder, decoder = Encoder(), Decoder()
    boot = [b"before"]

    def answer(socket: zmq.Socket) -> bool:
        client, *frames = socket.recv_multipart(copy=False)
        op, request_id, *_ = decoder.decode(frames)
        if op == "alive":  # the node restarted: its queue is another incarnation
            boot[0] = b"after"
            value: object = [False, boot[0]]
        elif op == "boot" and boot[0] == b"after":
            return False  # the restarted node is busy recovering its queues
        else:
            value = boot[0] if op == "boot" else []
        socket.send_multipart([client, *encoder.encode([wire.REPLY_OK, request_id, value])])
        return False

    with answering(socket, answer):
        node = TcpNode(endpoint, connect_timeout_s=ANSWER_WAIT_MS / 1000)
        try:
            queue = RemoteQueue(node, "orders", incarnation=1)
            assert not queue.alive(queue.ask_async("ping"))
            assert node.gone(wait_s=0.5)
        finally:
            node.close()
