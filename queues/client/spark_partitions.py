"""Which partition of a super stream each row of a Spark write goes to: the partition its
``routing_key`` hashes to (``warren.queues.routing.partition_of``: MurmurHash3 with
RabbitMQ's seed, so a key lands where any client publishing it through the super
stream's exchange puts it), or, for a row without one, the task's own partition
(``Target.keyless_partition``: the Spark partition's index modulo the count, so a task
run again sends its rows where the first attempt did, and exactly once holds).

``key_partitions`` hashes a whole Arrow column at once with numpy, a few thousand rows
at a time (each row's key laid out in 32-bit words, padded with zeros to the slice's
longest key; a key over ``LONG_KEY_BYTES`` is hashed alone, so one long key does not
widen a whole slice): the per-row ``partition_of`` is the reference it is tested
against.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..routing import PARTITION_SEED, murmur3_32, partition_of

if TYPE_CHECKING:
    import numpy
    import pyarrow

__all__ = ["key_partitions", "row_partition"]

SLICE_ROWS = 16384  # rows hashed at a time (bounds the padded copy of their keys)
LONG_KEY_BYTES = 256  # longer keys are hashed one by one


def row_partition(key: str | bytes | None, partitions: int, keyless: int) -> int:
    """The partition of one row whose routing key is ``key`` (None: ``keyless``)."""
    return keyless if key is None else partition_of(key, partitions)


def key_partitions(keys: pyarrow.Array, partitions: int, keyless: int) -> numpy.ndarray:
    """Each row's partition (int64) for an Arrow string or binary column of routing keys;
    a null key is ``keyless``'s row."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    keys = keys.cast(pa.large_binary())
    out = np.empty(len(keys), dtype=np.int64)
    for start in range(0, len(keys), SLICE_ROWS):
        part = keys.slice(start, SLICE_ROWS)
        too_long = pc.fill_null(pc.greater(pc.binary_length(part), LONG_KEY_BYTES), False)
        long_rows = np.flatnonzero(too_long.to_numpy(zero_copy_only=False))
        if len(long_rows):  # hashed alone, below: an empty key in their place here
            part = pc.if_else(too_long, pa.scalar(b"", pa.large_binary()), part)
        hashes = (_murmur3(part) % np.uint32(partitions)).astype(np.int64)
        for row in long_rows.tolist():
            hashes[row] = murmur3_32(keys[start + row].as_py()) % partitions
        nulls = part.is_null().to_numpy(zero_copy_only=False)
        out[start : start + len(part)] = np.where(nulls, keyless, hashes)
    return out


def _murmur3(keys: pyarrow.Array) -> Any:
    """MurmurHash3 x86_32 of each key (``warren.queues.routing.murmur3_32``), vectorised."""
    import numpy as np

    count = len(keys)
    buffers = keys.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64, count=count + 1, offset=keys.offset * 8)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else None
    if data is None or not len(data):  # every key null or empty
        data = np.zeros(1, dtype=np.uint8)
    starts, lengths = offsets[:-1], np.diff(offsets)
    words = int(lengths.max(initial=0)) // 4 + 1  # whole blocks, and the tail's
    columns = np.arange(words * 4)
    inside = columns[None, :] < lengths[:, None]
    where = np.minimum(starts[:, None] + columns[None, :], max(len(data) - 1, 0))
    laid_out = np.where(inside, data[where], 0).astype(np.uint8)
    blocks = np.ascontiguousarray(laid_out).view("<u4").reshape(count, words)
    whole = lengths // 4
    has_tail = lengths % 4 != 0
    c1, c2 = np.uint32(0xCC9E2D51), np.uint32(0x1B873593)
    hash_ = np.full(count, PARTITION_SEED, dtype=np.uint32)
    with np.errstate(over="ignore"):
        for index in range(words):
            block = blocks[:, index] * c1
            block = ((block << np.uint32(15)) | (block >> np.uint32(17))) * c2
            mixed = hash_ ^ block
            mixed = ((mixed << np.uint32(13)) | (mixed >> np.uint32(19))) * np.uint32(5)
            mixed = mixed + np.uint32(0xE6546B64)
            tail = (index == whole) & has_tail
            hash_ = np.where(index < whole, mixed, np.where(tail, hash_ ^ block, hash_))
        hash_ ^= lengths.astype(np.uint32)
        hash_ ^= hash_ >> np.uint32(16)
        hash_ *= np.uint32(0x85EBCA6B)
        hash_ ^= hash_ >> np.uint32(13)
        hash_ *= np.uint32(0xC2B2AE35)
        hash_ ^= hash_ >> np.uint32(16)
    return hash_
