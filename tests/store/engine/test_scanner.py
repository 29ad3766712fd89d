"""The scanner finds every record and nothing else, whatever surrounds it (the cases of
RabbitMQ's msg_store_file_scan suite, with Warren's rule that duplicates are all reported
so recovery can keep the last copy)."""

import os
import random
import struct

import pytest

from warren.store import scan_buffer, scan_file
from warren.store.engine.records import encode_record

from ..helpers import msg_id, record

KIB = 1024
MIB = 1024 * KIB


def found(buf: bytes) -> list[tuple[bytes, int, int]]:
    return scan_buffer(buf).records


@pytest.mark.parametrize(
    "content", [b"", bytes(KIB), bytes(MIB)], ids=["empty", "1KiB-zeros", "1MiB-zeros"]
)
def test_nothing_is_found_in_an_empty_or_zeroed_file(content):
    result = scan_buffer(content)
    assert result.records == []
    assert result.damaged == []


def test_an_empty_file_on_disk_scans_to_nothing(tmp_path):
    path = tmp_path / "0.rdq"
    path.write_bytes(b"")
    assert scan_file(path).records == []


@pytest.mark.parametrize(
    "payload",
    [b"\x00", b"\xff", b"\x00" * 100, b"\xff" * 100, os.urandom(1000), os.urandom(MIB)],
    ids=["0x00", "0xFF", "zeros", "ones", "random-1k", "random-1MiB"],
)
@pytest.mark.parametrize("pad_before", [0, KIB, MIB])
@pytest.mark.parametrize("pad_after", [0, KIB, MIB])
def test_a_single_record_is_found_with_any_padding(payload, pad_before, pad_after):
    one = encode_record(msg_id(1), payload)
    result = scan_buffer(bytes(pad_before) + one + bytes(pad_after))
    assert result.records == [(msg_id(1), pad_before, len(payload) + 25)]
    assert result.damaged == []


def test_a_zero_length_body_is_a_valid_record():
    assert found(encode_record(msg_id(7), b"")) == [(msg_id(7), 0, 25)]


@pytest.mark.parametrize("count", [2, 5, 20, 100])
def test_consecutive_records_are_all_found_with_exact_offsets(count):
    records = [record(n, size=n * 7) for n in range(count)]
    offsets = [sum(map(len, records[:n])) for n in range(count)]
    assert found(b"".join(records)) == [(msg_id(n), offsets[n], n * 7 + 25) for n in range(count)]


def test_a_random_mix_of_records_and_padding_is_found_exactly():
    rng = random.Random(42)
    buf, expected = bytearray(), []
    for n in range(200):
        buf += bytes(rng.choice([0, 0, KIB]))
        size = rng.randrange(0, 3000)
        expected.append((msg_id(n), len(buf), size + 25))
        buf += record(n, size)
    assert found(bytes(buf)) == expected


def test_every_copy_of_a_duplicated_record_is_reported_in_order():
    one = record(1)
    buf = one + bytes(KIB) + one + one
    assert found(buf) == [
        (msg_id(1), 0, 125),
        (msg_id(1), 125 + KIB, 125),
        (msg_id(1), 250 + KIB, 125),
    ]


@pytest.mark.parametrize("cut", [1, 4, 7, 8, 20, 24, 60, 124])
def test_a_truncated_record_start_is_skipped_and_the_next_record_found(cut):
    torn = record(1)[:cut]
    result = scan_buffer(torn + record(2))
    assert result.records == [(msg_id(2), cut, 125)]


def test_a_torn_tail_is_reported_as_damage_after_the_last_record():
    result = scan_buffer(record(1) + record(2)[:-1])
    assert result.records == [(msg_id(1), 0, 125)]
    assert result.end_of_records == 125
    assert result.damaged == [(125, 124)]


def test_runs_of_0xff_are_skipped_and_reported_as_damage():
    result = scan_buffer(b"\xff" * 5000 + record(3) + b"\xff" * 300)
    assert result.records == [(msg_id(3), 5000, 125)]
    assert result.damaged == [(0, 5000), (5125, 300)]


@pytest.mark.parametrize("size_field", [15, 16, 17])
def test_size_fields_around_the_minimum_with_short_data_are_not_records(size_field):
    short = struct.pack(">Q", size_field) + msg_id(9)[: size_field - 2] + b"\xff"
    assert found(short) == []
    assert found(short + bytes(KIB)) == []


