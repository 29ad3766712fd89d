"""The ``warren`` command as an operator meets it: its help, its settings from options and
a TOML file, and one clear line (never a traceback) for every mistake."""

import ctypes
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from warren.store import MessageStore
from warren.supervisor import Node
from warren.supervisor.cli.main import build_parser, format_status, node_settings
from warren.supervisor.cli.queues import format_queues
from warren.supervisor.errors import UsageError
from warren.supervisor.tables import Column, format_table, shown_width

from ...waiting import wait_for
from ..node.test_node import warren_node

ROOT = Path(__file__).resolve().parents[3]
WARREN = [sys.executable, "-m", "warren.supervisor.cli"]


def warren(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*WARREN, *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout
    )


def settings_from(*argv: str) -> dict:
    return node_settings(build_parser().parse_args(["node", *argv]))


def test_version_and_an_unknown_option_answered_by_the_subcommand_itself():
    version = warren("--version")
    assert version.returncode == 0 and version.stdout.startswith("warren ")
    bogus = warren("node", "--bogus")
    assert bogus.returncode == 2
    assert bogus.stderr.startswith("usage: warren node ")
    assert "warren node: error: unrecognized arguments: --bogus" in bogus.stderr
    nested = warren("declare", "queue", "q", "--data-dir", "d", "--bogus")
    assert "warren declare queue: error: unrecognized arguments: --bogus" in nested.stderr


def test_help_lists_every_exit_code_and_says_linux_is_required():
    shown = warren("--help")
    assert shown.returncode == 0
    for code in ("0", "1", "2", "3", "4"):
        assert f"\n  {code}  " in shown.stdout
    assert "Linux" in shown.stdout
    assert "exit codes" in warren("node", "--help").stdout


@pytest.mark.parametrize(
    "data_dir, complaint",
    [
        ("", "must name a directory"),
        ("/nonexistent-parent-of-warren/data", "does not exist; create it first"),
    ],
)
def test_an_empty_data_dir_or_one_with_a_missing_parent_is_refused(data_dir, complaint):
    refused = warren("node", "--data-dir", data_dir)
    assert refused.returncode == 2
    assert complaint in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not os.path.exists("/nonexistent-parent-of-warren")


def test_a_directory_of_other_files_is_refused_by_node_and_keys_and_left_as_it_was(tmp_path):
    papers = tmp_path / "papers"
    papers.mkdir()
    (papers / "thesis.txt").write_text("years of work")
    for command in (["node"], ["keys", "laptop", "--out", str(tmp_path)], ["users", "add", "x"]):
        refused = warren(*command, "--data-dir", str(papers))
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr.splitlines() == [
            f"warren: {papers} is not a node's data directory (it has files, but none of "
            "node.lock, definitions.json, msg_store_persistent, node.key, amqp_users): give "
            "a new or empty directory, or a node's"
        ]
        assert os.listdir(papers) == ["thesis.txt"]
    assert not (tmp_path / "laptop.key").exists()
    missing = warren("keys", "laptop", "--data-dir", str(tmp_path / "nowhere"))
    assert missing.returncode == 2
    assert missing.stderr.splitlines() == [
        f"warren: {tmp_path / 'nowhere'} does not exist; name a node's data directory"
    ]


def test_a_key_written_into_a_missing_directory_is_one_line(tmp_path):
    (tmp_path / "data").mkdir()
    refused = warren(
        "keys", "laptop", "--data-dir", str(tmp_path / "data"), "--out", str(tmp_path / "nowhere")
    )
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        f"warren: {tmp_path / 'nowhere'} is not a directory; make it first, or give another"
    ]


