"""The one codec for everything that crosses a socket: msgpack, never pickle.

What it encodes: ``None``, ``bool``, ``int``, ``float``, ``str``, ``bytes``, lists and tuples
(both arrive as lists), dicts, ``ActorRef`` and any frozen dataclass or NamedTuple
registered with ``@message`` (or ``register_message``). Anything else is refused at the
sender with ``CodecError``; nothing a peer sends can make this process import a module or
run code, because decoding only ever builds the registered classes.

Frames: ``encode`` returns a list of frames. The first is the msgpack header; every
``bytes`` value of at least ``LARGE_BODY_BYTES`` that is the message itself or a field of a
registered message travels as a frame of its own, named in the header by its index, so a
large body is never copied into the header (ZeroMQ sends the frames from the caller's
buffers). ``decode`` takes the same list back.

Extension types inside the header:

    1  registered message   msgpack [type name, field values...]
    2  ActorRef             msgpack [name, address, control, incarnation, pid, node, pinned]
    3  out-of-band frame    big-endian u32 index into the frames after the header

Races and hostile input: a peer may send any bytes. Decoding malformed bytes raises
``CodecError``. A registered message this process cannot build decodes to an
``UnknownMessage`` placeholder instead of raising, so the receiver still learns the request
id and can answer the caller with a clear error (the loop checks ``Decoder.saw_unknown``
after each decode, and ``find_unknown`` says what was wrong): a type name this process
has not registered, or a known type sent with the wrong number of fields or with values
its constructor refuses (``malformed``). Registration is per process and happens at
import, so both ends must import the module that defines a message type; the actor
process imports it when it unpickles its actor class.
"""

from __future__ import annotations

import dataclasses
import struct
from typing import Any, TypeVar

import msgpack

from .errors import CodecError

# A bytes value at least this long (bytes) travels as its own frame (docs/architecture.md).
LARGE_BODY_BYTES = 64 * 1024

_EXT_MESSAGE = 1
_EXT_REF = 2
_EXT_FRAME = 3
_FRAME_INDEX = struct.Struct(">I")

T = TypeVar("T", bound=type)

_types_by_name: dict[str, type] = {}
_names_by_type: dict[type, str] = {}
_field_names: dict[type, tuple[str, ...]] = {}
# Set by actors.ref at import: builds an ActorRef from its decoded fields, and names the
# class so the encoder can recognise it (the codec must not import actors.ref: ref imports
# the codec).
_ref_type: type | None = None
_ref_fields: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class UnknownMessage:
    """Stands in for a message this process cannot build: a registered type it does not
    know, or (``malformed``) a known one whose fields do not fit; ``reason`` says which."""

    type_name: str
    reason: str = "the message has a type this actor's process has not registered"
    malformed: bool = False


def register_message(cls: T, name: str | None = None) -> T:
    """Register a frozen dataclass or a NamedTuple so it may travel in messages.

    ``name`` defaults to ``module.QualifiedName``; both processes must use the same one.
    Every field must be settable through the constructor, in declaration order.
    """
    # A forked child imports the application's main script as __mp_main__; it must name
    # the script's types as the parent does.
    module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
    type_name = name or f"{module}.{cls.__qualname__}"
    if dataclasses.is_dataclass(cls):
        fields = dataclasses.fields(cls)
        if not all(f.init for f in fields):
            raise CodecError(f"{type_name}: every dataclass field must be an __init__ field")
        if not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
            raise CodecError(f"{type_name}: messages must be frozen dataclasses")
        field_names = tuple(f.name for f in fields)
    elif issubclass(cls, tuple) and hasattr(cls, "_fields"):
        field_names = tuple(cls._fields)
    else:
        raise CodecError(f"{type_name}: only frozen dataclasses and NamedTuples can be registered")
    known = _types_by_name.get(type_name)
    if known is not None and known is not cls:
        raise CodecError(f"{type_name}: another class is already registered under this name")
    _types_by_name[type_name] = cls
    _names_by_type[cls] = type_name
    _field_names[cls] = field_names
    return cls


def message(cls: T) -> T:
    """Class decorator: ``@message`` registers a frozen dataclass or NamedTuple."""
    return register_message(cls)


def _install_ref_type(cls: type, field_names: tuple[str, ...]) -> None:
    global _ref_type, _ref_fields
    _ref_type = cls
    _ref_fields = field_names


