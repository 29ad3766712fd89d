"""Specs are validated when built, naming the field and the value; alarms go off and
clear at their limits."""

import math
import os
import subprocess
import sys
import types
from collections.abc import Iterator

import psutil
import pytest

from warren.actors import ProcessActor
from warren.supervisor.errors import InvalidSpec
from warren.supervisor.node import alarms
from warren.supervisor.node.alarms import (
    AlarmLimits,
    NodeMemory,
    ResourceMonitor,
    available_memory,
)
from warren.supervisor.specs import ChildSpec, SupervisorFlags, SupervisorSpec


class Worker(ProcessActor):
    pass


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"strategy": "one_for_some"}, "strategy"),
        ({"intensity": -1}, "intensity"),
        ({"intensity": 1.5}, "intensity"),
        ({"period_s": 0}, "period_s"),
        ({"period_s": math.nan}, "period_s"),
        ({"period_s": math.inf}, "period_s"),
        ({"start_together": 0}, "start_together"),
        ({"start_together": True}, "start_together"),
        ({"start_together": 4, "strategy": "rest_for_one"}, "start_together"),
    ],
)
def test_invalid_supervisor_flags_are_rejected_naming_field_and_value(kwargs, field):
    with pytest.raises(InvalidSpec) as caught:
        SupervisorFlags(**kwargs)
    assert caught.value.field == field
    assert repr(next(iter(kwargs.values()))) in str(caught.value)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"id": ""}, "id"),
        ({"id": 7}, "id"),
        ({"actor": object}, "actor"),
        ({"actor": "Worker"}, "actor"),
        ({"args": [1]}, "args"),
        ({"kwargs": {1: 2}}, "kwargs"),
        ({"restart": "sometimes"}, "restart"),
        ({"shutdown_s": -5}, "shutdown_s"),
        ({"shutdown_s": "gently"}, "shutdown_s"),
        ({"start_timeout_s": 0}, "start_timeout_s"),
        ({"start_timeout_s": math.inf}, "start_timeout_s"),
        ({"shutdown_s": math.nan}, "shutdown_s"),
        ({"heartbeat_interval_s": math.nan}, "heartbeat_interval_s"),
        ({"heartbeat_timeout_s": math.inf}, "heartbeat_timeout_s"),
        ({"heartbeat_interval_s": None}, "heartbeat_timeout_s"),
        ({"heartbeat_interval_s": 2.0, "heartbeat_timeout_s": 1.0}, "heartbeat_timeout_s"),
    ],
)
def test_invalid_child_specs_are_rejected_naming_field_and_value(kwargs, field):
    spec = {"id": "worker", "actor": Worker, **kwargs}
    with pytest.raises(InvalidSpec) as caught:
        ChildSpec(**spec)
    assert caught.value.field == field


def test_valid_specs_keep_otp_defaults():
    child = ChildSpec("worker", Worker)
    assert (child.restart, child.shutdown_s) == ("permanent", 5.0)
    flags = SupervisorFlags()
    assert (flags.strategy, flags.intensity, flags.period_s) == ("one_for_one", 1, 5.0)
    assert ChildSpec("brutal", Worker, shutdown_s="brutal_kill").shutdown_s == "brutal_kill"


def test_siblings_need_unique_ids_and_simple_one_for_one_one_template():
    with pytest.raises(InvalidSpec, match="unique child ids"):
        SupervisorSpec("sup", children=(ChildSpec("a", Worker), ChildSpec("a", Worker)))
    with pytest.raises(InvalidSpec, match="exactly one ChildSpec"):
        SupervisorSpec(
            "sup",
            SupervisorFlags("simple_one_for_one"),
            children=(ChildSpec("a", Worker), ChildSpec("b", Worker)),
        )


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"memory_high_watermark": 0}, "memory_high_watermark"),
        ({"memory_high_watermark": 1.5}, "memory_high_watermark"),
        ({"memory_limit_bytes": 0}, "memory_limit_bytes"),
        ({"disk_free_limit_bytes": -1}, "disk_free_limit_bytes"),
        ({"check_interval_s": 0}, "check_interval_s"),
        ({"check_interval_s": math.nan}, "check_interval_s"),
        ({"check_interval_s": math.inf}, "check_interval_s"),
        ({"memory_high_watermark": math.nan}, "memory_high_watermark"),
    ],
)
def test_invalid_alarm_limits_are_rejected(kwargs, field):
    with pytest.raises(InvalidSpec) as caught:
        AlarmLimits(**kwargs)
    assert caught.value.field == field


def test_the_memory_limit_is_a_fraction_of_ram_or_an_absolute_figure():
    assert AlarmLimits().memory_limit() == int(0.4 * available_memory())
    assert AlarmLimits(memory_limit_bytes=10**6).memory_limit() == 10**6


def test_memory_and_disk_alarms_are_raised_and_cleared_once_each(tmp_path):
    pids = [os.getpid()]
    monitor = ResourceMonitor(
        str(tmp_path), AlarmLimits(memory_limit_bytes=1, disk_free_limit_bytes=2**62), lambda: pids
    )
    raised = monitor.check()
    assert {(c.resource, c.raised) for c in raised} == {("memory", True), ("disk", True)}
    assert monitor.active == {"memory", "disk"}
    assert monitor.check() == []  # no change, nothing to tell
    monitor.limits = AlarmLimits(memory_limit_bytes=2**62, disk_free_limit_bytes=0)
    cleared = monitor.check()
    assert {(c.resource, c.raised) for c in cleared} == {("memory", False), ("disk", False)}
    assert monitor.active == set()
    assert monitor.readings["memory_bytes"] > 0


def test_a_process_that_is_gone_counts_no_memory():
    assert NodeMemory().exact([2**22 + 12345]) == 0
    assert NodeMemory().estimate([2**22 + 12345], check_interval_s=1.0) == 0


