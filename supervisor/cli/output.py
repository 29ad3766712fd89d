"""What ``warren consume`` needs to ack only what was really written out, and to stop on a
signal without losing an ack.

``Output.write(data)`` writes and flushes one message; ``taken`` is how many of the bytes
written its reader has *taken*:
- a file or a terminal has taken them once write(2) returned (after the flush);
- a pipe has taken them once the reader has read them: what is still in the pipe is what
  Linux reports for FIONREAD, so the bytes taken are those written less that count. A
  pipe holds up to 64 KiB the reader may never read (``warren consume q | head -3``: head
  exits after its third line), and acking a message that only reached the pipe would
  lose it. The consume loop keeps writing while the reader reads (a pipe's worth ahead)
  and acks each batch of messages whose last byte was taken (``wait_taken``): a message
  is never acked before it was read, and the reader is never waited for one message at a
  time (that round trip per message held a pipe to 2,000 messages a second).
- with ``checked=False`` (a stream read without a name: nothing is acked, nothing
  stored) a pipe counts as taken too: only a reader that went away ends the run.

The races: the reader may exit while bytes wait in the pipe (POLLERR on our end: those
bytes not taken), or before the write (EPIPE, which Python raises as BrokenPipeError: not
taken); a stop signal while the reader is slow (what it did not read goes back to the
queue). A write never blocks on a full pipe: it first waits, watching the signals, for
room (a message larger than the pipe waits for the pipe to be empty, then blocks while
the reader reads it). Once the reader is gone, stdout is pointed at /dev/null so that the
interpreter's own flush at exit does not print a BrokenPipeError.

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
from collections.abc import Callable, Iterator
from types import FrameType, TracebackType
from typing import BinaryIO

__all__ = ["Output", "StopSignals", "Stopped"]

DRAIN_POLL_MS = 10  # at most this long between looks whether a pipe's reader took more
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
    """A binary stream written one message at a time, knowing how much its reader took."""

    def __init__(self, stream: BinaryIO, stop: StopSignals, *, checked: bool = True) -> None:
        self._stream = stream
        self._fd = stream.fileno()
        self._stop = stop
        self._is_pipe = checked and stat.S_ISFIFO(os.fstat(self._fd).st_mode)
        self._capacity = fcntl.fcntl(self._fd, fcntl.F_GETPIPE_SZ) if self._is_pipe else 0
        self.written = 0  # bytes written and flushed
        self.reader_gone = False
        self._taken_when_gone = 0

    @property
    def taken(self) -> int:
        """How many of the bytes written the reader has taken (see the module)."""
        if self.reader_gone:
            return self._taken_when_gone
        return self.written - _unread(self._fd) if self._is_pipe else self.written

    def write(self, data: bytes) -> bool:
        """Write and flush ``data``; False when it was not written (the reader went away,
        or a stop signal came while the pipe had no room for it)."""
        if self.reader_gone:
            return False
        if self._is_pipe and not self._wait(lambda: self._room_for(len(data))):
            return False
        try:
            self._stream.write(data)
            self._stream.flush()
        except BrokenPipeError:
            self._gone()
            return False
        self.written += len(data)
        return True

    def wait_taken(self, position: int) -> bool:
        """Wait until the reader has taken the bytes up to ``position``; False when it
        went away first, or a stop signal came (one last look decides)."""
        return self._wait(lambda: self.taken >= position)

    def _room_for(self, size: int) -> bool:
        if self.reader_gone:
            return False
        unread = _unread(self._fd)
        return unread == 0 or unread + size <= self._capacity

    def _wait(self, ready: Callable[[], bool]) -> bool:
        poller = select.poll()
        poller.register(self._fd, select.POLLERR)
        pause_ms = 0  # a reader that keeps up is looked at again at once, a slow one less
        while not ready():
            if self.reader_gone:
                return False
            pause_ms = min(DRAIN_POLL_MS, 2 * pause_ms or 1)
            if poller.poll(pause_ms):  # POLLERR: the read end is closed
                # It may have read everything before it went (head reads its last line,
                # then exits): what it took stays taken, the rest is not.
                self._gone()
                return ready()
            if self._stop.received is not None:
                return ready()  # one last look: it may have read while the poll waited
        return True

    def _gone(self) -> None:
        self._taken_when_gone = self.taken  # while stdout is still the pipe
        self.reader_gone = True
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, self._fd)
        os.close(null)


def _unread(fd: int) -> int:
    """Bytes written to the pipe ``fd`` and not yet read from it."""
    return int(struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0])
