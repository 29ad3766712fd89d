"""The clean-shutdown files: the index, the file summary and the clean marker.

A clean stop writes all three (each to a temporary name, fsynced, renamed; the directory
fsynced at the end), the marker last, so that its presence vouches for the other two. The
next start loads them and deletes them before serving anything, so a crash after that
start is a dirty start next time. Any file missing, short, with a bad magic, version or
checksum, or a marker whose recorded checksums do not match the files beside it, makes
the start dirty: an empty or damaged marker never means "clean and empty".

Format of each file (little-endian): magic (8 bytes) · version u32 · payload length u64
· CRC-32 of the payload u32 · payload. Payloads:

- index: count u64 · count msg_ids (16 bytes each) · count u64 low words · count u64 high
  words of the packed index values (see ``warren.store.engine.index``; the index keys ids as ints);
- file summary: count u64 · count × (file u64, valid_total_size u64, file_size u64), in
  ascending file order (the last one is the current file);
- marker: CRC of the index payload u32 · CRC of the summary payload u32 · client count
  u32 · per client: length u16 · bytes.

Nothing here is pickle: loading these files never runs code.
"""

from __future__ import annotations

import os
import struct
import sys
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from isal.isal_zlib import crc32

from .. import replicated_io
from .index import ADOPTABLE
from .records import data_file_name

INDEX_FILE = "index.snapshot"
SUMMARY_FILE = "file_summary.snapshot"
MARKER_FILE = "clean.marker"
FILES = (INDEX_FILE, SUMMARY_FILE, MARKER_FILE)

_VERSION = 1
_PREAMBLE = struct.Struct("<8sIQI")
_MAGIC = {INDEX_FILE: b"WRNINDEX", SUMMARY_FILE: b"WRNSUMRY", MARKER_FILE: b"WRNCLEAN"}
_SUMMARY_ENTRY = struct.Struct("<QQQ")
_LOW_WORD = (1 << 64) - 1
_LOW_WORD_NOT_ADOPTABLE = _LOW_WORD & ~ADOPTABLE


class SnapshotInvalid(Exception):
    """A snapshot file is missing or damaged; the start must be dirty."""


@dataclass(frozen=True)
class Snapshot:
    index: dict[int, int]
    summary: list[tuple[int, int, int]]  # (file, valid_total_size, file_size)
    clients: frozenset[bytes]


def _little_endian_words(values: Iterable[int]) -> bytes:
    words = array("Q", values)
    if sys.byteorder == "big":
        words.byteswap()
    return words.tobytes()


def _words_from(data: bytes) -> array[int]:
    words = array("Q")
    words.frombytes(data)
    if sys.byteorder == "big":
        words.byteswap()
    return words


def _encode_index(index: dict[int, int]) -> bytes:
    values = index.values()
    return b"".join(
        (
            struct.pack("<Q", len(index)),
            b"".join(key.to_bytes(16, "big") for key in index),
            # An adoption window never outlives the process that opened it.
            _little_endian_words(v & _LOW_WORD_NOT_ADOPTABLE for v in values),
            _little_endian_words(v >> 64 for v in values),
        )
    )


def _decode_index(payload: bytes) -> dict[int, int]:
    (count,) = struct.unpack_from("<Q", payload)
    ids_end = 8 + 16 * count
    if len(payload) != ids_end + 16 * count:
        raise SnapshotInvalid("index snapshot has the wrong length")
    keys = [int.from_bytes(payload[i : i + 16], "big") for i in range(8, ids_end, 16)]
    lows = _words_from(payload[ids_end : ids_end + 8 * count])
    highs = _words_from(payload[ids_end + 8 * count :])
    # The length check above makes all three hold ``count`` items.
    values = [low | (high << 64) for low, high in zip(lows, highs, strict=True)]
    return dict(zip(keys, values, strict=True))


def _encode_summary(summary: list[tuple[int, int, int]]) -> bytes:
    return struct.pack("<Q", len(summary)) + b"".join(
        _SUMMARY_ENTRY.pack(*entry) for entry in summary
    )


def _decode_summary(payload: bytes) -> list[tuple[int, int, int]]:
    (count,) = struct.unpack_from("<Q", payload)
    if len(payload) != 8 + count * _SUMMARY_ENTRY.size:
        raise SnapshotInvalid("file summary snapshot has the wrong length")
    return list(_SUMMARY_ENTRY.iter_unpack(payload[8:]))


