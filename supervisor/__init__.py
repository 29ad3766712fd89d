"""Supervision trees with OTP's semantics, resource alarms, and the Warren node.

``Supervisor`` runs a ``SupervisorSpec`` of ``ChildSpec``s over actor processes
(``warren.supervisor.supervisor``); ``Node`` boots a whole broker node on a data directory
(``warren.supervisor.node.node``); ``AlarmLimits`` sets the memory and disk alarms
(``warren.supervisor.node.alarms``). ``warren.supervisor.cli.main`` is the ``warren`` command.
"""

from typing import TYPE_CHECKING

from warren.actors.lazy import lazy_face

if TYPE_CHECKING:  # what the names are, for type checkers and editors
    from .errors import FaultMissed, InvalidSpec, NodeLocked, SupervisorError, UsageError
    from .node.alarms import AlarmChange, AlarmLimits
    from .node.node import Node, query_status
    from .specs import ChildSpec, SupervisorFlags, SupervisorSpec
    from .supervisor import Supervisor


_EXPORTS = {
    "AlarmChange": ".node.alarms",
    "AlarmLimits": ".node.alarms",
    "ChildSpec": ".specs",
    "FaultMissed": ".errors",
    "InvalidSpec": ".errors",
    "Node": ".node.node",
    "NodeLocked": ".errors",
    "query_status": ".node.node",
    "Supervisor": ".supervisor",
    "SupervisorError": ".errors",
    "SupervisorFlags": ".specs",
    "SupervisorSpec": ".specs",
    "UsageError": ".errors",
}
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
del lazy_face, TYPE_CHECKING
__all__ = sorted(_EXPORTS)
