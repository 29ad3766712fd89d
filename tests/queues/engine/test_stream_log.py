"""The stream log: Osiris's byte layout, append and read by every kind of start, rollover
with tracking snapshots, recovery from torn tails, corruption, retention, readers in
other processes, a writer killed mid-append, and a model of the whole."""

import multiprocessing
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
import zlib

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from warren.queues.engine.stream_log import (
    CHUNK_TRACKING_DELTA,
    CHUNK_TRACKING_SNAPSHOT,
    CHUNK_USER,
    INDEX_HEADER,
    LOG_HEADER,
    OffsetOutOfRange,
    StreamCorrupt,
    StreamError,
    StreamLocked,
    StreamLog,
    StreamReader,
    Timestamp,
    chunk_ranges,
    decode_entries,
    index_file_name,
    pack_chunk,
    read_index,
    segment_file_name,
    unpack_chunk,
)

from ..helpers import fail_the_next_fdatasync

T0 = 1_700_000_000_000


def body(offset: int) -> bytes:
    return f"record {offset} ".encode() * 3


def chunk_positions(segment: bytes) -> list[int]:
    """The byte position of every chunk in a segment file, from the headers' lengths."""
    positions, position = [], 8
    while position < len(segment):
        positions.append(position)
        data, trailer, bloom = struct.unpack_from(">IIB", segment, position + 36)
        position += 48 + bloom + data + trailer
    return positions


def read_all(log: StreamLog, start="first") -> list[tuple[int, int, bytes]]:
    with log.reader(start) as reader:
        return list(reader)


# -- the byte layout ----------------------------------------------------------------------


def test_a_chunk_header_holds_each_field_at_its_osiris_byte_position(tmp_path):
    with StreamLog(tmp_path) as log:
        log.append([b"hello", b"stream!"], timestamp_ms=T0)
        log.append_tracking(producers={"p1": 7}, consumers={"c1": 1}, timestamp_ms=T0 + 1)
    segment = (tmp_path / segment_file_name(0)).read_bytes()
    assert segment_file_name(0) == "00000000000000000000.segment"
    assert segment[:8] == b"OSIL\x00\x00\x00\x01" == LOG_HEADER

    chunk = segment[8:]
    data = b"\x00\x00\x00\x05hello\x00\x00\x00\x07stream!"
    assert chunk[0] == 0x50  # magic 5 in the high nibble, version 0 in the low one
    assert chunk[1] == CHUNK_USER
    assert int.from_bytes(chunk[2:4], "big") == 2  # entries
    assert int.from_bytes(chunk[4:8], "big") == 2  # records
    assert int.from_bytes(chunk[8:16], "big", signed=True) == T0
    assert int.from_bytes(chunk[16:24], "big") == 0  # epoch
    assert int.from_bytes(chunk[24:32], "big") == 0  # chunk id: the first offset
    assert int.from_bytes(chunk[32:36], "big") == zlib.crc32(data)
    assert int.from_bytes(chunk[36:40], "big") == len(data)
    assert int.from_bytes(chunk[40:44], "big") == 0  # trailer
    assert chunk[44] == 0  # bloom filter size: no filter
    assert chunk[45:48] == b"\x00\x00\x00"  # reserved
    assert chunk[48 : 48 + len(data)] == data

    delta = chunk[48 + len(data) :]
    delta_body = b"\x00\x02p1" + (7).to_bytes(8, "big") + b"\x01\x02c1" + (1).to_bytes(8, "big")
    assert delta[1] == CHUNK_TRACKING_DELTA
    assert int.from_bytes(delta[24:32], "big") == 2  # the offset after the two records
    assert delta[48:] == len(delta_body).to_bytes(4, "big") + delta_body

    index = (tmp_path / index_file_name(0)).read_bytes()
    assert index[:8] == b"OSII\x00\x00\x00\x01" == INDEX_HEADER
    assert len(index) == 8 + 2 * 29
    record = index[8:37]
    assert int.from_bytes(record[0:8], "big") == 0  # chunk id
    assert int.from_bytes(record[8:16], "big", signed=True) == T0
    assert int.from_bytes(record[16:24], "big") == 0  # epoch
    assert int.from_bytes(record[24:28], "big") == 8  # position in the segment file
    assert record[28] == CHUNK_USER
    assert int.from_bytes(index[37 + 24 : 37 + 28], "big") == 8 + 48 + len(data)
    assert index[37 + 28] == CHUNK_TRACKING_DELTA


def test_a_reader_reads_sub_batches_and_skips_a_bloom_filter_in_files_written_by_hand(
    tmp_path,
):
    sub_batch_body = b"\x00\x00\x00\x01x\x00\x00\x00\x02yy"
    sub_batch = bytes([0x80]) + struct.pack(">HII", 2, 11, 11) + sub_batch_body
    data = b"\x00\x00\x00\x01a" + sub_batch
    chunk = bytearray(pack_chunk(CHUNK_USER, data, 2, 3, T0, 4, 0))
    chunk[44] = 16  # a 16-byte bloom filter between the header and the data
    chunk[48:48] = bytes(range(16))
    (tmp_path / segment_file_name(0)).write_bytes(LOG_HEADER + bytes(chunk))
    (tmp_path / index_file_name(0)).write_bytes(
        INDEX_HEADER + struct.pack(">QqQIB", 0, T0, 4, 8, CHUNK_USER)
    )
    with StreamReader(tmp_path, "first", committed_offset=2) as reader:
        assert list(reader) == [(0, T0, b"a"), (1, T0, b"x"), (2, T0, b"yy")]
    with StreamLog(tmp_path) as log:  # the writer recovers the file and goes on after it
        assert log.last_offset == 2
        assert log.append([b"z"]) == (3, 3)


def test_decode_entries_rejects_an_entry_running_past_the_data():
    with pytest.raises(ValueError, match="runs past"):
        decode_entries(b"\x00\x00\x00\x09short")


# -- append and read ----------------------------------------------------------------------


def test_records_round_trip_from_every_kind_of_start(tmp_path):
    with StreamLog(tmp_path) as log:
        assert log.append([body(0), body(1), body(2)], timestamp_ms=T0) == (0, 2)
        log.append_tracking(consumers={"c": 2}, timestamp_ms=T0 + 5)  # offset 3
        assert log.append([body(4), body(5)], timestamp_ms=T0 + 10) == (4, 5)
        assert log.append([body(6)], timestamp_ms=T0 + 20) == (6, 6)
        assert log.sync() == 6
        everything = [(0, T0, body(0)), (1, T0, body(1)), (2, T0, body(2))]
        everything += [(4, T0 + 10, body(4)), (5, T0 + 10, body(5)), (6, T0 + 20, body(6))]

        assert (log.first_offset, log.last_offset, log.committed_offset) == (0, 6, 6)
        assert read_all(log, "first") == everything
        assert read_all(log, "last") == everything[-1:]
        assert read_all(log, 1) == everything[1:]
        assert read_all(log, 5) == everything[4:]
        assert read_all(log, 3) == everything[3:]  # the tracking chunk's offset
        assert read_all(log, Timestamp(T0 + 1)) == everything[3:]
        assert read_all(log, Timestamp(T0 + 10)) == everything[3:]
        assert read_all(log, Timestamp(T0 + 21)) == []

        following = log.reader("next")
        assert list(following) == []
        log.append([body(7)], timestamp_ms=T0 + 30)
        assert list(following) == []  # not committed yet
        log.sync()
        assert list(following) == [(7, T0 + 30, body(7))]
        following.close()


def test_an_offset_outside_the_stream_raises_naming_the_valid_range(tmp_path):
    with StreamLog(tmp_path) as log:
        log.append([b"a", b"b"])
        log.sync()
        assert read_all(log, 2) == []  # the next offset is a valid start
        with pytest.raises(OffsetOutOfRange, match="offsets 0 to 1 .and 2 next"):
            log.reader(3)
        with pytest.raises(OffsetOutOfRange):
            log.reader(-1)


def test_readers_never_see_past_the_committed_offset(tmp_path):
    with StreamLog(tmp_path) as log:
        log.append([b"a"])
        log.sync()
        log.append([b"b"])
        assert log.committed_offset == 0 and log.last_offset == 1
        assert [r[2] for r in read_all(log)] == [b"a"]
        with StreamReader(tmp_path, "first", committed_offset=-1) as reader:
            assert list(reader) == []


def test_a_sync_on_another_thread_covers_what_came_before_it_even_past_a_rollover(tmp_path):
    with StreamLog(tmp_path, max_segment_chunks=2) as log:
        log.append([b"a", b"b"])
        first = log.begin_sync()  # covers offsets 0 and 1
        log.append([b"c"])
        log.append([b"d"])  # a rollover: the segment first syncs is closed by the writer
        second = log.begin_sync()
        assert log.committed_offset == -1
        with pytest.raises(StreamError, match="not run"):
            log.commit(first)
        # the later sync ends first: the earlier one must not move the offset back
        assert log.commit(second.run()) == log.last_offset
        assert log.commit(first.run()) == log.last_offset
        assert [r[2] for r in read_all(log)] == [b"a", b"b", b"c", b"d"]
    with StreamLog(tmp_path) as reopened:
        assert [r[2] for r in read_all(reopened)] == [b"a", b"b", b"c", b"d"]


@pytest.mark.parametrize("where", ["group commit", "rollover"])
def test_after_a_failed_flush_nothing_more_is_committed_until_the_stream_is_reopened(
    tmp_path, monkeypatch, where
):
    log = StreamLog(tmp_path, max_segment_chunks=2)
    log.append([b"a"])
    fail_the_next_fdatasync(monkeypatch)
    with pytest.raises(OSError, match="Input/output error"):
        if where == "group commit":
            log.sync()
        else:
            log.append([b"b"])
            log.append([b"c"])  # the segment is full: fdatasync'd before the next one
    # The kernel may have dropped the pages it could not write: a second fdatasync
    # succeeding would prove nothing, and a sync with nothing new to flush none at all.
    with pytest.raises(StreamError, match="a flush failed"):
        log.sync()
    assert log.committed_offset == -1
    with pytest.raises(StreamError, match="a flush failed"):
        log.close()
    with StreamLog(tmp_path) as reopened:  # the lock was released; recovery from disk
        assert [r[2] for r in read_all(reopened)][:1] == [b"a"]
        assert reopened.sync() == reopened.last_offset


def test_a_second_writer_on_the_directory_is_refused(tmp_path, held_lock_refused_at_once):
    with StreamLog(tmp_path):
        with pytest.raises(StreamLocked):
            StreamLog(tmp_path)


# -- rollover and tracking ----------------------------------------------------------------


def snapshot_of(tmp_path, first: int) -> bytes:
    segment = (tmp_path / segment_file_name(first)).read_bytes()
    assert segment[8 + 1] == CHUNK_TRACKING_SNAPSHOT
    assert int.from_bytes(segment[8 + 24 : 8 + 32], "big") == first
    (entry,) = decode_entries(segment[8 + 48 : 8 + 48 + int.from_bytes(segment[44:48], "big")])
    return entry


def test_rollover_by_chunk_count_starts_each_segment_with_a_tracking_snapshot(tmp_path):
    with StreamLog(tmp_path, max_segment_chunks=3) as log:
        log.append_tracking(producers={"p": 1}, consumers={"c": 0})
        for n in range(8):
            log.append([body(n)], producer_sequences={"p": n + 2})
        log.sync()
        firsts = [info.first_offset for info in log.segments()]
        assert len(firsts) == 4
        for first in firsts[1:]:
            records = read_index(str(tmp_path / index_file_name(first)))
            assert records[0].chunk_type == CHUNK_TRACKING_SNAPSHOT
            assert len(records) <= 3
            assert snapshot_of(tmp_path, first).startswith(b"\x00\x01p")
        assert log.tracking().producers == {"p": 9}
        assert [r[2] for r in read_all(log)] == [body(n) for n in range(8)]


