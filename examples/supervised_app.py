"""An application's own actors under a supervision tree: one is killed and comes back.

    .venv/bin/python examples/supervised_app.py

A ticket counter and a greeter run as processes under a one_for_one supervisor inside a
Warren node. The counter is killed with SIGKILL; the supervisor restarts it (a new process,
the same address, so the ref the application holds still works) and the greeter is left
alone. Then the whole node stops, children in reverse order.

With ``--serve`` the node then stays up as a service would, until SIGTERM, SIGINT (Ctrl-C)
or SIGHUP, and stops in order (``Node.run_until_signalled``).
"""

from __future__ import annotations

import os
import signal
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from warren.actors import ProcessActor, UnhandledMessage  # noqa: E402  (the path above only makes examples.* importable, for a node's forkserver; warren comes from the install)
from warren.supervisor import ChildSpec, Node  # noqa: E402


class TicketCounter(ProcessActor):
    """Hands out ticket numbers; its count lives in memory, so a restart starts over."""

    def __init__(self) -> None:
        self.next_ticket = 1

    def on_receive(self, message):
        if message == "ticket":
            ticket, self.next_ticket = self.next_ticket, self.next_ticket + 1
            return ticket
        if message == "pid":
            return os.getpid()
        raise UnhandledMessage(f"unknown request {message!r}")


class Greeter(ProcessActor):
    def on_receive(self, message):
        if message == "pid":
            return os.getpid()
        return f"hello, {message}"


def wait_for_restart(node: Node, child: str, old_pid: int) -> dict:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        row = next(c for c in node.app.which_children() if c["id"] == child)
        if row["pid"] != old_pid and row["state"] == "running":
            return row
        time.sleep(0.01)
    raise SystemExit(f"{child} was not restarted")


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="warren-app-") as data_dir:
        children = (ChildSpec("ticket_counter", TicketCounter), ChildSpec("greeter", Greeter))
        with Node(data_dir, children=children) as node:
            counter = node.actors.whereis("ticket_counter")
            greeter = node.actors.whereis("greeter")
            print("tickets:", [counter.ask("ticket") for _ in range(3)])
            print("greeter says:", greeter.ask("world"))
            counter_pid, greeter_pid = counter.ask("pid"), greeter.ask("pid")

            print(f"killing the ticket counter (pid {counter_pid}) with SIGKILL ...")
            started = time.monotonic()
            os.kill(counter_pid, signal.SIGKILL)
            row = wait_for_restart(node, "ticket_counter", counter_pid)
            print(
                f"restarted as pid {row['pid']} (incarnation {row['incarnation']}) in "
                f"{(time.monotonic() - started) * 1000:.0f} ms; restarts: {row['restarts']}"
            )
            print("the same ref reaches it; its count started over:", counter.ask("ticket"))
            print(f"the greeter was left alone: pid {greeter.ask('pid')} (was {greeter_pid})")
            if "--serve" in sys.argv:
                print(f"serving until a signal: kill -TERM {os.getpid()}, or Ctrl-C", flush=True)
                signum = node.run_until_signalled()
                print(
                    "stopped in order on",
                    signal.Signals(signum).name if signum else "the root supervisor's failure",
                )
        print("node stopped: every process of the tree has exited")


if __name__ == "__main__":
    main()
