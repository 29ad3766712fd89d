"""Replication's wire between two nodes' coordinators: the follower serves its replica
at its ``--peer`` address (``ReplicaServer``, a ZeroMQ ROUTER), and the leader keeps one
``FollowerLink`` (a DEALER) to each follower. Both are driven by their coordinator's
thread (``serve``/``pump`` with a timeout); neither starts a thread of its own.

Messages, each a multipart ZeroMQ message whose first frame is a JSON header and whose
other frames are the actions' bytes in order:
- ``hello {cluster, epoch}`` → ``state {epoch, applied, level}``: where the replica
  stands;
- ``manifest {cluster, epoch}`` → ``manifest {files}``: its files' sizes and block
  digests (hex), for a full sync;
- ``batch {cluster, epoch, actions, resync_to, partial}`` + data → ``ack {applied}``, or
  ``refused {reason, needed}`` (a deposed epoch, a gap: nothing applied).
Any request of another cluster, or that does not parse, is answered ``refused`` with the
reason and changes nothing; a peer that answers nothing the link can read is reported
in one line (``PeerError``), never taken for a follower.

The coordinator's ``warren.supervisor.cluster.shipping`` drives them, each link on a
thread of its own. Not yet: CURVE between peers (anyone who reaches a follower's peer
port could write into its data directory: keep it on a private network until then).

Races it guards against:
- A follower restarted while a batch was in flight: the batch is refused or never
  answered; the link asks ``hello`` again and sends from the position the replica has,
  which counts only when the replica is level with this leader's epoch (a full sync from
  it ended there): a new follower, one of another leader and one whose sync was cut
  short are synced whole.
- A follower's disk failing (full, an I/O error): the request is refused with the
  reason, nothing is acknowledged, and the server goes on.
- A batch applied whose ack was lost: sending it again is refused with ``needed`` past
  it, and the link moves on from there (never a gap: the replica checks the order).
- A leader deposed while it sends: a replica that has heard from a newer epoch (a
  hello, a manifest request or a batch) refuses it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import zmq

from ..errors import PeerError
from .replication import (
    ActionLog,
    FileAction,
    OutOfOrder,
    Replica,
    StaleEpoch,
    manifest,
    sync_actions,
)

__all__ = ["FollowerLink", "ReplicaServer"]

ANSWER_TIMEOUT_S = 5.0  # how long a link waits for a follower's answer before it asks anew
BATCH_ACTIONS = 1000  # the most actions one batch carries
SYNC_BATCH_BYTES = 16 * 2**20  # a full sync goes in batches of about this many bytes


def _frames(header: dict[str, Any], actions: Sequence[FileAction] = ()) -> list[bytes]:
    meta = [
        {"seq": a.seq, "kind": a.kind, "path": a.path, "offset": a.offset, "target": a.target}
        for a in actions
    ]
    return [json.dumps({**header, "actions": meta}).encode(), *(a.data for a in actions)]


def _actions(header: dict[str, Any], data: list[bytes]) -> list[FileAction]:
    meta = header.get("actions", [])
    if not isinstance(meta, list) or len(meta) != len(data):
        raise ValueError("a batch whose actions and data frames do not match")
    return [
        FileAction(
            int(m["seq"]),
            str(m["kind"]),
            str(m["path"]),
            int(m["offset"]),
            payload,
            str(m["target"]),
        )
        for m, payload in zip(meta, data, strict=True)
    ]


class ReplicaServer:
    """A follower's replica, served at ``endpoint`` to its cluster's leader."""

    def __init__(self, context: zmq.Context, endpoint: str, cluster: str, replica: Replica) -> None:
        self.cluster, self.replica = cluster, replica
        self.socket = context.socket(zmq.ROUTER)
        self.socket.linger = 0
        self.socket.bind(endpoint)
        self.counters = {"batches": 0, "refused": 0}
        # The newest epoch a leader spoke to it under: a deposed leader still shipping
        # is refused from a newer one's first hello on, not only from its first batch.
        self.fenced_epoch = replica.epoch

    def serve(self, timeout_s: float) -> None:
        """Answer every request that arrives within ``timeout_s``."""
        if not self.socket.poll(int(timeout_s * 1000)):
            return
        while True:
            try:
                identity, *frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.socket.send_multipart([identity, json.dumps(self._answer(frames)).encode()])

    def _answer(self, frames: list[bytes]) -> dict[str, Any]:
        try:
            header = json.loads(frames[0]) if frames else None
            if not isinstance(header, dict):
                raise ValueError("not a replication request")
            if header.get("cluster") != self.cluster:
                raise ValueError(f"a request of cluster {header.get('cluster')!r}")
            kind, epoch = header.get("kind"), int(header.get("epoch", 0))
            if epoch < self.fenced_epoch:
                raise StaleEpoch(
                    f"a {kind} of epoch {epoch}, where a leader of epoch "
                    f"{self.fenced_epoch} spoke already: its leader was deposed"
                )
            self.fenced_epoch = epoch
            if kind == "hello":
                replica = self.replica
                return {
                    "kind": "state",
                    "epoch": replica.epoch,
                    "applied": replica.applied,
                    "level": replica.level,
                    "log": replica.log,
                }
            if kind == "manifest":
                files = manifest(self.replica.data_dir)
                listed = {p: [size, [d.hex() for d in ds]] for p, (size, ds) in files.items()}
                return {"kind": "manifest", "files": listed}
            if kind == "batch":
                resync = header.get("resync_to")
                actions = _actions(header, frames[1:])
                applied = self.replica.apply(
                    epoch,
                    actions,
                    log=str(header.get("log", "")),
                    resync_to=None if resync is None else int(resync),
                    partial=bool(header.get("partial", False)),
                )
                self.counters["batches"] += 1
                return {"kind": "ack", "applied": applied}
            raise ValueError(f"an unknown request {kind!r}")
        except OutOfOrder as exc:
            self.counters["refused"] += 1
            return {"kind": "refused", "reason": str(exc), "needed": exc.needed}
        except (StaleEpoch, ValueError, KeyError, TypeError) as exc:
            self.counters["refused"] += 1
            return {"kind": "refused", "reason": str(exc)}
        except OSError as exc:  # its disk (full, failing): said, and the server goes on
            self.counters["refused"] += 1
            return {"kind": "refused", "reason": f"the follower's disk: {exc}"}

    def close(self) -> None:
        self.socket.close()


class FollowerLink:
    """The leader's link to one follower at ``endpoint``, fed from ``log``."""

    def __init__(
        self,
        context: zmq.Context,
        endpoint: str,
        cluster: str,
        follower: str,
        log: ActionLog,
        data_dir: str,
    ) -> None:
        self.endpoint, self.cluster, self.follower = endpoint, cluster, follower
        self.log, self.data_dir = log, data_dir
        self.socket = self._dealer(context)
        self.known = False  # the follower's position is known (after a hello)
        self.needs_sync = True  # until a hello or a full sync says it is level
        self.last_error: str | None = None
        # Whether the leader retired this link: a full sync under way sends no more of
        # its batches (its successor's would be overwritten with older bytes).
        self.stopped: Callable[[], bool] = lambda: False

    def _ask(self, header: dict[str, Any], actions: Sequence[FileAction] = ()) -> dict[str, Any]:
        frames = _frames({"cluster": self.cluster, **header}, actions)
        self.socket.send_multipart(frames, copy=False)  # the data frames as they are
        if not self.socket.poll(int(ANSWER_TIMEOUT_S * 1000)):
            self._reconnect()
            raise PeerError(f"{self.follower} at {self.endpoint} did not answer")
        frames = self.socket.recv_multipart()
        try:
            answer = json.loads(frames[0])
            if not isinstance(answer, dict) or "kind" not in answer:
                raise ValueError(answer)
        except ValueError:
            self._reconnect()
            raise PeerError(
                f"{self.endpoint} is not a Warren node's peer address: it answered "
                f"{frames[0][:60]!r}"
            ) from None
        return answer

    def _reconnect(self) -> None:
        """A fresh socket: an answer that comes late must not be taken for the next."""
        self.socket.close()
        self.socket = self._dealer(self.socket.context)
        self.known = False

    def _dealer(self, context: zmq.Context) -> zmq.Socket:
        socket = context.socket(zmq.DEALER)
        socket.linger = 0
        socket.connect(self.endpoint)
        return socket

    def pump(self, epoch: int) -> int:
        """Bring the follower one batch nearer the log's end (a full sync first when it
        is not level with this leader's log); its position, acknowledged."""
        if not self.known:
            self._hello(epoch)
        identity = self.log.identity  # a renewed log ignores what this pump learns
        batch = None if self.needs_sync else self.log.batch_for(self.follower, BATCH_ACTIONS)
        if batch is None:
            return self._full_sync(epoch)
        if not batch:
            return self.log.acked.get(self.follower, 0)
        header = {"kind": "batch", "epoch": epoch, "log": identity}
        return self._acknowledged(self._ask(header, batch), identity)

    def _hello(self, epoch: int) -> None:
        """Where the follower stands. Its position counts only when a full sync from this
        leader's epoch ended there and the log reaches it; anything else (a new follower,
        one of another leader, one whose sync was cut short) is synced whole."""
        identity = self.log.identity
        state = self._ask({"kind": "hello", "epoch": epoch})
        if state.get("kind") != "state":
            self.last_error = str(state.get("reason", state))
            raise PeerError(f"{self.follower} refused: {self.last_error}")
        try:
            their_epoch, applied = int(state["epoch"]), int(state["applied"])
        except (KeyError, TypeError, ValueError):
            raise PeerError(f"{self.endpoint} answered a hello with {state!r}") from None
        level = bool(state.get("level")) and their_epoch == epoch and state.get("log") == identity
        self.needs_sync = not level or applied > self.log.position
        if not self.needs_sync:
            self.log.resynced(self.follower, applied, identity)
        self.known = True

    def _acknowledged(self, answer: dict[str, Any], identity: str) -> int:
        """The follower's answer to a batch of the log ``identity`` taken in (nothing,
        if the log was renewed since: its position is then unknown)."""
        try:
            if answer.get("kind") == "ack":
                self.log.acknowledge(self.follower, int(answer["applied"]), identity)
                self.last_error = None
                return self.log.acked.get(self.follower, 0)
            if answer.get("kind") == "refused" and "needed" in answer:
                needed = int(answer["needed"])
                if needed - 1 > self.log.position:  # ahead of this log: not its data
                    self.needs_sync = True
                else:
                    self.log.resynced(self.follower, needed - 1, identity)
                return self.log.acked.get(self.follower, 0)
        except (KeyError, TypeError, ValueError):
            raise PeerError(f"{self.endpoint} answered a batch with {answer!r}") from None
        self.last_error = str(answer.get("reason", answer))
        self.known = False  # where it stands is asked again before the next batch
        raise PeerError(f"{self.follower} refused: {self.last_error}")

    def _full_sync(self, epoch: int) -> int:
        """The follower's files made the leader's, as of the log's position now, in
        batches of about ``SYNC_BATCH_BYTES``. All but the last set the replica's
        position to 0, so that a follower killed mid-sync is synced again from the
        start, never taken for one that has the log up to where it was."""
        identity, position = self.log.identity, self.log.position
        theirs = self._ask({"kind": "manifest", "epoch": epoch})
        if theirs.get("kind") != "manifest":
            self.last_error = str(theirs.get("reason", theirs))
            raise PeerError(f"{self.follower} refused its manifest: {self.last_error}")
        try:
            files = {
                str(path): (int(size), tuple(bytes.fromhex(d) for d in digests))
                for path, (size, digests) in theirs["files"].items()
            }
        except (KeyError, TypeError, ValueError, AttributeError):
            raise PeerError(f"{self.endpoint} answered a manifest request badly") from None
        self.log.resynced(self.follower, 0, identity)
        batches = _sized(sync_actions(self.data_dir, manifest(self.data_dir), files))
        batch = next(batches, [])
        for following in batches:
            if self.stopped():
                raise PeerError(f"the link to {self.follower} was stopped mid-sync")
            header = {
                "kind": "batch",
                "epoch": epoch,
                "log": identity,
                "resync_to": 0,
                "partial": True,
            }
            self._acknowledged(self._ask(header, batch), identity)
            batch = following
        if self.stopped():
            raise PeerError(f"the link to {self.follower} was stopped mid-sync")
        header = {"kind": "batch", "epoch": epoch, "log": identity, "resync_to": position}
        acked = self._acknowledged(self._ask(header, batch), identity)
        self.needs_sync = identity != self.log.identity  # renewed meanwhile: again
        return acked

    def close(self) -> None:
        self.socket.close()


def _sized(actions: Iterator[FileAction]) -> Iterator[list[FileAction]]:
    """``actions`` in lists of about ``SYNC_BATCH_BYTES`` of data each."""
    batch: list[FileAction] = []
    size = 0
    for action in actions:
        batch.append(action)
        size += len(action.data)
        if size >= SYNC_BATCH_BYTES or len(batch) >= BATCH_ACTIONS:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch
