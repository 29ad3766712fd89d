"""Child specs and supervisor flags, with OTP's options and defaults, validated when built.

``SupervisorFlags(strategy, intensity, period_s)``

- ``strategy``: ``"one_for_one"`` (restart the child that died), ``"one_for_all"``
  (stop all the others, in reverse start order, then start all again in order),
  ``"rest_for_one"`` (stop the children started after it, in reverse, then restart it and
  them in order), ``"simple_one_for_one"`` (one template spec; children are added with
  ``start_child(args)`` and each restarts alone). Default ``"one_for_one"``.
- ``intensity`` (int >= 0, default 1) restarts within ``period_s`` (seconds > 0, default
  5): one more and the supervisor stops all its children, in reverse order, and fails;
  its parent treats that as the failure of a child.
- ``start_together`` (int >= 1, default 1): how many children the supervisor's start
  has starting at one time. 1 is OTP's order, each child ready before the next starts;
  more is for ``one_for_one`` children that do not depend on each other (a node's
  queues, whose recoveries wait on the disk and on their own processes: RabbitMQ
  recovers its queues side by side too). The children are still taken in order.

``ChildSpec(id, actor, args, kwargs, restart, shutdown_s, start_timeout_s,
heartbeat_interval_s, heartbeat_timeout_s)``

- ``id``: a non-empty str, unique among its siblings; also the actor's registered name.
- ``actor``: the ``warren.actors.ProcessActor`` subclass to run; ``args``/``kwargs`` its
  arguments (picklable: they reach the child through the forkserver).
- ``restart``: ``"permanent"`` (always restarted, the default), ``"transient"``
  (restarted only after an abnormal exit: a crash, a signal, a non-zero code), or
  ``"temporary"`` (never restarted).
- ``shutdown_s``: seconds between the stop request and SIGTERM, and again before
  SIGKILL (default 5); ``"brutal_kill"`` sends SIGKILL at once. A store writing its
  recovery files wants minutes: RabbitMQ gives its message stores 600 s.
- ``start_timeout_s``: how long a start (``on_start``, a recovery from disk) may take
  before the child is killed and counted as failed (default 60).
- ``heartbeat_interval_s`` / ``heartbeat_timeout_s``: once the child is ready it is
  pinged on its control channel every interval; no answer for the timeout and it is
  deemed hung, killed and restarted (defaults 1 s / 5 s; ``None`` disables).

``SupervisorSpec(id, flags, children, restart, shutdown_s)`` nests a supervisor as a child.
"""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field
from typing import Any

from warren.actors import ProcessActor

from .errors import InvalidSpec

STRATEGIES = ("one_for_one", "one_for_all", "rest_for_one", "simple_one_for_one")
RESTARTS = ("permanent", "transient", "temporary")
BRUTAL_KILL = "brutal_kill"
SHUTDOWN_S = 5.0
START_TIMEOUT_S = 60.0
HEARTBEAT_INTERVAL_S = 1.0
HEARTBEAT_TIMEOUT_S = 5.0
STORE_SHUTDOWN_S = 600.0  # msg_store_shutdown_timeout


def check_seconds(
    name: str, value: Any, *, at_least: float = 0.0, allow_none: bool = False
) -> None:
    """A duration setting: a finite number of seconds, more than 0 (or ``at_least``);
    ``InvalidSpec`` otherwise. NaN and infinity are refused: either would leave a timer
    that never fires, or one that fires at once, forever."""
    if allow_none and value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not (value >= at_least if at_least else value > 0)
        or not math.isfinite(value)
    ):
        bound = f">= {at_least:g}" if at_least else "> 0"
        raise InvalidSpec(
            name, value, f"expected finite seconds {bound}" + (" or None" if allow_none else "")
        )


