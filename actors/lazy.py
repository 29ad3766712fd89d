"""Lazy package faces (PEP 562): a package names what it exports and where each name lives,
and a module is imported only when one of its names is first used.

Every face of Warren (``warren``, ``warren.actors``, ``warren.store``, ``warren.queues``,
``warren.supervisor``) is built with ``lazy_face``, so ``import warren.actors`` loads the
actor runtime alone and ``import warren`` loads nothing heavy until a name is used: a Spark
executor or a forkserver preload pays only for what it touches. A name, once resolved, is
stored in the package's namespace, so later lookups never come back here. A face deletes
the helpers it was built with (``lazy_face``, ``TYPE_CHECKING``), and its ``dir()`` lists its
exports and its submodules only: the namespace holds Warren's names and no others.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["lazy_face"]


def lazy_face(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package``, whose ``exports`` map each public name
    to the module that defines it (relative to ``package``, e.g. ``".engine.index"``)."""

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        # the exports and the package's own submodules: never the face's helpers
        submodules = {
            name
            for name, value in vars(sys.modules[package]).items()
            if isinstance(value, ModuleType) and value.__name__ == f"{package}.{name}"
        }
        return sorted(set(exports) | submodules)

    return __getattr__, __dir__
