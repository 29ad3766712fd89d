"""A queue publishing until it is killed: ``python -m tests.queues.queue_child ROOT``.

Over in-process stores in ROOT, it publishes persistent messages of mixed sizes (with
some transient ones and some fetches and acks between), syncs every 50 publishes and
appends the numbers each sync confirmed to ROOT/confirmed, one per line, flushed: what
the parent may expect back after it SIGKILLs this process.
"""

import os
import sys

from warren.queues import VariableQueue
from warren.store import LocalStoreClient, MessageStore

from .helpers import message

root = sys.argv[1]
persistent = MessageStore(os.path.join(root, "msg_store_persistent"))
transient = MessageStore(os.path.join(root, "msg_store_transient"))
queue = VariableQueue(
    os.path.join(root, "queues", "q"),
    segment_entry_count=16,
    io_batch_size=8,
    persistent_store=lambda ref: LocalStoreClient(persistent, ref),
    transient_store=lambda ref: LocalStoreClient(transient, ref),
)
queue.set_ram_duration_target(0)
numbers = {}
with open(os.path.join(root, "confirmed"), "a", buffering=1) as confirmed:
    print("ready", flush=True)
    n = 0
    while True:
        persistent_message = n % 5 != 0
        seq_id = queue.publish(
            message(n, size=(10, 300, 6000)[n % 3], persistent=persistent_message)
        )
        if persistent_message:
            numbers[seq_id] = n
        n += 1
        if n % 50 == 0:
            for seq_id in queue.sync():
                if seq_id in numbers:
                    confirmed.write(f"{numbers.pop(seq_id)}\n")
