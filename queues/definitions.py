"""A node's queue definitions: which queues exist, with what arguments, durable ones kept
across restarts in ``<data_dir>/definitions.json``.

The file is replaced whole (temp file, fsync, rename, directory fsync), so a crash leaves
the old definitions or the new ones, never a mix. A non-durable queue's directory holds a
``.transient`` marker; a node deletes such directories at boot, and leaves alone (with a
warning) any queue directory it has no definition of.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
from dataclasses import asdict, dataclass

from .errors import PreconditionFailed
from .walker import QUEUES_DIR

__all__ = ["DEFINITIONS_FILE", "QueueDefinition", "check_queue_name", "load_definitions",
           "save_definitions", "remove_transient_queues"]

log = logging.getLogger("warren.queues")

DEFINITIONS_FILE = "definitions.json"
TRANSIENT_MARKER = ".transient"
_NAME = re.compile(r"[A-Za-z0-9_.-]{1,200}")


@dataclass(frozen=True)
class QueueDefinition:
    name: str
    durable: bool = True
    lazy: bool = False

    def check_same(self, other: "QueueDefinition") -> None:
        if self != other:
            raise PreconditionFailed(
                f"queue {self.name!r} exists with durable={self.durable}, lazy={self.lazy}; "
                f"declare it with those arguments, or delete it first")


def check_queue_name(name: object) -> str:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in (".", ".."):
        raise ValueError(f"a queue name is 1 to 200 letters, digits, '_', '.' or '-'; "
                         f"got {name!r}")
    return name


def queue_directory(data_dir: str, name: str) -> str:
    return os.path.join(data_dir, QUEUES_DIR, check_queue_name(name))


def load_definitions(data_dir: str) -> dict[str, QueueDefinition]:
    """The durable queues declared on the node."""
    try:
        with open(os.path.join(data_dir, DEFINITIONS_FILE)) as file:
            saved = json.load(file)
    except FileNotFoundError:
        return {}
    return {entry["name"]: QueueDefinition(**entry) for entry in saved["queues"]}


def save_definitions(data_dir: str, definitions: dict[str, QueueDefinition]) -> None:
    durable = [asdict(d) for d in definitions.values() if d.durable]
    path = os.path.join(data_dir, DEFINITIONS_FILE)
    with open(path + ".tmp", "w") as file:
        json.dump({"queues": durable}, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(path + ".tmp", path)
    fd = os.open(data_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def mark_transient(directory: str) -> None:
    os.makedirs(directory, exist_ok=True)
    open(os.path.join(directory, TRANSIENT_MARKER), "w").close()


def remove_transient_queues(data_dir: str, durable: dict[str, QueueDefinition]) -> None:
    """Delete the directories of non-durable queues, left by the node's last run."""
    root = os.path.join(data_dir, QUEUES_DIR)
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return
    for name in names:
        directory = os.path.join(root, name)
        if name in durable:
            continue
        if os.path.exists(os.path.join(directory, TRANSIENT_MARKER)):
            shutil.rmtree(directory)
        else:
            log.warning("%s has no queue definition; left alone", directory)