def test_a_config_file_sets_what_node_takes_and_options_win(tmp_path):
    config = tmp_path / "warren.toml"
    config.write_text(
        f'[node]\ndata_dir = "{tmp_path / "data"}"\nlog_level = "info"\n'
        f'[store]\nfile_size_limit = "4MiB"\nsync_policy = "flush"\ngc = "combine"\n'
        f'[alarms]\ndisk_free_limit = "1GB"\nmemory_high_watermark = 0.5\n'
    )
    settings = settings_from(
        "--config", str(config), "--sync-policy", "fsync", "--memory-limit", "2GiB"
    )
    assert settings["store_gc"] == "combine"
    assert settings_from("--config", str(config), "--store-gc", "compact")["store_gc"] == "compact"
    assert settings["data_dir"] == str(tmp_path / "data")
    assert settings["log_level"] == "INFO"
    assert settings["file_size_limit"] == 4 * 2**20
    assert settings["sync_policy"] == "fsync"
    limits = settings["alarm_limits"]
    assert limits.disk_free_limit_bytes == 10**9
    assert limits.memory_high_watermark == 0.5
    assert limits.memory_limit_bytes == 2 * 2**30


@pytest.mark.parametrize(
    "content, complaint",
    [
        ('[store]\nfile_size_limt = "4MiB"\n', "unknown key 'file_size_limt' in [store]"),
        ("[queues]\nx = 1\n", "unknown section [queues]"),
        ('[store]\nfile_size_limit = "4 parsecs"\n', "unknown unit 'parsecs'"),
        ('[store]\nsync_policy = "sometimes"\n', "sync_policy must be 'fsync' or 'flush'"),
        ('[store]\ngc = "sweep"\n', "gc must be 'compact' or 'combine', got 'sweep'"),
        ("[alarms]\nmemory_high_watermark = 7\n", "memory_high_watermark=7"),
        ("[store\n", "is not valid TOML"),
        (bytes(range(256)), "is not text: a config file is UTF-8 TOML"),
    ],
)
def test_a_config_file_with_a_mistake_is_refused_with_the_key_named(tmp_path, content, complaint):
    config = tmp_path / "warren.toml"
    config.write_bytes(content if isinstance(content, bytes) else content.encode())
    refused = warren("node", "--config", str(config), "--data-dir", str(tmp_path / "data"))
    assert refused.returncode == 2
    assert complaint in refused.stderr
    assert "Traceback" not in refused.stderr
    assert not (tmp_path / "data").exists()


def test_a_node_started_from_a_config_file_raises_the_disk_alarm_it_sets(tmp_path):
    data = tmp_path / "data"
    config = tmp_path / "warren.toml"
    config.write_text(
        f'[node]\ndata_dir = "{data}"\n'
        f'[alarms]\ndisk_free_limit = "1000000TB"\ncheck_interval_s = 0.1\n'
    )
    with warren_node(str(data), "--config", str(config)) as node:
        assert node.stdout.readline().startswith("node warren")

        def alarms_shown():
            shown = warren("status", "--data-dir", str(data), timeout=30)
            return shown.returncode == 0 and "alarms: disk" in shown.stdout

        wait_for(alarms_shown)
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0


def test_inspect_of_a_directory_that_is_not_a_store_exits_2_without_a_traceback(tmp_path):
    (tmp_path / "photos").mkdir()
    (tmp_path / "notes.txt").write_text("hello")
    for target in ("photos", "notes.txt", "missing"):
        refused = warren("store", "inspect", str(tmp_path / target))
        assert refused.returncode == 2, target
        assert "is not a store directory" in refused.stderr
        assert "Traceback" not in refused.stderr


def test_a_directory_named_like_a_data_file_is_listed_and_ignored_by_inspect(tmp_path):
    store_dir = tmp_path / "store"
    with MessageStore(store_dir) as store:
        store.write(b"m" * 16, b"kept")
    (store_dir / "3.rdq").mkdir()
    shown = warren("store", "inspect", str(store_dir))
    assert shown.returncode == 0, shown.stderr
    assert "not regular files, ignored: 3.rdq" in shown.stdout
    assert "1 files, 1 messages" in shown.stdout


def test_tables_fit_an_80_column_terminal_by_wrapping_the_long_columns():
    columns = (Column("what", wrap=True), Column("figure", ">"), Column("note", wrap=True))
    rows = [
        [
            "a benchmark whose name is long enough to need two lines at least",
            "61,425",
            "confirm p50 20.7 ms p99 33.1 ms with a thousand writes in flight",
        ]
    ]
    table = format_table(columns, rows)
    assert all(len(line) <= 80 for line in table.splitlines())
    assert " ".join(table.split()).count("61,425") == 1
    words = "".join(table.splitlines()[2:])
    assert all(word in words for word in rows[0][0].split() + rows[0][2].split())
    with pytest.raises(ValueError, match="2 cells for 3 columns"):
        format_table(columns, [["one", "two"]])


def test_long_names_are_cut_with_an_ellipsis_and_big_counts_abbreviated_to_fit_80_columns():
    long_name = "orders." + "eu-west." * 30 + "priority"
    stats = {
        "mode": "lazy",
        "messages_ready": 12_345_678_901,
        "messages_unacked": 987_654,
        "alpha": 0,
        "beta": 1_500_000,
        "gamma": 99_999,
        "delta": 12_345_678_901,
        "ram_bytes": 3 * 2**20,
        "disk_bytes": 40 * 2**30,
        "rates": {"ingress": 1_234_567.0, "egress": 45_000.4},
    }
    table = format_queues(
        [
            {"name": long_name, "state": "running", "stats": stats},
            {"name": "short", "state": "restarting", "stats": None},
        ]
    )
    lines = table.splitlines()
    assert all(len(line) <= 80 for line in lines), table
    assert len(lines) == 4  # header, rule, one line per queue
    assert lines[2].startswith("orders.eu-w…  running")
    assert lines[2].split()[2:] == ["12G", "988k", "0/1.5M/100k/12G", "3.1MB", "43GB", "1.2M/45k"]
    bindings = format_table(
        (Column("exchange", cut=True, min_width=10), Column("queue", cut=True, min_width=10)),
        [[long_name, long_name]],
    )
    assert all(len(line) <= 80 and line.count("…") in (0, 2) for line in bindings.splitlines())


def test_the_status_table_fits_80_columns():
    actor = {
        "kind": "actor",
        "pid": 4242,
        "state": "running",
        "restarts": 0,
        "rss_bytes": 30 * 2**20,
        "cpu_percent": 1.5,
    }
    status = {
        "node": "warren",
        "pid": 1,
        "data_dir": "/var/lib/warren",
        "state": "running",
        "alarms": [],
        "stores": {},
        "tree": {
            "id": "node",
            "kind": "supervisor",
            "strategy": "rest_for_one",
            "state": "running",
            "children": [
                {**actor, "id": "msg_store_persistent"},
                {
                    "id": "queue_sup",
                    "kind": "supervisor",
                    "state": "running",
                    "strategy": "one_for_one",
                    "children": [{**actor, "id": "queue an-order-queue-with-a-rather-long-name"}],
                },
            ],
        },
    }
    shown = format_status(status)
    assert all(len(line) <= 80 for line in shown.splitlines())
    assert "msg_store_persistent" in shown and "4242" in shown


def test_a_size_needs_a_known_unit():
    with pytest.raises(UsageError, match="unknown unit"):
        settings_from("--data-dir", "/tmp/x", "--file-size-limit", "3 furlongs")
    assert (
        settings_from("--data-dir", "/tmp/x", "--file-size-limit", "1.5MB")["file_size_limit"]
        == 1_500_000
    )


