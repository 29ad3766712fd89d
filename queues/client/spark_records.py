"""A Spark read's columns, and how a stream's chunks become them: the ``warren`` data
source's reading half (``spark_read``) plans and fetches; this turns each answer's chunks
into one Arrow batch, on the executor that fetched them.

Columns (``schema``): ``offset`` (long), ``timestamp`` (when the stream wrote the record's
chunk), ``body`` (binary), ``routing_key`` (the ``x-routing-key`` header, RabbitMQ's name
for it in a stream: a stream keeps messages, not the key they were routed by),
``headers``, ``message_id``, ``properties`` (a struct of what the publisher set, null when
it set none: its ``message_id``, ``correlation_id``, ``content_type``,
``content_encoding``, ``reply_to``, ``expiration`` (milliseconds, as text),
``timestamp``, ``priority``, ``type``, ``app_id`` and ``user_id``) and ``stream`` (the
stream the record is of, as a query may read several). ``headers`` is a map of string to
string (a value other than text as its text: JSON for numbers and booleans), or, with
option ``includeHeaders``, Kafka's lossless ``array<struct<key: string, value: binary>>``
in the order published (bytes as published, text as UTF-8, other values as their text).
A message published over AMQP (the node's AMQP port) has them from its AMQP properties,
its AMQP headers in ``headers`` and, without an ``x-routing-key`` header, the key it was
published with in ``routing_key``; one of Warren's client, its message id and expiration
(the client's own clock stamp is not a property its publisher set: the ``timestamp``
column is when the stream wrote it).

Every chunk is checked here, its CRC and then its framing (``stream_log.check_chunk``,
then the entries): bytes damaged anywhere between the disk and the task fail the task. A
chunk whose records are all messages without properties (what Spark's writer and
``publish_many`` store) is never split into Python objects: numpy finds each body's
place in the chunk's bytes, exactly (``_plain_spans``), and Arrow copies the bodies out
in one call; any other chunk is decoded record by record (``decode``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..engine.stream_log import SIMPLE_ENTRY_HEADER_BYTES
from ..message import Message, decode, encode

if TYPE_CHECKING:
    import pyarrow

__all__ = ["COLUMNS", "PROPERTY_FIELDS", "ROUTING_KEY_HEADER", "record_batch", "schema"]

# The properties struct's fields: a publisher's AMQP properties, by their AMQP names
PROPERTY_FIELDS = (
    ("message_id", "string"),
    ("correlation_id", "string"),
    ("content_type", "string"),
    ("content_encoding", "string"),
    ("reply_to", "string"),
    ("expiration", "string"),
    ("timestamp", "timestamp"),
    ("priority", "int"),
    ("type", "string"),
    ("app_id", "string"),
    ("user_id", "string"),
)
COLUMNS = (
    "offset",
    "timestamp",
    "body",
    "routing_key",
    "headers",
    "message_id",
    "properties",
    "stream",
)
ROUTING_KEY_HEADER = "x-routing-key"


def schema(include_headers: bool = False) -> str:
    """The read's columns as Spark's DDL: ``headers`` a map of string to string, or with
    ``include_headers`` Kafka's list of (key, binary value) pairs."""
    headers = (
        "array<struct<key: string, value: binary>>" if include_headers else ("map<string,string>")
    )
    return (
        f"offset long, timestamp timestamp, body binary, routing_key string, "
        f"headers {headers}, message_id string, properties struct<"
        + ", ".join(f"{name}: {kind}" for name, kind in PROPERTY_FIELDS)
        + ">, stream string"
    )


