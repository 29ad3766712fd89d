"""Actor classes the tests spawn (a module of its own, so the forkserver can preload it)."""

from __future__ import annotations

import gc
import logging
import os
import resource
import threading
import time
from dataclasses import dataclass
from typing import Any, NamedTuple

import pykka

from warren.actors import Down, Exit, ProcessActor, UnhandledMessage, message
from warren.actors.ref import ActorRef


@message
@dataclass(frozen=True)
class Put:
    key: str
    body: bytes


class Point(NamedTuple):
    x: int
    y: int


message(Point)


@message
@dataclass(frozen=True)
class Span:
    """A message whose constructor checks its fields."""

    low: int
    high: int

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ValueError(f"low {self.low} is above high {self.high}")


@dataclass(frozen=True)
class NeverRegistered:
    """A dataclass the parent registers only after spawning (the child never does)."""

    value: int


class Recorder(ProcessActor):
    """Keeps what it is told; answers questions about it."""

    def __init__(self, label: str = "recorder") -> None:
        self.label = label
        self.seen: list[Any] = []
        self.batch_sizes: list[int] = []
        self.stored: dict[str, bytes] = {}
        self.idle_marks: list[int] = []
        self.batched_since_idle = False
        self.alarms: list[tuple[str, bool]] = []

    def on_alarm(self, resource: str, raised: bool) -> None:
        self.alarms.append((resource, raised))

    def on_idle(self) -> None:
        if self.batched_since_idle:
            self.idle_marks.append(len(self.seen))
            self.batched_since_idle = False

    def on_receive_batch(self, messages: list[Any]) -> None:
        self.batch_sizes.append(len(messages))
        self.batched_since_idle = True
        super().on_receive_batch(messages)

    def on_receive(self, message: Any) -> Any:
        match message:
            case "seen":
                return self.seen
            case "batch_sizes":
                return self.batch_sizes
            case "label":
                return self.label
            case "alarms":
                return self.alarms
            case "pid":
                return os.getpid()
            case "ref":
                return self.ref
            case ("raise", type_name, text):
                raise {"ValueError": ValueError, "KeyError": KeyError}.get(type_name, RuntimeError)(
                    text
                )
            case ("crash",):
                raise RuntimeError("asked to crash")
            case ("sleep", seconds):
                time.sleep(seconds)
                return "slept"
            case ("nap", seconds, label):
                time.sleep(seconds)
                self.seen.append(label)
                return label
            case ("busy", path):
                with open(path, "w") as out:
                    out.write("busy")
                time.sleep(60)
                return "rested"
            case ("busy_until", started, release):
                open(started, "w").close()
                while not os.path.exists(release):
                    time.sleep(0.01)
                return "released"
            case ("block_until", path):
                while not os.path.exists(path):
                    time.sleep(0.01)
                return "released"
            case ("ask_other", ref, question):
                return ref.ask(question, timeout=10)
            case ("tell_other", ref, note):
                ref.tell(note)
                return "told"
            case ("whereis", name):
                return self.whereis(name)
            case ("register", name):
                self.register(name)
                return "registered"
            case ("monitor", ref):
                self.monitor(ref)
                return "monitoring"
            case ("monitor_named", names):
                return self.monitor_named(names)
            case ("monitor_named_async", names, other, question):
                monitoring = self.monitor_named_async(names)
                answered = other.ask(question, timeout=10)  # work while the node answers
                return answered, monitoring.get(timeout=10)
            case ("stop_other", ref):
                return ref.stop(timeout=5)
            case ("stop_self", abnormal):
                self.stop(abnormal=abnormal)
                return "stopping"
            case ("remind_me", delay, note):
                self.call_later(delay, lambda: self.seen.append(note))
                return "scheduled"
            case "full_collection_faults":  # the pages one full collection copied
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                gc.collect()
                return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
            case "idle_marks":
                return self.idle_marks
            case "mailbox_empty":
                return self.mailbox_empty()
            case ("wait_for_more", seconds):
                deadline = time.monotonic() + seconds
                while self.mailbox_empty() and time.monotonic() < deadline:
                    time.sleep(0.005)
                return "more waits" if not self.mailbox_empty() else "nothing came"
            case ("link", ref):
                self.link(ref)
                return "linked"
            case Put(key=key, body=body):
                self.stored[key] = body
                return len(body)
            case ("get", key):
                return self.stored[key]
            case Point(x=x, y=y):
                return Point(y, x)
            case Span(low=low, high=high):
                return high - low
            case "unanswerable":
                return object()
            case ("log", level, text):
                logging.getLogger("sample").log(level, text)
                return "logged"
            case ("refuse", text):
                raise UnhandledMessage(text)
            case ("defer_then_raise", text):
                self.defer_reply()
                raise ValueError(text)
            case ("defer",):
                self.defer_reply()
                return None
            case "later":
                reply = self.defer_reply()
                threading.Thread(target=lambda: reply.send("from another thread")).start()
                return None
            case _:
                self.seen.append(message)
                return message


