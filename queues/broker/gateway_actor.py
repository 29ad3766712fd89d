"""``GatewayActor``: an actor whose work runs on a gateway thread of its own (the tcp
listener, the AMQP port), started with the actor and stopped before it ends.

The actor's loop answers its supervisor while the gateway serves its sockets. A gateway
whose ``run`` fails ends the process (``EXIT_CRASHED``): a bug there must not leave a
process that accepts clients and never answers them, and its supervisor restarts it.
Both a clean stop (``on_stop``) and a crash (``on_failure``) stop the gateway (``stop``: it
leaves its loop soon after), wait up to ``GATEWAY_JOIN_S`` for its thread, then close it,
so that its sockets are closed by the thread that used them or, if it hangs, after it
had its time.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Protocol

from warren.actors import ProcessActor
from warren.actors.exitcodes import EXIT_CRASHED

log = logging.getLogger("warren.gateway")

GATEWAY_JOIN_S = 5.0


class Gateway(Protocol):
    def run(self) -> None:
        """Serve until ``stop``."""

    def stop(self) -> None:
        """Ask ``run`` to return soon (from another thread)."""

    def close(self) -> None:
        """Release what it holds, once ``run`` returned (or had its time)."""


class GatewayActor(ProcessActor):
    """An actor that runs a ``Gateway`` on a thread; see the module docstring."""

    _running: tuple[Gateway, threading.Thread] | None = None

    def start_gateway(self, gateway: Gateway, thread_name: str) -> None:
        thread = threading.Thread(
            target=_run_or_exit, args=(gateway, thread_name), name=thread_name, daemon=True
        )
        self._running = (gateway, thread)
        thread.start()

    def on_stop(self) -> None:
        self._stop_gateway()

    def on_failure(self, *exc_info: object) -> None:
        self._stop_gateway()

    def _stop_gateway(self) -> None:
        if self._running is None:
            return
        gateway, thread = self._running
        self._running = None
        gateway.stop()
        thread.join(timeout=GATEWAY_JOIN_S)
        gateway.close()


def _run_or_exit(gateway: Gateway, thread_name: str) -> None:
    try:
        gateway.run()
    except Exception:
        log.exception("%s: the gateway thread failed; exiting to be restarted", thread_name)
        os._exit(EXIT_CRASHED)