def record_batch(
    chunks: Sequence[bytes],
    start: int,
    end: int,
    where: str,
    stream: str = "",
    include_headers: bool = False,
) -> pyarrow.RecordBatch:
    """The records of ``chunks`` (whole chunks as they travelled, each checked here: its
    CRC, then its framing) whose offsets are in ``[start, end)``, of ``stream``, in the
    columns ``schema(include_headers)`` names. A chunk whose records
    are all messages without properties has its bodies found by numpy and gathered by
    Arrow straight from its bytes (``_plain_spans``); any other is decoded record by
    record."""
    import numpy as np
    import pyarrow as pa

    from ..engine.stream_log import check_chunk, entry_bodies  # the format; no file opened

    offsets: list[Any] = []  # numpy arrays, one a chunk
    stamps: list[Any] = []
    bodies: list[Any] = []  # Arrow arrays, one a chunk
    properties: list[tuple[int, list | None]] = []  # (rows, [_Described] or None)
    for raw in chunks:
        header = check_chunk(raw, where)
        first = header.chunk_id
        low, high = max(0, start - first), min(header.record_count, end - first)
        spans = _plain_spans(raw, header)
        payloads = None
        if spans is None:  # its framing is checked, read or not
            data = raw[header.data_position : header.data_position + header.data_bytes]
            payloads = entry_bodies(header, data, f"{where} (chunk {first})")
        if low >= high:
            continue
        offsets.append(np.arange(first + low, first + high, dtype=np.int64))
        stamps.append(np.full(high - low, header.timestamp_ms * 1000, dtype=np.int64))
        if payloads is None:
            assert spans is not None
            bodies.append(_gather(raw, spans[0][low:high], spans[1][low:high]))
            properties.append((high - low, None))
        else:
            chunk_bodies, chunk_properties = _decoded(payloads[low:high])
            bodies.append(pa.array(chunk_bodies, pa.binary()))
            properties.append((high - low, chunk_properties))
    rows = sum(count for count, _ in properties)
    columns = [
        pa.array(np.concatenate(offsets) if offsets else [], pa.int64()),
        pa.array(np.concatenate(stamps) if stamps else [], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")
        ),
        pa.concat_arrays([body.cast(pa.binary()) for body in bodies])
        if bodies
        else pa.array([], pa.binary()),
    ]
    headers_type = (
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
        if include_headers
        else pa.map_(pa.string(), pa.string())
    )
    types = [pa.string(), headers_type, pa.string(), _properties_type()]
    if all(found is None for _, found in properties):
        columns += [pa.nulls(rows, kind) for kind in types]
    else:
        nothing = (None, None, None, None)
        listed = [
            values
            for count, found in properties
            for values in (found if found is not None else [nothing] * count)
        ]
        shown = _binary_pairs if include_headers else _text_pairs
        columns += [
            pa.array([shown(values[1]) if i == 1 else values[i] for values in listed], kind)
            for i, kind in enumerate(types)
        ]
    columns.append(pa.repeat(stream, rows))
    return pa.RecordBatch.from_arrays(columns, names=list(COLUMNS))


def _properties_type() -> Any:
    import pyarrow as pa

    kinds = {"string": pa.string(), "int": pa.int32(), "timestamp": pa.timestamp("us", tz="UTC")}
    return pa.struct([(name, kinds[kind]) for name, kind in PROPERTY_FIELDS])


# A record's routing key, headers (name, value as published), message id and properties
_Described = tuple[str | None, list[tuple[str, object]] | None, str | None, dict | None]


def _text_pairs(headers: list[tuple[str, object]] | None) -> list[tuple[str, str | None]] | None:
    """Headers as the map<string,string> column holds them."""
    return None if headers is None else [(name, _text(value)) for name, value in headers]


def _binary_pairs(headers: list[tuple[str, object]] | None) -> list[dict[str, Any]] | None:
    """Headers as includeHeaders' list of (key, value) holds them, Kafka's shape: bytes
    as published, text as UTF-8, any other value as its text in UTF-8."""
    if headers is None:
        return None
    return [
        {
            "key": name,
            "value": value
            if value is None or isinstance(value, bytes)
            else (value if isinstance(value, str) else _text(value) or "").encode(),
        }
        for name, value in headers
    ]


