"""Exit codes of actor processes, so that a ``Down`` says why an actor stopped.

A process killed by a signal has no exit code: its ``Down`` carries the signal number
instead (``Down.signal``), as ``waitpid`` reports it.
"""

import signal

# Stopped on request (a stop, a node close) after on_stop ran.
EXIT_NORMAL = 0
# An exception escaped on_receive/on_receive_batch for a tell, or on_stop; on_failure ran.
EXIT_CRASHED = 70
# The actor's constructor or on_start raised; spawn raised SpawnError in the caller.
EXIT_START_FAILED = 71
# The forkserver (and so the node) was gone when the actor process started or while it ran.
EXIT_PARENT_GONE = 72
# A linked actor died abnormally and this actor does not trap exits.
EXIT_LINKED = 73
# SIGTERM arrived (the second step of a stop after its graceful timeout); on_stop ran.
EXIT_TERMINATED = 74
# The actor stopped itself as a failure (``stop(abnormal=True)``); on_stop ran.
EXIT_STOPPED_ABNORMALLY = 75
# A forkserver's spare child refused what came down its order pipe (cut short, garbage, or
# not signed by the node) and ran nothing: the forkserver forks the order it handed that
# spare, if any, afresh (never reported to the node as an actor's exit).
EXIT_ORDER_REFUSED = 76

_NAMES = {
    EXIT_NORMAL: "normal",
    EXIT_CRASHED: "crashed",
    EXIT_START_FAILED: "start failed",
    EXIT_PARENT_GONE: "parent gone",
    EXIT_LINKED: "linked actor died",
    EXIT_TERMINATED: "terminated",
    EXIT_STOPPED_ABNORMALLY: "stopped abnormally",
    EXIT_ORDER_REFUSED: "order refused",
}


def describe(exitcode: int | None, signal_number: int | None) -> str:
    """A short human reason: ``"normal"``, ``"crashed (exit 70)"``, ``"exit 3"``,
    ``"killed by SIGKILL"``."""
    if signal_number is not None:
        try:
            return f"killed by {signal.Signals(signal_number).name}"
        except ValueError:
            return f"killed by signal {signal_number}"
    if exitcode is None:
        return "no such process"
    if exitcode == EXIT_NORMAL:
        return _NAMES[EXIT_NORMAL]
    name = _NAMES.get(exitcode)
    return f"{name} (exit {exitcode})" if name else f"exit {exitcode}"
