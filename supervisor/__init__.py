"""Supervision trees with OTP's semantics, resource alarms, and the Warren node.

``Supervisor`` runs a ``SupervisorSpec`` of ``ChildSpec``s over actor processes
(``warren.supervisor.supervisor``); ``Node`` boots a whole broker node on a data directory
(``warren.supervisor.node.node``); ``AlarmLimits`` sets the memory and disk alarms
(``warren.supervisor.node.alarms``). ``warren.supervisor.cli.main`` is the ``warren`` command.
"""

from .errors import InvalidSpec, NodeLocked, SupervisorError
from .node.alarms import AlarmChange, AlarmLimits
from .node.node import Node, query_status
from .specs import ChildSpec, SupervisorFlags, SupervisorSpec
from .supervisor import Supervisor

__all__ = [
    "AlarmChange",
    "AlarmLimits",
    "ChildSpec",
    "InvalidSpec",
    "Node",
    "NodeLocked",
    "Supervisor",
    "SupervisorError",
    "SupervisorFlags",
    "SupervisorSpec",
    "query_status",
]