def _decoded(payloads: list[bytes]) -> tuple[list[bytes], list[_Described]]:
    """Each record's body and what describes it (``_Described``), record by record."""
    bodies: list[bytes] = []
    described: list[_Described] = []
    for payload in payloads:
        body = _plain_body(payload)
        if body is not None:
            bodies.append(body)
            described.append((None, None, None, None))
            continue
        message = decode(payload)
        bodies.append(message.body)
        headers = dict(message.headers or {})
        key: object = headers.get(ROUTING_KEY_HEADER)
        properties: dict[str, Any] = {
            "message_id": message.message_id,
            "content_type": message.content_type,
            "expiration": None if message.expiration_ms is None else str(message.expiration_ms),
        }
        if message.amqp is not None:
            published = _amqp_published(message.amqp)
            if published is not None:
                amqp_key, amqp_properties, amqp_headers = published
                key = amqp_key if key is None else key
                properties.update(amqp_properties)
                headers.update(amqp_headers)
        described.append(
            (
                None if key is None else _text(key),
                list(headers.items()) if headers else None,
                properties["message_id"],
                properties if any(v is not None for v in properties.values()) else None,
            )
        )
    return bodies, described


def _amqp_published(amqp: bytes) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """The routing key, properties (``PROPERTY_FIELDS``'s, those set) and headers of a
    message published over AMQP; None when its kept publish does not read."""
    from ..amqp.frames import AmqpError, read_properties  # pamqp, only where needed
    from ..amqp_envelope import split

    parts = split(amqp)
    if parts is None:
        return None
    _, routing_key, properties = parts
    names = tuple(name for name, _ in PROPERTY_FIELDS) + ("headers",)
    try:
        found = read_properties(properties, names)
    except AmqpError:
        return None
    headers = found.pop("headers") or {}
    return (
        routing_key[1:].decode("utf-8", "backslashreplace"),
        {name: value for name, value in found.items() if value is not None},
        headers,
    )


def _plain_spans(raw: bytes, header: Any) -> tuple[Any, Any] | None:
    """Where each record's body starts and ends in ``raw`` (numpy arrays), when every
    record of the chunk is one simple entry holding a message without properties (what
    Spark's writer and ``publish_many`` send); None otherwise, and the chunk is decoded
    record by record.

    Exact, not a guess: the candidates are the bytes where a message without properties
    starts (``_PLAIN_START``, then nil, nil, nil, a nil or uint64 timestamp, nil and a
    bool); they are kept only when they chain as the framing does (the first entry at the
    data's start, each entry ending where the next candidate's entry begins, the last at
    the data's end, as many as the header's records), which only the real entries do,
    and when each body's msgpack bin header gives the size its entry leaves for it. A
    body that happens to hold such bytes breaks the chain, and the chunk is decoded."""
    import numpy as np

    count = header.record_count
    if count == 0 or header.entry_count != count:  # sub-batches: decoded
        return None
    size = header.data_bytes
    data = np.frombuffer(raw, np.uint8, size, header.data_position)
    starts = np.flatnonzero(data == _PLAIN_START >> 32)
    if len(starts) < count:
        return None
    # the data and zeros after it, seen as the big-endian u64 (and u32) at every byte: a
    # read near the end sees zeros, which fail the checks below
    padded = np.zeros(size + 32, np.uint8)
    padded[:size] = data
    words = np.ndarray((size + 25,), ">u8", padded, 0, (1,))
    quads = np.ndarray((size + 29,), ">u4", padded, 0, (1,))
    starts = starts[starts >= SIMPLE_ENTRY_HEADER_BYTES]
    first = words[starts]
    kept = first >> 24 == _PLAIN_START
    starts, first = starts[kept], first[kept]
    if len(starts) != count:
        return None
    stamped = (first >> 16 & 0xFF == _UINT64) & (first >> 8 & 0x80 == 0)  # below 2**63
    if stamped.any():
        stamped &= words[starts + 8] & 0xFFFF | 1 == _NIL << 8 | _TRUE
    if not (stamped | (first & 0xFFFFFF | 1 == _NIL << 16 | _NIL << 8 | _TRUE)).all():
        return None
    ends = starts + quads[starts - SIMPLE_ENTRY_HEADER_BYTES].astype(np.int64)
    if (
        starts[0] != SIMPLE_ENTRY_HEADER_BYTES
        or ends[-1] != size
        or not np.array_equal(ends[:-1], starts[1:] - SIMPLE_ENTRY_HEADER_BYTES)
    ):
        return None
    markers = starts + np.where(stamped, 16, 8)  # the body's bin header
    head = words[markers]
    kind = head >> 56
    if (kind == 0xC4).all():  # bin 8, every one: the common case
        sizes = (head >> 48 & 0xFF).astype(np.int64)
        bodies = markers + 2
    else:
        width = np.where(kind == 0xC4, 1, np.where(kind == 0xC5, 2, np.where(kind == 0xC6, 4, 0)))
        if not width.all():
            return None
        bits = (8 * width).astype(np.uint64)
        sizes = (head >> (np.uint64(56) - bits) & (np.uint64(1) << bits) - np.uint64(1)).astype(
            np.int64
        )
        bodies = markers + 1 + width
    if not np.array_equal(bodies + sizes, ends):
        return None
    return bodies + header.data_position, ends + header.data_position


