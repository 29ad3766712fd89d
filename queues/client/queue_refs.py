"""Asking one incarnation of a queue's process, as every part of a connection does: the
answer to an ask, while looking whether the incarnation still lives (a plain process
cannot monitor it), the channel a thread sends on, and whether a queue is a stream.

The race it guards against: a queue killed while an ask waits for its answer. The ask
died with it; the wait looks every ``RESTART_CHECK_S`` whether the process is gone or
another incarnation answers at its address, and says so (``ActorDeadError``) rather than
waiting out the whole timeout. A wait no longer than that look (a caller that waits in
short slices, as ``warren publish`` does) would never reach it: at its end, a process that
is gone is said so too (a cheap look, no ping), not a timeout after which the answer "may
still come". An incarnation found gone is remembered (the last ``GONE_REMEMBERED``), so
that the other asks waiting on it end at once: a producer with thousands of single
publishes in flight to a killed queue would otherwise learn of it one look, a second,
per publish.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

from warren.actors import ActorDeadError, ActorError, ActorRef, AskTimeout
from warren.actors.process import process_exists

from ..protocol import STREAM_ACTOR_PREFIX, QueueRef
from .tcp_node import RemoteQueue

__all__ = [
    "RESTART_CHECK_S",
    "await_answer",
    "is_stream_ref",
    "known_gone",
    "process_gone",
    "sender",
]

RESTART_CHECK_S = 1.0  # how often a wait looks whether its queue restarted
GONE_REMEMBERED = 1024  # incarnations known gone, kept to end other waits on them at once
# (address, incarnation, pid): a pid is never an earlier node's incarnation at one address
_gone: collections.OrderedDict[tuple[str, int, int], None] = collections.OrderedDict()
_gone_lock = threading.Lock()


def await_answer(
    ref: QueueRef,
    future: Any,
    timeout: float | None,
    on_wait: Callable[[], None] | None = None,
) -> Any:
    """``future``'s answer. A plain process cannot monitor the queue, so while it waits it
    looks, every ``RESTART_CHECK_S``, whether the incarnation ``ref`` names still lives:
    ``ActorDeadError`` once its process is gone or another incarnation answers at its
    address (the request died with it); ``TimeoutError`` after ``timeout``. ``on_wait``
    is called at each of those looks (it may raise, to give the wait up)."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        if known_gone(ref):
            raise ActorDeadError(f"{ref.name} incarnation {ref.incarnation} is gone")
        wait = (
            RESTART_CHECK_S
            if deadline is None
            else max(0.0, min(RESTART_CHECK_S, deadline - time.monotonic()))
        )
        try:
            return future.get(timeout=wait)
        except AskTimeout:
            if deadline is not None and time.monotonic() >= deadline:
                if isinstance(ref, ActorRef) and process_gone(ref):
                    raise ActorDeadError(
                        f"{ref.name} incarnation {ref.incarnation} is gone"
                    ) from None
                raise TimeoutError(f"{ref.name} did not answer within {timeout} s") from None
            if on_wait is not None:
                on_wait()
            if not _alive(ref, future):
                _remember_gone(ref)
                raise ActorDeadError(f"{ref.name} incarnation {ref.incarnation} is gone") from None


def process_gone(ref: ActorRef) -> bool:
    """Whether the process of the incarnation ``ref`` names (on this machine) has ended;
    remembered, so that every wait on it ends at once."""
    if process_exists(ref.pid):
        return False
    _remember_gone(ref)
    return True


def known_gone(ref: QueueRef) -> bool:
    """Whether this process found the incarnation ``ref`` names gone."""
    if not isinstance(ref, ActorRef):
        return False  # behind a listener, whose node looks for itself
    with _gone_lock:
        return (ref.address, ref.incarnation, ref.pid) in _gone


def _remember_gone(ref: QueueRef) -> None:
    if not isinstance(ref, ActorRef):
        return
    with _gone_lock:
        _gone[(ref.address, ref.incarnation, ref.pid)] = None
        while len(_gone) > GONE_REMEMBERED:
            _gone.popitem(last=False)


def _alive(ref: QueueRef, future: Any) -> bool:
    if isinstance(ref, RemoteQueue):
        return ref.alive(future)  # the listener looks, on the node's machine
    assert isinstance(ref, ActorRef), "a queue ref is an ActorRef or a RemoteQueue"
    if not process_exists(ref.pid):  # the node runs on this machine
        return False
    try:
        return ref.unpin().ping(timeout=RESTART_CHECK_S).incarnation == ref.incarnation
    except ActorError:
        return True  # busy, or between incarnations: wait on


def sender(ref: QueueRef) -> Any:
    """The channel this thread sends to ``ref`` on (None for a queue behind a listener,
    whose connection has one socket whichever thread sends)."""
    return ref.channel() if isinstance(ref, ActorRef) else None


def is_stream_ref(ref: QueueRef) -> bool:
    if isinstance(ref, RemoteQueue):
        return ref.stream
    return ref.name.startswith(STREAM_ACTOR_PREFIX)