class SmallMailbox(Recorder):
    max_message_bytes = 64 * 1024


class ShortPasses(Recorder):
    """A Recorder whose loop passes end after half a millisecond of handling; it marks
    every ``on_idle``, after asks too."""

    max_pass_s = 0.0005

    def on_idle(self) -> None:
        self.idle_marks.append(len(self.seen))


class Mute(ProcessActor):
    """Handles nothing: ProcessActor's own on_receive."""


class FailsToStart(ProcessActor):
    def on_start(self) -> None:
        raise ValueError("no disk today")


class TitledWorker(ProcessActor):
    def on_receive(self, message: Any) -> Any:
        with open(f"/proc/{os.getpid()}/cmdline", "rb") as cmdline:
            return cmdline.read().replace(b"\0", b" ").decode().strip()


class StopsOnSignal(Recorder):
    """Records in a file that on_stop ran."""

    def __init__(self, marker: str) -> None:
        super().__init__()
        self.marker = marker

    def on_stop(self) -> None:
        with open(self.marker, "w") as out:
            out.write("stopped")


class IgnoresStop(ProcessActor):
    """Ignores SIGTERM and blocks its loop (writing ``marker`` first): only SIGKILL ends it."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def on_start(self) -> None:
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    def on_receive(self, message: Any) -> Any:
        with open(self.marker, "w") as out:
            out.write("blocked")
        while True:
            time.sleep(0.05)


class Greeter(pykka.ThreadingActor):
    """An in-process pykka actor that forwards greetings to its neighbour."""

    def __init__(self, neighbour: pykka.ActorRef[Any] | None = None) -> None:
        super().__init__()
        self.neighbour = neighbour
        self.received: list[Any] = []

    def on_receive(self, message: Any) -> Any:
        if message == "received":
            return self.received
        self.received.append(message)
        if self.neighbour is not None:
            self.neighbour.tell(message)
        return None


class PykkaHost(ProcessActor):
    """Hosts two pykka actors; each batch of tells reaches the first as one message."""

    def on_start(self) -> None:
        self.second = Greeter.start()
        self.first = Greeter.start(self.second)

    def on_receive_batch(self, messages: list[Any]) -> None:
        self.first.tell(list(messages))

    def on_receive(self, message: Any) -> Any:
        if message == "received":
            return {"first": self.first.ask("received"), "second": self.second.ask("received")}
        return None

    def on_stop(self) -> None:
        pykka.ActorRegistry.stop_all()


class PeerTracker(Recorder):
    """Records the pids whose last connection to its mailbox closed."""

    def __init__(self, making_s: float = 0.0) -> None:
        super().__init__("peer tracker")
        self.gone: list[int] = []
        time.sleep(making_s)  # a slow constructor: peers may connect meanwhile

    def on_peer_gone(self, pid: int) -> None:
        self.gone.append(pid)

    def on_receive(self, message: Any) -> Any:
        match message:
            case "gone":
                return self.gone
            case ("connected", pid):
                return self.peer_connected(pid)
        return super().on_receive(message)


class Caller(Recorder):
    """Is given a peer's ref, and never talks to it unless told."""

    def __init__(self, peer: ActorRef) -> None:
        super().__init__("caller")
        self.peer = peer


class Watcher(Recorder):
    """Records Down and Exit messages (it traps exits)."""

    trap_exits = True

    def on_receive(self, message: Any) -> Any:
        if isinstance(message, (Down, Exit)):
            self.seen.append(message)
            return None
        if message == "downs":
            return [m for m in self.seen if isinstance(m, (Down, Exit))]
        return super().on_receive(message)


def pinned(ref: ActorRef) -> ActorRef:
    return ref.pin()


class Relay(Recorder):
    """Asks its peer without waiting and answers its own caller when the peer's answer
    can be read (``when_readable``): no timer looks for it."""

    def on_receive(self, message: Any) -> Any:
        match message:
            case ("relay", peer, question):
                future = peer.ask_async(question)
                reply = self.defer_reply()
                self.when_readable(future.socket, lambda: reply.send(("relayed", future.get(1))))
                return None
        return super().on_receive(message)