def test_rollover_by_size_keeps_each_segment_under_the_limit(tmp_path):
    with StreamLog(tmp_path, max_segment_size_bytes=2_000) as log:
        log.append_tracking(consumers={"reader": 0})
        for n in range(40):
            log.append([body(n) * 4])
        log.sync()
        infos = log.segments()
        assert len(infos) > 3
        for info in infos:
            assert os.path.getsize(info.segment_path) <= 2_000
        for info in infos[1:]:
            assert snapshot_of(tmp_path, info.first_offset) == (
                b"\x01\x06reader" + (0).to_bytes(8, "big")
            )
        assert [r[2] for r in read_all(log)] == [body(n) * 4 for n in range(40)]


def test_tracking_survives_reopen_and_retention_through_snapshots(tmp_path):
    with StreamLog(tmp_path, max_segment_chunks=2) as log:
        log.append_tracking(producers={"p": 1}, consumers={"c": 10})
        log.append([b"x"], producer_sequences={"p": 2, "q": 5})
        for n in range(6):
            log.append([body(n)])
        log.append_tracking(consumers={"c": 11, "d": 3})
        expected = ({"p": 2, "q": 5}, {"c": 11, "d": 3})
        assert log.tracking() == expected
        log.apply_retention(max_bytes=0)
        assert len(log.segments()) == 1
    with StreamLog(tmp_path, max_segment_chunks=2) as log:
        assert log.tracking() == expected


def test_user_records_leave_out_tracking_chunks_and_snapshots_across_reopen_and_retention(
    tmp_path,
):
    with StreamLog(tmp_path, max_segment_chunks=2) as log:
        log.append([b"a", b"b", b"c"])  # offsets 0-2
        log.append_tracking(consumers={"billing": 2})  # 3
        assert log.user_records(0, log.last_offset + 1) == 3
        for n in range(5):  # each chunk after the second in a segment rolls over: a snapshot
            log.append([body(n)])
        assert log.last_offset + 1 - 3 > 5  # offsets taken by snapshots too
        assert log.user_records(3, log.last_offset + 1) == 5
        assert log.user_records(-10, 10**9) == 8
    with StreamLog(tmp_path, max_segment_chunks=2) as log:  # rebuilt from the indexes
        assert log.user_records(3, log.last_offset + 1) == 5
        log.apply_retention(max_bytes=0)
        held = [offset for offset, _, _ in read_all(log)]
        assert log.user_records(0, log.last_offset + 1) == len(held) == 1


# -- recovery -----------------------------------------------------------------------------


def write_synced_then_unsynced(path) -> tuple[list[tuple[int, int, bytes]], int]:
    """Ten synced chunks then two written but never synced; returns the synced records
    and the last synced offset."""
    log = StreamLog(path)
    for n in range(10):
        log.append([body(2 * n), body(2 * n + 1)], timestamp_ms=T0 + n)
    synced = log.sync()
    records = read_all(log)
    log.append([b"unsynced 1"])
    log.append([b"unsynced 2"])
    log.abandon()
    return records, synced


def test_a_chunk_cut_short_at_the_tail_is_truncated_on_reopen(tmp_path):
    records, synced = write_synced_then_unsynced(tmp_path)
    segment = tmp_path / segment_file_name(0)
    last = chunk_positions(segment.read_bytes())[-1]
    os.truncate(segment, last + 48 + 3)  # the header and three bytes of its data
    with StreamLog(tmp_path) as log:
        assert log.last_offset == synced + 1  # the first unsynced chunk survived whole
        assert read_all(log)[: len(records)] == records
        assert os.path.getsize(segment) == last
        assert len(read_index(str(tmp_path / index_file_name(0)))) == 11
        assert log.append([b"after"]) == (synced + 2, synced + 2)


