"""Resource alarms: RabbitMQ's memory high watermark and free-disk limit.

A ``ResourceMonitor`` measures, each time ``check()`` is called (the node calls it every
``check_interval_s``):

- memory: the sum of the proportional set size (PSS) of the node's processes. RSS would
  count every page shared between the forkserver's children once per process and
  overstate a node of many actors several-fold; PSS splits each shared page among its
  sharers, so the sum is what the node really holds. The limit is
  ``memory_high_watermark`` (default 0.4) of the machine's RAM, or of the cgroup's memory
  limit when that is lower (a container), or an absolute ``memory_limit_bytes``;
- disk: the free bytes of the filesystem holding the data directory, against
  ``disk_free_limit_bytes`` (default 50 MB); none while a harness says the disk is full
  (``warren.store.disk_faults``).

Crossing a limit raises that resource's alarm; going back under it clears it. ``check()``
returns only the changes, so the node tells every actor once per change (publishers are
blocked while any alarm is raised). A process that exits between listing and measuring is
skipped: the next check sees the tree as it is then.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

from warren.store.disk_faults import disk_full

from ..errors import InvalidSpec
from ..specs import check_seconds

VM_MEMORY_HIGH_WATERMARK = 0.4  # fraction of RAM, as RabbitMQ's default
DISK_FREE_LIMIT_BYTES = 50_000_000  # RabbitMQ's default disk_free_limit
CHECK_INTERVAL_S = 1.0

_CGROUP_LIMIT_FILES = (
    "/sys/fs/cgroup/memory.max",  # cgroup v2
    "/sys/fs/cgroup/memory/memory.limit_in_bytes",
)  # cgroup v1


@dataclass(frozen=True)
class AlarmLimits:
    """Where the alarms go off; validated when built."""

    memory_high_watermark: float = VM_MEMORY_HIGH_WATERMARK
    memory_limit_bytes: int | None = None  # when set, used instead of the fraction
    disk_free_limit_bytes: int = DISK_FREE_LIMIT_BYTES
    check_interval_s: float = CHECK_INTERVAL_S

    def __post_init__(self) -> None:
        if not isinstance(self.memory_high_watermark, (int, float)) or not (
            0 < self.memory_high_watermark <= 1
        ):
            raise InvalidSpec(
                "memory_high_watermark",
                self.memory_high_watermark,
                "expected a fraction of memory in (0, 1]",
            )
        if self.memory_limit_bytes is not None and (
            not isinstance(self.memory_limit_bytes, int) or self.memory_limit_bytes <= 0
        ):
            raise InvalidSpec(
                "memory_limit_bytes",
                self.memory_limit_bytes,
                "expected a positive number of bytes, or None",
            )
        if not isinstance(self.disk_free_limit_bytes, int) or self.disk_free_limit_bytes < 0:
            raise InvalidSpec(
                "disk_free_limit_bytes",
                self.disk_free_limit_bytes,
                "expected a number of bytes >= 0",
            )
        check_seconds("check_interval_s", self.check_interval_s)

    def memory_limit(self) -> int:
        if self.memory_limit_bytes is not None:
            return self.memory_limit_bytes
        return int(self.memory_high_watermark * available_memory())


@dataclass(frozen=True)
class AlarmChange:
    """One alarm raised or cleared, with the reading and the limit that decided it."""

    resource: str  # "memory" or "disk"
    raised: bool
    value: int  # bytes used (memory) or free (disk)
    limit: int


@dataclass
class ResourceMonitor:
    data_dir: str
    limits: AlarmLimits
    node_pids: Callable[[], Iterable[int]]
    active: set[str] = field(default_factory=set)
    readings: dict[str, int] = field(default_factory=dict)

    def check(self) -> list[AlarmChange]:
        """Measure both resources; return the alarms that changed since the last check."""
        memory, memory_limit = node_memory(self.node_pids()), self.limits.memory_limit()
        free = 0 if disk_full() else psutil.disk_usage(self.data_dir).free
        self.readings = {
            "memory_bytes": memory,
            "memory_limit_bytes": memory_limit,
            "disk_free_bytes": free,
            "disk_free_limit_bytes": self.limits.disk_free_limit_bytes,
        }
        changes = []
        for resource, over, value, limit in (
            ("memory", memory > memory_limit, memory, memory_limit),
            (
                "disk",
                free < self.limits.disk_free_limit_bytes,
                free,
                self.limits.disk_free_limit_bytes,
            ),
        ):
            if over != (resource in self.active):
                (self.active.add if over else self.active.discard)(resource)
                changes.append(AlarmChange(resource, over, value, limit))
        return changes


def available_memory() -> int:
    """The machine's RAM, or the memory limit of this process's cgroup when lower."""
    total = psutil.virtual_memory().total
    for path in _cgroup_limit_files():
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def _cgroup_limit_files() -> list[str]:
    """The limit files of this process's own cgroup (v2 and v1), then the roots'."""
    files = []
    try:
        with open("/proc/self/cgroup") as f:
            lines = f.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            files.append(f"/sys/fs/cgroup{path.rstrip('/')}/memory.max")
        elif "memory" in controllers.split(","):
            files.append(f"/sys/fs/cgroup/memory{path.rstrip('/')}/memory.limit_in_bytes")
    return files + list(_CGROUP_LIMIT_FILES)


def node_memory(pids: Iterable[int]) -> int:
    """The PSS of the given processes, summed; processes that are gone count 0."""
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return total


def this_process_tree() -> list[int]:
    """This process and all its descendants: a node's processes when it runs them."""
    me = psutil.Process(os.getpid())
    return [me.pid, *(child.pid for child in me.children(recursive=True))]
