"""``ActiveConsumers``: which member of each named consumer group reads a stream now
(RabbitMQ's single active consumer), kept by the stream's process.

Protocol (``GroupBeat(group, member, release, leave)``, a member's ask every
``MEMBER_BEAT_S``): the answer is the member's turn, ``"active"`` (read, and store the
offset processed), ``"standby"`` (read nothing) or ``"step-down"`` (stop reading, store
the offset processed, then beat with ``release``: only then does the next member become
active, so two members never read the group's records at once while both beat). A member
that ``leave``s is gone at once; one unheard of for ``MEMBER_LEASE_S`` (killed, or its
node connection lost) is dropped, and if it was active the next member takes over.

Which member is active: on a super stream's partition, the members' ids sorted, and the
one at the partition's index modulo their number. Every partition sorts the same ids, so
N consumers sharing a group share its partitions about evenly (one that joins takes its
share over, each partition handed on as above), and one that goes leaves its partitions
to the others. On a stream of its own (RabbitMQ's single active consumer) the active
member stays while it is there, and the longest-standing member follows it.

Races: a member that stalls past its lease while active is dropped and another takes
over; its next beat answers ``"standby"`` (not ``"step-down"``), so it stores no offset
over the new member's. Membership lives in the stream's process: after its restart no
member is made active for ``ELECTION_DELAY_S`` (longer than a beat), so the member that
was active before hears "standby" and stops before another starts; then the rule picks
one, and whatever the last active member processed after its last stored offset is read
again (at least once, as RabbitMQ's).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..protocol import MEMBER_BEAT_S, MEMBER_LEASE_S

__all__ = ["ELECTION_DELAY_S", "MEMBER_BEAT_S", "MEMBER_LEASE_S", "ActiveConsumers"]

ELECTION_DELAY_S = 1.5 * MEMBER_BEAT_S  # after a start: every member beat once


@dataclass
class _Group:
    seen: dict[str, float] = field(default_factory=dict)  # member -> last beat
    active: str | None = None  # the member reading now (or stepping down)


class ActiveConsumers:
    """The consumer groups of one stream, whose partition index is ``partition`` (None:
    a stream that is no super stream's partition)."""

    def __init__(self, partition: int | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.partition = partition
        self._clock = clock
        self._groups: dict[str, _Group] = {}
        self._elect_from = clock() + ELECTION_DELAY_S

    def beat(self, group: str, member: str, release: bool, leave: bool) -> str:
        """``member`` of ``group`` beats; its turn (see the module docstring)."""
        now = self._clock()
        state = self._groups.setdefault(group, _Group())
        if leave:
            state.seen.pop(member, None)
        else:
            state.seen[member] = now
        self._expire(now)
        if release and state.active == member:
            state.active = None
        if group not in self._groups:
            return "standby"
        if now < self._elect_from:
            return "standby"
        if self.partition is None:  # the one reading keeps on; else the longest there
            wanted = state.active or next(iter(state.seen))
        else:
            wanted = sorted(state.seen)[self.partition % len(state.seen)]
        if state.active is None:
            state.active = wanted
        if state.active != member:
            return "standby"
        return "active" if wanted == member else "step-down"

    def _expire(self, now: float) -> None:
        """Drop the members unheard of for their lease (an active one leaves its turn
        free), and the groups left without members."""
        for name, state in list(self._groups.items()):
            for other, last in list(state.seen.items()):
                if now - last > MEMBER_LEASE_S:
                    del state.seen[other]
            if state.active not in state.seen:
                state.active = None
            if not state.seen:
                del self._groups[name]

    def groups(self) -> dict[str, dict[str, Any]]:
        """Each group's members and its active one, for the stream's stats (the members
        whose lease ran out are gone from it, whether or not another beat since)."""
        self._expire(self._clock())
        return {
            name: {"members": len(state.seen), "active": state.active}
            for name, state in sorted(self._groups.items())
        }
