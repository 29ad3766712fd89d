"""What a chaos run did, as plain data: each fault as it landed (``Event``) and the run's
faults, samples and restarts (``ChaosResult``). The harness (``run``) fills it in and the
report (``report``) reads it; neither needs the other.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["SAMPLE_EVERY_S", "ChaosResult", "Event"]

SAMPLE_EVERY_S = 0.5  # how often a run samples the caller's counters (seconds)


@dataclass
class Event:
    """One fault as it landed: when (seconds from the start), what, on what, and how long
    the node took to be healthy again (None for a fault that did not land)."""

    at_s: float
    kind: str
    target: str
    landed: bool
    detail: str = ""
    recovery_s: float | None = None


@dataclass
class ChaosResult:
    """What a run did: its faults, the samples of the caller's counters, the restarts."""

    seed: int
    duration_s: float
    events: list[Event] = field(default_factory=list)
    samples: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    restarts: int = 0  # actor restarts by supervisors, summed over node lives
    node_starts: int = 0
    healthy_at_end: bool = False
    problems: list[str] = field(default_factory=list)

    def faults_by_kind(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for event in self.events:
            if event.landed:
                counts[event.kind] = counts.get(event.kind, 0) + 1
        return counts

    def recovery_times(self) -> list[float]:
        return sorted(e.recovery_s for e in self.events if e.recovery_s is not None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "duration_s": self.duration_s,
            "events": [asdict(e) for e in self.events],
            "samples": [[t, counts] for t, counts in self.samples],
            "restarts": self.restarts,
            "node_starts": self.node_starts,
            "healthy_at_end": self.healthy_at_end,
            "problems": self.problems,
        }