def test_a_chunk_failing_its_crc_at_the_tail_is_truncated_on_reopen(tmp_path):
    records, synced = write_synced_then_unsynced(tmp_path)
    segment = tmp_path / segment_file_name(0)
    raw = bytearray(segment.read_bytes())
    raw[-1] ^= 0xFF  # the last chunk's data, torn
    raw += b"\x50\x00\x00"  # and the start of a header that never finished
    segment.write_bytes(raw)
    with StreamLog(tmp_path) as log:
        assert log.last_offset == synced + 1
        assert read_all(log)[: len(records)] == records
        assert [r[2] for r in read_all(log, synced + 1)] == [b"unsynced 1"]


def test_a_torn_index_record_at_the_tail_is_cut_and_the_index_rebuilt(tmp_path):
    records, synced = write_synced_then_unsynced(tmp_path)
    index = tmp_path / index_file_name(0)
    before = index.read_bytes()
    index.write_bytes(before[: -29 * 3 - 10])  # three records lost and a fourth torn
    with StreamLog(tmp_path) as log:
        assert index.read_bytes() == before
        assert log.last_offset == synced + 2
        assert read_all(log, 7) == records[7:] + read_all(log, synced + 1)
    garbage = bytearray(before)
    garbage[-29:] = b"\xff" * 29  # a last record pointing nowhere
    index.write_bytes(garbage)
    with StreamLog(tmp_path) as log:
        assert index.read_bytes() == before
    os.unlink(index)  # no index at all
    with StreamLog(tmp_path) as log:
        assert index.read_bytes() == before
        assert read_all(log)[: len(records)] == records


def test_a_flipped_bit_in_a_middle_chunk_raises_instead_of_delivering_it(tmp_path):
    records, synced = write_synced_then_unsynced(tmp_path)
    segment = tmp_path / segment_file_name(0)
    raw = bytearray(segment.read_bytes())
    fifth = chunk_positions(bytes(raw))[4]
    raw[fifth + 48 + 6] ^= 0x04
    segment.write_bytes(raw)
    with StreamLog(tmp_path) as log:
        assert log.last_offset == synced + 2  # damage in the middle is not a torn tail
        reader = log.reader("first")
        assert [reader.read_chunk() for _ in range(4)] == [records[i : i + 2] for i in (0, 2, 4, 6)]
        with pytest.raises(StreamCorrupt, match="chunk 8 .*fails its CRC"):
            reader.read_chunk()
        with pytest.raises(StreamCorrupt):
            reader.read_chunk()  # it stays before the bad chunk
        reader.close()
        assert read_all(log, 10)[:10] == records[10:]


def test_a_flipped_bit_in_an_older_segment_s_last_chunk_costs_that_chunk_alone(tmp_path):
    # Only the newest segment can end in a torn write: an older one was synced whole
    # before the next began. A bit flipped in an older segment's last chunk, with its
    # index damaged too (so that recovery walks it), cut that chunk as torn, and then
    # deleted every later segment as not following it (chaos seed 311768900).
    with StreamLog(tmp_path, max_segment_chunks=3) as log:
        for n in range(9):
            log.append([b"%d" % n])
        log.sync()
    older = tmp_path / segment_file_name(0)
    raw = bytearray(older.read_bytes())
    raw[chunk_positions(bytes(raw))[-1] + 48] ^= 0x04  # its last chunk's data
    older.write_bytes(raw)
    index = tmp_path / index_file_name(0)
    header = bytearray(index.read_bytes())
    header[1] ^= 0x01  # its index's header: recovery walks the segment
    index.write_bytes(header)
    with StreamLog(tmp_path, max_segment_chunks=3) as log:
        assert [info.first_offset for info in log.segments()] == [0, 3, 6]
        assert log.last_offset == 8
        reader = log.reader("first")
        assert [r[2] for r in reader.read_chunk() + reader.read_chunk()] == [b"0", b"1"]
        with pytest.raises(StreamCorrupt):
            reader.read_chunk()
        reader.close()
        assert [r[2] for r in read_all(log, 3)] == [b"%d" % n for n in range(3, 9)]


