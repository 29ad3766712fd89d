"""``warren chaos --cluster``: one round of every cluster fault on three real etcd members
and three nodes passes with nothing lost and nothing left running; its proxies hold a
cut link's bytes and deliver them in order once healed; its checks fail where a replica
differs or two nodes lead under one epoch; bad input is refused before anything
starts."""

import json
import os
import shutil
import signal
import socket
import subprocess
import threading
from pathlib import Path

import pytest

from warren.queues.engine.stream_inspect import chunk_checksums
from warren.queues.engine.stream_log import StreamLog, numbered_files, segment_file_name
from warren.supervisor.chaos.cluster_run import CLUSTER_FAULTS, Leaderships, replica_differences
from warren.supervisor.cluster.tcp_proxy import TcpProxy

from .interrupting import ROOT, WARREN, interrupt_run

needs_etcd = pytest.mark.skipif(
    shutil.which("etcd") is None,
    reason="needs etcd (Debian's etcd-server, which .ci/run installs)",
)


@needs_etcd
@pytest.mark.timeout(900)
def test_one_round_of_every_cluster_fault_loses_nothing_confirmed(tmp_path):
    report_dir = tmp_path / "report"
    run = subprocess.run(
        [
            *WARREN,
            "chaos",
            "--cluster",
            "--data-dir",
            str(tmp_path / "cluster"),
            "--rounds",
            "1",
            "--duration",
            "600",
            "--seed",
            "7",
            "--producers",
            "2",
            "--consumers",
            "1",
            "--size",
            "1KiB..4KiB",
            "--every",
            "0.5..1",
            "--report",
            str(report_dir),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-3000:]
    report = json.loads((report_dir / "report.json").read_text())
    assert sorted(e["kind"] for e in report["events"]) == sorted(CLUSTER_FAULTS)
    assert all(e["landed"] for e in report["events"]) and report["problems"] == []
    assert report["lost"] == 0 and report["unflagged_duplicates"] == 0
    assert report["offset_conflicts"] == [] and report["stream_duplicates"] == []
    assert report["deposed_confirms"] == [] and report["leaders_outside_isr"] == []
    assert report["replica_mismatches"] == [] and report["healthy"] is True
    # the workload went on through the faults, and each fault's pause in confirms is told
    assert report["confirmed"] > 50 and report["stream_confirmed"] > 20
    assert all(e["recovery_s"] is not None for e in report["events"])
    assert report["network_cut_by"].startswith("TCP proxies")
    assert "PASSED: seed 7" in run.stdout


@needs_etcd
@pytest.mark.timeout(600)
def test_an_interrupted_cluster_run_leaves_no_process_behind(tmp_path):
    # while the cluster starts: three etcd members, three nodes and their first actors
    interrupt_run(
        ["--cluster", "--data-dir", str(tmp_path / "c"), "--seed", "3"],
        signal.SIGTERM,
        to_group=True,  # systemd's stop (one node's run is interrupted every other way)
        running_at_least=12,
        start_timeout_s=120,
        stop_timeout_s=240,
    )


@pytest.mark.parametrize(
    "args, complaint",
    [
        (["--faults", "kill-leader,meteor"], "unknown cluster fault meteor"),
        (["--rounds", "0"], "rounds=0: at least 1"),
        (["--patterns", "queue *"], "--patterns is for one node's run, not --cluster"),
        (["--lease-ttl-s", "2"], "--lease-ttl-s: at least 5 seconds"),
    ],
)
def test_bad_cluster_chaos_input_is_refused_before_anything_starts(tmp_path, args, complaint):
    root = tmp_path / "cluster"
    refused = subprocess.run(
        [*WARREN, "chaos", "--cluster", "--data-dir", str(root), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert complaint in refused.stderr and "Traceback" not in refused.stderr
    assert not root.exists()


def test_rounds_and_a_lease_go_with_cluster_only_and_a_used_directory_is_refused(tmp_path):
    alone = subprocess.run(
        [*WARREN, "chaos", "--data-dir", str(tmp_path / "n"), "--rounds", "1"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert alone.returncode == 2 and "--rounds goes with --cluster" in alone.stderr
    used = tmp_path / "used"
    used.mkdir()
    (used / "photo.jpg").write_bytes(b"\xff\xd8")
    refused = subprocess.run(
        [*WARREN, "chaos", "--cluster", "--data-dir", str(used)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode == 2 and "holds files" in refused.stderr
    assert os.listdir(used) == ["photo.jpg"]


# ------------------------------------------------------------------ the proxy


def _echo_server() -> tuple[socket.socket, threading.Thread]:
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=_echo, args=(conn,), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return server, thread


def _echo(conn: socket.socket) -> None:
    with conn:
        while data := conn.recv(65536):
            conn.sendall(data)


def _read(sock: socket.socket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            break
        data += chunk
    return data


def test_a_cut_link_holds_what_both_sides_send_and_delivers_it_in_order_once_healed():
    server, _ = _echo_server()
    proxy = TcpProxy(server.getsockname())
    try:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        client.sendall(b"before")
        assert _read(client, 6) == b"before"
        proxy.cut()
        client.sendall(b"during the cut, ")
        client.sendall(b"in two writes")
        client.settimeout(1.0)
        with pytest.raises(TimeoutError):  # neither end is told: nothing comes back
            client.recv(100)
        late = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        late.sendall(b"a new connection")
        late.settimeout(1.0)
        with pytest.raises(TimeoutError):  # accepted, and held the same way
            late.recv(100)
        proxy.heal()
        client.settimeout(10)
        late.settimeout(10)
        assert _read(client, 29) == b"during the cut, in two writes"
        assert _read(late, 16) == b"a new connection"
        client.close()
        late.close()
    finally:
        proxy.close()
        server.close()


def test_a_proxy_to_an_upstream_that_is_down_closes_the_connection_as_a_dead_peer_does():
    with socket.create_server(("127.0.0.1", 0)) as gone:
        address = gone.getsockname()
    proxy = TcpProxy(address)
    try:
        client = socket.create_connection(("127.0.0.1", proxy.port), timeout=10)
        assert client.recv(10) == b""  # closed: nothing listens upstream
        client.close()
    finally:
        proxy.close()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=5)


# ------------------------------------------------------------------ the checks can fail


def _stream(directory: Path, chunks: int) -> None:
    with StreamLog(str(directory), max_segment_size_bytes=2048) as stream:
        for n in range(chunks):
            stream.append([f"record {n}".encode() * 20])
        stream.sync()


def test_copies_of_a_stream_that_differ_are_named_chunk_by_chunk(tmp_path):
    for name in ("n0", "n1", "n2"):
        _stream(tmp_path / name, 30)
    same = {name: chunk_checksums(tmp_path / name) for name in ("n0", "n1", "n2")}
    assert len(same["n0"]) >= 30 and replica_differences(same) == []
    # a follower behind by its tail is no difference: it was not shipped yet
    behind = dict(same, n2={c: crc for c, crc in same["n2"].items() if c < 20})
    assert replica_differences(behind) == []
    # a copy missing, or empty, while the others hold the stream
    assert replica_differences(dict(same, n2=None)) == [
        f"n2 holds no copy of the stream (n0 holds {len(same['n0'])} chunks)"
    ]
    assert replica_differences(dict(same, n1={})) == [
        f"n1 holds an empty copy of the stream (n0 holds {len(same['n0'])} chunks)"
    ]
    with pytest.raises(FileNotFoundError):
        chunk_checksums(tmp_path / "never made")
    # one chunk's data flipped on n1: its CRC fails there
    segment = (
        tmp_path / "n1" / segment_file_name(numbered_files(str(tmp_path / "n1"), ".segment")[0])
    )
    data = bytearray(segment.read_bytes())
    data[-10] ^= 0xFF
    segment.write_bytes(bytes(data))
    flipped = dict(same, n1=chunk_checksums(tmp_path / "n1"))
    assert any("n1: chunk" in d and "fails its CRC" in d for d in replica_differences(flipped))
    # another record written at an offset: the two copies' CRCs differ
    first = min(same["n0"])
    other = dict(same, n0={**same["n0"], first: same["n0"][first] ^ 1})
    assert any(f"chunk {first}: CRC" in d for d in replica_differences(other))
    # a hole in the middle of one copy
    holed = dict(same, n0={c: crc for c, crc in same["n0"].items() if c != sorted(same["n0"])[5]})
    assert any("not on n0" in d for d in replica_differences(holed))


def _leader(epoch: int, confirmed: int, isr=("n0", "n1", "n2")) -> dict:
    """A leader's view of its cluster, having answered ``confirmed`` commits."""
    return {
        "role": "leader",
        "epoch": epoch,
        "isr": list(isr),
        "replication": {"mode": "leader", "epoch": epoch, "counters": {"confirmed": confirmed}},
    }


def test_a_deposed_leader_that_commits_or_a_leader_outside_its_isr_is_named():
    seen = Leaderships()
    seen.see("n0", _leader(7, 100))
    seen.see("n0", _leader(7, 180))  # the leader commits: fine
    seen.see("n1", {"role": "follower", "epoch": 7, "isr": ["n0", "n1", "n2"]})
    seen.see("n1", _leader(9, 181, isr=("n1", "n2")))  # n0 paused, n1 took over
    # n0 resumed: its stale view still says it leads at 7, and it confirms nothing more
    seen.see("n0", _leader(7, 190))
    seen.see("n0", _leader(7, 190))
    assert seen.deposed_confirms == [] and seen.outside_isr == []
    seen.see("n0", _leader(7, 195))  # ... and then it moves: a confirm nobody fenced
    seen.see("n2", _leader(12, 10, isr=("n0", "n1")))
    assert seen.deposed_confirms == ["n0 confirmed 5 commits under epoch 7 after epoch 9 led"]
    assert seen.outside_isr == ["n2 led under epoch 12 outside its ISR ['n0', 'n1']"]