@pytest.mark.parametrize(
    "target, complaint",
    [
        ("tests.supervisor.sample_actors", "as module:function"),
        ("tests.no_such_module:children", "cannot import tests.no_such_module"),
        ("tests.supervisor.sample_actors:no_such_function", "has no no_such_function"),
        ("tests.supervisor.cli.test_cli:not_specs", "must return ChildSpecs and SupervisorSpecs"),
        ("json:loads", "json:loads('"),  # a function that raises on a data directory
    ],
)
def test_an_application_tree_that_cannot_be_had_is_refused_in_one_line(tmp_path, target, complaint):
    refused = warren("node", "--data-dir", str(tmp_path / "data"), "--children", target)
    assert refused.returncode == 2 and complaint in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    assert "Traceback" not in refused.stderr and not (tmp_path / "data").exists()


def not_specs(data_dir):
    return ["a worker, in words"]


def test_the_application_tree_is_called_with_the_data_directory(tmp_path):
    settings = settings_from(
        "--data-dir", str(tmp_path / "data"), "--children", "tests.supervisor.cli.test_cli:tree_of"
    )
    (child,) = settings["children"]
    assert child.id == "worker" and child.args == (str(tmp_path / "data"),)


def tree_of(data_dir):
    from warren.supervisor import ChildSpec

    from ..sample_actors import Worker

    return [ChildSpec("worker", Worker, (data_dir,))]


@pytest.mark.parametrize("value", ["1", "0", "-5", "nan", "inf"])
def test_a_heartbeat_timeout_under_two_seconds_or_not_finite_is_refused(tmp_path, value):
    with pytest.raises(UsageError, match="heartbeat_timeout_s must be a finite number of seconds"):
        settings_from("--data-dir", str(tmp_path / "data"), "--heartbeat-timeout-s", value)


SETTINGS_AND_BAD_VALUES = [
    (section, key, value)
    for section, key, values in [
        ("node", "heartbeat_timeout_s", ["nan", "inf", "-inf", "0", "-3"]),
        ("alarms", "check_interval_s", ["nan", "inf", "0", "-1"]),
        ("alarms", "memory_high_watermark", ["nan", "inf", "0", "-0.5"]),
        ("store", "file_size_limit", ['"nan"', '"inf"', "0", '"0MiB"', "-1"]),
        ("alarms", "memory_limit", ['"nan"', '"inf"', "0", "-1"]),
        ("alarms", "disk_free_limit", ['"nan"', '"inf"', "-1"]),
    ]
    for value in values
]


@pytest.mark.parametrize("section, key, value", SETTINGS_AND_BAD_VALUES)
def test_nan_infinite_zero_and_negative_settings_are_refused_from_toml_and_options(
    tmp_path, section, key, value
):
    data = str(tmp_path / "data")
    config = tmp_path / "warren.toml"
    config.write_text(f"[{section}]\n{key} = {value}\n")
    with pytest.raises(UsageError, match=key.removesuffix("_bytes")):
        settings_from("--config", str(config), "--data-dir", data)
    option = "--" + key.replace("_", "-")
    with pytest.raises(UsageError, match=key.removesuffix("_bytes")):
        settings_from("--data-dir", data, f"{option}={value.strip(chr(34))}")


def test_a_command_without_its_subcommand_names_them_in_plain_words():
    for command, named in ((["store"], "inspect"), (["declare"], "queue, exchange"), ([], "node")):
        shown = warren(*command)
        assert shown.returncode == 2
        assert f"error: name one of its commands: {named}" in shown.stderr
        assert "store_command" not in shown.stderr and "declare_kind" not in shown.stderr
        assert "Traceback" not in shown.stderr


def test_inspect_of_a_queue_directory_reads_its_segment_files(tmp_path):
    data = str(tmp_path / "data")
    with Node(data) as node:
        node.declare_queue("orders")
        with node.connect() as connection:
            connection.publish_many("orders", [b"order %d" % n for n in range(5)])
            delivery = connection.get("orders")
            delivery.ack()
    (queue_dir,) = (tmp_path / "data" / "queues").iterdir()
    shown = warren("store", "inspect", str(queue_dir))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"queue directory {queue_dir} (stopped cleanly")
    assert "1 segment file, 4 messages (waiting or unacked)" in shown.stdout
    assert "valid records judged by" not in shown.stdout  # not read as a message store
    segment = queue_dir / "0.qi"
    with open(segment, "r+b") as file:  # a torn write: the last present slot's CRC fails
        file.seek(64 + 4 * 48 + 10)
        file.write(b"\xff")
    torn = warren("store", "inspect", str(queue_dir))
    assert "1 segment file, 3 messages" in torn.stdout
    assert "the queue's next recovery drops 1 torn slot" in torn.stdout


