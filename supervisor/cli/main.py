"""The ``warren`` command line.

    warren node --data-dir DIR [--config FILE] [options]   run a node in the foreground
    warren status --data-dir DIR [--json]                  the tree of the node on DIR
    warren keys --data-dir DIR NAME [--out DIR]            a CURVE key for a remote client
    warren users add|password|delete|list --data-dir DIR [NAME]
                                                           the AMQP port's users
    warren chaos --data-dir DIR [--duration S] [--faults K,K] [--seed N] [--report DIR]
                                                           a node under faults and load,
                                                           then its invariants checked
    warren chaos --cluster --data-dir DIR [--rounds N] ... the same for a cluster of three
    warren store inspect DIR                               what a store, stream or queue
                                                           directory holds
    warren queues | publish | consume | purge | delete     a running node's queues
                                                           (``warren.supervisor.cli.queues``)

``warren node`` takes every setting ``Node`` takes, from a TOML file (``--config``) and
from options, the options winning::

    [node]
    data_dir = "/var/lib/warren"
    name = "warren"
    log_level = "INFO"             # DEBUG, INFO, WARNING, ERROR
    heartbeat_timeout_s = 60       # a store, GC or queue silent this long is killed
    children = "myapp.tree:children"   # the application's tree: a function of the data
                                       # directory returning ChildSpecs and
                                       # SupervisorSpecs (run under app_sup)

    [store]
    file_size_limit = "16MiB"      # bytes, or a size with a unit: kB MB GB KiB MiB GiB
    sync_policy = "fsync"          # or "flush"
    gc = "compact"                 # or "combine" (docs/store.md, "Garbage collection")

    [listener]
    listen = "tcp://127.0.0.1:5673"   # remote clients (warren.connect("tcp://..."))
    curve = false                  # require a key from `warren keys` (any non-loopback
    insecure = false               # address needs curve, or insecure to say you mean it)

    [http]
    listen = "127.0.0.1:15692"     # /metrics for Prometheus, /api/* as JSON (any
                                   # non-loopback address needs insecure, here or in
                                   # [listener]; port 0: any free one)

    [amqp]
    listen = "127.0.0.1:5672"      # AMQP 0-9-1 clients (pika, kombu, Celery); users
                                   # from `warren users` (guest: from loopback only)
    certfile = "/etc/warren/amqp.pem"    # TLS: a non-loopback address needs it, or
    keyfile = "/etc/warren/amqp.key"     # insecure (passwords would cross in clear)

    [cluster]
    name = "orders"                # join this cluster (docs/cluster.md); with etcd and peer
    etcd = "http://10.0.0.1:2379,http://10.0.0.2:2379,http://10.0.0.3:2379"
    peer = "tcp://10.0.0.1:5680"   # where the cluster's other nodes reach this one
    lease_ttl_s = 10               # a leader unheard of this long is replaced

    [alarms]
    memory_high_watermark = 0.4    # a fraction of RAM (or of the cgroup's limit)
    memory_limit = "2GiB"          # instead of the fraction
    disk_free_limit = "50MB"
    check_interval_s = 1.0

A key the file does not know, a value of the wrong type or out of range, an empty
``--data-dir`` or one whose parent directory does not exist: a one-line error and exit 2,
before anything starts. Nothing here prints a traceback for a mistake a user can make.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import os
import re
import sys
import textwrap
import time
import tomllib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from ..errors import UsageError
from ..tables import Column, counted, format_table, strict_json
from ..version import __version__
from .access import (
    node_status,
    permission_denied,
    usable_data_directory,
)
from .cluster import add_cluster_commands, add_cluster_options, cluster_settings
from .queues import add_queue_commands
from .sizes import parse_size
from .users import add_user_commands

if TYPE_CHECKING:
    from warren.store.engine.inspect import StoreReport

EXIT_OK = 0
EXIT_NO_NODE = 1
EXIT_INVARIANT_FAILED = 1  # warren chaos
EXIT_USAGE = 2
EXIT_NODE_FAILED = 3
EXIT_START_FAILED = 4
EXIT_INTERRUPTED = 130
EXIT_READER_GONE = 128 + 13  # SIGPIPE's: what a Unix tool whose reader left exits with
EXIT_CODES = (
    (EXIT_OK, "success (a node stopped by Ctrl-C, SIGTERM or SIGHUP stops cleanly)"),
    (EXIT_NO_NODE, "no node answers on the data directory (chaos: an invariant failed)"),
    (
        EXIT_USAGE,
        "bad usage or configuration, a path that is not a store directory, a data "
        "directory another node holds, or a path this user may not open",
    ),
    (EXIT_NODE_FAILED, "the node's root supervisor gave up (restart intensity exceeded)"),
    (EXIT_START_FAILED, "the node did not start"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C, SIGTERM, SIGHUP); everything started is stopped"),
    (EXIT_READER_GONE, "the reader of the output went away (a pipe into head): nothing more said"),
)
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
# The store's GC settings (``warren.store.engine.message_store.GC_MODES``, which ``Node``
# checks), spelt here so that parsing a command line imports no store code.
STORE_GC_MODES = ("compact", "combine")
# What the config file may hold: section -> key -> the option it sets.
_CONFIG_KEYS = {
    "node": {
        "data_dir": "data_dir",
        "name": "name",
        "log_level": "log_level",
        "heartbeat_timeout_s": "heartbeat_timeout_s",
        "children": "children",
    },
    "store": {
        "file_size_limit": "file_size_limit",
        "sync_policy": "sync_policy",
        "gc": "store_gc",
    },
    "listener": {"listen": "listen", "curve": "curve", "insecure": "insecure"},
    "http": {"listen": "http", "insecure": "insecure"},
    "amqp": {
        "listen": "amqp",
        "certfile": "amqp_certfile",
        "keyfile": "amqp_keyfile",
        "insecure": "insecure",
    },
    "cluster": {
        "name": "cluster",
        "etcd": "etcd",
        "peer": "peer",
        "peer_listen": "peer_listen",
        "lease_ttl_s": "cluster_ttl_s",
        "min_insync": "min_insync",
    },
    "alarms": {
        "memory_high_watermark": "memory_high_watermark",
        "memory_limit": "memory_limit",
        "disk_free_limit": "disk_free_limit",
        "check_interval_s": "check_interval_s",
    },
}


def load_config(path: str) -> dict[str, Any]:
    """The options a TOML config file sets, checked against the keys it may hold."""
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except OSError as exc:
        raise UsageError(f"cannot read the config file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"the config file {path} is not valid TOML: {exc}") from None
    except UnicodeDecodeError:
        raise UsageError(
            f"the config file {path} is not text: a config file is UTF-8 TOML"
        ) from None
    options: dict[str, Any] = {}
    set_in: dict[str, str] = {}  # option -> the section that set it
    for section, values in document.items():
        keys = _CONFIG_KEYS.get(section)
        if keys is None or not isinstance(values, dict):
            raise UsageError(
                f"{path}: unknown section [{section}] (known: "
                f"{', '.join(f'[{s}]' for s in _CONFIG_KEYS)})"
            )
        for key, value in values.items():
            if key not in keys:
                raise UsageError(
                    f"{path}: unknown key {key!r} in [{section}] (known: {', '.join(keys)})"
                )
            option = keys[key]
            if option in options and options[option] != value:
                raise UsageError(
                    f"{path}: {key} is {options[option]!r} in [{set_in[option]}] and "
                    f"{value!r} in [{section}]; give one value"
                )
            options[option], set_in[option] = value, section
    return options


def node_settings(args: argparse.Namespace) -> dict[str, Any]:
    """``Node``'s keyword arguments from the config file and the options (options win)."""
    from ..errors import InvalidSpec
    from ..node.alarms import AlarmLimits
    from ..specs import check_seconds

    options = load_config(args.config) if args.config else {}
    options.update(
        {
            key: value
            for key, value in vars(args).items()
            if value is not None and key in _OPTION_KEYS
        }
    )
    data_dir = options.get("data_dir")
    if not isinstance(data_dir, str) or not data_dir.strip():
        raise UsageError("--data-dir (or data_dir in [node]) must name a directory")
    data_dir = usable_data_directory(data_dir)
    settings: dict[str, Any] = {"data_dir": data_dir}
    if "name" in options:
        if not isinstance(options["name"], str) or not options["name"]:
            raise UsageError(f"name must be a non-empty string, got {options['name']!r}")
        settings["name"] = options["name"]
    level = options.get("log_level", "WARNING")
    if not isinstance(level, str) or level.upper() not in LOG_LEVELS:
        raise UsageError(f"log_level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    settings["log_level"] = level.upper()
    if "children" in options:
        settings["children"] = application_children(options["children"], data_dir)
    if "heartbeat_timeout_s" in options:
        timeout = options["heartbeat_timeout_s"]
        try:
            check_seconds("heartbeat_timeout_s", timeout, at_least=2)
        except InvalidSpec:
            raise UsageError(
                f"heartbeat_timeout_s must be a finite number of seconds >= 2, got {timeout!r}"
            ) from None
        settings["heartbeat_timeout_s"] = timeout
    if "file_size_limit" in options:
        settings["file_size_limit"] = parse_size(options["file_size_limit"], "file_size_limit")
        if settings["file_size_limit"] == 0:
            raise UsageError("file_size_limit must be more than 0 bytes, got 0")
    if "sync_policy" in options:
        if options["sync_policy"] not in ("fsync", "flush"):
            raise UsageError(
                f"sync_policy must be 'fsync' or 'flush', got {options['sync_policy']!r}"
            )
        settings["sync_policy"] = options["sync_policy"]
    if "store_gc" in options:
        if options["store_gc"] not in STORE_GC_MODES:
            raise UsageError(f"gc must be 'compact' or 'combine', got {options['store_gc']!r}")
        settings["store_gc"] = options["store_gc"]
    if "listen" in options:
        if not isinstance(options["listen"], str):
            raise UsageError(
                f"listen must be an address such as tcp://127.0.0.1:5673, got {options['listen']!r}"
            )
        settings["listen"] = options["listen"]
    if "http" in options:
        settings["http"] = options["http"]
    for option in ("amqp", "amqp_certfile", "amqp_keyfile"):
        if option in options:
            settings[option] = options[option]
    for flag in ("curve", "insecure"):
        if flag in options:
            if not isinstance(options[flag], bool):
                raise UsageError(f"{flag} must be true or false, got {options[flag]!r}")
            settings[flag] = options[flag]
    if settings.get("listen") is not None:
        from warren.queues.broker.listener import check_listen_address

        try:
            check_listen_address(
                settings["listen"],
                curve=settings.get("curve", False),
                insecure=settings.get("insecure", False),
            )
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    elif settings.get("curve"):
        raise UsageError("--curve protects a listener: pass --listen tcp://HOST:PORT too")
    if "http" in settings:
        from ..node.http_endpoint import check_http_address

        try:
            check_http_address(settings["http"], insecure=settings.get("insecure", False))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if "amqp" in settings or "amqp_certfile" in settings or "amqp_keyfile" in settings:
        from warren.queues.amqp.server import check_amqp_address

        from ..node.node import amqp_tls_files

        try:
            tls = amqp_tls_files(
                settings.get("amqp"), settings.get("amqp_certfile"), settings.get("amqp_keyfile")
            )
            check_amqp_address(
                settings.get("amqp"), tls=tls, insecure=settings.get("insecure", False)
            )
        except ValueError as exc:  # InvalidSpec too
            raise UsageError(str(exc)) from None
    settings.update(cluster_settings(options))
    limits: dict[str, Any] = {}
    if "memory_high_watermark" in options:
        limits["memory_high_watermark"] = options["memory_high_watermark"]
    if "memory_limit" in options:
        limits["memory_limit_bytes"] = parse_size(options["memory_limit"], "memory_limit")
    if "disk_free_limit" in options:
        limits["disk_free_limit_bytes"] = parse_size(options["disk_free_limit"], "disk_free_limit")
    if "check_interval_s" in options:
        limits["check_interval_s"] = options["check_interval_s"]
    try:
        settings["alarm_limits"] = AlarmLimits(**limits)
    except InvalidSpec as exc:
        raise UsageError(str(exc)) from None
    return settings


FAULT_KINDS_HELP = (
    "kill (SIGKILL an actor)",
    "stop (SIGSTOP it until its supervisor kills it)",
    "node (SIGKILL the whole node)",
    "torn (a file's tail cut)",
    "flip (a bit flipped)",
    "full (the disk alarm)",
    "slow (slow syncs)",
)
_OPTION_KEYS = {key for keys in _CONFIG_KEYS.values() for key in keys.values()}


def application_children(target: Any, data_dir: str) -> tuple:
    """The specs that ``"module:function"`` returns when called with the data directory,
    checked: the application's tree (a module of the current directory, or an installed
    one)."""
    import importlib

    from ..specs import ChildSpec, SupervisorSpec

    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise UsageError(f"children must name a function as module:function, got {target!r}")
    module_name, function_name = target.split(":")
    if os.getcwd() not in sys.path:  # the application's own modules, as python -m
        sys.path.insert(0, os.getcwd())
    try:
        function = getattr(importlib.import_module(module_name), function_name)
    except ImportError as exc:
        raise UsageError(f"children: cannot import {module_name}: {exc}") from None
    except AttributeError:
        raise UsageError(f"children: {module_name} has no {function_name}") from None
    try:
        children = tuple(function(data_dir))
    except Exception as exc:  # the application's code: whatever it raises is one line
        raise UsageError(
            f"children: {target}({data_dir!r}) raised {type(exc).__name__}: {exc}"
        ) from None
    wrong = [c for c in children if not isinstance(c, (ChildSpec, SupervisorSpec))]
    if wrong:
        raise UsageError(
            f"children: {target}() must return ChildSpecs and SupervisorSpecs, not {wrong[0]!r}"
        )
    return children


def _node(args: argparse.Namespace) -> int:
    import signal

    from ..errors import ClusterMismatch, NodeLocked
    from ..node.node import STOP_SIGNALS, Node

    settings = node_settings(args)
    logging.basicConfig(
        level=settings["log_level"],
        format="%(asctime)s %(levelname)s node[%(process)d] %(name)s: %(message)s",
    )
    # A stop signal that arrives while the tree starts waits for the node's handler.
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    data_dir = settings.pop("data_dir")
    try:
        node = Node(data_dir, **settings)
    except (NodeLocked, ClusterMismatch) as exc:
        print(f"warren: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PermissionError:  # a directory it may list but not write, or a file in it
        print(f"warren: {permission_denied(data_dir, 'the data directory')}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # reported as a line a person reads, with its own exit code
        print(f"warren: the node did not start: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_START_FAILED
    with node:
        print(format_status(node.status()), flush=True)
        received = node.run_until_signalled(STOP_SIGNALS)
    if node.failed.is_set():
        print(f"node {node.name} stopped: its root supervisor gave up", flush=True)
        return EXIT_NODE_FAILED
    by = f" by {signal.Signals(received).name}" if received is not None else ""
    print(f"node {node.name} stopped{by}; its data is in {data_dir}", flush=True)
    return EXIT_OK


def _status(args: argparse.Namespace) -> int:
    status = node_status(args.data_dir)
    if status is None:
        return EXIT_NO_NODE
    print(strict_json(status) if args.json else format_status(status))
    return EXIT_OK


_STATUS_COLUMNS = (
    Column("actor", wrap=True, min_width=24),
    Column("pid", ">"),
    Column("state"),
    Column("restarts", ">"),
    Column("RSS MiB", ">"),
    Column("CPU%", ">"),
)


def format_status(status: dict) -> str:
    """The node's tree and its stores' figures, for a person at an 80-column terminal."""
    alarms = ", ".join(status["alarms"]) or "none"
    rows: list[list[str]] = []

    def walk(entry: dict, prefix: str, last: bool, top: bool) -> None:
        branch = "" if top else ("└─ " if last else "├─ ")
        label = f"{prefix}{branch}{entry['id']}"
        if entry["kind"] == "supervisor":
            rows.append(
                [
                    f"{label} ({entry['strategy']})",
                    "",
                    entry["state"],
                    str(entry.get("restarts", 0)),
                    "",
                    "",
                ]
            )
        else:
            rss = f"{entry['rss_bytes'] / 2**20:.1f}" if entry["rss_bytes"] else "-"
            cpu = f"{entry['cpu_percent']:.1f}" if entry["cpu_percent"] is not None else "-"
            rows.append(
                [label, str(entry["pid"] or "-"), entry["state"], str(entry["restarts"]), rss, cpu]
            )
        children = entry.get("children", [])
        inner = prefix if top else prefix + ("   " if last else "│  ")
        for i, child in enumerate(children):
            walk(child, inner, i == len(children) - 1, False)

    state = status["state"]
    if state == "starting":
        state += f" (recovering {counted(status['recovering'], 'message')})"
    lines = textwrap.wrap(
        f"node {status['node']} (pid {status['pid']}): {state}; alarms: {alarms}", 80
    )
    for line in [f"data directory: {status['data_dir']}", *listening(status)]:
        # wrapped between words only: a path or an address stays whole, to be copied
        lines += textwrap.wrap(
            line, 80, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False
        )
    if status.get("tree"):
        walk(status["tree"], "", True, True)
        lines.append(format_table(_STATUS_COLUMNS, rows))
    for name, figures in status.get("stores", {}).items():
        if figures is None:
            lines.append(f"{name}: not answering")
            continue
        lines += textwrap.wrap(
            f"{name}: {figures['message_count']:,} messages, {figures['file_count']} files, "
            f"{figures['bytes_on_disk']:,} bytes ({figures['garbage_fraction']:.0%} garbage), "
            f"GC {figures['gc']}: {figures['gc_runs']} combines, "
            f"{figures['gc_compactions']} compactions, "
            f"reads {figures['direct_reads_reported']:,} direct / "
            f"{figures['fallback_reads']:,} through the store, {figures['locked_files']} locked "
            f"files, longest confirm wait {figures['longest_confirm_wait_ms']:.1f} ms",
            80,
            subsequent_indent="  ",
        )
    if status.get("queues"):
        lines += textwrap.wrap(
            "queues: " + ", ".join(f"{name} {state}" for name, state in status["queues"].items()),
            80,
            subsequent_indent="  ",
        )
    return "\n".join(lines)


def listening(status: dict) -> list[str]:
    """Where the node listens, a line each: its tcp listener for remote clients, its HTTP
    endpoint (the management page, Prometheus's /metrics, the JSON /api/*); or that it
    answers only on this machine (by its data directory)."""
    lines = []
    if status.get("listen_endpoint"):
        lines.append(f"listener: {status['listen_endpoint']} (remote clients: --url, connect)")
    if status.get("amqp_endpoint"):
        over = " over TLS" if status.get("amqp_tls") else ""
        connected = status.get("amqp_connections")
        open_now = "" if connected is None else f": {counted(connected, 'connection')} open"
        lines.append(
            f"amqp: {status['amqp_endpoint']}{over} (AMQP 0-9-1 clients: pika, kombu ...){open_now}"
        )
    cluster = status.get("cluster")
    if cluster:
        leader = cluster["leader"] or "none"
        lines.append(
            f"cluster {cluster['cluster']}: this node is {cluster['role']}; leader {leader}, "
            f"epoch {cluster['epoch'] if cluster['epoch'] is not None else '-'} "
            "(warren cluster status)"
        )
    http = status.get("http_endpoint")
    if http:
        lines.append(f"management page: {status.get('management_page') or http + '/'}")
        lines.append(f"metrics: {http}/metrics (Prometheus), {http}/api/* (JSON)")
    return lines or [
        "listening: on this machine only (--listen for remote clients, --amqp for AMQP, "
        "--http for metrics)"
    ]


def _store_inspect(args: argparse.Namespace) -> int:
    from warren.queues.engine.stream_log import SEGMENT_SUFFIX, numbered_files
    from warren.store.engine.inspect import inspect_store
    from warren.store.errors import StoreDirectoryError

    from .queue_files import format_queue_inspection, is_queue_directory

    if os.path.isdir(args.directory) and numbered_files(args.directory, SEGMENT_SUFFIX):
        print(format_stream_inspection(args.directory))
        return EXIT_OK
    if os.path.isdir(args.directory) and is_queue_directory(args.directory):
        print(format_queue_inspection(args.directory))
        return EXIT_OK
    try:
        report = inspect_store(args.directory)
    except StoreDirectoryError as exc:
        print(f"warren: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(format_inspection(report))
    return EXIT_OK


_INSPECT_COLUMNS = (
    Column("file", ">"),
    Column("bytes", ">"),
    Column("records", ">"),
    Column("valid", ">"),
    Column("valid bytes", ">"),
    Column("garbage", ">"),
    Column("compacted", ">"),
    Column("damaged regions", wrap=True, min_width=15),
)


_STREAM_INSPECT_COLUMNS = (
    Column("segment", ">"),
    Column("bytes", ">"),
    Column("chunks", ">"),
    Column("tracking", ">"),
    Column("records", ">"),
    Column("epochs", wrap=True, min_width=6),
    Column("written", wrap=True, min_width=12),
    Column("damage", wrap=True, min_width=15),
)


def format_stream_inspection(directory: str) -> str:
    """What a stream directory holds (``warren.queues.engine.stream_inspect.inspect_stream``),
    as a person reads it."""
    from warren.queues.engine.stream_inspect import inspect_stream

    def when(ms: int | None) -> str:
        return "-" if ms is None else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(ms / 1000))

    reports = inspect_stream(directory)
    rows = []
    for report in reports:
        damage = [f"chunk {c} fails its CRC" for c in report.bad_crc_chunks]
        if report.unreadable_tail_bytes:
            damage.append(f"{report.unreadable_tail_bytes} B torn tail (cut at next open)")
        rows.append(
            [
                str(report.first_offset),
                f"{report.size_bytes:,}",
                f"{report.user_chunks:,}",
                f"{report.tracking_chunks:,}",
                f"{report.records:,}",
                ", ".join(map(str, report.epochs)) or "-",
                f"{when(report.first_timestamp_ms)} .. {when(report.last_timestamp_ms)} UTC",
                ", ".join(damage) or "-",
            ]
        )
    records = sum(r.records for r in reports)
    total = sum(r.size_bytes for r in reports)
    return "\n".join(
        [
            f"stream {directory}",
            format_table(_STREAM_INSPECT_COLUMNS, rows),
            f"{len(reports)} segments, {records:,} records, {total:,} bytes on disk",
        ]
    )


def format_inspection(report: StoreReport) -> str:
    """A ``warren.store.engine.inspect.StoreReport`` as a person reads it."""
    from warren.store.engine.records import data_file_name

    lines = [f"store {report.directory}", f"valid records judged by: {report.validity_source}"]
    if report.snapshot_problem:
        lines.append(f"clean-shutdown files present but unusable: {report.snapshot_problem}")
    rows = [
        [
            data_file_name(f.file),
            f"{f.size:,}",
            f"{f.records:,}",
            f"{f.valid_records:,}",
            f"{f.valid_bytes:,}",
            f"{f.garbage_bytes:,}",
            f"{f.compactions}x, {f.compacted_bytes:,} B cut" if f.compactions else "no",
            ", ".join(f"{length} B at {offset}" for offset, length in f.damaged) or "-",
        ]
        for f in report.files
    ]
    lines.append(format_table(_INSPECT_COLUMNS, rows))
    total = sum(f.size for f in report.files)
    valid = sum(f.valid_bytes for f in report.files)
    lines.append(
        f"{len(report.files)} files, {report.message_count:,} messages, "
        f"{total:,} bytes on disk, {valid:,} valid, {total - valid:,} garbage"
    )
    if report.stray_temp_files:
        lines.append(
            f"left by an unfinished combine (deleted at next open): "
            f"{', '.join(report.stray_temp_files)}"
        )
    if report.unfinished_compactions:
        lines.append(
            f"left by an unfinished compaction (rolled back at next open): "
            f"{', '.join(report.unfinished_compactions)}"
        )
    if report.not_files:
        lines.append(f"not regular files, ignored: {', '.join(report.not_files)}")
    return "\n".join(lines)


def _keys(args: argparse.Namespace) -> int:
    from warren.queues.client.keys import create_client_key
    from warren.queues.errors import KeyFileError

    from ..errors import NotANodeDirectory
    from ..node.node import check_node_directory

    try:
        check_node_directory(args.data_dir, must_exist=True)
        path = create_client_key(args.data_dir, args.name, args.out)
    except (KeyFileError, NotANodeDirectory) as exc:
        raise UsageError(str(exc)) from None
    except PermissionError as exc:  # the data directory, or --out, or a file in them
        what = "the data directory" if exc.filename == args.data_dir else ""
        raise UsageError(permission_denied(str(exc.filename), what)) from None
    print(f"wrote {path}; a node started with --curve on {args.data_dir} lets it in")
    return EXIT_OK


ENVELOPE_ROOM = 2**16  # what a chaos body leaves of a message for its properties
SINGLE_NODE_FAULTS = "kill,stop,node,torn"  # warren chaos's faults by default
PATTERNS = "queue *,stream *,msg_store_*,wal"  # ... and the actors its kill and stop aim at
_RANGE = re.compile(r"\s*(\S+?)\s*\.\.\s*(\S+)\s*")


_Bound = TypeVar("_Bound", int, float)


def parse_range(value: str, what: str, parse: Callable[[str], _Bound]) -> tuple[_Bound, _Bound]:
    """``"A..B"`` (or one value) as (from, to), each parsed by ``parse``; from <= to."""
    match = _RANGE.fullmatch(value)
    low, high = (match.group(1), match.group(2)) if match else (value, value)
    low, high = parse(low), parse(high)
    if not 0 < low <= high:
        raise UsageError(f"{what} must be a range FROM..TO with 0 < FROM <= TO, got {value!r}")
    return low, high


def _positive_seconds(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        raise UsageError(f"expected a number of seconds, got {value!r}") from None
    if not 0 < seconds < math.inf:
        raise UsageError(f"a duration must be more than 0 seconds, and finite, got {value!r}")
    return seconds


def _chaos(args: argparse.Namespace) -> int:
    import random

    from warren.queues.message import MAX_MESSAGE_BYTES

    from ..chaos.broker_run import RUN_DIR, run_chaos
    from ..chaos.cluster_run import CLUSTER_FAULTS, run_cluster_chaos

    duration = _positive_seconds(args.duration)
    if args.cluster:
        for flag in ("patterns", "store_gc"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} is for one node's run, not --cluster")
    else:
        for flag in ("rounds", "lease_ttl_s"):
            if getattr(args, flag) is not None:
                raise UsageError(f"--{flag.replace('_', '-')} goes with --cluster")
    faults = args.faults or (",".join(CLUSTER_FAULTS) if args.cluster else SINGLE_NODE_FAULTS)
    kinds = [k.strip() for k in faults.split(",") if k.strip()]
    sizes = parse_range(args.size, "--size", lambda v: parse_size(v, "--size"))
    if sizes[1] > MAX_MESSAGE_BYTES - ENVELOPE_ROOM:
        raise UsageError(
            f"--size: a body may take at most {MAX_MESSAGE_BYTES - ENVELOPE_ROOM:,} "
            f"bytes (a message holds {MAX_MESSAGE_BYTES:,} with its properties)"
        )
    every = parse_range(args.every, "--every", _positive_seconds)
    for flag in ("producers", "consumers"):
        if getattr(args, flag) < 1:
            raise UsageError(f"--{flag} must be at least 1")
    patterns = tuple(p.strip() for p in (args.patterns or PATTERNS).split(",") if p.strip())
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    try:
        if args.cluster:
            if args.lease_ttl_s is not None and args.lease_ttl_s < 5:
                raise UsageError("--lease-ttl-s: at least 5 seconds")
            document = run_cluster_chaos(
                args.data_dir,
                duration_s=duration,
                rounds=args.rounds,
                kinds=kinds,
                producers=args.producers,
                consumers=args.consumers,
                sizes=sizes,
                seed=seed,
                every_s=every,
                ttl_s=args.lease_ttl_s or 5,
                report_dir=args.report,
            )
            return EXIT_OK if document["ok"] else EXIT_INVARIANT_FAILED
        document = run_chaos(
            args.data_dir,
            duration_s=duration,
            kinds=kinds,
            producers=args.producers,
            consumers=args.consumers,
            sizes=sizes,
            seed=seed,
            patterns=patterns,
            every_s=every,
            report_dir=args.report,
            store_gc=args.store_gc,
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except KeyboardInterrupt:
        print(
            "warren: chaos interrupted: the node(s) and the workload are stopped", file=sys.stderr
        )
        return EXIT_INTERRUPTED
    except (RuntimeError, TimeoutError, OSError) as exc:
        # The node would not start (or start again) on the data directory: nothing runs.
        print(
            f"warren: chaos stopped: {exc}; the logs are in "
            f"{os.path.join(os.path.abspath(args.data_dir), 'run' if args.cluster else RUN_DIR)}",
            file=sys.stderr,
        )
        return EXIT_START_FAILED
    return EXIT_OK if document["ok"] else EXIT_INVARIANT_FAILED


class CommandParser(argparse.ArgumentParser):
    """argparse's parser (each subcommand's too), whose complaint about a missing name
    also says where a name that starts with '-' goes: argparse takes it for an option."""

    def error(self, message: str) -> NoReturn:
        missing = message.partition("the following arguments are required: ")[2]
        if any(not name.startswith("-") for name in missing.split(", ") if name):
            message += _dash_hint(["-"])
        super().error(message)


def build_parser() -> argparse.ArgumentParser:
    codes = "\n".join(f"  {code}  {meaning}" for code, meaning in EXIT_CODES)
    parser = CommandParser(
        prog="warren",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Warren: a durable message broker with RabbitMQ's persistence design. "
        "Linux only (OFD locks, PR_SET_PDEATHSIG).",
        epilog=f"exit codes:\n{codes}",
    )
    parser.add_argument("--version", action="version", version=f"warren {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    node = commands.add_parser(
        "node",
        help="run a node in the foreground",
        epilog=f"exit codes:\n{codes}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a node in the foreground until Ctrl-C, SIGTERM or SIGHUP, which "
        "stop it cleanly. Settings come from --config (TOML: sections [node], "
        "[store], [listener], [http], [alarms]) and the options below, which win.",
    )
    node.add_argument(
        "--data-dir", help="the node's data directory (created if missing; its parent must exist)"
    )
    node.add_argument("--config", help="a TOML file of settings")
    node.add_argument("--name", help="the node's name (default warren)")
    node.add_argument(
        "--log-level",
        choices=LOG_LEVELS,
        type=str.upper,
        help="what every actor process logs to stderr (default WARNING)",
    )
    node.add_argument(
        "--children",
        metavar="MODULE:FUNCTION",
        help="the application's tree: a function of the data directory "
        "returning the ChildSpecs and SupervisorSpecs to run under app_sup",
    )
    node.add_argument(
        "--heartbeat-timeout-s",
        type=float,
        metavar="SECONDS",
        help="kill and restart a store, GC or queue that does not answer "
        "heartbeats this long (default 60)",
    )
    node.add_argument(
        "--file-size-limit", metavar="SIZE", help="store file size before rollover (default 16MiB)"
    )
    node.add_argument(
        "--sync-policy",
        choices=("fsync", "flush"),
        help="fsync: confirm after fdatasync (default); flush: after write(2)",
    )
    node.add_argument(
        "--store-gc",
        choices=STORE_GC_MODES,
        help="compact: a file's live messages moved to its head in place (default); "
        "combine: two neighbouring files merged",
    )
    node.add_argument(
        "--listen",
        metavar="tcp://HOST:PORT",
        help="accept remote clients there (loopback unless --curve or --insecure)",
    )
    node.add_argument(
        "--curve",
        action="store_true",
        default=None,
        help="remote clients need a key (warren keys); the node's key pair is "
        "made in the data directory at the first start",
    )
    node.add_argument(
        "--insecure",
        action="store_true",
        default=None,
        help="allow --listen on a non-loopback address without --curve, --amqp without "
        "TLS, and --http on a non-loopback address",
    )
    node.add_argument(
        "--amqp",
        metavar="HOST:PORT",
        help="serve AMQP 0-9-1 clients (pika, kombu, Celery) there (loopback unless TLS or "
        "--insecure; port 0: any free one); users: warren users",
    )
    node.add_argument(
        "--amqp-certfile",
        metavar="PEM",
        help="serve the AMQP port over TLS with this certificate chain (and --amqp-keyfile)",
    )
    node.add_argument("--amqp-keyfile", metavar="PEM", help="the private key of --amqp-certfile")
    node.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="serve /metrics (Prometheus) and /api/* (JSON) there (loopback unless "
        "--insecure; port 0: any free one)",
    )
    node.add_argument(
        "--memory-high-watermark",
        type=float,
        metavar="FRACTION",
        help="memory alarm at this fraction of RAM (default 0.4)",
    )
    node.add_argument(
        "--memory-limit", metavar="SIZE", help="memory alarm at this size instead of the fraction"
    )
    node.add_argument(
        "--disk-free-limit",
        metavar="SIZE",
        help="disk alarm below this much free space (default 50MB)",
    )
    node.add_argument(
        "--check-interval-s",
        type=float,
        metavar="SECONDS",
        help="how often the alarms are checked (default 1)",
    )
    add_cluster_options(node)
    node.set_defaults(handler=_node)
    status = commands.add_parser("status", help="the tree of the node running on a data dir")
    status.add_argument("--data-dir", required=True)
    status.add_argument("--json", action="store_true", help="print the status as JSON")
    status.set_defaults(handler=_status)
    keys = commands.add_parser(
        "keys",
        help="make a CURVE key for a remote client and let it in",
        description="Write NAME.key (the client's key pair and the node's public key, in "
        "ZeroMQ's certificate format, mode 0600) and add its public key to the "
        "node's authorized_keys. Clients connect with "
        "warren.connect('tcp://HOST:PORT', key_file='NAME.key').",
    )
    keys.add_argument("--data-dir", required=True, help="the node's data directory")
    keys.add_argument("name", help="the client's name (letters, digits, _ . -)")
    keys.add_argument("--out", default=".", help="where to write NAME.key (default: here)")
    keys.set_defaults(handler=_keys)
    chaos = commands.add_parser(
        "chaos",
        help="run a node under faults and load, then check nothing was lost",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=textwrap.fill(
            "Start a node on --data-dir (new, empty, or a stopped node's), run "
            "producers with confirms and consumers with acks over tcp across a "
            "default, a lazy, a fanout pair and a quorum queue, land seeded faults, then "
            "drain and check: every confirmed message consumed with its body, "
            "every duplicate flagged redelivered, no wrong bytes, no quorum delivery "
            "count going back, the node healthy. "
            f"Faults: {', '.join(FAULT_KINDS_HELP)}. With --cluster: three etcd members "
            "and three nodes of one cluster under --data-dir (new or empty), links cut by "
            "TCP proxies, the same workload through whichever node leads, and rounds of "
            "the cluster's faults (each healed before the next): "
            "kill-leader, pause-leader, leader-from-followers, leader-from-etcd, "
            "cut-follower, kill-etcd-leader, damaged-tail; then the same checks, plus no "
            "deposed leader committing, no leader outside the ISR, and the in-sync "
            "copies' stream chunks identical.",
            78,
        ),
        epilog="exit codes:\n  0  every invariant held\n  1  an invariant failed (the "
        "report says which)\n  2  bad usage\n  4  the node did not start\n"
        "  130  interrupted",
    )
    chaos.add_argument(
        "--data-dir",
        required=True,
        help="the node's data directory (with --cluster: where the cluster is made)",
    )
    chaos.add_argument(
        "--cluster",
        action="store_true",
        help="run a cluster of three nodes on three etcd members under the cluster's faults",
    )
    chaos.add_argument(
        "--duration", default="60", metavar="SECONDS", help="how long faults land (default 60)"
    )
    chaos.add_argument(
        "--rounds",
        type=int,
        metavar="N",
        help="--cluster: at most N rounds of every fault (default: until --duration)",
    )
    chaos.add_argument(
        "--lease-ttl-s",
        type=int,
        metavar="SECONDS",
        help="--cluster: the nodes' etcd lease (default 5, at least 5)",
    )
    chaos.add_argument(
        "--faults",
        metavar="KIND,KIND",
        help=f"which faults (default {SINGLE_NODE_FAULTS}; with --cluster, all of its own)",
    )
    chaos.add_argument("--producers", type=int, default=4, help="default 4")
    chaos.add_argument("--consumers", type=int, default=2, help="default 2")
    chaos.add_argument(
        "--size", default="1KiB..64KiB", metavar="FROM..TO", help="body sizes (default 1KiB..64KiB)"
    )
    chaos.add_argument(
        "--seed",
        type=int,
        help="the schedule's seed (default: a random one, printed, to repeat the run)",
    )
    chaos.add_argument(
        "--patterns",
        metavar="PATTERN,...",
        help=f"which actors kill and stop aim at (default '{PATTERNS}')",
    )
    chaos.add_argument(
        "--every", default="1..3", metavar="FROM..TO", help="seconds between faults (default 1..3)"
    )
    chaos.add_argument(
        "--report", metavar="DIR", help="write report.json, report.txt and throughput.png there"
    )
    chaos.add_argument(
        "--store-gc",
        choices=STORE_GC_MODES,
        help="the stores' GC (default: an even seed compacts, an odd one combines)",
    )
    chaos.set_defaults(handler=_chaos)
    store = commands.add_parser(
        "store",
        help="message store tools",
        description="Tools that read a store's, a stream's or a queue's files.",
    )
    store_commands = store.add_subparsers(dest="store_command", metavar="COMMAND")
    inspect = store_commands.add_parser(
        "inspect",
        help="report files, records, valid and garbage bytes, damaged regions; changes nothing",
        description="What a directory holds, read without changing anything: a message "
        "store's files (records, valid and garbage bytes, damaged regions), a stream's "
        "segments, or a queue's segment files (<data_dir>/queues/NAME: its messages, "
        "torn slots).",
    )
    inspect.add_argument("directory")
    inspect.set_defaults(handler=_store_inspect)
    add_queue_commands(commands)
    add_user_commands(commands)
    add_cluster_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _run(argv)
        finally:
            sys.stdout.flush()  # here, not at exit: a reader that left is seen below
    except BrokenPipeError:
        # The reader of stdout went away (`warren status --json | head`): as a Unix tool
        # killed by SIGPIPE, say nothing more; what is still buffered goes nowhere, so
        # the interpreter's flush at exit does not report the broken pipe either.
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, sys.stdout.fileno())
        os.close(null)
        return EXIT_READER_GONE


def _run(argv: list[str] | None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(
        names_after_double_dash(parser, sys.argv[1:] if argv is None else argv)
    )
    chosen = _chosen(parser, args)
    if unknown:  # said by the subcommand, with its own usage, not the top level's
        chosen.error(f"unrecognized arguments: {' '.join(unknown)}{_dash_hint(unknown)}")
    if getattr(args, "handler", None) is None:  # a command that needs a subcommand
        chosen.error(f"name one of its commands: {', '.join(_subcommands(chosen))}")
    try:
        return args.handler(args)
    except UsageError as exc:
        print(f"warren: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except PermissionError as exc:  # a path of the user's that this user may not open
        print(f"warren: {permission_denied(str(exc.filename))}", file=sys.stderr)
        return EXIT_USAGE


def _dash_hint(unknown: list[str]) -> str:
    """For an argument taken as an unknown option: where a name starting with '-' goes."""
    if any(arg.startswith("-") for arg in unknown):
        return " (a name that starts with '-' goes after '--': ... -- -name --data-dir D)"
    return ""


def names_after_double_dash(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """``argv`` with the command's own long options that follow ``--`` (and their values)
    moved before it. ``--`` makes what follows it names, so that a queue or exchange
    whose name starts with '-' can be given; the options may still follow the name, as
    the usage lines show them: ``warren declare queue -- -audit --data-dir D``."""
    if "--" not in argv:
        return argv
    cut = argv.index("--")
    command = parser
    for token in argv[:cut]:  # the (sub)command the words before '--' choose
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction) and token in action.choices:
                command = action.choices[token]
    options = {
        option: action
        for action in command._actions
        for option in action.option_strings
        if option.startswith("--")
    }
    before, names = list(argv[:cut]), list[str]()
    after = iter(argv[cut + 1 :])
    for token in after:
        option = options.get(token.partition("=")[0])
        if option is None:
            names.append(token)
            continue
        before.append(token)
        if option.nargs != 0 and "=" not in token:
            before.extend(itertools.islice(after, 1))  # its value
    return [*before, "--", *names]


def _subcommands(parser: argparse.ArgumentParser) -> list[str]:
    return [
        name
        for action in parser._actions
        if isinstance(action, argparse._SubParsersAction)
        for name in action.choices
    ]


def _chosen(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The (sub)command parser that ``args`` were parsed by, the deepest one chosen."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            chosen = action.choices.get(getattr(args, action.dest, None) or "")
            if chosen is not None:
                return _chosen(chosen, args)
    return parser


if __name__ == "__main__":
    sys.exit(main())
