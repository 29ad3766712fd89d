"""Reading a stream's segment files as they lie on disk, without its writer: what
``warren stream inspect`` prints (``inspect_stream``) and what ``warren chaos --cluster``
compares between the copies of a replicated stream (``chunk_checksums``).

Both only read: no lock is taken and nothing is repaired (a writer's open does that), so
they may run beside the stream's writer. Races: a chunk being appended meanwhile is either
whole in the file as read (its header and its data both there) or left out; a segment
deleted by retention between the listing and its open is skipped. The format is
``warren.queues.engine.stream_log``'s.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import NamedTuple

from .stream_log import (
    CHUNK_USER,
    FILE_HEADER_BYTES,
    SEGMENT_SUFFIX,
    numbered_files,
    segment_file_name,
    verified_data,
    walk_chunks,
)

__all__ = ["SegmentReport", "chunk_checksums", "inspect_stream"]


class SegmentReport(NamedTuple):
    """What ``inspect_stream`` found in one segment file."""

    first_offset: int
    size_bytes: int
    user_chunks: int
    tracking_chunks: int
    records: int  # in user chunks
    first_timestamp_ms: int | None
    last_timestamp_ms: int | None
    bad_crc_chunks: list[int]  # chunk ids whose data fails its CRC
    unreadable_tail_bytes: int  # after the last whole chunk: torn, or not a chunk
    epochs: list[int]  # the epochs its chunks were written in, each once, in order


def inspect_stream(directory: str | os.PathLike[str]) -> list[SegmentReport]:
    """Walk every segment of a stream directory, checking every chunk's CRC."""
    reports = []
    for first, fd in _segments(directory):
        try:
            size = os.fstat(fd).st_size
            user = tracking = records = 0
            stamps: list[int] = []
            bad: list[int] = []
            epochs: list[int] = []
            end = FILE_HEADER_BYTES
            for header in walk_chunks(fd, size, first):
                end = header.end
                if not epochs or epochs[-1] != header.epoch:
                    epochs.append(header.epoch)
                stamps.append(header.timestamp_ms)
                if header.chunk_type == CHUNK_USER:
                    user, records = user + 1, records + header.record_count
                else:
                    tracking += 1
                if verified_data(fd, header) is None:
                    bad.append(header.chunk_id)
        finally:
            os.close(fd)
        reports.append(
            SegmentReport(
                first,
                size,
                user,
                tracking,
                records,
                min(stamps) if stamps else None,
                max(stamps) if stamps else None,
                bad,
                max(0, size - end),
                epochs,
            )
        )
    return reports


def chunk_checksums(directory: str | os.PathLike[str]) -> dict[int, int]:
    """Every whole chunk of the stream's segments: its id and the CRC its header gives
    (of its data: two copies of a chunk with equal CRCs, ids and sizes hold the same
    records), the data checked against it (-1 where it fails)."""
    checksums = {}
    for first, fd in _segments(directory):
        try:
            for header in walk_chunks(fd, os.fstat(fd).st_size, first):
                checksums[header.chunk_id] = (
                    header.data_crc if verified_data(fd, header) is not None else -1
                )
        finally:
            os.close(fd)
    return checksums


def _segments(directory: str | os.PathLike[str]) -> Iterator[tuple[int, int]]:
    """Each segment's first offset and a descriptor open on it (the caller closes it)."""
    for first in numbered_files(os.fspath(directory), SEGMENT_SUFFIX):
        try:
            fd = os.open(os.path.join(directory, segment_file_name(first)), os.O_RDONLY)
        except FileNotFoundError:
            continue  # deleted by retention since the listing
        yield first, fd