def test_a_segment_created_but_never_written_is_reused_and_gets_a_snapshot(tmp_path):
    with StreamLog(tmp_path, max_segment_chunks=2) as log:
        log.append_tracking(consumers={"c": 0})
        log.append([b"a"])
    (tmp_path / segment_file_name(2)).write_bytes(b"OSI")  # torn at creation
    (tmp_path / index_file_name(2)).write_bytes(b"")
    with StreamLog(tmp_path, max_segment_chunks=2) as log:
        assert [info.first_offset for info in log.segments()] == [0, 2]
        assert read_index(str(tmp_path / index_file_name(2)))[0].chunk_type == (
            CHUNK_TRACKING_SNAPSHOT
        )
        assert log.append([b"b"]) == (3, 3)
        log.sync()
        assert [r[2] for r in read_all(log)] == [b"a", b"b"]


# -- retention ----------------------------------------------------------------------------


def test_retention_by_bytes_deletes_the_oldest_segments_and_keeps_the_newest(tmp_path):
    with StreamLog(tmp_path, max_segment_chunks=2) as log:
        for n in range(10):
            log.append([body(n)])
        log.sync()
        infos = log.segments()
        assert len(infos) == 5
        limit = infos[-1].size_bytes + infos[-2].size_bytes
        assert log.apply_retention(max_bytes=limit) == [0, 2, 4]
        assert not any(os.path.exists(info.segment_path) for info in infos[:3])
        assert not any(os.path.exists(info.index_path) for info in infos[:3])
        assert log.size_bytes() == limit
        assert log.first_offset == 6
        assert [r[0] for r in read_all(log)] == [6, 7, 8, 9]
        assert log.apply_retention(max_bytes=0) == [6]
        assert [r[0] for r in read_all(log)] == [8, 9]  # the newest segment stays
        with pytest.raises(OffsetOutOfRange, match="offsets 8 to 9"):
            log.reader(7)


def test_retention_by_age_deletes_segments_whose_last_chunk_is_too_old(tmp_path):
    now = T0 / 1000
    with StreamLog(tmp_path, max_segment_chunks=2) as log:
        for n in range(6):
            log.append([body(n)], timestamp_ms=T0 - (6 - n) * 60_000)  # n minutes ago
        log.sync()
        assert log.apply_retention(max_age_s=3.5 * 60, now=now) == [0]
        assert log.apply_retention(max_age_s=1, now=now) == [2]  # the newest stays
        assert log.first_offset == 4
        assert sorted(os.listdir(tmp_path)) == [
            ".identity",
            ".lock",
            "00000000000000000004.index",
            "00000000000000000004.segment",
        ]


def test_a_reader_in_a_deleted_segment_finishes_it_then_moves_to_the_new_first(tmp_path):
    with StreamLog(tmp_path, max_segment_chunks=2) as log:
        for n in range(10):
            log.append([body(n)])
        log.sync()
        reader = log.reader("first")
        assert [r[0] for r in reader.read_chunk()] == [0]
        log.apply_retention(max_bytes=0)
        assert [r[0] for r in reader] == [1, 8, 9]  # its open segment, then the new first
        reader.close()


# -- other processes ----------------------------------------------------------------------


def read_in_another_process(directory, committed, stop, results) -> None:
    """Read the stream as it grows, checking every record against the committed offset
    published by the writer; report every offset read and any seen past it."""
    offsets, beyond = [], []
    with StreamReader(directory, "first", lambda: committed.value) as reader:
        while True:
            stopping = stop.is_set()
            for offset, _timestamp, record in reader:
                if offset > committed.value or record != body(offset):
                    beyond.append(offset)
                offsets.append(offset)
            if stopping:
                break
            time.sleep(0.001)  # pacing: the reader follows, stop decides when it ends
    results.put((offsets, beyond))


