"""What ``warren consume`` needs to ack only what was really written out, and to stop on a
signal without losing an ack.

``Output.write(data)`` writes and flushes, and returns whether the data was *taken*:
- a file or a terminal has taken it once write(2) returned (after the flush);
- a pipe has taken it once the reader has read it: the bytes still in the pipe are what
  Linux reports for FIONREAD, so ``write`` waits for that count to reach 0. A pipe holds
  up to 64 KiB the reader may never read (``warren consume q | head -3``: head exits after
  its third line), and acking a message that only reached the pipe would lose it.
The races: the reader may exit while bytes wait in the pipe (POLLERR on our end: not
taken), or before the write (EPIPE, which Python raises as BrokenPipeError: not taken);
a stop signal while the reader is slow (not taken: it goes back to the queue). Once the
reader is gone, stdout is pointed at /dev/null so that the interpreter's own flush at exit
does not print a BrokenPipeError.

``StopSignals`` turns SIGINT, SIGTERM and SIGHUP into a flag the consume loop checks
between messages, so the loop ends where it stands, the acks it made are sent and the
connection hands back the rest; the caller exits 130, as an interrupted node does.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import stat
import struct
import termios
from collections.abc import Iterator
from types import FrameType, TracebackType
from typing import BinaryIO

__all__ = ["Output", "StopSignals", "Stopped"]

DRAIN_POLL_MS = 10  # how often a write to a pipe looks whether its reader took it
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """Raised by ``StopSignals(interrupt=True)`` where a stop signal arrived."""


class StopSignals:
    """A context in which SIGINT, SIGTERM and SIGHUP set ``received`` instead of
    stopping the process; inside ``interrupting()`` (a read of stdin waiting for the next
    line, say) they also raise ``Stopped`` where the process stands. Elsewhere the caller
    checks ``stop_if_received()`` between steps, so a publish waiting for its confirm is
    never cut off in doubt. The previous handlers come back on exit."""

    def __init__(self) -> None:
        self.received: int | None = None
        self._interruptible = False
        self._previous: dict[int, object] = {}

    def _note(self, number: int, frame: FrameType | None) -> None:
        self.received = number
        if self._interruptible:
            raise Stopped(signal.Signals(number).name)

    def stop_if_received(self) -> None:
        if self.received is not None:
            raise Stopped(signal.Signals(self.received).name)

    @contextlib.contextmanager
    def interrupting(self) -> Iterator[None]:
        self.stop_if_received()
        self._interruptible = True
        try:
            yield
        finally:
            self._interruptible = False

    def __enter__(self) -> StopSignals:
        for number in _STOP_SIGNALS:
            self._previous[number] = signal.signal(number, self._note)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)  # type: ignore[arg-type]  # as signal() gave it


class Output:
    """A binary stream written one message at a time, each known taken or not."""

    def __init__(self, stream: BinaryIO, stop: StopSignals) -> None:
        self._stream = stream
        self._fd = stream.fileno()
        self._stop = stop
        self._is_pipe = stat.S_ISFIFO(os.fstat(self._fd).st_mode)
        self.reader_gone = False

    def write(self, data: bytes) -> bool:
        """Write and flush ``data``; whether its reader took it (see the module)."""
        if self.reader_gone:
            return False
        try:
            self._stream.write(data)
            self._stream.flush()
        except BrokenPipeError:
            self._gone()
            return False
        return self._taken() if self._is_pipe else True

    def _taken(self) -> bool:
        poller = select.poll()
        poller.register(self._fd, select.POLLERR)
        while _unread(self._fd) > 0:
            if poller.poll(DRAIN_POLL_MS):  # POLLERR: the read end is closed
                # It may have read everything before it went (head reads its last line,
                # then exits): taken, and the next write finds it gone.
                taken = _unread(self._fd) == 0
                self._gone()
                return taken
            if self._stop.received is not None:
                # one last look: the reader may have taken it while the poll waited
                return _unread(self._fd) == 0
        return True

    def _gone(self) -> None:
        self.reader_gone = True
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._fd)
        os.close(null)


def _unread(fd: int) -> int:
    """Bytes written to the pipe ``fd`` and not yet read from it."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
