"""Embedding Warren's actor runtime: two actors in their own processes, a kill, a monitor.

Run it from the repository root::

    .venv/bin/python examples/embed_actors.py

What it shows, in order: an application defines a ``Ledger`` actor (keeps balances) and a
``Teller`` actor (takes deposits and books them in the ledger it is given a ref to),
spawns both as OS processes, talks to them with tell, tell_many, ask and ask_async,
shows that a message an actor does not handle is refused (``UnhandledMessage``: the error
of an ask; a tell is logged and counted, never a crash), kills the ledger with SIGKILL,
sees the ``Down`` from its monitor (and the teller's own monitor), restarts it at the
same address and uses the old ref again.

Like multiprocessing, the runtime imports this script in its forkserver (to find the
actor classes), so everything that runs belongs under ``if __name__ == "__main__"``.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass
from typing import Any

from warren.actors import ActorRef, Down, Node, ProcessActor, UnhandledMessage, message


@message
@dataclass(frozen=True)
class Deposit:
    account: str
    amount: int


class Ledger(ProcessActor):
    """Keeps balances; a batch of deposits is booked in one go."""

    def __init__(self) -> None:
        self.balances: dict[str, int] = {}

    def on_receive_batch(self, messages: list[Any]) -> None:
        for deposit in messages:
            balance = self.balances.get(deposit.account, 0)
            self.balances[deposit.account] = balance + deposit.amount

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Deposit):
            self.on_receive_batch([message])
            return self.balances[message.account]
        if message == "balances":
            return dict(self.balances)
        raise UnhandledMessage(f"the ledger does not understand {message!r}")


class Teller(ProcessActor):
    """Books deposits in the ledger it was given, and watches that ledger."""

    def __init__(self, ledger: ActorRef) -> None:
        self.ledger = ledger
        self.notices: list[str] = []

    def on_start(self) -> None:
        self.monitor(self.ledger)

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, Down):
            self.notices.append(f"ledger pid {message.ref.pid}: {message.reason}")
            return None
        if message == "notices":
            return self.notices
        match message:
            case (str(account), int(amount)):
                self.ledger.tell(Deposit(account, amount))
                return "booked"
        raise UnhandledMessage(f"a teller takes (account, amount), not {message!r}")


def main() -> None:
    with Node("bank") as node:
        ledger = node.spawn(Ledger, name="ledger")
        teller = node.spawn(Teller, ledger, name="teller")
        print(f"spawned {ledger!r}\n        {teller!r}")

        print("teller:", teller.ask(("alice", 10)))
        ledger.tell_many([Deposit("bob", n) for n in range(1, 101)])
        print("balances:", ledger.ask("balances"))
        future = ledger.ask_async(Deposit("carol", 7))
        print("carol after her deposit:", future.get(timeout=5))
        try:
            ledger.ask("audit")
        except UnhandledMessage as error:
            print("the ledger refused:", error)
        teller.tell("a stray message")
        answer = teller.ask(("dave", 1))  # after the stray tell, in its mailbox
        print(
            f"a stray tell is logged and counted, not a crash: the teller answers "
            f"{answer!r}, unhandled = {teller.stats()['unhandled']}"
        )

        monitor = node.monitor(ledger)
        os.kill(ledger.pid, signal.SIGKILL)
        down = monitor.wait(timeout=5)
        print(f"monitor fired: {down.ref.name} {down.reason}")

        restarted = node.restart(ledger)
        print(f"restarted as incarnation {restarted.incarnation}, pid {restarted.pid}")
        print("old ref works again, state starts afresh:", ledger.ask("balances"))
        print("the teller saw it too:", teller.ask("notices"))
    print("node closed: no process of it is left")


if __name__ == "__main__":
    main()
