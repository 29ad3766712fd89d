"""An actor's published figures: its last answer to a node's metrics question, kept in a
small shared file where the node reads it at a scrape without waking the actor.

A node's metrics ask each actor one FIGURES question (``ActorRef.figures_async``). Asking
is a round trip to another process, and a thousand of them cost a scrape far more than
the answers are worth when most actors did nothing since the last one. So the actor's
loop (``warren.actors._loop``) also keeps its answer here, and the node asks only the
actors whose answer may have changed since. One file per actor incarnation (of a class
whose ``figures_from_loop`` is true, on an ipc control socket), ``<hash>.fig`` next to its
control socket ``<hash>.ctl`` in the node's private runtime directory (``slot_path``),
``SLOT_BYTES`` long and sparse (a page of memory in use, or two). ``FiguresSlot`` writes it
with ``pwrite`` (the actor's loop, alone); ``SlotReader`` reads it (the node's metrics
thread, alone) through a shared mapping made once per incarnation that holds no file
descriptor (the node of a thousand queues holds thousands already). Both go through the
page cache, so what one writes the other sees.

Layout, little-endian (``HEADER``), then the answer::

    0   magic        8 bytes, MAGIC
    8   pid          u32, the writing process
    12  (unused)     u32
    16  incarnation  u64, the writing incarnation
    24  turned_at    f64, CLOCK_MONOTONIC seconds by which the loop will have turned
                     next at the latest, written before it polls (``STAMP_S`` apart at
                     least; an idle loop sleeps until something is due)
    32  dirty        u64, 0 while the published answer is the actor's answer now; set
                     before the loop handles anything that may change it
    40  seq          u64, answers published so far (0: none yet)
    48  length       u32, bytes of the answer
    52  crc          u32, CRC-32 of seq (8 bytes, little-endian) and the answer
    56  answer       msgpack of [counters, the answer to the question | None], then
                     msgpack of the process's usage ({"cpu_seconds", "rss_bytes"}), or
                     None when the request that it answered did not ask for it

Protocol. The writer publishes an answer in one write (``seq``, ``length``, ``crc`` and
the answer's bytes), then clears ``dirty``. ``mark_dirty`` sets it again before the
actor's next change. ``publish`` compares the counters and the answer (their msgpack
bytes) with those published last and, when they are the same, only clears ``dirty``: the
usage published with them (CPU seconds and RSS) stays that of the last publish, unless
the caller says ``always`` (an answer to a request that asked for the usage); then the
same figures are written again, with the new usage, while ``dirty`` stays clear. The reader takes an
answer only when ``magic``, ``pid`` and ``incarnation`` are the ref's, ``dirty`` is clear,
``seq`` is not 0, ``turned_at`` is no more than ``LIVE_S`` ago and the CRC holds; otherwise it says
None and the node asks the actor. It decodes an answer once per ``seq``.

Races, each with its answer:
- A read while the answer is rewritten (the writer does not wait for readers): the CRC,
  over the sequence number and the bytes, fails and the node asks; a read of the header
  before the rewrite began is the answer of that moment, whole.
- The actor changes after the reader saw ``dirty`` clear: what the reader took was the
  actor's answer when the read began, a snapshot like an answer to a request.
- A process killed or stopped: its loop stops turning, and ``LIVE_S`` past its last
  stamp (the turn it promised before its last poll) the reader says None; the node
  asks, and an actor that does not answer has no series. An actor the node's tree no
  longer runs is not read at all.
- A restarted incarnation: it makes a new file (a temporary name, sized, its header
  written, then renamed over the path: a new inode), so a mapping of the previous file
  never sees it shrink (no SIGBUS) and the reader, seeing another incarnation in its
  mapping, maps the path again. A file left by a killed incarnation stays until its
  successor replaces it or the runtime directory goes.
- An answer larger than the file, or one msgpack cannot hold, is not published: the
  actor stays dirty and is asked at every scrape.
- A write that fails (a full disk, where the file system must allocate to overwrite):
  the writer writes nothing more, stamps included, and removes its file; the reader
  asks ``LIVE_S`` past the loop's last stamp, and until then reads the
  last answer published. Writing through a mapping instead would kill the actor with a
  SIGBUS. The reader's mapping never faults: the file is never shrunk, and a hole in it
  reads as zeros.
- Memory order: the reader's loads are plain loads, the writer's writes plain copies in
  the kernel. On x86 they are seen in program order; elsewhere a reader may see
  ``dirty`` clear before the answer that goes with it, and then reads the previous
  answer whole, or a torn one that the CRC refuses.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import os
import struct
import zlib
from collections.abc import Callable
from typing import Any

import msgpack

from .process import LIBC

MAGIC = b"WRNFIG01"
HEADER = struct.Struct("<8sIIQdQQII")
SLOT_BYTES = 64 * 1024  # the file's size: the header and the largest answer published
STAMP_S = 0.25  # the loop stamps the file at most this often
LIVE_S = 2.5  # a loop silent this long past its stamp is not read: it is asked
_TURNED_AT = 24
_DIRTY = 32
_SEQ = 40  # seq, length and crc, then the answer: written at once
_DIRTY_FLAG = struct.Struct("<Q")
_TURN = struct.Struct("<d")
_PUBLISHED = struct.Struct("<QII")  # seq, length, crc
_SEQ_BYTES = struct.Struct("<Q")


LIBC.mmap.restype = ctypes.c_void_p
LIBC.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
LIBC.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


def slot_path(control: str) -> str | None:
    """The figures file of the actor whose control endpoint is ``control``; None for an
    endpoint that is not an ipc socket of a runtime directory (a tcp one)."""
    if not control.startswith("ipc://") or not control.endswith(".ctl"):
        return None
    return control.removeprefix("ipc://").removesuffix(".ctl") + ".fig"


class FiguresSlot:
    """The writing side, owned by one actor incarnation's loop; see the module docstring.
    It writes with ``pwrite``: a disk that cannot take a write is an error here (then
    the slot stops writing, stamps included, and the node asks), never a SIGBUS."""

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._inode = os.fstat(fd).st_ino
        self._seq = 0
        self._figures = b""  # msgpack of [counters, answer] last published
        self._broken = False
        self.dirty = True

    @classmethod
    def create(cls, control: str, incarnation: int, pid: int) -> FiguresSlot | None:
        """Make this incarnation's file (dirty, nothing published); None when there is no
        place for one (see ``slot_path``). OSError when it cannot be made."""
        path = slot_path(control)
        if path is None:
            return None
        temporary = f"{path}.{pid}.tmp"
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.ftruncate(fd, SLOT_BYTES)
            os.pwrite(fd, HEADER.pack(MAGIC, pid, 0, incarnation, 0.0, 1, 0, 0, 0), 0)
            os.replace(temporary, path)
        except OSError:
            os.close(fd)
            with contextlib.suppress(OSError):
                os.unlink(temporary)
            raise
        return cls(path, fd)

    def _write(self, data: bytes, offset: int) -> bool:
        if self._broken:
            return False
        try:
            os.pwrite(self._fd, data, offset)
        except OSError:
            self._broken = True  # no more stamps either: the node asks within LIVE_S
            self._unlink()
            return False
        return True

    def stamp(self, turned_by: float) -> None:
        """The loop will have turned again by ``turned_by`` (``time.monotonic()``)."""
        self._write(_TURN.pack(turned_by), _TURNED_AT)

    def mark_dirty(self) -> None:
        """The actor is about to handle something that may change its answer."""
        self.dirty = True
        self._write(_DIRTY_FLAG.pack(1), _DIRTY)

    def mark_clean(self) -> None:
        """The published answer was found to be the actor's answer still."""
        if self.dirty and self._write(_DIRTY_FLAG.pack(0), _DIRTY):
            self.dirty = False

    def publish(
        self, counters: Any, answer: Any, usage: Callable[[], Any], *, always: bool = False
    ) -> bool:
        """Keep ``[counters, answer, usage()]`` as the actor's answer now. When counters and
        answer are what was published last, only clear ``dirty`` (the usage published
        stays), unless ``always``. False, and still dirty, when the answer does not fit,
        msgpack cannot hold it or the file cannot be written."""
        try:
            figures = msgpack.packb([counters, answer], use_bin_type=True)
            if figures == self._figures and not always:
                self.mark_clean()
                return not self.dirty
            data = figures + msgpack.packb(usage(), use_bin_type=True)
        except (TypeError, ValueError, OverflowError):
            self.mark_dirty()
            return False
        if HEADER.size + len(data) > SLOT_BYTES:
            self.mark_dirty()
            return False
        # Dirty: nothing is read until the answer is whole. Clean: the figures are those
        # published already (only the usage is new), and a read of a half-written answer
        # fails its CRC.
        seq = self._seq + 1
        crc = zlib.crc32(data, zlib.crc32(_SEQ_BYTES.pack(seq)))
        if not self._write(_PUBLISHED.pack(seq, len(data), crc) + data, _SEQ):
            return False
        self._seq = seq
        self._figures = figures
        self.mark_clean()
        return not self.dirty

    def _unlink(self) -> None:
        """Remove the file, unless a successor's has replaced it."""
        with contextlib.suppress(OSError):
            if os.stat(self.path).st_ino == self._inode:
                os.unlink(self.path)

    def close(self) -> None:
        self._unlink()
        os.close(self._fd)


