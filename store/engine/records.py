"""The ``.rdq`` record: RabbitMQ's message store format, byte for byte.

A record is ``size:u64 big-endian`` (= 16 + len(body)) · ``msg_id:16 bytes`` · ``body`` ·
``0xFF``; it occupies ``len(body) + 25`` bytes on disk. Files are ``0.rdq``, ``1.rdq`` ...
(lower numbers are older) with no header and no checksum: a record is valid when its size
field fits the file, its trailer is 0xFF and, where the reader knows which id it expects,
the id matches. Every reader validates; a failed check is never returned as data.
"""

from __future__ import annotations

import re
import struct

from ..errors import InvalidBody, InvalidMessageId

MSG_ID_BYTES = 16
SIZE_FIELD = struct.Struct(">Q")
HEADER = struct.Struct(">Q16s")
HEADER_BYTES = HEADER.size  # 24: size field + msg_id
OK_MARKER = 0xFF
RECORD_OVERHEAD = HEADER_BYTES + 1  # 25 bytes besides the body
MAX_BODY_BYTES = 2**36 - RECORD_OVERHEAD - 1  # what the packed index can address
FILE_SUFFIX = ".rdq"
TEMP_SUFFIX = ".rdt"
_DATA_FILE = re.compile(r"^(0|[1-9][0-9]*)\.rdq$")


def check_msg_id(msg_id: object) -> bytes:
    """Return ``msg_id`` as bytes, or raise InvalidMessageId."""
    if isinstance(msg_id, (bytes, bytearray, memoryview)) and len(msg_id) == MSG_ID_BYTES:
        return bytes(msg_id)
    if isinstance(msg_id, (bytes, bytearray, memoryview)):
        raise InvalidMessageId(f"msg_id must be {MSG_ID_BYTES} bytes, got {len(msg_id)} bytes")
    raise InvalidMessageId(f"msg_id must be {MSG_ID_BYTES} bytes, got {type(msg_id).__name__}")


def check_body(body: object) -> bytes:
    """Return ``body`` as bytes, or raise InvalidBody."""
    if not isinstance(body, (bytes, bytearray, memoryview)):
        raise InvalidBody(f"message body must be bytes, got {type(body).__name__}")
    if len(body) > MAX_BODY_BYTES:
        raise InvalidBody(f"message body of {len(body)} bytes exceeds {MAX_BODY_BYTES}")
    return bytes(body)


def encode_record(msg_id: bytes, body: bytes) -> bytes:
    """The on-disk bytes of one record."""
    return HEADER.pack(MSG_ID_BYTES + len(body), msg_id) + body + b"\xff"


def data_file_name(file: int) -> str:
    return f"{file}{FILE_SUFFIX}"


def temp_file_name(file: int) -> str:
    return f"{file}{TEMP_SUFFIX}"


def data_file_number(name: str) -> int | None:
    """The N of ``N.rdq``; None for any other name."""
    match = _DATA_FILE.match(name)
    return int(match.group(1)) if match else None
