"""A slow or full disk on demand, for a crash-recovery harness running a node.

A harness that starts a node sets ``WARREN_DISK_FAULTS`` in the node's environment to the
path of a small JSON file it owns, and rewrites that file to start and end a fault::

    {"sync_delay_s": 0.05, "disk_full": true}

- ``sync_delay_s``: every group commit (a store's or a queue's ``sync``) sleeps this long
  first, as a disk whose fdatasync takes that much longer would make it;
- ``disk_full``: the node's resource monitor reads the disk's free space as 0, so the disk
  alarm goes off as it does when the disk fills, and publishers are blocked until the
  file says otherwise.

Without the variable (every node but a harness's) the hooks cost one lookup of it.
The file is read again only when its inode, modification time or size changes (one
``stat`` a commit), so a commit never parses JSON in the steady state. A file that is missing,
half-written or not JSON means no fault: a harness writes it atomically (a rename), and a
reader that catches it mid-rename sees the old one or none, never half of the new one.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["ENVIRONMENT_VARIABLE", "disk_full", "slow_sync", "write_faults"]

ENVIRONMENT_VARIABLE = "WARREN_DISK_FAULTS"
_seen: tuple[int, int, int] | None = None
_faults: dict[str, Any] = {}  # the harness's JSON object


def _current(path: str) -> dict[str, Any]:
    global _seen, _faults
    try:
        status = os.stat(path)
    except OSError:
        _seen, _faults = None, {}
        return _faults
    key = (status.st_ino, status.st_mtime_ns, status.st_size)
    if key != _seen:
        try:
            with open(path, encoding="utf-8") as file:
                loaded = json.load(file)
        except (OSError, ValueError):
            loaded = {}
        _seen, _faults = key, loaded if isinstance(loaded, dict) else {}
    return _faults


def slow_sync() -> None:
    """Before a group commit: sleep as long as the harness's slow disk says."""
    path = os.environ.get(ENVIRONMENT_VARIABLE)
    if not path:
        return
    delay = _current(path).get("sync_delay_s", 0)
    if isinstance(delay, (int, float)) and delay > 0:
        time.sleep(min(delay, 10.0))


def disk_full() -> bool:
    """Whether the harness says the disk is full."""
    path = os.environ.get(ENVIRONMENT_VARIABLE)
    if not path:
        return False
    return _current(path).get("disk_full") is True


def write_faults(
    path: str | os.PathLike, *, sync_delay_s: float = 0.0, disk_full: bool = False
) -> None:
    """The harness's side: say which disk faults are on, atomically."""
    path = os.fspath(path)
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w", encoding="utf-8") as file:
        json.dump({"sync_delay_s": sync_delay_s, "disk_full": disk_full}, file)
    os.replace(temporary, path)