# what a queue killed between writing a small file's copy and its rename leaves beside it
@pytest.mark.parametrize("left_by_a_kill", [None, "store_clients.4242.tmp", "recovery.json.7.tmp"])
def test_inspect_of_an_empty_queues_directory_says_it_is_one(tmp_path, left_by_a_kill):
    with Node(tmp_path / "data") as node:
        node.declare_queue("empty")
    (queue_dir,) = (tmp_path / "data" / "queues").iterdir()
    if left_by_a_kill is not None:
        (queue_dir / left_by_a_kill).write_text("store ab")  # cut short
    shown = warren("store", "inspect", str(queue_dir))
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"queue directory {queue_dir}")


def as_a_user_without_root_override() -> None:
    """Run in a child before it execs: the permission bits bind it as they bind any user.
    Root passes them by two capabilities (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH); they
    are dropped from the child's bounding set, which for a root process is what it holds
    after exec. Not root: nothing to drop."""
    if os.geteuid() != 0:
        return
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2


def warren_unprivileged(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*WARREN, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=as_a_user_without_root_override,
    )


def test_a_data_directory_the_user_may_not_open_is_one_line_and_exit_2(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0)
    try:
        for command in (["node"], ["status"], ["queues"], ["keys", "laptop"]):
            refused = warren_unprivileged(*command, "--data-dir", str(locked))
            assert refused.returncode == 2, (command, refused.stderr)
            assert refused.stderr.startswith(
                f"warren: permission denied on the data directory {locked}: run warren as "
            ), refused.stderr
            assert len(refused.stderr.splitlines()) == 1
    finally:
        locked.chmod(0o700)


def test_a_node_socket_the_user_may_not_open_is_said_so_not_a_silent_node(tmp_path):
    data = str(tmp_path / "data")
    with warren_node(data) as node:
        assert node.stdout.readline().startswith("node warren")
        wait_for(lambda: os.path.exists(os.path.join(data, "node.json")))
        with open(os.path.join(data, "node.json")) as file:
            socket_path = json.load(file)["status_endpoint"].removeprefix("ipc://")
        os.chmod(socket_path, 0)  # the node's own processes keep their open sockets
        try:
            for command in (["status"], ["queues"]):
                refused = warren_unprivileged(*command, "--data-dir", data)
                assert refused.returncode == 2, refused.stderr
                assert refused.stderr.startswith(
                    f"warren: permission denied on the node's socket {socket_path}: "
                ), refused.stderr
                assert "does not answer" not in refused.stderr
        finally:
            os.chmod(socket_path, 0o755)
        assert warren("status", "--data-dir", data).returncode == 0
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0


def test_a_node_says_where_it_listens_and_says_stopped_last(tmp_path):
    data = str(tmp_path / "data")
    with warren_node(data, "--listen", "tcp://127.0.0.1:*", "--http", "127.0.0.1:0") as node:
        assert node.stdout.readline().startswith("node warren")
        wait_for(lambda: os.path.exists(os.path.join(data, "node.json")))
        status = json.loads(warren("status", "--data-dir", data, "--json").stdout)
        listener, page = status["listen_endpoint"], status["management_page"]
        assert listener.startswith("tcp://127.0.0.1:") and not listener.endswith(":*")
        assert page == status["http_endpoint"] + "/"
        with urllib.request.urlopen(page, timeout=30) as answer:
            assert answer.status == 200 and b"<html" in answer.read().lower()
        shown = warren("status", "--data-dir", data).stdout.splitlines()
        assert f"listener: {listener} (remote clients: --url, connect)" in shown
        assert f"management page: {page}" in shown
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0
        printed = node.stdout.read().splitlines()
    assert f"listener: {listener} (remote clients: --url, connect)" in printed
    assert printed[-1] == f"node warren stopped by SIGTERM; its data is in {data}"