def test_a_record_right_after_a_zero_byte_with_a_leading_zero_size_is_found_at_offset_one():
    payload = b"\x01\xff\x02" + b"\xff" * 40
    assert found(b"\x00" + encode_record(msg_id(5), payload)) == [(msg_id(5), 1, len(payload) + 25)]


def a_body_that_fakes_a_record_one_byte_early(size: int) -> bytes:
    """A random body of ``size`` bytes whose record, read from one byte before its start,
    has a size field 256 times smaller that ends on a 0xFF in the body."""
    fake_size = (size + 16) >> 8
    body = bytearray(os.urandom(size))
    body[fake_size - 17] = 0xFF  # the fake's last byte: 24 header bytes in, one back
    return bytes(body)


@pytest.mark.parametrize("size", [5000, 100 * KIB, MIB])
@pytest.mark.parametrize(
    ("after", "found_after"),
    [(b"", []), (bytes(KIB), []), (record(3), [msg_id(3)])],
    ids=["end-of-file", "zeros", "a-record"],
)
def test_a_record_after_zeros_is_not_hidden_by_a_shorter_record_its_body_fakes(
    size, after, found_after
):
    real = encode_record(msg_id(1), a_body_that_fakes_a_record_one_byte_early(size))
    buf = bytes(KIB) + real + after
    fake_size = (size + 16) >> 8
    assert fake_size >= 16 and buf[KIB - 1 + fake_size + 8] == 0xFF  # a record by its bytes
    assert [ident for ident, _, _ in found(buf)] == [msg_id(1), *found_after]
    assert found(buf)[0] == (msg_id(1), KIB, size + 25)


@pytest.mark.parametrize("cut", [5, 30, 60])
def test_a_record_after_zeros_before_a_torn_one_stays_the_last_whole_record(cut):
    # A crash's current file: a hole, a record whose body fakes a shorter one, then the
    # start of the next append.
    real = encode_record(msg_id(1), a_body_that_fakes_a_record_one_byte_early(5000))
    torn = record(2)[:cut]
    result = scan_buffer(bytes(KIB) + real + torn)
    assert result.records == [(msg_id(1), KIB, 5025)]
    assert result.end_of_records == KIB + len(real)  # what recovery keeps of the file


@pytest.mark.parametrize("after", [b"", record(3)], ids=["end-of-file", "a-record"])
def test_a_record_after_zeros_whose_body_is_zeros_around_a_shorter_reading_is_found(after):
    size = 5000
    body = bytearray(size)
    body[((size + 16) >> 8) - 17] = 0xFF  # the shorter reading's last byte, zeros after
    buf = bytes(KIB) + encode_record(msg_id(1), bytes(body)) + after
    assert found(buf)[0] == (msg_id(1), KIB, size + 25)


def test_a_record_after_zeros_followed_by_damage_is_kept_and_the_damage_reported():
    real = record(1)
    result = scan_buffer(bytes(KIB) + real + b"\xab" * 9 + record(2))
    assert [ident for ident, _, _ in result.records] == [msg_id(1), msg_id(2)]
    assert result.damaged == [(KIB + len(real), 9)]


@pytest.mark.parametrize("past_end", range(1, 10))
def test_a_fake_size_header_near_a_4mib_boundary_does_not_hide_the_record_after_it(past_end):
    real = record(11)
    fake_at = 4 * MIB - 12
    junk = b"\xab\xcd\xef\x01"
    buf_len = fake_at + 8 + len(junk) + len(real)
    fake_size = buf_len + past_end - 9 - fake_at  # its record would end past EOF
    buf = bytes(fake_at - 1) + b"\x01" + struct.pack(">Q", fake_size) + junk + real
    assert len(buf) == buf_len and fake_at + fake_size + 9 == len(buf) + past_end
    result = scan_buffer(buf)
    assert result.records == [(msg_id(11), fake_at + 12, 125)]


def test_scanning_a_file_on_disk_matches_scanning_its_bytes(tmp_path):
    buf = bytes(100) + record(1) + b"garbage" + record(2, 5000)
    path = tmp_path / "3.rdq"
    path.write_bytes(buf)
    assert scan_file(path).records == scan_buffer(buf).records
    assert scan_file(path).damaged == [(225, 7)]
