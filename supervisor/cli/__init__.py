"""The ``warren`` command: ``main`` parses the arguments and runs one subcommand."""

from .main import main

__all__ = ["main"]
