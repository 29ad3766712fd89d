"""A consumer in its own process: ``python -m tests.queues.consumer_child DATA QUEUE N``.

Connects to the node on DATA with ``warren.connect``, takes N deliveries of QUEUE without
acking them, prints their bodies (one line, space-separated) and then waits to be killed.
"""

import sys
import time

from warren import connect

if __name__ == "__main__":
    data_dir, queue, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
    connection = connect(data_dir)
    taken = []
    with connection.consume(queue, prefetch=count) as consumer:
        while len(taken) < count:
            taken.append(next(consumer).body.decode())
        print(" ".join(taken), flush=True)
        time.sleep(3600)
