"""Replication wired into the coordinator: the node's writers commit here, a leader
ships their actions to its followers and answers each commit once every in-sync replica
has it on its disk, and a follower serves its copy of the leader's data directory.

One thread (``warren-replication``) owns two sockets and the mode:
- the **commit socket** (a ROUTER at ``commit_endpoint``, an ipc path of the node's
  runtime directory) where the node's processes send what they wrote (``warren.store.
  replicated_io``, through ``warren.store.replication_link``);
- in mode ``idle`` (the start: a coordinator restarted while its node led must not
  serve a replica under the node's running processes) nothing is served and every
  commit is refused, until the node says which of the two it is;
- in mode ``replica`` (after ``follow(serve=True)``, which the node sends once none of
  its processes writes): a ``ReplicaServer`` at the node's ``--peer-listen`` address
  (its ``--peer`` by default), which
  applies a leader's batches; every commit is refused (a follower's processes write
  nothing: the node runs them only while it leads);
- in mode ``leader`` (after ``lead(epoch)``, which the node asks for before it starts the
  processes that write): each commit's actions are numbered into an ``ActionLog``, a
  thread per other node (``_Link``) pumps them to it, and the commit is answered
  ``committed`` once the ISR holds at least ``min_insync`` nodes and each of them has
  acknowledged its last action.

The ISR moves with what the links see, always by a fenced etcd write that the
coordinator's own thread makes (``wanted_isr``, then ``isr_written``): a follower
level with this leader's log and caught up to its end joins it; a member whose etcd
lease is gone (its node lost or stopped) is removed at once, and one that leaves a
commit waiting ``FOLLOWER_DEADLINE_S`` is removed, and the commit is released only
after the smaller ISR is written (and only if it still holds ``min_insync``: below
that, commits wait for a follower to catch up, as Kafka's ``min.insync.replicas``).

Races it guards against:
- A leader that stops leading (its lease, an epoch that is not the key's): every commit
  waiting and every later one is refused at once (``election.leading`` is asked at each
  turn), not when the node has stopped its processes.
- The data directory written by two hands: the replica server is closed before
  ``lead`` returns, and bound again only on ``follow``, which the node calls once its
  writing processes have stopped.
- A follower that does not answer: only its own link's thread waits on it (the others,
  the commits and the coordinator's keepalives go on).
"""

from __future__ import annotations

import collections
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq

from warren.store.replication_link import recorded_actions

from ..errors import PeerError
from .election import ClusterView, Election
from .peers import FollowerLink, ReplicaServer
from .replication import ActionLog, FileAction, Replica

__all__ = ["FOLLOWER_DEADLINE_S", "Shipping"]

log = logging.getLogger("warren.cluster")

FOLLOWER_DEADLINE_S = 5.0  # an ISR member that holds a commit back this long is removed
LINK_RETRY_S = 0.5  # a link whose follower did not answer tries again after this
TURN_MS = 100  # the replication thread looks at the ISR and its deadlines this often


class _Link(threading.Thread):
    """The leader's thread for one follower: it pumps the log to it while it lags."""

    def __init__(self, shipping: Shipping, follower: str, peer: str, epoch: int) -> None:
        super().__init__(name=f"warren-link-{follower}", daemon=True)
        self.shipping, self.follower, self.peer, self.epoch = shipping, follower, peer, epoch
        assert shipping.log is not None, "a link runs while the node leads"
        self.log = shipping.log
        self.link = FollowerLink(
            shipping.context, peer, shipping.cluster, follower, self.log, shipping.data_dir
        )
        self.stopping = threading.Event()
        self.link.stopped = self.stopping.is_set
        self.error: str | None = None

    def lagging(self) -> bool:
        return (
            not self.link.known
            or self.link.needs_sync
            or self.log.acked.get(self.follower, 0) < self.log.position
        )

    def run(self) -> None:
        changed = self.shipping.changed
        try:
            while not self.stopping.is_set():
                with changed:
                    changed.wait_for(lambda: self.stopping.is_set() or self.lagging(), 1.0)
                if self.stopping.is_set():
                    return
                try:
                    self.link.pump(self.epoch)
                    self.error = None
                except PeerError as exc:
                    if self.error != str(exc):
                        log.warning("replication: %s", exc)
                    self.error = str(exc)
                    self.stopping.wait(LINK_RETRY_S)
                except OSError as exc:  # the leader's own disk, in a full sync
                    self.error = f"the leader's disk: {exc}"
                    log.error("replication to %s: %s", self.follower, self.error)
                    self.stopping.wait(LINK_RETRY_S)
                self.shipping.poke()
        finally:
            self.link.close()

    def caught_up(self) -> bool:
        """Level with this leader's log and holding all of it now."""
        return (
            self.link.known
            and not self.link.needs_sync
            and self.log.acked.get(self.follower, 0) >= self.log.position
        )

    def stop(self) -> None:
        self.stopping.set()
        with self.shipping.changed:
            self.shipping.changed.notify_all()


