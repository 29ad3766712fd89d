"""A writer process for the store-actor benchmark (not a benchmark itself).

    python -m bench.store_writer REF_JSON BODY_BYTES COUNT IN_FLIGHT

Waits for a line on stdin, writes COUNT messages through a StoreClient with IN_FLIGHT
writes in flight, and prints JSON: seconds, and the confirm latency of every batch
(from the batch's first write to its settlement) in milliseconds.
"""

import json
import os
import sys
import time

from warren.actors import ActorRef
from warren.store.client import StoreClient


def main() -> None:
    ref = ActorRef(**json.loads(sys.argv[1]))
    size, count, in_flight = map(int, sys.argv[2:5])
    batch = min(800, max(1, in_flight // 4))
    started_at: dict[int, float] = {}
    latencies: list[float] = []
    next_first = [0]  # batches settle in order: each starts after the last

    def settled(s) -> None:
        latencies.append((time.perf_counter() - started_at.pop(next_first[0])) * 1000)
        next_first[0] = s.up_to_seq + 1

    client = StoreClient(ref, on_settled=settled, batch_messages=batch, max_in_flight=in_flight)
    body = os.urandom(size)
    ids = [os.urandom(16) for _ in range(count)]
    print("ready", flush=True)
    sys.stdin.readline()
    begin = time.perf_counter()
    for msg_id in ids:
        starts_batch = client.batched == 0
        now = time.perf_counter()
        seq = client.write(msg_id, body)
        if starts_batch:
            started_at[seq] = now
    client.settle()
    seconds = time.perf_counter() - begin
    client.terminate()
    print(json.dumps({"seconds": seconds, "latencies_ms": latencies}), flush=True)


if __name__ == "__main__":
    main()
