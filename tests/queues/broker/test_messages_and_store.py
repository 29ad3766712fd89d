"""Messages' one encoding, and the per-queue store's records: every record carries its
size and CRC, and one that fails either is never handed out."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.queues import (
    CorruptMessage,
    InvalidMessage,
    Message,
    QueueIndex,
    QueueStore,
    decode,
    encode,
)
from warren.queues.engine.queue_index import records_at
from warren.queues.engine.queue_store import RECORD_HEADER_BYTES
from warren.queues.message import body_encoder


def test_every_property_survives_encoding():
    message = Message(
        b"\x00body",
        message_id="m-1",
        headers={"k": [1, "two", b"3", None]},
        expiration_ms=60000,
        timestamp_ms=1_700_000_000_000,
        content_type="application/json",
        persistent=False,
    )
    assert decode(encode(message)) == message


def test_a_message_published_over_amqp_keeps_its_publish_bytes():
    """The AMQP publish as a publisher sent it (exchange, routing key, and properties:
    here delivery_mode 2 and a header whose type, a decimal, msgpack cannot hold) comes
    back unchanged; a message without one encodes exactly as before they existed."""
    properties = b"\x02ex\x02rk\x30\x00\x00\x00\x00\x0a\x03feeD\x02\x00\x00\x01\x2c\x02"
    message = Message(b"body", expiration_ms=5, persistent=True, amqp=properties)
    assert decode(encode(message)) == message
    plain = Message(b"body", message_id="m")
    assert encode(plain) == bytes.fromhex("9801a16dc0c0c0c0c3c404626f6479")
    assert decode(encode(plain)).amqp is None
    encode_body = body_encoder(message)
    assert encode_body(b"other") == encode(
        Message(b"other", None, None, 5, None, None, True, properties)
    )


def test_a_message_whose_amqp_publish_is_not_bytes_is_refused_both_ways():
    with pytest.raises(InvalidMessage, match="amqp"):
        encode(Message(b"x", amqp="\x00\x00"))
    import msgpack

    not_bytes = msgpack.packb([2, None, None, None, None, None, True, "text", b"x"])
    with pytest.raises(CorruptMessage, match="AMQP publish"):
        decode(not_bytes)
    wrong_version = msgpack.packb([1, None, None, None, None, None, True, b"\x00\x00", b"x"])
    with pytest.raises(CorruptMessage):
        decode(wrong_version)


@pytest.mark.parametrize(
    "message, field",
    [
        (Message("text"), "body"),
        (Message(b"x", message_id=5), "message_id"),
        (Message(b"x", headers={"k": {1, 2}}), "headers"),
        (Message(b"x", headers={1: "v"}), "header names"),
        (Message(b"x", expiration_ms=-1), "expiration_ms"),
        (Message(b"x", persistent="yes"), "persistent"),
    ],
)
def test_a_property_that_does_not_encode_is_refused_by_name(message, field):
    with pytest.raises(InvalidMessage, match=field):
        encode(message)


header_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text() | st.binary(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)
properties = st.builds(
    Message,
    body=st.just(b""),
    message_id=st.none() | st.text(max_size=20),
    headers=st.none() | st.dictionaries(st.text(max_size=8), header_values, max_size=4),
    expiration_ms=st.none() | st.integers(0, 2**63 - 1),
    timestamp_ms=st.none() | st.integers(0, 2**63 - 1),
    content_type=st.none() | st.text(max_size=20),
    persistent=st.booleans(),
)


@given(properties, st.lists(st.binary(max_size=70_000), min_size=1, max_size=4))
def test_a_batch_encoded_once_for_its_properties_is_exactly_what_encode_gives(template, bodies):
    """publish_many packs the properties once and each body after them: the bytes must be
    encode's, byte for byte, whatever the properties and the body's length (msgpack's bin
    8, 16 and 32 prefixes)."""
    encode_body = body_encoder(template)
    for body in bodies:
        message = Message(
            body,
            template.message_id,
            template.headers,
            template.expiration_ms,
            template.timestamp_ms,
            template.content_type,
            template.persistent,
        )
        assert encode_body(body) == encode(message)
        assert encode_body(bytearray(body)) == encode(message)


def test_a_batch_with_a_body_or_property_that_does_not_encode_is_refused_by_name():
    with pytest.raises(InvalidMessage, match="body"):
        body_encoder(Message(b""))("text")
    with pytest.raises(InvalidMessage, match="headers"):
        body_encoder(Message(b"", headers={"k": {1}}))


@pytest.mark.parametrize("data", [b"", b"\xc1", b"\x93\x01\x02\x03", encode(Message(b"x"))[:-1]])
def test_bytes_that_are_not_a_message_do_not_decode(data):
    with pytest.raises(CorruptMessage):
        decode(data)


def open_store(directory) -> tuple[QueueIndex, QueueStore]:
    """A queue's own store, in the segment files of its index (which owns them)."""
    index = QueueIndex(directory, segment_entry_count=16)
    return index, QueueStore(directory, index.files, segment_entry_count=16)


def test_records_read_back_from_the_buffer_and_from_disk(tmp_path):
    index, store = open_store(tmp_path)
    places = {seq: store.write(seq, b"record %d" % seq) for seq in range(40)}
    assert store.read(3, places[3], len(b"record 3")) == b"record 3"
    store.sync()
    assert all(
        store.read(s, places[s], len(b"record %d" % s)) == b"record %d" % s for s in range(40)
    )
    store.close()
    index.close()


def test_a_record_written_and_removed_before_the_flush_is_never_written(tmp_path):
    index, store = open_store(tmp_path)
    store.write(0, b"kept")
    store.write(1, b"gone")
    store.remove([1])
    store.sync()
    assert (tmp_path / "0.qi").stat().st_size == records_at(16) + RECORD_HEADER_BYTES + 4
    store.close()
    index.close()


@pytest.mark.parametrize("damage", ["flipped_byte", "cut_mid_record", "offset_past_end"])
def test_a_damaged_record_raises_a_clear_error_on_read(tmp_path, damage):
    index, store = open_store(tmp_path)
    offset = store.write(0, b"precious")
    store.sync()
    path = tmp_path / "0.qi"
    data = bytearray(path.read_bytes())
    if damage == "flipped_byte":
        data[-1] ^= 1
    elif damage == "cut_mid_record":
        data = data[:-3]
    else:
        offset += 4096
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptMessage, match="seq id 0 at offset"):
        store.read(0, offset, len(b"precious"))
    assert store.valid_records(0, [(offset, len(b"precious"))]) == [False]
    store.close()
    index.close()
