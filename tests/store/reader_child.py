"""A reader process for the lock-table tests.

python -m tests.store.reader_child read DIR LOCATIONS SECONDS
    reads every record listed in LOCATIONS (lines "id_hex file offset size sha_hex")
    directly, again and again for SECONDS; prints "reading" once it has read them all
    once, then "direct fallback wrong".
python -m tests.store.reader_child hold DIR FILE stop|wait|fork
    takes the read lock of FILE's slot, prints "held" (with "fork", after forking a
    child that sleeps, prints "held CHILD_PID"), then stops itself (SIGSTOP) or waits
    to be killed.
"""

import hashlib
import os
import signal
import sys
import time

from warren.store.engine.lock_table import LockTableReader


def read_loop(directory: str, locations: str, seconds: float) -> None:
    reader = LockTableReader(directory)
    records = []
    with open(locations) as f:
        for line in f:
            id_hex, file, offset, size, sha = line.split()
            records.append((bytes.fromhex(id_hex), int(file), int(offset), int(size), sha))
    direct = fallback = wrong = passes = 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for msg_id, file, offset, size, sha in records:
            body = reader.read(file, offset, size, msg_id)
            if body is None:
                fallback += 1
            elif hashlib.sha256(body).hexdigest() == sha:
                direct += 1
            else:
                wrong += 1
        passes += 1
        if passes == 1:
            print("reading", flush=True)
    print(direct, fallback, wrong, flush=True)


def hold(directory: str, file: int, then: str) -> None:
    reader = LockTableReader(directory)
    reader._table()
    slot = file % reader._slot_count
    assert reader._acquire(slot)
    if then == "fork":
        child = os.fork()
        if child == 0:
            time.sleep(300)
            os._exit(0)
        print("held", child, flush=True)
    else:
        print("held", flush=True)
    if then == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(300)


if __name__ == "__main__":
    command, directory, *rest = sys.argv[1:]
    if command == "read":
        read_loop(directory, rest[0], float(rest[1]))
    else:
        hold(directory, int(rest[0]), rest[1])