class _Mapping:
    """A read-only shared mapping of a whole file that holds no file descriptor (the
    ``mmap`` module keeps a duplicate of one per mapping, and a node maps a file per
    actor). ``view`` is the bytes; never used after ``close``."""

    def __init__(self, fd: int, size: int) -> None:
        address = LIBC.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if address is None or address == _MAP_FAILED:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code))
        self._address = address
        self._size = size
        self.view = (ctypes.c_char * size).from_address(address)

    def __len__(self) -> int:
        return self._size

    def read(self, offset: int, length: int) -> bytes:
        """A copy of ``length`` bytes at ``offset``, within the file."""
        assert self._address and 0 <= offset <= offset + length <= self._size
        return ctypes.string_at(self._address + offset, length)

    def close(self) -> None:
        if self._address:
            del self.view
            LIBC.munmap(self._address, self._size)
            self._address = 0


class SlotReader:
    """The reading side, owned by one thread of the node: a mapping per actor, made once
    per incarnation, and the last answer decoded from each; see the module docstring."""

    def __init__(self) -> None:
        self._maps: dict[str, tuple[int, _Mapping]] = {}  # control -> (incarnation, map)
        self._decoded: dict[str, tuple[int, int, list[Any]]] = {}  # control -> (inc, seq, answer)

    def read(self, control: str, pid: int, incarnation: int, now: float) -> tuple[int, list] | None:
        """``(seq, answer)`` published by that incarnation, when it is the actor's answer
        now and its loop's stamp is no more than ``LIVE_S`` before ``now``; else None
        (ask it)."""
        header = self._header(control, pid, incarnation)
        if header is None:
            return None
        map_, (_, _, _, _, turned_at, dirty, seq, length, crc) = header
        if dirty or not seq or now - turned_at > LIVE_S:
            return None
        decoded = self._decoded.get(control)
        if decoded is not None and decoded[0] == incarnation and decoded[1] == seq:
            return seq, decoded[2]
        if HEADER.size + length > len(map_):
            return None
        data = map_.read(HEADER.size, length)
        if zlib.crc32(data, zlib.crc32(_SEQ_BYTES.pack(seq))) != crc:
            return None
        unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
        unpacker.feed(data)
        try:
            figures, usage = unpacker.unpack(), unpacker.unpack()
        except (ValueError, TypeError, msgpack.UnpackException, msgpack.OutOfData):
            return None
        if not isinstance(figures, list) or len(figures) != 2:
            return None
        answer = [*figures, usage]
        self._decoded[control] = (incarnation, seq, answer)
        return seq, answer

    def _header(self, control: str, pid: int, incarnation: int) -> tuple[_Mapping, tuple] | None:
        """The mapping of that incarnation's file and its header; the path is mapped again
        when the mapping held is another incarnation's."""
        held = self._maps.get(control)
        if held is not None and held[0] == incarnation:
            header = HEADER.unpack_from(held[1].view, 0)
            if header[0] == MAGIC and header[1] == pid and header[3] == incarnation:
                return held[1], header
        map_ = self._map(control)
        if map_ is None:
            return None
        header = HEADER.unpack_from(map_.view, 0)
        if header[0] != MAGIC or header[1] != pid or header[3] != incarnation:
            map_.close()
            return None
        self._drop(control)
        self._maps[control] = (incarnation, map_)
        return map_, header

    @staticmethod
    def _map(control: str) -> _Mapping | None:
        path = slot_path(control)
        if path is None:
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None
        try:
            size = os.fstat(fd).st_size
            if size < HEADER.size:
                return None
            return _Mapping(fd, size)
        except OSError:
            return None
        finally:
            os.close(fd)

    def keep(self, controls: set[str]) -> None:
        """Unmap the files of every actor but these (those the tree runs now)."""
        for control in [c for c in self._maps if c not in controls]:
            self._drop(control)
        for control in [c for c in self._decoded if c not in controls]:
            del self._decoded[control]

    def _drop(self, control: str) -> None:
        held = self._maps.pop(control, None)
        if held is not None:
            held[1].close()

    def close(self) -> None:
        self.keep(set())
