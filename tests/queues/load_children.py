"""Producer and consumer processes for the crash tests under load.

    python -m tests.queues.load_children produce DATA QUEUE NAME COUNT OUT
    python -m tests.queues.load_children consume DATA QUEUE OUT

The producer publishes COUNT messages NAME-0, NAME-1 ... (sizes on both sides of the
4 KiB threshold, each body checkable on its own), one at a time, and appends each one's
id to OUT once it is confirmed; a publish that fails (the queue or a store restarting)
is sent again, as a real publisher would, and its id appended to OUT.resent (the first
attempt may have reached the queue: the message may then be there twice). The consumer acks every message it gets and
appends "id redelivered" to OUT; it runs until killed. Both print "ready" first.
"""

import hashlib
import sys
import time

from warren import connect
from warren.actors import ActorError
from warren.queues import QueueError

SIZES = (40, 900, 6000)


def body_of(message_id: str) -> bytes:
    n = int(message_id.rsplit("-", 1)[1])
    seed = hashlib.sha256(message_id.encode()).hexdigest().encode()
    return message_id.encode() + b":" + (seed * 200)[:SIZES[n % len(SIZES)]]


def checked_id(body: bytes) -> str:
    message_id = body.split(b":", 1)[0].decode()
    if body != body_of(message_id):
        raise AssertionError(f"body of {message_id} is damaged")
    return message_id


def produce(data_dir, queue, name, count, out_path):
    connection = connect(data_dir)
    print("ready", flush=True)
    with open(out_path, "a", buffering=1) as out, \
            open(out_path + ".resent", "a", buffering=1) as resent:
        for n in range(count):
            message_id = f"{name}-{n}"
            while True:
                try:
                    connection.publish(queue, body_of(message_id), timeout=30)
                    break
                except (QueueError, ActorError, TimeoutError):
                    resent.write(message_id + "\n")
                    time.sleep(0.05)
            out.write(message_id + "\n")


def consume(data_dir, queue, out_path):
    connection = connect(data_dir)
    print("ready", flush=True)
    with open(out_path, "a", buffering=1) as out:
        while True:
            try:
                delivery = connection.get(queue)
            except (QueueError, ActorError, TimeoutError):
                time.sleep(0.05)
                continue
            if delivery is None:
                time.sleep(0.01)
                continue
            out.write(f"{checked_id(delivery.body)} {int(delivery.redelivered)}\n")
            try:
                delivery.ack()
            except (QueueError, ActorError):
                pass                  # the queue restarted: it redelivers the message


if __name__ == "__main__":
    if sys.argv[1] == "produce":
        produce(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]), sys.argv[6])
    else:
        consume(sys.argv[2], sys.argv[3], sys.argv[4])
