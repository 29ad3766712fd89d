"""Specs are validated when built, naming the field and the value; alarms go off and
clear at their limits."""

import math
import os

import pytest

from warren.actors import ProcessActor
from warren.supervisor.errors import InvalidSpec
from warren.supervisor.node.alarms import (
    AlarmLimits,
    ResourceMonitor,
    available_memory,
    node_memory,
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
    assert node_memory([2**22 + 12345]) == 0
