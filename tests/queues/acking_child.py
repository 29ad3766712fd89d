"""A consumer that acks on command: ``python -m tests.queues.acking_child TARGET QUEUE N``.

Connects to the node at TARGET (a data directory or a tcp url), takes N deliveries of
QUEUE, prints their bodies (one line, space-separated), then reads ``ack K`` from stdin,
acks the first K deliveries (each a separate ack, sent without waiting), gives its
sockets a moment to hand them to the kernel, prints ``acked`` and waits to be killed.
"""

import sys
import time

from warren import connect

HAND_OVER_S = 1.0  # ample for this process's I/O thread to write the acks out, loaded or not

if __name__ == "__main__":
    target, queue, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    connection = connect(target)
    consumer = connection.consume(queue, prefetch=count)
    taken = [next(consumer) for _ in range(count)]
    print(" ".join(d.body.decode() for d in taken), flush=True)
    command, acks = sys.stdin.readline().split()
    assert command == "ack", command
    for delivery in taken[: int(acks)]:
        delivery.ack()
    time.sleep(HAND_OVER_S)
    print("acked", flush=True)
    time.sleep(3600)
