"""A process running a Warren node with two application actors, for the tests that signal
or kill the node's process itself.

    python -m tests.supervisor.node_child DATA_DIR [--messages N] [--queue NAME]
                                          [--listen ADDR] [--until-signalled]
                                          [--declare-forever PREFIX]
                                          [--delete-and-die NAME [--before-the-save]]
                                          [--auto-delete-and-die NAME]

Writes N persistent messages (ids ``message_id(i)``, bodies ``message_body(i)``) and waits
until the store has confirmed them all, declares queue NAME if asked (listening on ADDR if
asked), then prints the pids of the node's process, its forkserver and its actors on one
line. With ``--declare-forever`` it then declares durable queues PREFIX0, PREFIX1, ...
one after another, printing each name once its declare has returned, until killed.
With ``--delete-and-die`` it then deletes queue NAME and SIGKILLs itself the moment the
definitions without NAME are saved, before its messages and files are removed: a node
killed in the middle of a delete (its forkserver then ends its actors); with
``--before-the-save``, the moment before that save instead. With
``--auto-delete-and-die`` it declares NAME durable and ``auto_delete``, publishes
``AUTO_DELETED_MESSAGES`` persistent messages to it, has a consumer start and stop
with the persistent store stopped (SIGSTOP), and once the queue, deleting itself, has
written its tombstone, SIGKILLs the queue, the store and itself: a node killed while
an auto-delete queue was deleting itself.
Without ``--until-signalled`` it then waits, as an
embedding application would, with the default reaction to every signal. With it, it runs
as ``warren node`` does: the stop signals are blocked while the node is built, then
``Node.run_until_signalled`` runs it; it prints the signal that stopped it and exits 0,
or 3 if the node failed.
"""

import argparse
import itertools
import os
import signal
import sys
import time

import psutil

from tests.supervisor.sample_actors import Worker
from tests.waiting import wait_for
from warren.queues.broker.definitions import is_marked_deleted, queue_directory
from warren.store.client import StoreClient
from warren.supervisor import ChildSpec, Node
from warren.supervisor.chaos.faults import is_alive
from warren.supervisor.node.node import STOP_SIGNALS

AUTO_DELETED_MESSAGES = 20
AUTO_DELETED_BODY_BYTES = 6000  # kept in the shared store, not in the queue's files


def message_id(i: int) -> bytes:
    return i.to_bytes(16, "big")


def message_body(i: int) -> bytes:
    return b"confirmed before the stop %d" % i


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("data_dir")
    parser.add_argument("--messages", type=int, default=0)
    parser.add_argument("--queue")
    parser.add_argument("--listen")
    parser.add_argument("--until-signalled", action="store_true")
    parser.add_argument("--declare-forever", metavar="PREFIX")
    parser.add_argument("--delete-and-die", metavar="NAME")
    parser.add_argument("--before-the-save", action="store_true")
    parser.add_argument("--auto-delete-and-die", metavar="NAME")
    args = parser.parse_args()
    if args.until_signalled:
        signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    node = Node(
        args.data_dir,
        children=(ChildSpec("one", Worker), ChildSpec("two", Worker)),
        listen=args.listen,
    )
    if args.messages:
        client = StoreClient(node.store())
        for i in range(args.messages):
            client.write(message_id(i), message_body(i))
        client.settle()
    if args.queue:
        node.declare_queue(args.queue)
    print(*node._pids(), flush=True)
    if args.declare_forever is not None:
        for n in itertools.count():
            node.declare_queue(f"{args.declare_forever}{n}")
            print(f"{args.declare_forever}{n}", flush=True)
    if args.delete_and_die is not None:
        die_saving_without(node, args.delete_and_die, before=args.before_the_save)
        node.delete_queue(args.delete_and_die)
    if args.auto_delete_and_die is not None:
        die_auto_deleting(node, args.auto_delete_and_die)
    if not args.until_signalled:
        while True:
            time.sleep(60)
    signum = node.run_until_signalled()
    if signum is None:
        return 3
    print(signal.Signals(signum).name, flush=True)
    return 0


def die_saving_without(node: Node, name: str, before: bool) -> None:
    """SIGKILL this process as soon as a save of the node's definitions without queue
    ``name`` returns (``before``: as soon as one is called)."""
    definitions = node._definitions
    save = definitions.save

    def save_then_die() -> None:
        if before and name not in definitions.queues:
            os.kill(os.getpid(), signal.SIGKILL)
        save()
        if name not in definitions.queues:
            os.kill(os.getpid(), signal.SIGKILL)

    definitions.save = save_then_die  # type: ignore[method-assign]


def die_auto_deleting(node: Node, name: str) -> None:
    """SIGKILL auto-delete queue ``name``, the persistent store and this process while
    the queue waits for the stopped store in the middle of deleting itself."""
    node.declare_queue(name, auto_delete=True)
    connection = node.connect()
    connection.publish_many(
        name, [b"%d " % n + b"x" * AUTO_DELETED_BODY_BYTES for n in range(AUTO_DELETED_MESSAGES)]
    )
    consumer = connection.consume(name)  # nothing fetched: no store read pending
    queue, store = psutil.Process(node.queue(name).pid), psutil.Process(node.store().pid)
    store.suspend()
    consumer.cancel()  # the last consumer: the queue deletes itself
    wait_for(lambda: is_marked_deleted(queue_directory(node.data_dir, name)), timeout=60)
    queue.kill()
    store.kill()
    wait_for(lambda: not is_alive(queue) and not is_alive(store), timeout=60)
    os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main())