@dataclass(frozen=True)
class SupervisorFlags:
    strategy: str = "one_for_one"
    intensity: int = 1
    period_s: float = 5.0
    start_together: int = 1

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise InvalidSpec("strategy", self.strategy, f"expected one of {', '.join(STRATEGIES)}")
        if (
            isinstance(self.start_together, bool)
            or not isinstance(self.start_together, int)
            or self.start_together < 1
        ):
            raise InvalidSpec("start_together", self.start_together, "expected an int >= 1")
        if self.start_together > 1 and self.strategy != "one_for_one":
            raise InvalidSpec(
                "start_together",
                self.start_together,
                f"expected 1 with {self.strategy}: only one_for_one children start side by side",
            )
        if (
            isinstance(self.intensity, bool)
            or not isinstance(self.intensity, int)
            or (self.intensity < 0)
        ):
            raise InvalidSpec("intensity", self.intensity, "expected an int >= 0")
        check_seconds("period_s", self.period_s)


@dataclass(frozen=True)
class ChildSpec:
    id: str
    actor: type[ProcessActor]
    args: tuple = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    restart: str = "permanent"
    shutdown_s: float | str = SHUTDOWN_S
    start_timeout_s: float = START_TIMEOUT_S
    heartbeat_interval_s: float | None = HEARTBEAT_INTERVAL_S
    heartbeat_timeout_s: float | None = HEARTBEAT_TIMEOUT_S

    def __post_init__(self) -> None:
        _check_common(self.id, self.restart, self.shutdown_s)
        if not (isinstance(self.actor, type) and issubclass(self.actor, ProcessActor)):
            raise InvalidSpec("actor", self.actor, "expected a subclass of actors.ProcessActor")
        if not isinstance(self.args, tuple):
            raise InvalidSpec("args", self.args, "expected a tuple")
        if not isinstance(self.kwargs, dict) or not all(isinstance(k, str) for k in self.kwargs):
            raise InvalidSpec("kwargs", self.kwargs, "expected a dict with str keys")
        check_seconds("start_timeout_s", self.start_timeout_s)
        check_seconds("heartbeat_interval_s", self.heartbeat_interval_s, allow_none=True)
        check_seconds("heartbeat_timeout_s", self.heartbeat_timeout_s, allow_none=True)
        if (self.heartbeat_interval_s is None) != (self.heartbeat_timeout_s is None):
            raise InvalidSpec(
                "heartbeat_timeout_s",
                self.heartbeat_timeout_s,
                "expected None exactly when heartbeat_interval_s is None",
            )
        if (
            self.heartbeat_interval_s is not None
            and self.heartbeat_timeout_s is not None
            and self.heartbeat_timeout_s <= self.heartbeat_interval_s
        ):
            raise InvalidSpec(
                "heartbeat_timeout_s",
                self.heartbeat_timeout_s,
                f"expected more than heartbeat_interval_s ({self.heartbeat_interval_s})",
            )


@dataclass(frozen=True)
class SupervisorSpec:
    id: str
    flags: SupervisorFlags = field(default_factory=SupervisorFlags)
    children: tuple[ChildSpec | SupervisorSpec, ...] = ()
    restart: str = "permanent"
    shutdown_s: float | str = 60.0

    def __post_init__(self) -> None:
        _check_common(self.id, self.restart, self.shutdown_s)
        if not isinstance(self.flags, SupervisorFlags):
            raise InvalidSpec("flags", self.flags, "expected a SupervisorFlags")
        if not isinstance(self.children, tuple) or not all(
            isinstance(c, (ChildSpec, SupervisorSpec)) for c in self.children
        ):
            raise InvalidSpec(
                "children", self.children, "expected a tuple of ChildSpec and SupervisorSpec"
            )
        ids = [c.id for c in self.children]
        duplicates = sorted(i for i, n in collections.Counter(ids).items() if n > 1)
        if duplicates:
            raise InvalidSpec("children", duplicates, "expected unique child ids")
        if self.flags.strategy == "simple_one_for_one" and (
            len(self.children) != 1 or not isinstance(self.children[0], ChildSpec)
        ):
            raise InvalidSpec(
                "children",
                ids,
                "expected exactly one ChildSpec (the template) for simple_one_for_one",
            )


def _check_common(child_id: Any, restart: Any, shutdown_s: Any) -> None:
    if not isinstance(child_id, str) or not child_id:
        raise InvalidSpec("id", child_id, "expected a non-empty str")
    if restart not in RESTARTS:
        raise InvalidSpec("restart", restart, f"expected one of {', '.join(RESTARTS)}")
    if shutdown_s != BRUTAL_KILL:
        check_seconds("shutdown_s", shutdown_s)