def test_a_reader_in_another_process_follows_the_writer_up_to_the_committed_offset(tmp_path):
    context = multiprocessing.get_context("fork")
    committed = context.Value("q", -1)
    stop = context.Event()
    results = context.Queue()
    log = StreamLog(tmp_path, max_segment_size_bytes=4_000)
    reader = context.Process(
        target=read_in_another_process, args=(str(tmp_path), committed, stop, results)
    )
    reader.start()
    try:
        for _ in range(150):
            log.append([body(o) for o in range(log.last_offset + 1, log.last_offset + 6)])
            committed.value = log.sync()
            # on disk but uncommitted until the next sync, the last one for good
            log.append([body(log.last_offset + 1)])
            time.sleep(0.001)  # pacing, so that the reader meets the log at many sizes
        stop.set()
        offsets, beyond = results.get(timeout=60)
        reader.join(timeout=30)
        assert reader.exitcode == 0
    finally:
        if reader.is_alive():
            reader.kill()
            reader.join()
        log.abandon()
    assert beyond == []
    assert committed.value == log.last_offset - 1 == 150 * 6 - 2
    assert offsets == list(range(committed.value + 1))
    assert len(log.segments()) > 5


def read_all_committed(directory, committed: int) -> list[tuple[int, int, bytes]]:
    with StreamReader(directory, "first", committed) as reader:
        return list(reader)


WRITER = """
import sys
from warren.queues.engine.stream_log import StreamLog

log = StreamLog(sys.argv[1], max_segment_size_bytes=32 * 1024)
next_offset = 0
while True:
    log.append([f"record {o} ".encode() * 3 for o in range(next_offset, next_offset + 40)])
    next_offset += 40
    if next_offset % 120 == 0:
        print(log.sync(), flush=True)
"""


