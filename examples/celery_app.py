"""A Celery app on Warren's AMQP port, unchanged from what would run on RabbitMQ.

    .venv/bin/warren node --data-dir /tmp/warren-celery --amqp 127.0.0.1:5672 &
    .venv/bin/celery --app examples.celery_app worker --loglevel INFO &
    .venv/bin/python examples/celery_app.py

(the two background commands from the repository's root; stop each with Ctrl-C or kill
when done). The last command sends the work and prints what came back: tasks whose
results it waits for, one that fails twice and is retried with a countdown, one sent
with a countdown and one with an ETA, and a chord (ten additions, then their sum).

Warren is the broker: task messages go to the durable queue ``celery`` as persistent
messages, published with confirms (``confirm_publish``), so a task that was sent is on
disk. The worker acknowledges a task once it has run (``task_acks_late``), one at a time
(prefetch 1): a worker or a node killed mid-task has the task delivered again, flagged
redelivered. Celery's at-least-once promise; each task here records its runs in a
ledger (one line per run: task id, redelivered flag) so that a test can check it.

Results go to an SQLite file through Celery's database backend, not to the broker: the
rpc backend cannot hold a chord's parts (Celery refuses chords on it), and a result kept
outside the broker outlives a kill of the node. Settings come from the environment:
``WARREN_AMQP_URL`` (default ``amqp://guest:guest@127.0.0.1:5672//``),
``CELERY_RESULTS`` (the SQLite file, default ``celery-results.sqlite`` in the working
directory) and ``CELERY_LEDGER`` (the ledger file, default ``celery-ledger.txt``).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime, timedelta

from celery import Celery, chord

BROKER_URL = os.environ.get("WARREN_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
RESULTS = os.path.abspath(os.environ.get("CELERY_RESULTS", "celery-results.sqlite"))
LEDGER = os.path.abspath(os.environ.get("CELERY_LEDGER", "celery-ledger.txt"))

# Task names are given: the worker imports this file as examples.celery_app, the sender
# runs it as __main__, and both must call the tasks by one name.
app = Celery("warren_example", broker=BROKER_URL, backend=f"db+sqlite:///{RESULTS}")
app.conf.update(
    task_acks_late=True,  # acknowledged once run: a kill mid-task means it runs again
    task_reject_on_worker_lost=True,
    worker_prefetch_multiplier=1,
    broker_transport_options={"confirm_publish": True},  # sent means on Warren's disk
    broker_connection_retry_on_startup=True,
    broker_connection_max_retries=None,  # a worker waits out a node restart
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    result_extended=True,
)


def _record(task_id: str, redelivered: bool) -> None:
    """One line per run in the ledger, appended in one write (runs of several worker
    processes interleave whole lines)."""
    line = f"{task_id} {'redelivered' if redelivered else 'first'}\n".encode()
    fd = os.open(LEDGER, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


@app.task(bind=True, name="warren_example.add")
def add(self, x: int, y: int, pause_s: float = 0.0) -> int:
    """``x + y``, after ``pause_s`` (a task that takes a while, to be killed during)."""
    time.sleep(pause_s)
    _record(self.request.id, bool((self.request.delivery_info or {}).get("redelivered")))
    return x + y


@app.task(bind=True, name="warren_example.total")
def total(self, numbers: list[int]) -> int:
    """The chord's body: the sum of its parts' results."""
    _record(self.request.id, bool((self.request.delivery_info or {}).get("redelivered")))
    return sum(numbers)


@app.task(bind=True, name="warren_example.flaky", max_retries=5)
def flaky(self, failures: int) -> int:
    """Fails its first ``failures`` runs, each retried after a one-second countdown;
    returns the number of tries it took."""
    _record(self.request.id, bool((self.request.delivery_info or {}).get("redelivered")))
    if self.request.retries < failures:
        raise self.retry(countdown=1, exc=RuntimeError(f"try {self.request.retries + 1} fails"))
    return self.request.retries + 1


def main() -> int:
    started = time.monotonic()
    sums = [add.delay(n, n) for n in range(10)]
    retried = flaky.delay(2)
    later = add.apply_async((20, 22), countdown=2)
    at = add.apply_async((1, 1), eta=datetime.now(UTC) + timedelta(seconds=3))
    summed = chord(add.s(n, 1) for n in range(10))(total.s())
    print(f"sent 13 tasks and a chord to {BROKER_URL}; waiting for a worker's results")
    print("additions:", [result.get(timeout=120) for result in sums])
    print("flaky task, tries it took:", retried.get(timeout=120))
    print("countdown 2 s:", later.get(timeout=120), "| ETA in 3 s:", at.get(timeout=120))
    print("chord (n + 1 for n < 10, summed):", summed.get(timeout=120))
    print(f"done in {time.monotonic() - started:.1f} s; each run is a line of {LEDGER}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
