"""A small application tested by Warren's crash-recovery harness: a ledger that must never
lose a deposit it acknowledged.

    .venv/bin/python examples/chaos_ledger.py             # 20 s of faults, then the check
    .venv/bin/python examples/chaos_ledger.py --broken    # a ledger that answers first

The application is two actors under the node's ``app_sup``:

- ``ledger`` appends each deposit (``["deposit", number, cents]``) to ``ledger.log`` in its
  directory and fdatasyncs it, then answers;
- ``teller`` makes deposits one after another and, for each one answered, appends a
  receipt to ``receipts.log`` (fdatasync'd as well). A teller that restarts goes on from
  its last receipt.

The invariant (``check``): every receipted deposit is in the ledger. A deposit in the
ledger without a receipt is fine (the teller died before writing it).

``--broken`` runs ``HastyLedger`` instead: it answers at once and writes its deposits to
disk in batches a little later, as a cache in front of a database would. Killing it
loses deposits it already acknowledged, and the harness reports them.

The same run from a test, with the ``warren_chaos`` fixture that ``pip install warren-mq``
adds to pytest (see ``tests/supervisor/chaos/test_harness.py``)::

    def test_the_ledger_never_loses_a_deposit(warren_chaos):
        report = warren_chaos.run("examples.chaos_ledger:children", check=check,
                                  kinds=("kill", "node"), patterns=("ledger", "teller"),
                                  duration_s=10, seed=7)
        assert report["ok"], warren_chaos.text(report)

Run from the repository's root (the node imports ``examples.chaos_ledger``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from warren.actors import ActorError, ProcessActor, UnhandledMessage  # noqa: E402  (the path above only makes examples.* importable, for a node's forkserver; warren comes from the install)
from warren.supervisor import ChildSpec  # noqa: E402

LEDGER, RECEIPTS = "ledger.log", "receipts.log"
APP_DIR = "ledger-app"  # in the node's data directory
ASK_TIMEOUT_S = 2.0
HASTY_FLUSH_S = 0.5


def _append(fd: int, line: str) -> None:
    os.write(fd, line.encode())
    os.fdatasync(fd)


class Ledger(ProcessActor):
    """Writes a deposit durably, then answers."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.fd = os.open(
            os.path.join(directory, LEDGER), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644
        )

    def on_receive(self, message):
        if isinstance(message, list) and len(message) == 3 and message[0] == "deposit":
            self.record(message[1], message[2])
            return "ok"
        raise UnhandledMessage(f"unknown request {message!r}")

    def record(self, number: int, cents: int) -> None:
        _append(self.fd, f"{number} {cents}\n")

    def on_stop(self) -> None:
        os.close(self.fd)


class HastyLedger(Ledger):
    """The bug: answers first, writes later (every ``HASTY_FLUSH_S``)."""

    def __init__(self, directory: str) -> None:
        super().__init__(directory)
        self.pending: list[str] = []

    def on_start(self) -> None:
        self.call_later(HASTY_FLUSH_S, self.flush)

    def record(self, number: int, cents: int) -> None:
        self.pending.append(f"{number} {cents}\n")

    def flush(self) -> None:
        if self.pending:
            _append(self.fd, "".join(self.pending))
            self.pending.clear()
        self.call_later(HASTY_FLUSH_S, self.flush)


class Teller(ProcessActor):
    """Deposits 1, 2, 3 ... cents, one at a time, receipting each answered one."""

    def __init__(self, directory: str) -> None:
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, RECEIPTS)
        self.next = max((int(line) for line in _lines(path)), default=0) + 1
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def on_start(self) -> None:
        self.call_later(0, self.deposit)

    def deposit(self) -> None:
        ledger = self.whereis("ledger")
        try:
            if ledger is None:
                raise ActorError("no ledger yet")
            ledger.ask(["deposit", self.next, self.next], timeout=ASK_TIMEOUT_S)
        except (ActorError, TimeoutError):
            self.call_later(0.05, self.deposit)  # restarting: try the same one again
            return
        _append(self.fd, f"{self.next}\n")
        self.next += 1
        self.call_later(0, self.deposit)

    def on_receive(self, message):
        raise UnhandledMessage(f"the teller takes no requests, got {message!r}")

    def on_stop(self) -> None:
        os.close(self.fd)


def _lines(path: str) -> list[str]:
    try:
        with open(path) as file:
            return [line for line in file.read().split("\n")[:-1] if line]
    except FileNotFoundError:
        return []


def _tree(data_dir: str, ledger: type[Ledger]) -> tuple[ChildSpec, ...]:
    directory = os.path.join(data_dir, APP_DIR)
    return (ChildSpec("ledger", ledger, (directory,)), ChildSpec("teller", Teller, (directory,)))


def children(data_dir: str) -> tuple[ChildSpec, ...]:
    """The application's tree (``warren node --children examples.chaos_ledger:children``)."""
    return _tree(data_dir, Ledger)


def broken_children(data_dir: str) -> tuple[ChildSpec, ...]:
    return _tree(data_dir, HastyLedger)


def check(data_dir: str) -> list[str]:
    """Every receipted deposit is in the ledger; the ones that are not."""
    directory = os.path.join(data_dir, APP_DIR)
    ledger = {int(line.split()[0]) for line in _lines(os.path.join(directory, LEDGER))}
    receipts = [int(line) for line in _lines(os.path.join(directory, RECEIPTS))]
    if not receipts:
        return ["the teller never got a deposit acknowledged"]
    missing = [n for n in receipts if n not in ledger]
    return [f"deposit {n} was acknowledged but is not in the ledger" for n in missing]


def deposits(data_dir: str) -> dict[str, int]:
    """What the throughput plot shows: deposits receipted so far."""
    return {"confirmed": len(_lines(os.path.join(data_dir, APP_DIR, RECEIPTS)))}


def main() -> int:
    from warren.supervisor.chaos.report import format_report
    from warren.supervisor.chaos.tree import run_tree

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--broken", action="store_true", help="run the hasty ledger")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--duration", type=float, default=20.0)
    parser.add_argument("--report", help="a directory for report.json and the plot")
    args = parser.parse_args()
    os.chdir(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory(prefix="warren-ledger-") as tmp:
        report = run_tree(
            os.path.join(tmp, "data"),
            f"examples.chaos_ledger:{'broken_children' if args.broken else 'children'}",
            kinds=("kill", "node"),
            patterns=("ledger", "teller"),
            duration_s=args.duration,
            seed=args.seed,
            check=check,
            sample=deposits,
            report_dir=args.report,
        )
    print(format_report(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
