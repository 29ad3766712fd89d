"""The supervisor package's errors: what building and running a tree can raise."""

from __future__ import annotations

__all__ = ["InvalidSpec", "NodeLocked", "SupervisorError"]


class SupervisorError(Exception):
    """Base of every error the supervisor package raises."""


class InvalidSpec(SupervisorError, ValueError):
    """A child spec, supervisor flag or alarm limit is invalid; names the field and value."""

    def __init__(self, field: str, value: object, expected: str) -> None:
        super().__init__(f"{field}={value!r}: expected {expected}")
        self.field = field
        self.value = value


class NodeLocked(SupervisorError):
    """Another node runs on this data directory."""