class Shipping:
    """See the module docstring. ``election`` is the coordinator's (``leading`` and
    ``epoch`` are read here; every etcd write stays on the coordinator's thread)."""

    def __init__(
        self,
        election: Election,
        data_dir: str,
        commit_endpoint: str,
        min_insync: int,
        peer_listen: str,
    ) -> None:
        self.election, self.data_dir, self.min_insync = election, data_dir, min_insync
        self.peer_listen = peer_listen  # where its replica server binds
        self.cluster, self.node = election.cluster, election.node
        self.context = zmq.Context()
        self.commits = self.context.socket(zmq.ROUTER)
        self.commits.linger = 0
        self.commits.bind(commit_endpoint)
        self.wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.changed = threading.Condition()  # the log grew, or a link should stop
        self.lock = threading.Lock()  # isr, nodes, wanted_isr
        self.mode = "idle"  # until the node says whether its processes write (see Node)
        self.closing = False  # the node is stopping: it leads no more from now on
        self.epoch: int | None = None
        self.log: ActionLog | None = None
        self.replica_server: ReplicaServer | None = None
        self.links: dict[str, _Link] = {}
        self.retired: list[_Link] = []  # links told to stop, not ended yet
        self.waiting: collections.deque[tuple[bytes, int, float]] = collections.deque()
        self.isr: tuple[str, ...] = ()
        self.nodes: dict[str, str] = {}
        self.wanted_isr: tuple[str, ...] | None = None
        self.counters = {
            "commits": 0,
            "actions": 0,
            "refused": 0,
            "isr_changes": 0,
            "resyncs": 0,
            "confirmed": 0,  # commits answered as held by the cluster
        }
        self._commands: queue.Queue[tuple[Callable[[], Any], list[Any], threading.Event]]
        self._commands = queue.Queue()
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="warren-replication", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ------------------------------------------------------------------ other threads

    def poke(self) -> None:
        os.eventfd_write(self.wake_fd, 1)

    def observed(self, view: ClusterView) -> None:
        """The coordinator's newest view: the ISR it holds, the nodes alive."""
        with self.lock:
            self.isr = tuple(view.isr)
            self.nodes = dict(view.nodes)
        self.poke()

    def isr_change(self) -> tuple[str, ...] | None:
        """The ISR this leader wants written (the coordinator's thread writes it)."""
        with self.lock:
            return self.wanted_isr

    def isr_written(self, members: tuple[str, ...]) -> None:
        with self.lock:
            self.isr, self.wanted_isr = tuple(sorted(members)), None
            self.counters["isr_changes"] += 1
        self.poke()

    def lead(self, epoch: int) -> bool:
        """Take the data directory for the node's processes and ship their writes under
        ``epoch``; False when the node does not lead at that epoch."""
        return bool(self._on_thread(lambda: self._lead(epoch)))

    def follow(self, *, serve: bool) -> None:
        """Ship nothing more and refuse every commit; with ``serve`` (the node's
        processes stopped writing), serve the replica again."""
        self._on_thread(lambda: self._follow(serve))

    def resync(self) -> None:
        """Sync every follower whole before any later commit is answered (a writing
        process of the node ended without committing what it wrote last)."""
        self._on_thread(self._resync)

    def status(self) -> dict[str, Any]:
        with self.lock:
            isr = self.isr
        shipped = self.log
        followers = {}
        for name, link in list(self.links.items()):
            lag_actions, lag_bytes = shipped.lag(name) if shipped else (0, 0)
            followers[name] = {
                "acked": shipped.acked.get(name, 0) if shipped else 0,
                "lag_actions": lag_actions,
                "lag_bytes": lag_bytes,
                "syncing": link.link.needs_sync,
                "error": link.error,
            }
        return {
            "mode": self.mode,
            "epoch": self.epoch,  # the leadership it ships under (None: it does not)
            "position": shipped.position if shipped else None,
            "committed": shipped.committed(isr) if shipped else None,
            "kept_bytes": shipped.kept_bytes if shipped else 0,
            "waiting_commits": len(self.waiting),
            "min_insync": self.min_insync,
            "followers": followers,
            "counters": dict(self.counters),
        }

    def stop(self) -> None:
        self._stopping.set()
        self.poke()
        self._thread.join(timeout=10)

    def _on_thread(self, call: Callable[[], Any]) -> Any:
        done = threading.Event()
        result: list[Any] = []
        self._commands.put((call, result, done))
        self.poke()
        if not done.wait(timeout=30):
            raise PeerError("the replication thread did not answer within 30 s")
        if isinstance(result[0], Exception):
            raise result[0]
        return result[0]

    # ------------------------------------------------------------------ its thread

    def _run(self) -> None:
        poller = zmq.Poller()
        poller.register(self.commits, zmq.POLLIN)
        poller.register(self.wake_fd, zmq.POLLIN)
        registered: list[zmq.Socket] = []  # the replica server's socket, while served
        try:
            while not self._stopping.is_set():
                server = self.replica_server
                if registered != ([server.socket] if server else []):
                    for socket in registered:
                        poller.unregister(socket)
                    registered = [server.socket] if server else []
                    for socket in registered:
                        poller.register(socket, zmq.POLLIN)
                ready = dict(poller.poll(TURN_MS))
                try:
                    self._turn(ready, server)
                except Exception:  # a bug, or a disk: logged, and the next turn goes on
                    log.exception("replication: a turn failed")
        finally:
            self._stop_links(wait=True)  # their sockets closed before the context ends
            self._refuse_waiting("the node's coordinator stopped")
            if self.replica_server is not None:
                self.replica_server.close()
            self.commits.close()
            self.context.term()
            os.close(self.wake_fd)

    def _turn(self, ready: dict[Any, int], server: ReplicaServer | None) -> None:
        if self.wake_fd in ready:
            try:
                os.eventfd_read(self.wake_fd)
            except BlockingIOError:
                pass
        while not self._commands.empty():
            call, result, done = self._commands.get()
            try:
                result.append(call())
            except Exception as exc:
                result.append(exc)
            done.set()
        if self.commits in ready:
            self._take_commits()
        # the server polled, if a command has not closed it since
        if server is not None and server is self.replica_server and server.socket in ready:
            server.serve(0)
        if self.mode == "leader":
            self._release()
            if self._leads_now():
                self._mind_links()
            else:  # deposed: it ships nothing more (the node stops its processes next)
                self._stop_links()

    def _serve_replica(self) -> None:
        self.replica_server = ReplicaServer(
            self.context, self.peer_listen, self.cluster, Replica(self.data_dir)
        )

    def _lead(self, epoch: int) -> bool:
        if self.closing or not self.election.leading() or self.election.epoch != epoch:
            return False
        if self.mode == "leader" and self.epoch == epoch:
            return True
        if self.replica_server is not None:
            self.replica_server.close()
            self.replica_server = None
        self._stop_links()
        self.mode, self.epoch = "leader", epoch
        self.log = ActionLog(self.node)
        log.info("replication: %s ships its writes at epoch %d", self.node, epoch)
        return True

    def _follow(self, serve: bool) -> None:
        self._stop_links()
        self._refuse_waiting("the node does not lead any more")
        self.mode, self.epoch, self.log = ("replica" if serve else "stopped"), None, None
        self.closing = self.closing or not serve
        if serve and self.replica_server is None:
            self._serve_replica()
        elif not serve and self.replica_server is not None:
            self.replica_server.close()
            self.replica_server = None

    def _resync(self) -> None:
        """Renew the log (every follower's position unknown, an ack of the old log
        ignored) and have each link ask where its follower stands: the hello finds
        another log, and the follower is synced whole. Nothing is joined: it is quick."""
        if self.mode != "leader" or self.log is None:
            return
        self.log.renew()
        for link in self.links.values():
            link.link.known = False
        with self.changed:
            self.changed.notify_all()
        self.counters["resyncs"] += 1
        log.warning("replication: a process of the node ended unsynced: syncing followers whole")

    def _stop_links(self, wait: bool = False) -> None:
        """Tell every link to stop. Only the thread's own end (``wait``) waits for them:
        a link in the middle of a question to a follower that is gone ends with its
        answer's timeout (``peers.ANSWER_TIMEOUT_S`` a question), and this thread, held
        that long, would hold the coordinator's actor (its ``follow`` waits for it) past
        its heartbeat. A link told to stop asks nothing more, and what it was asking
        under an older leadership a follower refuses or ignores (its epoch, its log);
        a full sync under way stops before its next batch, and no new link to that
        follower starts until the retired one has ended (``retired``): two syncs of one
        follower at a time would interleave their files' bytes."""
        links, self.links = list(self.links.values()), {}
        for link in links:
            link.stop()
        self.retired = [link for link in (*self.retired, *links) if link.is_alive()]
        for link in self.retired if wait else ():
            link.join(timeout=10)

    def _leads_now(self) -> bool:
        return (
            self.mode == "leader"
            and self.election.leading()
            and self.election.epoch == (self.epoch)
        )

    def _take_commits(self) -> None:
        while True:
            try:
                identity, *frames = self.commits.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if not self._leads_now() or self.log is None:
                self._answer(identity, {"refused": f"{self.node} does not lead its cluster"})
                continue
            try:
                actions = recorded_actions(frames)
                for action in actions:  # all checked before any is recorded
                    FileAction(1, action.kind, action.path, action.offset, b"", action.target)
                for action in actions:
                    self.log.record(
                        action.kind,
                        action.path,
                        offset=action.offset,
                        data=action.data,
                        target=action.target,
                    )
            except (ValueError, KeyError, TypeError) as exc:
                self._answer(identity, {"refused": f"a malformed commit: {exc}"})
                continue
            self.counters["commits"] += 1
            self.counters["actions"] += len(actions)
            self.waiting.append((identity, self.log.position, time.monotonic()))
            with self.changed:
                self.changed.notify_all()

    def _answer(self, identity: bytes, answer: dict[str, Any]) -> None:
        if "refused" in answer:
            self.counters["refused"] += 1
        else:
            self.counters["confirmed"] += 1  # a writer's sync returns: its confirms go
        try:
            self.commits.send_multipart([identity, _json(answer)], zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the writer is gone: its process ended, and its sync with it

    def _refuse_waiting(self, reason: str) -> None:
        while self.waiting:
            identity, _, _ = self.waiting.popleft()
            self._answer(identity, {"refused": reason})

    def _release(self) -> None:
        if not self._leads_now():
            self._refuse_waiting(f"{self.node} does not lead its cluster any more")
            return
        assert self.log is not None, "a leader has its log"
        with self.lock:
            isr, wanted = self.isr, self.wanted_isr
        if len(isr) < self.min_insync or self.node not in isr:
            return
        # A member being written into the ISR counts from the moment it is wanted: once
        # written it may lead, so it must hold everything confirmed from then on.
        joining = set(wanted or ()) - set(isr)
        committed = self.log.committed((*isr, *joining))
        while self.waiting and self.waiting[0][1] <= committed:
            identity, seq, _ = self.waiting.popleft()
            self._answer(identity, {"committed": seq})
        self.log.release()

    def _mind_links(self) -> None:
        """A link to every other node alive or in the ISR; the ISR grown by a follower
        caught up, or shrunk by one past its deadline."""
        assert self.epoch is not None and self.log is not None, "a leader has its log"
        with self.lock:
            isr, nodes, wanted = self.isr, dict(self.nodes), self.wanted_isr
        self.retired = [link for link in self.retired if link.is_alive()]
        ending = {link.follower for link in self.retired}
        for name, peer in nodes.items():
            if name != self.node and name not in self.links and name not in ending:
                self.links[name] = _Link(self, name, peer, self.epoch)
                self.links[name].start()
        for name in [n for n in self.links if n not in nodes and n not in isr]:
            link = self.links.pop(name)
            link.stop()
        if wanted is not None:
            return  # one change at a time: the coordinator writes it
        dead = {m for m in isr if m != self.node and m not in nodes} if self.node in nodes else ()
        if dead:  # no lease in etcd: lost, nothing to wait for (a new leader's old leader)
            log.warning("replication: %s left the cluster: out of the ISR", ", ".join(dead))
            self._want(tuple(m for m in isr if m not in dead))
            return
        if self.waiting and time.monotonic() - self.waiting[0][2] > FOLLOWER_DEADLINE_S:
            oldest = self.waiting[0][1]
            late = {m for m in isr if m != self.node and self.log.acked.get(m, 0) < oldest}
            if late:
                log.warning(
                    "replication: %s held a commit back %g s: out of the ISR",
                    ", ".join(sorted(late)),
                    FOLLOWER_DEADLINE_S,
                )
                self._want(tuple(m for m in isr if m not in late))
                return
        joining = [n for n, link in self.links.items() if n not in isr and link.caught_up()]
        if joining:
            log.info("replication: %s caught up: into the ISR", ", ".join(sorted(joining)))
            self._want((*isr, *joining))

    def _want(self, members: tuple[str, ...]) -> None:
        # The leader is always among them: the ISR it computes from may be a view read
        # before its own campaign wrote it in (an empty ISR, at a cluster's first
        # election), and a leader written out of its own ISR would never commit again.
        with self.lock:
            self.wanted_isr = tuple(sorted({*members, self.node}))


def _json(answer: dict[str, Any]) -> bytes:
    return json.dumps(answer).encode()