class Encoder:
    """Turns one message into frames. Not thread-safe: keep one per thread or per loop."""

    def __init__(self, large_body_bytes: int = LARGE_BODY_BYTES) -> None:
        self._large = large_body_bytes
        self._frames: list[Any] = []
        self._packer = msgpack.Packer(default=self._default, strict_types=True, autoreset=True)

    def encode(self, obj: Any) -> list[Any]:
        """Return ``[header, *large_bodies]``."""
        self._frames = frames = [b""]
        if type(obj) is bytes and len(obj) >= self._large:
            obj = self._out_of_band(obj)
        try:
            frames[0] = self._packer.pack(obj)
        except CodecError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise CodecError(f"cannot encode {type(obj).__name__}: {exc}") from exc
        return frames

    def _out_of_band(self, body: bytes | bytearray | memoryview) -> msgpack.ExtType:
        self._frames.append(body)
        return msgpack.ExtType(_EXT_FRAME, _FRAME_INDEX.pack(len(self._frames) - 1))

    def _pack_nested(self, values: list[Any]) -> bytes:
        return msgpack.packb(values, default=self._default, strict_types=True)

    def _default(self, obj: Any) -> Any:
        cls = type(obj)
        type_name = _names_by_type.get(cls)
        if type_name is not None:
            values: list[Any] = [type_name]
            large = self._large
            for field_name in _field_names[cls]:
                value = getattr(obj, field_name)
                if type(value) is bytes and len(value) >= large:
                    value = self._out_of_band(value)
                values.append(value)
            return msgpack.ExtType(_EXT_MESSAGE, self._pack_nested(values))
        if cls is _ref_type:
            return msgpack.ExtType(
                _EXT_REF, self._pack_nested([getattr(obj, f) for f in _ref_fields])
            )
        if isinstance(obj, (tuple, list)):
            return list(obj)
        if isinstance(obj, dict):
            return dict(obj)
        if isinstance(obj, (bytearray, memoryview)):
            return self._out_of_band(obj) if len(obj) >= self._large else bytes(obj)
        if isinstance(obj, bool):
            return bool(obj)
        if isinstance(obj, int):
            return int(obj)
        if isinstance(obj, float):
            return float(obj)
        if isinstance(obj, str):
            return str(obj)
        if isinstance(obj, bytes):
            return bytes(obj)
        raise CodecError(
            f"cannot encode {cls.__module__}.{cls.__qualname__}: register it "
            f"with @actors.message, or send plain data"
        )


class Decoder:
    """Turns frames back into a message. Not thread-safe: keep one per thread or per loop."""

    def __init__(self) -> None:
        self._frames: list[Any] = []
        self.saw_unknown = False

    def decode(self, frames: list[Any]) -> Any:
        """Decode ``[header, *large_bodies]``; raise ``CodecError`` on malformed input."""
        self._frames = frames
        self.saw_unknown = False
        try:
            return msgpack.unpackb(
                frames[0], ext_hook=self._ext_hook, raw=False, strict_map_key=False
            )
        except CodecError:
            raise
        except Exception as exc:  # msgpack raises many types on hostile bytes
            raise CodecError(f"malformed frame: {type(exc).__name__}: {exc}") from exc

    def _unpack_nested(self, data: bytes) -> Any:
        return msgpack.unpackb(data, ext_hook=self._ext_hook, raw=False, strict_map_key=False)

    def _ext_hook(self, code: int, data: bytes) -> Any:
        if code == _EXT_FRAME:
            (index,) = _FRAME_INDEX.unpack(data)
            if not 0 < index < len(self._frames):
                raise CodecError(f"frame index {index} out of range")
            frame = self._frames[index]
            return frame if type(frame) is bytes else bytes(frame)
        if code == _EXT_MESSAGE:
            type_name, *values = self._unpack_nested(data)
            cls = _types_by_name.get(type_name)
            if cls is None:
                self.saw_unknown = True
                return UnknownMessage(str(type_name))
            expected = len(_field_names[cls])
            if len(values) != expected:
                self.saw_unknown = True
                return UnknownMessage(
                    str(type_name),
                    f"{type_name} takes {expected} fields, the message carried {len(values)}",
                    malformed=True,
                )
            try:
                return cls(*values)
            except (TypeError, ValueError) as exc:  # a field its own checks refuse
                self.saw_unknown = True
                return UnknownMessage(str(type_name), f"{type_name}: {exc}", malformed=True)
        if code == _EXT_REF and _ref_type is not None:
            values = self._unpack_nested(data)
            return _ref_type(*values)
        raise CodecError(f"unknown extension type {code}")


def find_unknown(obj: Any) -> UnknownMessage | None:
    """The first ``UnknownMessage`` ``obj`` holds, anywhere in it (the rare, slow path)."""
    if isinstance(obj, UnknownMessage):
        return obj
    if isinstance(obj, list):
        items: Any = obj
    elif isinstance(obj, dict):
        items = obj.values()
    elif dataclasses.is_dataclass(obj) or (isinstance(obj, tuple) and hasattr(obj, "_fields")):
        items = [getattr(obj, f) for f in _field_names.get(type(obj), ())]
    else:
        return None
    for item in items:
        found = find_unknown(item)
        if found is not None:
            return found
    return None
