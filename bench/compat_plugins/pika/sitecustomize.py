"""Run at the start of every Python process of pika's suite (the compat runner puts this
folder on its ``PYTHONPATH``; ``bench/compat.py``), never in Warren's own.

The tests were exported from a pika commit newer than the release installed (1.4.4): that
commit renamed the module of small helpers (``time_now``, ``as_bytes``, ``ON_WINDOWS`` ...)
from ``pika.compat`` to ``pika._utils``. Here the release's module answers to the new name
too, so the tests of the broker run against the released client. A pytest plugin would not
do: the tests' forwarding server runs in a process of its own, started by ``spawn``."""

import importlib.abc
import importlib.util
import sys


class _HelpersUnderTheirNewName(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``pika._utils`` (only when pika itself has none) as ``pika.compat``."""

    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_loader(name, self) if name == "pika._utils" else None

    def create_module(self, spec):
        return importlib.import_module("pika.compat")

    def exec_module(self, module):
        pass  # pika.compat ran when it was imported


sys.meta_path.append(_HelpersUnderTheirNewName())