def test_processes_that_exit_after_their_readings_count_no_memory_at_the_next_estimate():
    sleepers = [
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(3)
    ]
    pids = [sleeper.pid for sleeper in sleepers]
    try:
        # readings that stand in for an hour: a check reads the PSS of one, the RSS of the rest
        readings = NodeMemory(refresh_s=3600)
        assert readings.exact(pids) > 0
        assert readings.estimate(pids, check_interval_s=1.0) > 0
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait()
    assert readings.estimate(pids, check_interval_s=1.0) == 0


def test_a_process_rss_is_read_as_psutil_reads_it_and_none_once_it_is_gone():
    me = psutil.Process()
    assert abs(alarms._resident_bytes(me) - me.memory_info().rss) < 2**20
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    gone = psutil.Process(sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    assert alarms._resident_bytes(gone) is None


MIB = 2**20
# A process that holds memory on demand: each line read is a number of MiB to allocate
# (every page written, so resident), answered "ok" once they are.
HOG = """
import sys
held = []
for line in sys.stdin:
    held.append(b"\\x01" * (int(line) * 2**20))
    print("ok", flush=True)
"""


class Hog:
    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOG], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.pid = self.process.pid

    def allocate(self, mib: int) -> None:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"{mib}\n")
        self.process.stdin.flush()
        assert self.process.stdout.readline() == "ok\n"

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


@pytest.fixture
def hog() -> Iterator[Hog]:
    process = Hog()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def sleepers() -> Iterator[list[int]]:
    """Eight idle processes, each with a PSS to read."""
    processes = [subprocess.Popen(["sleep", "600"]) for _ in range(8)]
    try:
        yield [p.pid for p in processes]
    finally:
        for process in processes:
            process.kill()
            process.wait()


def test_memory_allocated_between_pss_readings_raises_the_alarm_at_the_next_check(tmp_path, hog):
    # Given a process whose PSS was read, readings that stand in for an hour, and a limit
    # 32 MiB above what the process holds
    readings = NodeMemory(refresh_s=3600)
    held = readings.exact([hog.pid])
    limits = AlarmLimits(memory_limit_bytes=held + 32 * MIB, disk_free_limit_bytes=0)
    monitor = ResourceMonitor(str(tmp_path), limits, lambda: [hog.pid], memory_readings=readings)
    assert monitor.check() == []
    # When it allocates 64 MiB
    hog.allocate(64)
    # Then the next check raises the memory alarm, against a sum read afresh
    changes = monitor.check()
    assert [(c.resource, c.raised) for c in changes] == [("memory", True)]
    assert changes[0].value == monitor.readings["memory_bytes"] > held + 32 * MIB


def test_a_steady_check_reads_the_pss_of_a_few_processes_and_each_in_turn(
    tmp_path, sleepers, monkeypatch
):
    # Given eight processes and readings that stand in for four checks
    read: list[int] = []
    full_info = psutil.Process.memory_full_info

    def counted(process: psutil.Process) -> object:
        read.append(process.pid)
        return full_info(process)

    monkeypatch.setattr(psutil.Process, "memory_full_info", counted)
    limits = AlarmLimits(memory_limit_bytes=2**62, disk_free_limit_bytes=0)
    monitor = ResourceMonitor(
        str(tmp_path), limits, lambda: sleepers, memory_readings=NodeMemory(refresh_s=4.0)
    )
    # When the first check reads them all
    monitor.check()
    assert sorted(read) == sorted(sleepers)
    # Then each check after it reads two (a quarter), the oldest readings first, so four
    # checks read every process again
    rounds = []
    for _ in range(4):
        read.clear()
        monitor.check()
        rounds.append(list(read))
    assert [len(pids) for pids in rounds] == [2, 2, 2, 2]
    assert sorted(pid for pids in rounds for pid in pids) == sorted(sleepers)
    assert monitor.readings["memory_bytes"] > 0


def test_a_new_process_is_estimated_at_its_first_check_and_its_pss_read_at_the_next(
    tmp_path, sleepers, monkeypatch
):
    # Given seven processes whose PSS was read (a quarter of their RSS), and readings that
    # stand in for an hour. The figures are set: real ones of processes this small move
    # with every other process that maps the same libraries, more than the estimate is off
    pids, newcomer = sleepers[:7], sleepers[7]
    rss = {pid: 4 * 2**20 for pid in pids} | {newcomer: 8 * 2**20}
    read: list[int] = []

    def counted(process: psutil.Process) -> object:
        read.append(process.pid)
        return types.SimpleNamespace(rss=rss[process.pid], pss=rss[process.pid] // 4)

    monkeypatch.setattr(psutil.Process, "memory_full_info", counted)
    monkeypatch.setattr(alarms, "_resident_bytes", lambda process: rss[process.pid])
    limits = AlarmLimits(memory_limit_bytes=2**62, disk_free_limit_bytes=0)
    monitor = ResourceMonitor(
        str(tmp_path), limits, lambda: pids, memory_readings=NodeMemory(refresh_s=3600)
    )
    monitor.check()
    assert sorted(read) == sorted(pids)
    seven = monitor.readings["memory_bytes"]
    # When an eighth process starts
    pids.append(newcomer)
    read.clear()
    monitor.check()
    # Then the check counts it without reading its PSS (a node declaring queues would read
    # one at each declare), from its RSS and the others' PSS per byte of RSS
    assert newcomer not in read
    estimated = monitor.readings["memory_bytes"] - seven
    # and the next check reads it, before any other reading due
    read.clear()
    monitor.check()
    assert read == [newcomer]
    measured = monitor.readings["memory_bytes"] - seven
    assert estimated == measured == 2 * 2**20