def test_a_writer_killed_mid_append_loses_nothing_it_reported_synced(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", WRITER, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        reported = [int(child.stdout.readline()) for _ in range(150)]
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        if child.stdout is not None:
            child.stdout.close()
    last_synced = reported[-1]
    assert reported == sorted(reported) and last_synced >= 150 * 120 - 1
    with StreamLog(tmp_path, max_segment_size_bytes=32 * 1024) as log:
        assert log.last_offset >= last_synced
        assert len(log.segments()) > 10
        records = read_all(log)
    assert [offset for offset, _, _ in records] == list(range(log.last_offset + 1))
    assert all(record == body(offset) for offset, _, record in records)


# -- the model ----------------------------------------------------------------------------

names = st.sampled_from(["a", "b", "producer-é"])


class StreamLogModel(RuleBasedStateMachine):
    """Appends, tracking, syncs, reopens and retention against a list and two dicts."""

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.mkdtemp(prefix="stream-model-")
        self.log = self.open()
        self.records: list[tuple[int, bytes]] = []  # every user record kept
        self.next_offset = 0
        self.committed = -1
        self.producers: dict[str, int] = {}
        self.consumers: dict[str, int] = {}

    def open(self) -> StreamLog:
        return StreamLog(self.directory, max_segment_size_bytes=300, max_segment_chunks=3)

    @rule(bodies=st.lists(st.binary(max_size=40), min_size=1, max_size=4), trailer=st.booleans())
    def append(self, bodies, trailer):
        sequences = {"a": self.next_offset} if trailer else None
        first, last = self.log.append(bodies, producer_sequences=sequences)
        self.skip_a_snapshot(first)
        assert (first, last) == (self.next_offset, self.next_offset + len(bodies) - 1)
        self.records += list(zip(range(first, last + 1), bodies, strict=True))
        self.producers.update(sequences or {})
        self.next_offset = last + 1

    @rule(
        producers=st.dictionaries(names, st.integers(0, 2**64 - 1), max_size=2),
        consumers=st.dictionaries(names, st.integers(0, 2**64 - 1), min_size=1, max_size=2),
    )
    def append_tracking(self, producers, consumers):
        offset = self.log.append_tracking(producers, consumers)
        self.skip_a_snapshot(offset)
        assert offset == self.next_offset
        self.producers.update(producers)
        self.consumers.update(consumers)
        self.next_offset += 1

    def skip_a_snapshot(self, first: int) -> None:
        """A chunk that opened a segment follows that segment's tracking snapshot, which
        takes an offset, when there is any tracking."""
        if first == self.next_offset + 1:
            assert self.producers or self.consumers
            assert self.log.segments()[-1].first_offset == self.next_offset
            self.next_offset += 1

    @rule()
    def sync(self):
        assert self.log.sync() == self.next_offset - 1
        self.committed = self.next_offset - 1

    @rule(clean=st.booleans())
    def reopen(self, clean):
        if clean:
            self.log.close()
        else:
            self.log.abandon()
        self.log = self.open()
        self.committed = self.next_offset - 1  # whatever reached the page cache is kept

    @rule(max_bytes=st.integers(0, 1_500))
    def retention(self, max_bytes):
        self.log.apply_retention(max_bytes=max_bytes)
        assert self.log.size_bytes() <= max_bytes or len(self.log.segments()) == 1
        assert self.log.last_offset == self.next_offset - 1
        self.records = [(o, r) for o, r in self.records if o >= self.log.first_offset]

    @invariant()
    def reads_match_the_model(self):
        expected = [(o, r) for o, r in self.records if o <= self.committed]
        assert [(o, r) for o, _, r in read_all(self.log)] == expected
        assert self.log.committed_offset == self.committed
        assert self.log.tracking() == (self.producers, self.consumers)

    @invariant()
    def user_records_count_records_not_tracking(self):
        offsets = [o for o, _ in self.records]
        assert self.log.user_records(0, self.next_offset) == len(offsets)
        if offsets:  # from a record's offset on, and from the offset after it
            middle = offsets[len(offsets) // 2]
            later = [o for o in offsets if o > middle]
            assert self.log.user_records(middle, self.next_offset) == len(later) + 1
            assert self.log.user_records(middle + 1, self.next_offset + 5) == len(later)

    def teardown(self):
        self.log.abandon()
        shutil.rmtree(self.directory, ignore_errors=True)


TestStreamLogModel = StreamLogModel.TestCase
TestStreamLogModel.settings = settings(
    max_examples=60,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def test_a_stream_keeps_its_identity_across_opens_and_a_new_directory_gets_another(tmp_path):
    with StreamLog(tmp_path / "a") as log:
        first = log.identity
    with StreamLog(tmp_path / "a") as log:
        assert log.identity == first
    with StreamLog(tmp_path / "b") as other:
        assert other.identity != first


def test_chunk_ranges_cut_on_chunk_boundaries_and_cover_the_range_once(tmp_path):
    with StreamLog(tmp_path, max_segment_chunks=3) as log:
        for n in range(10):
            log.append([body(n * 10 + i) for i in range(10)])  # chunk n: offsets 10n..10n+9
        log.sync()
    ranges = chunk_ranges(tmp_path, 15, 95, target_bytes=1)  # one chunk each
    assert ranges[0] == (15, 20) and ranges[-1] == (90, 95)
    assert all(high == low for (_, high), (low, _) in zip(ranges, ranges[1:], strict=False))
    assert all(low % 10 == 0 for low, _ in ranges[1:])
    assert chunk_ranges(tmp_path, 0, 100, target_bytes=2**30) == [(0, 100)]
    assert chunk_ranges(tmp_path, 40, 40, target_bytes=1) == []


def test_a_raw_chunk_is_checked_where_it_arrives(tmp_path):
    with StreamLog(tmp_path) as log:
        log.append([b"one", b"two"])
        log.sync()
        with log.reader() as reader:
            raw = reader.read_raw_chunk()
    assert raw is not None
    header, bodies = unpack_chunk(raw, "test")
    assert (header.chunk_id, bodies) == (0, [b"one", b"two"])
    damaged = bytearray(raw)
    damaged[-2] ^= 1
    with pytest.raises(StreamCorrupt, match="test \\(chunk 0\\): its data fails its CRC"):
        unpack_chunk(bytes(damaged), "test")
    with pytest.raises(StreamCorrupt, match="cut short"):
        unpack_chunk(raw[:-1], "test")
