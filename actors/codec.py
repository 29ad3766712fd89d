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

    1  type mark            a registered message's type name (UTF-8), as the first item
                            of the array that holds the message: [mark, field values...]
    2  ActorRef             msgpack [name, address, control, incarnation, pid, node, pinned]
    3  out-of-band frame    big-endian u32 index into the frames after the header

Races and hostile input: a peer may send any bytes. Decoding malformed bytes raises
``CodecError``, and so does a type mark anywhere but at the head of an array. A
message's fields are packed inline, in the array its mark heads, not as a msgpack
document of their own inside an extension: that nesting copied a message's bytes twice
more on each side, and a Publish of a megabyte took 2 ms to encode instead of 0.1. The
decoder reads a frame as plain data first and starts again, building messages, at the
first mark it meets (early in a frame that carries a message), so replies of plain data
(a stream's records) pay no hook per array. Frames carry no version: both ends of a
socket must run the same Warren (a peer from before this layout, 0.1.0's first form of
it, fails to decode with a ``CodecError``).
A registered message this process cannot build decodes to an
``UnknownMessage`` placeholder instead of raising, so the receiver still learns the request
id and can answer the caller with a clear error (the loop checks ``Decoder.saw_unknown``
after each decode, and ``find_unknown`` says what was wrong): a type name this process
has not registered, or a known type sent with the wrong number of fields or with values
its constructor refuses (``malformed``). Registration is per process and happens at
import, so both ends must import the module that defines a message type; the actor
process imports it when it unpickles its actor class.

Field checks: this is the one place where a message's fields are validated. Each field of
a registered dataclass is checked on decode against its annotation (``bytes``, ``int``,
``str``, ``bool``, ``float``, ``X | None``, ``list[X]``, ``dict``, a class) and against
any ``Check`` the annotation carries (``Annotated[bytes, Check(is_id, "16 bytes")]``: a
constraint beyond the type, with the words a sender reads). A message that fails decodes
to an ``UnknownMessage`` whose ``reason`` is ``"malformed Read: msg_id must be 16 bytes,
got bytes"`` and whose ``answer`` is ``UnhandledMessage``: its actor never sees it, and an
ask is answered with that error. Checks run in the receiver only; a sender may build any
message (a test sends malformed ones on purpose). What one field cannot say alone (a
count that must match another field's) the handler checks.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

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
_marks_by_type: dict[type, msgpack.ExtType] = {}  # the type mark each class travels with
_field_names: dict[type, tuple[str, ...]] = {}
# Set by actors.ref at import: builds an ActorRef from its decoded fields, and names the
# class so the encoder can recognise it (the codec must not import actors.ref: ref imports
# the codec).
_ref_type: type | None = None
_ref_fields: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class UnknownMessage:
    """Stands in for a message this process cannot build: a registered type it does not
    know, or (``malformed``) a known one whose fields do not fit; ``reason`` says which,
    and ``answer`` names the error an ask gets (``UnhandledMessage`` for a field that
    fails its check, ``CodecError`` for a frame that is not the message at all)."""

    type_name: str
    reason: str = "the message has a type this actor's process has not registered"
    malformed: bool = False
    answer: str = "CodecError"


@dataclasses.dataclass(frozen=True)
class Check:
    """A constraint on a message field beyond its type, written in its annotation:
    ``Annotated[int, Check(lambda n: n >= 0, "an int >= 0")]``. ``expected`` says what the
    field must be, in the error its sender gets."""

    test: Callable[[Any], bool]
    expected: str


_Test = tuple[Callable[[Any], bool], str]  # a field's check and the words for it
_WORDS = {bytes: "bytes", str: "a str", bool: "a bool", int: "an int", dict: "a dict"}
_checks: dict[type, tuple[tuple[int, str, Callable[[Any], bool], str], ...]] = {}


def _type_test(annotation: Any) -> _Test | None:
    """The test a value of ``annotation`` must pass, or None where any value will do (an
    annotation this codec cannot check, such as ``Any``)."""
    if annotation is Any:
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Annotated:
        base = _type_test(args[0])
        checks = [extra for extra in args[1:] if isinstance(extra, Check)]
        if not checks:
            return base
        words = checks[-1].expected
        if base is None:
            return (lambda v: all(c.test(v) for c in checks)), words
        base_test = base[0]
        return (lambda v: base_test(v) and all(c.test(v) for c in checks)), words
    if annotation in (bytes, str, bool, int):
        return (lambda v: type(v) is annotation), _WORDS[annotation]
    if annotation is float:
        return (lambda v: type(v) in (int, float)), "a number"
    if origin in (types.UnionType, typing.Union):
        optional = type(None) in args
        members = [_type_test(a) for a in args if a is not type(None)]
        if any(m is None for m in members):
            return None
        tests = [m[0] for m in members if m is not None]
        words = " or ".join(m[1] for m in members if m is not None)
        if optional:
            return (lambda v: v is None or any(t(v) for t in tests)), f"None or {words}"
        return (lambda v: any(t(v) for t in tests)), words
    if origin is list or annotation is list:
        if args and args[0] in _WORDS:  # list[bytes] and the like: checked at C speed
            kinds = {args[0]}
            item_words = _WORDS[args[0]].removeprefix("an ").removeprefix("a ")
            return (lambda v: type(v) is list and set(map(type, v)) <= kinds), (
                f"a list of {item_words}"
            )
        item = _type_test(args[0]) if args else None
        if item is None:
            return (lambda v: type(v) is list), "a list"
        item_test = item[0]
        item_words = item[1].removeprefix("an ").removeprefix("a ")
        return (lambda v: type(v) is list and all(map(item_test, v))), f"a list of {item_words}"
    if origin is tuple or annotation is tuple:  # a tuple travels as a list
        return (lambda v: type(v) in (list, tuple)), "a list"
    if origin is dict or annotation is dict:
        return (lambda v: type(v) is dict), "a dict"
    if isinstance(annotation, type) and annotation is not object:
        return (lambda v: isinstance(v, annotation)), f"a {annotation.__name__}"
    return None


def _field_checks(cls: type) -> tuple[tuple[int, str, Callable[[Any], bool], str], ...]:
    """Each checkable field of ``cls``: (position, name, test, words); worked out once."""
    found = _checks.get(cls)
    if found is None:
        try:
            hints = typing.get_type_hints(cls, include_extras=True)
        except (NameError, AttributeError, TypeError):
            hints = {}  # annotations naming what only a type checker imports: unchecked
        found = tuple(
            (position, name, *test)
            for position, name in enumerate(_field_names[cls])
            if (test := _type_test(hints.get(name, Any))) is not None
        )
        _checks[cls] = found
    return found


def work_out_field_checks() -> None:
    """Work out the field checks of every message type registered so far: a forkserver
    does so once, and each process it forks inherits them rather than working out (and
    touching the memory for) those of each type it decodes for the first time."""
    for cls in list(_types_by_name.values()):
        _field_checks(cls)


def field_problem(cls: type, values: list[Any] | tuple[Any, ...]) -> str | None:
    """What is wrong with ``values`` as the fields of the registered ``cls`` (in order), or
    None when every field passes its check."""
    for position, name, test, words in _field_checks(cls):
        value = values[position]
        if not test(value):
            return f"{name} must be {words}, got {type(value).__name__}"
    return None


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
    _marks_by_type[cls] = msgpack.ExtType(_EXT_MESSAGE, type_name.encode())
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
        mark = _marks_by_type.get(cls)
        if mark is not None:
            values: list[Any] = [mark]
            large = self._large
            for field_name in _field_names[cls]:
                value = getattr(obj, field_name)
                if type(value) is bytes and len(value) >= large:
                    value = self._out_of_band(value)
                values.append(value)
            return values
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


class _MarkSeen(Exception):
    """A first decoding pass met a type mark: decode again, building messages."""


class _TypeMark:
    """A decoded type mark, until the array it heads is complete."""

    __slots__ = ("type_name",)

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name


class Decoder:
    """Turns frames back into a message. Not thread-safe: keep one per thread or per loop."""

    def __init__(self) -> None:
        self._frames: list[Any] = []
        self._loose_marks = 0  # type marks decoded and not yet at the head of an array
        self.saw_unknown = False

    def decode(self, frames: list[Any]) -> Any:
        """Decode ``[header, *large_bodies]``; raise ``CodecError`` on malformed input."""
        self._frames = frames
        self._loose_marks = 0
        self.saw_unknown = False
        try:
            try:  # plain data first: only a frame holding a message pays the array hook
                value = msgpack.unpackb(
                    frames[0], ext_hook=self._plain_ext_hook, raw=False, strict_map_key=False
                )
            except _MarkSeen:
                self._loose_marks = 0
                value = self._unpack_nested(frames[0])
        except CodecError:
            raise
        except Exception as exc:  # msgpack raises many types on hostile bytes
            raise CodecError(f"malformed frame: {type(exc).__name__}: {exc}") from exc
        if self._loose_marks:
            raise CodecError("malformed frame: a type mark that heads no array")
        return value

    def _unpack_nested(self, data: bytes) -> Any:
        return msgpack.unpackb(
            data,
            ext_hook=self._ext_hook,
            list_hook=self._list_hook,
            raw=False,
            strict_map_key=False,
        )

    def _plain_ext_hook(self, code: int, data: bytes) -> Any:
        if code == _EXT_MESSAGE:
            raise _MarkSeen  # a message's mark comes early in its frame: little is lost
        return self._ext_hook(code, data)

    def _list_hook(self, items: list[Any]) -> Any:
        if items and type(items[0]) is _TypeMark:
            self._loose_marks -= 1
            return self._message(items[0].type_name, items[1:])
        return items

    def _ext_hook(self, code: int, data: bytes) -> Any:
        if code == _EXT_FRAME:
            (index,) = _FRAME_INDEX.unpack(data)
            if not 0 < index < len(self._frames):
                raise CodecError(f"frame index {index} out of range")
            frame = self._frames[index]
            return frame if type(frame) is bytes else bytes(frame)
        if code == _EXT_MESSAGE:
            self._loose_marks += 1
            return _TypeMark(data.decode())
        if code == _EXT_REF and _ref_type is not None:
            values = self._unpack_nested(data)
            return _ref_type(*values)
        raise CodecError(f"unknown extension type {code}")

    def _message(self, type_name: str, values: list[Any]) -> Any:
        """The registered message ``type_name`` with these field values, or the
        ``UnknownMessage`` that says why there is none."""
        cls = _types_by_name.get(type_name)
        if cls is None:
            self.saw_unknown = True
            return UnknownMessage(type_name)
        expected = len(_field_names[cls])
        if len(values) != expected:
            self.saw_unknown = True
            return UnknownMessage(
                type_name,
                f"{type_name} takes {expected} fields, the message carried {len(values)}",
                malformed=True,
            )
        problem = field_problem(cls, values)
        if problem is not None:
            self.saw_unknown = True
            return UnknownMessage(
                type_name,
                f"malformed {cls.__name__}: {problem}",
                malformed=True,
                answer="UnhandledMessage",
            )
        try:
            return cls(*values)
        except (TypeError, ValueError) as exc:  # a field its own checks refuse
            self.saw_unknown = True
            return UnknownMessage(type_name, f"{type_name}: {exc}", malformed=True)


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