def _encode_marker(index_crc: int, summary_crc: int, clients: frozenset[bytes]) -> bytes:
    parts = [struct.pack("<III", index_crc, summary_crc, len(clients))]
    for client in sorted(clients):
        parts.append(struct.pack("<H", len(client)) + client)
    return b"".join(parts)


def _decode_marker(payload: bytes) -> tuple[int, int, frozenset[bytes]]:
    index_crc, summary_crc, count = struct.unpack_from("<III", payload)
    pos, clients = 12, []
    for _ in range(count):
        (length,) = struct.unpack_from("<H", payload, pos)
        clients.append(payload[pos + 2 : pos + 2 + length])
        pos += 2 + length
    if pos != len(payload):
        raise SnapshotInvalid("clean marker has the wrong length")
    return index_crc, summary_crc, frozenset(clients)


def _write_file(dir_fd: int, name: str, payload: bytes) -> int:
    crc = crc32(payload)
    temp = name + ".tmp"
    fd = replicated_io.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dir_fd)
    try:
        view = memoryview(_PREAMBLE.pack(_MAGIC[name], _VERSION, len(payload), crc) + payload)
        while view:
            view = view[replicated_io.write(fd, view) :]
        replicated_io.fsync(fd)
    finally:
        os.close(fd)
    replicated_io.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    return crc


def _read_file(dir_fd: int, name: str) -> tuple[bytes, int]:
    try:
        fd = os.open(name, os.O_RDONLY, dir_fd=dir_fd)
    except FileNotFoundError:
        raise SnapshotInvalid(f"{name} is missing") from None
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    if len(data) < _PREAMBLE.size:
        raise SnapshotInvalid(f"{name} is short ({len(data)} bytes)")
    magic, version, length, crc = _PREAMBLE.unpack_from(data)
    payload = data[_PREAMBLE.size :]
    if magic != _MAGIC[name] or version != _VERSION:
        raise SnapshotInvalid(f"{name} has magic {magic!r} version {version}")
    if len(payload) != length or crc32(payload) != crc:
        raise SnapshotInvalid(f"{name} fails its length or checksum")
    return payload, crc


def write(
    dir_fd: int,
    index: dict[int, int],
    summary: list[tuple[int, int, int]],
    clients: frozenset[bytes],
) -> None:
    """Write the three files, the marker last, and fsync the directory."""
    index_crc = _write_file(dir_fd, INDEX_FILE, _encode_index(index))
    summary_crc = _write_file(dir_fd, SUMMARY_FILE, _encode_summary(summary))
    _write_file(dir_fd, MARKER_FILE, _encode_marker(index_crc, summary_crc, clients))
    replicated_io.fsync(dir_fd)


def read(dir_fd: int) -> Snapshot:
    """Load the three files without changing anything; SnapshotInvalid if unusable."""
    marker, _ = _read_file(dir_fd, MARKER_FILE)
    try:
        index_crc, summary_crc, clients = _decode_marker(marker)
        index_payload, found_index_crc = _read_file(dir_fd, INDEX_FILE)
        summary_payload, found_summary_crc = _read_file(dir_fd, SUMMARY_FILE)
        if (found_index_crc, found_summary_crc) != (index_crc, summary_crc):
            raise SnapshotInvalid("index or summary is not the one the marker vouches for")
        return Snapshot(_decode_index(index_payload), _decode_summary(summary_payload), clients)
    except struct.error as exc:
        raise SnapshotInvalid(f"snapshot does not parse: {exc}") from None


def mismatch(saved: Snapshot, dir_fd: int, files: list[int]) -> str | None:
    """Why ``saved`` does not describe the data files on disk now; None if it does."""
    if [entry[0] for entry in saved.summary] != files:
        return "data files differ from the clean shutdown"
    for file, _valid, size in saved.summary:
        if os.stat(data_file_name(file), dir_fd=dir_fd).st_size != size:
            return f"{data_file_name(file)} changed size since the clean shutdown"
    return None


def present(dir_fd: int) -> list[str]:
    """Which of the three files exist."""
    names = set(os.listdir(dir_fd))
    return [name for name in FILES if name in names]


def delete(dir_fd: int) -> bool:
    """Delete whatever snapshot files exist (temporary ones too); True if any did."""
    deleted = False
    for name in os.listdir(dir_fd):
        if name in FILES or (name.endswith(".tmp") and name[:-4] in FILES):
            replicated_io.unlink(name, dir_fd=dir_fd)
            deleted = True
    return deleted