def test_wide_names_keep_the_columns_aligned():
    names = ["orders", "注文キュー", "🐇 rabbits", "é-combining" + "\u0301"]
    rows = [{"name": n, "state": "running", "stats": None} for n in names]
    lines = format_queues(rows).splitlines()
    starts = {shown_width(line[: line.index("running")]) for line in lines[2:]}
    assert len(starts) == 1, format_queues(rows)
    long_cjk = "長い名前" * 20
    cut = format_queues([{"name": long_cjk, "state": "running", "stats": None}])
    assert all(shown_width(line) <= 80 for line in cut.splitlines())
    assert "…" in cut


def printed_to_a_reader_that_left(*command: str) -> tuple[int, str]:
    """Run ``warren COMMAND`` with its stdout a pipe whose reader has already exited (as
    ``warren status --json | head`` once head has its lines): the exit status and what
    the command said on stderr."""
    process = subprocess.Popen(
        [*WARREN, *command], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    process.stdout.close()  # the reader is gone before the first line
    try:
        said = process.stderr.read().decode()
        return process.wait(timeout=60), said
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stderr.close()


def test_a_reader_that_went_away_ends_the_command_quietly(tmp_path):
    with MessageStore(tmp_path / "store") as store:
        store.write(b"m" * 16, b"kept")
    code, said = printed_to_a_reader_that_left("store", "inspect", str(tmp_path / "store"))
    assert (code, said) == (141, "")  # SIGPIPE's exit status, as a Unix tool's


def test_a_node_with_an_amqp_port_says_where_and_pika_connects_there(tmp_path):
    import pika

    data = str(tmp_path / "data")
    with warren_node(data, "--amqp", "127.0.0.1:0") as node:
        assert node.stdout.readline().startswith("node warren")
        wait_for(lambda: os.path.exists(os.path.join(data, "node.json")))
        status = json.loads(warren("status", "--data-dir", data, "--json").stdout)
        endpoint = status["amqp_endpoint"]
        host, port = endpoint.rsplit(":", 1)
        assert host == "127.0.0.1" and int(port) > 0
        shown = warren("status", "--data-dir", data).stdout.splitlines()
        assert (
            f"amqp: {endpoint} (AMQP 0-9-1 clients: pika, kombu ...): 0 connections open" in shown
        )
        connection = pika.BlockingConnection(pika.ConnectionParameters(host, int(port)))
        channel = connection.channel()
        channel.queue_declare("from-pika")
        shown = warren("status", "--data-dir", data).stdout
        assert "pika, kombu ...): 1 connection open" in shown
        connection.close()
        assert "from-pika" in warren("queues", "--data-dir", data).stdout
        node.send_signal(signal.SIGTERM)
        assert node.wait(timeout=60) == 0


@pytest.mark.parametrize(
    ("address", "complaint"),
    [
        ("0.0.0.0:5672", "not a loopback address"),
        ("127.0.0.1", "HOST:PORT"),
        ("127.0.0.1:99999", "HOST:PORT"),
    ],
)
def test_an_amqp_address_that_will_not_do_is_refused_in_one_line(tmp_path, address, complaint):
    refused = warren("node", "--data-dir", str(tmp_path / "data"), "--amqp", address)
    assert refused.returncode == 2 and complaint in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    config = tmp_path / "warren.toml"
    config.write_text(f'[amqp]\nlisten = "{address}"\n')
    with pytest.raises(UsageError, match=complaint):
        settings_from("--config", str(config), "--data-dir", str(tmp_path / "data"))