def _gather(raw: bytes, starts: Any, ends: Any) -> pyarrow.Array:
    """The bytes ``raw[starts[i]:ends[i]]`` of each i as one binary array: ``raw`` seen
    as the array (gap, body, gap, body, ...) whose odd values Arrow copies out."""
    import numpy as np
    import pyarrow as pa

    count = len(starts)
    large = len(raw) >= 2**31
    index = np.int64 if large else np.int32
    bounds = np.zeros(2 * count + 1, index)
    bounds[1::2] = starts
    bounds[2::2] = ends
    both = pa.Array.from_buffers(
        pa.large_binary() if large else pa.binary(),
        2 * count,
        [None, pa.py_buffer(bounds), pa.py_buffer(raw)],
    )
    return both.take(pa.array(np.arange(1, 2 * count, 2, dtype=index)))


# A message with a body and no property (what Spark's writer sends, persistent or not)
# encodes as one of these 8 bytes, then msgpack's bin 8, 16 or 32 header and the body.
_PLAIN_PREFIXES = frozenset(encode(Message(b"", persistent=p))[:8] for p in (True, False))
_BIN_HEADER_BYTES = {0xC4: 2, 0xC5: 3, 0xC6: 5}
# msgpack: an array of 8, the format version 1, then nil (message id), nil (headers),
# nil (expiration): how a message without properties starts, stamped or not (5 bytes)
_PLAIN_START = int.from_bytes(encode(Message(b"", timestamp_ms=0))[:5])
_NIL, _TRUE, _UINT64 = 0xC0, 0xC3, 0xCF


def _plain_body(payload: bytes) -> bytes | None:
    """The body of a message with no property, read without unpacking it (a third of
    ``decode``'s cost); None for any other message, or one whose length is wrong (which
    ``decode`` then refuses)."""
    if payload[:8] not in _PLAIN_PREFIXES or len(payload) < 10:
        return None
    header = _BIN_HEADER_BYTES.get(payload[8])
    if header is None or int.from_bytes(payload[9 : 8 + header]) != len(payload) - 8 - header:
        return None
    return payload[8 + header :]


def _text(value: object) -> str | None:
    """A header value as the map<string,string> column holds it."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, (bool, int, float)):
        return json.dumps(value)
    return json.dumps(value, default=_json_default)


def _json_default(value: object) -> str:
    """What a header value JSON has no type for becomes in its text: bytes decoded, an
    AMQP table's decimal or timestamp as Python writes it."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    return str(value)
