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

Reading PSS is dear: the kernel walks every page table of the process
(``/proc/PID/smaps_rollup``), about 0.6 ms per process, so every process every second
took a third of a core on a node of 1,000 queues (most of its process's 40 % idle).
Reading RSS (``/proc/PID/statm``, read directly: psutil's wrapper doubled the cost, at each
of a thousand processes every second) costs a hundredth of that. So ``NodeMemory`` keeps each
process's last PSS reading with the RSS it had then, and a check estimates each process
as that PSS plus what its RSS grew since (memory a process allocates is private: it adds
to its PSS in whole). A process it has no reading of (a new actor, or one restarted) is
not read at once either: a node declaring a hundred queues a second would read a hundred
PSS a second (a fifth of its process's CPU per declare). Its first check estimates it as
its RSS times the PSS per byte of RSS of the readings held (the node's processes are
forked from one forkserver and share alike), kept as the oldest reading, so that one of
the next checks reads it. It reads PSS:

- of every process when it holds no reading at all (the first check);
- of the processes whose readings are the oldest, a few each check (first the estimated
  ones), so that each is read again about every ``PSS_REFRESH_S`` (longer while many
  processes start at once: the reads per check stay the same);
- of every process at once, when the estimate would raise or clear the memory alarm: an
  alarm changes only on an exact sum, and the exact readings become the next estimate's.

What the estimate misses, until a process's next reading (about ``PSS_REFRESH_S``
later), is PSS that grows while RSS does not: pages of the forkserver's that a child
writes to (copy on write: resident in the child before and after, shared before, private
after), and the share of shared pages that falls to the others when a sharer exits.
Both happen slowly and are bounded by what the forkserver shares; memory allocated shows
at the next check. ``readings["memory_bytes"]`` is that estimate, or the exact sum when
the check read one.

Races: a process that exits between its listing and its reading counts 0, and its
reading is dropped. A pid that the kernel hands to a new process of the node between two
checks (its process having exited meanwhile) keeps the old process's reading, corrected by
the RSS, until its next reading: at most ``PSS_REFRESH_S``, and only once the kernel has
gone round every other pid.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

from warren.store.disk_faults import disk_full

from ..errors import InvalidSpec
from ..specs import check_seconds

VM_MEMORY_HIGH_WATERMARK = 0.4  # fraction of RAM, as RabbitMQ's default
DISK_FREE_LIMIT_BYTES = 50_000_000  # RabbitMQ's default disk_free_limit
CHECK_INTERVAL_S = 1.0
PSS_REFRESH_S = 30.0  # about the longest a process's PSS reading stands in for it

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

    resource: str  # "memory", "disk", or a cluster leader's "replication"
    raised: bool
    value: int  # bytes used (memory) or free (disk); nodes in sync (replication)
    limit: int


@dataclass
class _Reading:
    """A process's PSS as last read, with its RSS then."""

    process: psutil.Process
    pss: int
    rss: int
    read_at: float  # time.monotonic() of the reading; -inf for an estimate never read


class NodeMemory:
    """The node's memory, the PSS of its processes summed: exact, or estimated from each
    process's last PSS reading and its RSS now; see the module docstring."""

    def __init__(self, refresh_s: float = PSS_REFRESH_S) -> None:
        self.refresh_s = refresh_s
        self._readings: dict[int, _Reading] = {}  # pid -> its last PSS reading

    def estimate(self, pids: Iterable[int], check_interval_s: float) -> int:
        """The sum for ``pids``, reading the PSS of new processes and of the oldest
        readings' (enough of them that none is older than about ``refresh_s`` when this is
        called every ``check_interval_s``), the RSS of the others."""
        pids = set(pids)
        self._forget_all_but(pids)
        oldest = sorted(self._readings, key=lambda pid: self._readings[pid].read_at)
        due = math.ceil(len(oldest) * check_interval_s / self.refresh_s)
        reread = set(oldest[:due])
        pss_per_rss = self._pss_per_rss()
        total = 0
        for pid in pids:
            reading = self._readings.get(pid)
            if reading is None and pss_per_rss is not None:
                total += self._estimate_new(pid, pss_per_rss)
                continue
            if reading is None or pid in reread:
                total += self._read(pid)
                continue
            rss = _resident_bytes(reading.process)
            if rss is None:  # it exited: it holds nothing now
                del self._readings[pid]
                continue
            total += max(0, reading.pss + rss - reading.rss)
        return total

    def _pss_per_rss(self) -> float | None:
        """The PSS of the readings held per byte of their RSS; None when none is held."""
        rss = sum(reading.rss for reading in self._readings.values())
        if not rss:
            return None
        return sum(reading.pss for reading in self._readings.values()) / rss

    def _estimate_new(self, pid: int, pss_per_rss: float) -> int:
        """A new process's PSS as its RSS times ``pss_per_rss``, kept as the oldest
        reading (read at one of the next checks); 0 for a process that is gone."""
        try:
            process = psutil.Process(pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            return 0
        rss = _resident_bytes(process)
        if rss is None:
            return 0
        pss = round(rss * pss_per_rss)
        self._readings[pid] = _Reading(process, pss, rss, read_at=-math.inf)
        return pss

    def exact(self, pids: Iterable[int]) -> int:
        """The sum for ``pids``, every process's PSS read now."""
        pids = set(pids)
        self._forget_all_but(pids)
        return sum(self._read(pid) for pid in pids)

    def _read(self, pid: int) -> int:
        """Read a process's PSS and keep it; 0 for a process that is gone."""
        reading = self._readings.get(pid)
        try:
            process = reading.process if reading is not None else psutil.Process(pid)
            full = process.memory_full_info()
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            self._readings.pop(pid, None)
            return 0
        self._readings[pid] = _Reading(process, full.pss, full.rss, time.monotonic())
        return full.pss

    def _forget_all_but(self, pids: set[int]) -> None:
        for pid in self._readings.keys() - pids:
            del self._readings[pid]


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def _resident_bytes(process: psutil.Process) -> int | None:
    """The process's RSS now, None once it has exited (or may not be read): its
    ``statm`` read directly where there is one (Linux), else through psutil."""
    try:
        fd = os.open(f"/proc/{process.pid}/statm", os.O_RDONLY)
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return None  # no such process
    except OSError:
        pass
    else:
        try:
            return int(os.read(fd, 128).split()[1]) * _PAGE_BYTES
        except (OSError, IndexError, ValueError):
            return None  # gone between the open and the read
        finally:
            os.close(fd)
    try:
        return int(process.memory_info().rss)
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


@dataclass
class ResourceMonitor:
    data_dir: str
    limits: AlarmLimits
    node_pids: Callable[[], Iterable[int]]
    active: set[str] = field(default_factory=set)
    readings: dict[str, int] = field(default_factory=dict)
    memory_readings: NodeMemory = field(default_factory=NodeMemory)

    def check(self) -> list[AlarmChange]:
        """Measure both resources; return the alarms that changed since the last check."""
        pids, memory_limit = list(self.node_pids()), self.limits.memory_limit()
        memory = self.memory_readings.estimate(pids, self.limits.check_interval_s)
        if (memory > memory_limit) != ("memory" in self.active):
            memory = self.memory_readings.exact(pids)
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


def this_process_tree() -> list[int]:
    """This process and all its descendants: a node's processes when it runs them."""
    me = psutil.Process(os.getpid())
    return [me.pid, *(child.pid for child in me.children(recursive=True))]
