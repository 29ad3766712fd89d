"""The codec, in-process: what travels, what is refused, and what hostile bytes do."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import msgpack
import pytest

from tests.actors.sample_actors import Point, Put
from warren.actors import LARGE_BODY_BYTES, ActorRef, CodecError, Down
from warren.actors.codec import Check, Decoder, Encoder, UnknownMessage, register_message


def round_trip(obj: object) -> object:
    return Decoder().decode(Encoder().encode(obj))


def test_plain_data_round_trips_and_tuples_arrive_as_lists() -> None:
    value = {"a": [1, 2.5, None, True], 3: b"bytes", "t": (1, "x")}
    assert round_trip(value) == {"a": [1, 2.5, None, True], 3: b"bytes", "t": [1, "x"]}


def test_registered_dataclasses_and_namedtuples_round_trip_as_themselves() -> None:
    assert round_trip(Put("k", b"v")) == Put("k", b"v")
    assert round_trip([Point(1, 2)]) == [Point(1, 2)]


def test_refs_and_runtime_messages_round_trip_inside_other_messages() -> None:
    ref = ActorRef("a", "ipc:///x/a", "ipc:///x/b", 3, 42, "ipc:///x/n", pinned=True)
    down = Down(ref, None, 9)
    assert round_trip({"who": ref, "down": down}) == {"who": ref, "down": down}


def test_a_large_body_travels_as_its_own_frame_and_not_in_the_header() -> None:
    body = b"x" * LARGE_BODY_BYTES
    frames = Encoder().encode(Put("k", body))
    assert len(frames) == 2 and frames[1] is body
    assert len(frames[0]) < 100
    assert Decoder().decode(frames) == Put("k", body)


def test_an_unregistered_class_is_refused_at_the_sender() -> None:
    @dataclasses.dataclass(frozen=True)
    class Unregistered:
        value: int

    with pytest.raises(CodecError, match="Unregistered"):
        Encoder().encode(Unregistered(1))


def test_a_type_unknown_to_the_receiver_decodes_to_a_placeholder_and_is_flagged() -> None:
    ext = [msgpack.ExtType(1, b"some.Unknown"), 1]
    decoder = Decoder()
    assert decoder.decode([msgpack.packb([2, 0, 7, ext])]) == [
        2,
        0,
        7,
        UnknownMessage("some.Unknown"),
    ]
    assert decoder.saw_unknown


@pytest.mark.parametrize(
    "frame",
    [
        b"\xc1",
        b"\x93\x01",
        msgpack.packb(msgpack.ExtType(9, b"")),
        msgpack.packb(msgpack.ExtType(3, b"\0\0\0\5")),
        msgpack.packb(msgpack.ExtType(1, b"a.Mark")),  # a type mark heading no array
        msgpack.packb([1, msgpack.ExtType(1, b"a.Mark")]),
        msgpack.packb({"key": msgpack.ExtType(1, b"a.Mark")}),
        msgpack.packb([msgpack.ExtType(1, b"\xff")]),  # a type name that is not UTF-8
    ],
)
def test_malformed_frames_raise_codec_error(frame: bytes) -> None:
    with pytest.raises(CodecError):
        Decoder().decode([frame])


def test_only_frozen_dataclasses_can_be_registered() -> None:
    @dataclasses.dataclass
    class Mutable:
        value: int

    with pytest.raises(CodecError, match="frozen"):
        register_message(Mutable)


@dataclasses.dataclass(frozen=True)
class Order:
    """A message with field checks, as the store's and the queues' protocols declare them."""

    sku: Annotated[bytes, Check(lambda v: len(v) == 4, "4 bytes")]
    quantity: Annotated[int, Check(lambda v: v > 0, "an int > 0")]
    notes: list[str] | None = None


register_message(Order, "tests.codec.Order")


@pytest.mark.parametrize(
    ("sent", "complaint"),
    [
        (Order(b"toolong", 1), "malformed Order: sku must be 4 bytes, got bytes"),
        (Order("abcd", 1), "sku must be 4 bytes, got str"),
        (Order(b"abcd", 0), "quantity must be an int > 0, got int"),
        (Order(b"abcd", True), "quantity must be an int > 0, got bool"),
        (Order(b"abcd", 1, ["ok", 2]), "notes must be None or a list of str, got list"),
    ],
)
def test_a_field_failing_its_check_decodes_to_a_refusal_naming_it(sent, complaint) -> None:
    decoder = Decoder()
    decoded = decoder.decode(Encoder().encode(sent))
    assert isinstance(decoded, UnknownMessage) and decoder.saw_unknown
    assert decoded.malformed and decoded.answer == "UnhandledMessage"
    assert complaint in decoded.reason


def test_fields_that_pass_their_checks_decode_as_the_message() -> None:
    assert round_trip(Order(b"abcd", 3)) == Order(b"abcd", 3)
    assert round_trip(Order(b"abcd", 3, ["gift"])) == Order(b"abcd", 3, ["gift"])
