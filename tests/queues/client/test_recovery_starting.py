"""A recovering client and a node that is back but still starting: its node file is
written and its tcp listener answers before it serves a call (its control socket says
"starting"). The node started again is held at the last step of its start, its listener
up, until every client has met it starting: the test waits for that event, never for a
time."""

import contextlib
import logging
import signal
import subprocess
import sys
import threading

import pytest

from warren import connect
from warren.queues.errors import NodeStarting

from ...waiting import wait_for
from .node_process import ROOT, TRANSPORTS, NodeProcess, Traffic

# A node whose start stops before its last step (its listener is up, it serves nothing
# yet), says "held", and goes on once a line comes on its standard input; it says
# "serving" once it serves, and stops in order on SIGTERM.
# (Its standard output, which its actors' processes share, goes to /dev/null: the two
# lines go on a descriptor of its own, which no other process holds.)
HELD_NODE = """
import os, sys, threading
from warren.supervisor import Node
from warren.supervisor.node import node as node_module

said = os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
write_alarms = node_module.write_alarms
starting = threading.current_thread()

def held_write_alarms(*args, **kwargs):
    if threading.current_thread() is starting:
        node_module.write_alarms = write_alarms
        print("held", file=said, flush=True)
        sys.stdin.readline()
    return write_alarms(*args, **kwargs)

node_module.write_alarms = held_write_alarms
node = Node(sys.argv[1], listen=sys.argv[2])
print("serving", file=said, flush=True)
node.run_until_signalled()
"""


def start_held(node: NodeProcess) -> None:
    """Start ``node`` again on its data directory and port, held before it serves."""
    node.process = subprocess.Popen(
        [sys.executable, "-c", HELD_NODE, str(node.data_dir), node.endpoint],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        text=True,
    )
    assert node.process.stdout.readline() == "held\n"


def let_go(node: NodeProcess) -> None:
    """Let the held start go on, without waiting for it (once; again, or for a node not
    held, does nothing). Whatever became of the node: a test that failed while it was held
    lets its clients end this way, and the fixture stops it."""
    held = node.process.stdin
    if held is not None and not held.closed:
        with contextlib.suppress(OSError):  # it died held: nothing reads its input
            held.write("go on\n")
            held.close()


def release(node: NodeProcess) -> None:
    """Let the held start go on, and wait until it serves."""
    let_go(node)
    assert node.process.stdout.readline() == "serving\n"


def met_the_node_starting(records, thread: threading.Thread) -> bool:
    """Whether ``thread``'s connection logged an attempt to recover that the node
    refused as starting."""
    return any(r.threadName == thread.name and "is starting" in r.getMessage() for r in records)


CALLS = {
    "a declare": lambda connection, queue: connection.declare_queue(queue),
    "queue_stats": lambda connection, queue: connection.queue_stats(queue)["depth"],
}


def test_recovering_clients_wait_for_a_node_still_starting_and_nothing_is_nacked(node, caplog):
    """Producers (``publish_many``, a batch in flight when the node stops), consumers and
    connections idle until they declare or ask for stats, over ipc and tcp: each meets
    the node started again still starting, waits for it, and goes on; every publish is
    confirmed and consumed, no call fails."""
    caplog.set_level(logging.WARNING, logger="warren.queues")
    traffic: list[Traffic] = []
    idle = {}
    outcomes: dict[tuple[str, str], object] = {}
    callers: list[threading.Thread] = []

    def call_on_idle(key: tuple[str, str]) -> None:
        try:
            outcomes[key] = CALLS[key[1]](idle[key], f"orders-{key[0]}")
        except Exception as exc:
            outcomes[key] = exc

    try:
        for transport in TRANSPORTS:
            traffic.append(Traffic(node.target(transport), queue=f"orders-{transport}"))
            for call in CALLS:
                idle[transport, call] = connect(node.target(transport))
        for each in traffic:
            each.progressed()
        node.stop_by(signal.SIGTERM, "node")
        start_held(node)
        for key in idle:
            callers.append(threading.Thread(target=call_on_idle, args=(key,), name=str(key)))
            callers[-1].start()
        for thread in [t for each in traffic for t in each._threads] + callers:
            wait_for(
                lambda thread=thread: (
                    met_the_node_starting(caplog.records, thread) or not thread.is_alive()
                ),
                timeout=120,
            )
        release(node)
        for caller in callers:
            caller.join(timeout=300)
        for each in traffic:
            each.progressed()
        for each in traffic:
            each.finish()
    finally:
        let_go(node)  # failing while held: let its clients end
        for each in traffic:
            each.stop()
        for caller in callers:
            caller.join(timeout=300)
        for connection in idle.values():
            connection.close()
    failed = {key: repr(o) for key, o in outcomes.items() if isinstance(o, Exception)}
    assert not failed and len(outcomes) == len(idle), (failed, outcomes)
    for each in traffic:
        assert each.recoveries == {"producer": 1, "consumer": 1}, (each.queue, each.recoveries)
    assert {key: connection.recoveries for key, connection in idle.items()} == dict.fromkeys(
        idle, 1
    )


def test_a_connect_to_a_node_still_starting_is_node_starting_over_ipc_and_tcp(node):
    """Its listener answers, but a tcp connect asks the node too, as an ipc one does:
    ``NodeStarting`` at once, which ``connect(wait=...)`` waits through."""
    node.stop_by(signal.SIGTERM, "node")
    start_held(node)
    try:
        for transport in TRANSPORTS:
            with pytest.raises(NodeStarting, match="is starting"):
                connect(node.target(transport), recover=False)
    finally:
        let_go(node)
    release(node)
    for transport in TRANSPORTS:
        with connect(node.target(transport), recover=False) as connection:
            assert connection.list_queues() == []
