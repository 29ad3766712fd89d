"""Small files replaced whole and durably: recovery terms, definitions, the producer log's
compaction, key files.

``write_atomically`` writes a temporary file beside the target (named with this process's
pid, so two writers never share one), fsyncs it, renames it over the target and fsyncs
the directory: a reader, or a start after a crash at any point, finds the old file or
the new one, never a mix.
"""

from __future__ import annotations

import os

from warren.store import replicated_io

__all__ = ["fsync_directory", "is_temporary_of", "write_atomically"]


def fsync_directory(path: str | os.PathLike) -> None:
    """Make the directory's entries (files created, renamed, deleted) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        replicated_io.fsync(fd)
    finally:
        os.close(fd)


def is_temporary_of(name: str, target: str) -> bool:
    """Whether ``name`` is the temporary file ``write_atomically`` makes for ``target``
    (a name in the same directory), as a process killed before its rename leaves it."""
    prefix = f"{target}."
    return name.startswith(prefix) and name.endswith(".tmp") and name[len(prefix) : -4].isdigit()


def write_atomically(
    path: str | os.PathLike, data: bytes, mode: int = 0o644, *, durable: bool = True
) -> None:
    """Replace ``path`` with ``data`` (a new file gets ``mode``), durably unless
    ``durable`` is False (then a process killed at any point leaves the old file or the
    new one, whole, and only a power loss may leave neither)."""
    path = os.fspath(path)
    temporary = f"{path}.{os.getpid()}.tmp"  # see is_temporary_of
    fd = replicated_io.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[replicated_io.write(fd, view) :]
        if durable:
            replicated_io.fsync(fd)
    finally:
        os.close(fd)
    replicated_io.rename(temporary, path)
    if durable:
        fsync_directory(os.path.dirname(path) or ".")
