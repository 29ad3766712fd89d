"""The forkserver: one small single-threaded process per node that forks actor processes.

Why: a freshly spawned interpreter costs 70–95 ms before it runs a line of ours; a fork of
a process that has already imported the heavy modules costs a few milliseconds. Forking
the node's own process is not an option: it has threads and a live ZeroMQ context, and a
fork copies their locks in whatever state they are in. The forkserver has neither. It is
started with ``subprocess`` (``python -c``), imports the preload modules, and from then on
only forks.

Protocol on one unix stream socket (a socketpair; the node holds the other end):

    node → server   u32 length · u8 kind · payload
                    BOOT   payload = JSON {sys_path, preload, main, title, parent_pid,
                                           log_level, key}: ``key`` (hex, 32 random bytes)
                                           signs every later spawn order
                    SPAWN  payload = u64 token · u16 n · endpoints (n bytes) ·
                                     HMAC-SHA256 of the order under ``key`` (32 bytes) ·
                                     pickled order
                                     endpoints: the node's, then those of at most
                                     ``SPARE_PEERS`` live actors the order's arguments
                                     name (its peers), NUL-separated
                    KILL   payload = i32 pid · i32 signal
    server → node   fixed 17-byte records: u8 kind · u64 token · i32 pid · i32 status
                    BOOTED  (0, 0, 0)          the preloads are imported
                    FORKED  (token, pid, 0)    a child exists for this spawn
                    EXITED  (0, pid, status)   a child was reaped; status is its exit code,
                                               or minus the signal that killed it

Spares. Forking and readying a child is the slowest part of a spawn (the fork itself, the
child's first copy-on-write faults, its ZeroMQ context and its connection to the node):
a few milliseconds that a declare of a thousand queues pays a thousand times. So after
each SPAWN the server forks one spare child ahead of the next order: it ties its life to
the server's, makes its ZeroMQ context, connects to the node (whose endpoint the last
order named) and to the last order's peers that listen on ipc (a queue's two stores:
the next order is most likely another queue, which registers with both as it starts;
connections made ahead took 0.8–1.1 ms off a queue's 5 ms start; the actor closes those
its own order does not name, so that none holds an idle connection, nor tries again and
again to reach a peer gone since), sets up its logging to stderr (the actor then only
names itself in it), makes its two mailboxes and a monitor of the data one's connections
(the loop binds them: ``Mailboxes``; 0.5 ms of a start), and then waits on a pipe of its
own for an order. The next SPAWN goes down that pipe (u32 length · the SPAWN payload)
instead of into a fork, the spare's pid is
reported FORKED, and the spare becomes the actor as a freshly forked child would; the
server then forks the next spare while the node waits for that actor's READY. A spare is
the server's child like any other (stopped and reaped with them when the node goes,
killed by PR_SET_PDEATHSIG with the server), titled ``warren: spare``, and unknown to the
node: no EXITED is reported for it, and the node counts and watches only the actors it
ordered. None is forked before the first SPAWN (the node's endpoint is not known, nor
bound, before it), so a node that spawns nothing has none.

The spawn order is pickled by the node and unpickled only in the forked child: that is the
one sanctioned use of pickle (start arguments handed to a child we created), and it keeps
the user's modules out of the forkserver's own memory. The socket is an anonymous
socketpair, not a path: only the node holds the other end (its end is not inherited by
what the node execs, and a process forked from the node closes its copy at once; each
actor closes the server's end after its fork). On top of that, the server forks only for
an order whose HMAC under the BOOT key checks out, so the bytes a child unpickles are
the node's, whatever else might write to the socket; the BOOT message itself is JSON.
The child reports READY or FAILED to the node service itself, over ZeroMQ, from a fresh
context.

Signals. The server leads a process group of its own, which its children (the actors)
share: a signal to the node's group (Ctrl-C in a terminal, ``timeout``, ``kill -- -PGID``)
reaches the node alone, which stops its tree in order. The server ignores SIGTERM, SIGINT
and SIGHUP (systemd's control-group stop signals every process at once): it ends when its
node goes. It starts with no signal blocked, whatever mask the node had. Actors take
SIGTERM and SIGHUP as an orderly stop and ignore SIGINT.

Races and their answers:
- The node dies (even SIGKILL): the socket reaches EOF; the server asks every child to
  stop with SIGTERM (each finishes what it is doing and stops cleanly: a store writes its
  recovery files), waits up to ``CHILD_STOP_GRACE_S``, SIGKILLs what is left, reaps them
  all and exits. It also does so if ``getppid`` changes (checked once a second), in case
  the node's end leaked into another process and EOF never comes.
- The server dies: every child has PR_SET_PDEATHSIG = SIGKILL (the server is
  single-threaded, so "parent thread exits" means "parent exits"), and checks after the
  prctl that its parent did not die before it: that its parent is still the server's pid,
  as the server took it before the fork (a child killed with its node while it was being
  forked would otherwise live on, adopted, holding its files' locks).
- KILL names a pid: the server signals it only while that pid is its own unreaped child,
  so a recycled pid is never signalled.
- SIGCHLD wakes the select through a wake-up pipe; every reap is reported (but a spare's),
  so no child is left a zombie and the node learns exit codes and signals exactly.
- The spare dies while it waits (killed by someone): it is reaped unreported, the next
  SPAWN forks its child directly, and a new spare is forked after it (at most one spare
  fork per order: a spare that cannot start never loops).
- The spare's warm-up fails (its ZeroMQ context or its connection: out of descriptors),
  maybe after its order went down the pipe: the warm-up only saves time, so the spare
  says so on stderr and still reads its order and runs it as a directly forked child
  would (its actor connects, or fails its start and says why, as that child does); an
  order handed to a spare is never lost to a failed warm-up.
- The spare cannot take the order at once (stopped by a signal with its pipe full, or an
  order larger than the pipe holds): the write never blocks; the spare is SIGKILLed (it
  exits at EOF if it read part of it) and the order is forked directly.
- Something else writes to the spare's pipe (any process of the node's user can open
  it through /proc): the spare runs only a whole order, written in one write (so all
  there once its first byte is), of a length the pipe can hold, and signed under the
  BOOT key. Anything else (cut short, garbage, a bad signature) it refuses: it says so
  on stderr, contacts nobody, unpickles nothing and exits ``EXIT_ORDER_REFUSED``. Those
  bytes may have come before the node's order, or mixed with it: so a spare handed an
  order that exits so has the server fork that order afresh and report it FORKED again
  under its token (the node then waits on the new pid), and its exit is not reported.
  The server keeps each order handed to a spare until that child is reaped.
- The spare cannot be forked (the machine is out of processes, or the server out of
  descriptors): it is said on stderr and the next SPAWN is forked directly; the server
  itself goes on (a failed spare fork must not take the node's actors with it).
- The server goes (EOF of the node, or killed): a waiting spare's pipe reaches EOF and it
  exits; it is also sent SIGTERM with the other children, and PR_SET_PDEATHSIG covers a
  killed server.
"""

from __future__ import annotations

import fcntl
import functools
import gc
import hashlib
import hmac
import importlib
import importlib.util
import json
import logging
import os
import pickle
import select
import signal
import socket
import struct
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from .codec import work_out_field_checks
from .process import LIBC, SPARE_TITLE, die_with_parent

if TYPE_CHECKING:
    from ._loop import Mailboxes
    from .ref import ActorRef

BOOT = 1
SPAWN = 2
KILL = 3

BOOTED = 0
FORKED = 1
EXITED = 2

HEADER = struct.Struct(">IB")
REPORT = struct.Struct(">BQii")
ORDER_LENGTH = struct.Struct(">I")  # before a SPAWN payload handed down a spare's pipe
SPAWN_HEAD = struct.Struct(">QH")
ENDPOINT_SEPARATOR = "\0"  # between a SPAWN's endpoints: no path or address holds one
MAX_ENDPOINTS_BYTES = 2**16 - 1  # what SPAWN_HEAD's length holds
SPARE_PEERS = 4  # the most peers a spare connects to ahead (a queue talks to two stores)
KILL_BODY = struct.Struct(">ii")
SIGNATURE_BYTES = 32

# True while the forkserver imports the application's main script: a script that starts a
# node at import time (no ``if __name__ == "__main__"`` guard) would otherwise start a
# forkserver that imports the script that starts a node ... without end.
_importing_main = False

# How often the server checks that its parent is alive (seconds).
_PARENT_CHECK_S = 1.0
# How long the children of a dead node get to stop cleanly before SIGKILL (seconds): a
# store writes its recovery files in well under this.
CHILD_STOP_GRACE_S = 30.0


def _read_up_to(read: Callable[[int], bytes], size: int) -> bytes:
    """Up to ``size`` bytes from ``read`` (a blocking socket's ``recv``; ``os.read`` of a
    non-blocking pipe): fewer at EOF, or once a non-blocking one holds no more now."""
    chunks = []
    while size:
        try:
            chunk = read(size)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def _read_request(sock: socket.socket) -> tuple[int, bytes] | None:
    head = _read_up_to(sock.recv, HEADER.size)
    if len(head) < HEADER.size:
        return None
    length, kind = HEADER.unpack(head)
    payload = _read_up_to(sock.recv, length)
    return (kind, payload) if len(payload) == length else None


def set_title(title: str) -> None:
    """Show ``title`` whole in ps and top (argv rewritten by setproctitle)."""
    import setproctitle

    setproctitle.setproctitle(title)


# glibc's mallopt parameters, and the sizes this runtime sets them to (bytes).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
LARGE_BUFFER_BYTES = 64 * 2**20


def keep_large_buffers_on_the_heap() -> None:
    """Let malloc serve buffers up to ``LARGE_BUFFER_BYTES`` from the heap and keep freed
    ones for reuse. By default glibc maps every allocation above 128 KiB afresh and unmaps
    it when freed, so each large frame an actor receives (a store's batch of records, a
    MiB) costs a fresh mapping and a page fault per 4 KiB: measured at a fifth of a store
    process's time. Inherited by every actor forked from here; nothing elsewhere."""
    if sys.platform.startswith("linux"):
        LIBC.mallopt(_M_MMAP_THRESHOLD, LARGE_BUFFER_BYTES)
        LIBC.mallopt(_M_TRIM_THRESHOLD, 2 * LARGE_BUFFER_BYTES)


def settle_the_heap() -> None:
    """Collect the garbage of the imports, freeze what is left, and give the heap's free
    pages back, once, before the first fork. Every child shares the server's pages until
    it writes to one, and a full collection writes to the header of every object it
    walks: unfrozen, an actor's first full collection (a queue runs one a minute while
    it works) copied the pages of every object the server held, 2,000 pages (8 MiB) with
    the node's preloads, against 18 frozen. A fork copies the page table of what the
    server holds: trimmed, 20 MiB of anonymous memory against 22."""
    gc.collect()
    gc.freeze()
    if hasattr(LIBC, "malloc_trim"):  # glibc's
        LIBC.malloc_trim(0)


def serve(fd: int) -> None:
    """The forkserver's main: boot, then fork on request until the node goes away."""
    sock = socket.socket(fileno=fd)
    request = _read_request(sock)
    if request is None or request[0] != BOOT:
        os._exit(2)
    boot = json.loads(request[1])
    sys_path, preload, main_path = boot["sys_path"], boot["preload"], boot["main"]
    title, parent_pid, log_level = boot["title"], boot["parent_pid"], boot["log_level"]
    key = bytes.fromhex(boot["key"])
    sys.path[:] = sys_path
    set_title(title)
    os.setpgid(0, 0)
    keep_large_buffers_on_the_heap()
    for ignored in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(ignored, signal.SIG_IGN)
    # A node may be built with its stop signals blocked (so that one arriving meanwhile
    # waits for its handler), and a blocked mask survives fork and exec: an actor forked
    # with SIGTERM blocked would never stop on it.
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for module in preload:
        importlib.import_module(module)
    if main_path:
        _import_main(main_path)
    work_out_field_checks()
    settle_the_heap()
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_read, False)
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    children: set[int] = set()  # every unreaped child, spares included
    spares: set[int] = set()  # the children forked as spares and never handed an order
    handed: dict[int, bytes] = {}  # the spares handed an order: the order, until reaped
    spare: _Spare | None = None
    close_in_child = (sock.fileno(), wake_read, wake_write)
    sock.sendall(REPORT.pack(BOOTED, 0, 0, 0))
    watched: list[Any] = [sock, wake_read]
    while True:
        readable, _, _ = select.select(watched, [], [], _PARENT_CHECK_S)
        if wake_read in readable:
            try:
                while os.read(wake_read, 4096):
                    pass
            except BlockingIOError:
                pass  # drained; the pipe only says "reap now"
        for refused in _reap(sock, children, spares, handed):  # forked afresh
            child = _fork(close_in_child, functools.partial(_run_child, refused, key, log_level))
            children.add(child)
            sock.sendall(REPORT.pack(FORKED, SPAWN_HEAD.unpack_from(refused)[0], child, 0))
        if spare is not None and spare.pid not in children:
            spare.close()
            spare = None
        if os.getppid() != parent_pid:
            break
        if sock not in readable:
            continue
        request = _read_request(sock)
        if request is None:
            break
        kind, payload = request
        if kind == SPAWN and signed_order(key, payload) is None:
            print(
                "warren forkserver: refused a spawn order that is not the node's (its "
                "signature does not check out)",
                file=sys.stderr,
                flush=True,
            )
        elif kind == SPAWN:
            pid = spare.take(payload) if spare is not None else None
            if pid is not None:
                spares.discard(pid)  # an actor now: its exit is reported
                handed[pid] = payload
            else:
                if spare is not None:
                    spare.close()
                    os.kill(spare.pid, signal.SIGKILL)  # still unreaped: it is our child
                pid = _fork(close_in_child, functools.partial(_run_child, payload, key, log_level))
                children.add(pid)
            spare = None
            token = SPAWN_HEAD.unpack_from(payload)[0]
            sock.sendall(REPORT.pack(FORKED, token, pid, 0))
            try:
                spare = _Spare.fork(close_in_child, key, log_level, _endpoints(payload))
            except OSError as exc:  # out of processes or descriptors: no spare this time
                print(f"warren forkserver: no spare child: {exc}", file=sys.stderr, flush=True)
            else:
                children.add(spare.pid)
                spares.add(spare.pid)
        elif kind == KILL:
            pid, signum = KILL_BODY.unpack(payload)
            if pid in children and pid not in spares:  # a spare is none of the node's
                os.kill(pid, signum)
    if spare is not None:
        spare.close()  # at EOF, a spare that has not yet seen the SIGTERM exits too
    _stop_children(children)
    os._exit(0)


def _fork(close_in_child: tuple[int, ...], run: Callable[[int], int]) -> int:
    """Fork a child that closes the server's own descriptors (``close_in_child``), takes
    the default SIGCHLD and SIGTERM, and runs ``run(server_pid)`` to its exit code; its
    pid."""
    server_pid = os.getpid()  # the child's parent: if it is not, it died meanwhile
    pid = os.fork()
    if pid == 0:
        for fd in close_in_child:
            os.close(fd)
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os._exit(run(server_pid))
    return pid


def _endpoints(payload: bytes) -> list[str]:
    """The endpoints a SPAWN payload names: the node's (where the child reports), then
    its peers'."""
    size = SPAWN_HEAD.unpack_from(payload)[1]
    return payload[SPAWN_HEAD.size : SPAWN_HEAD.size + size].decode().split(ENDPOINT_SEPARATOR)


def peer_refs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Iterator[ActorRef]:
    """The refs a spawn order's arguments name: an argument, or in a tuple or list that
    is one."""
    from .ref import ActorRef  # not at import: the server itself has no use for ZeroMQ

    for value in (*args, *kwargs.values()):
        for item in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(item, ActorRef):
                yield item


def spawn_head(token: int, node_endpoint: str, peers: tuple[str, ...]) -> bytes:
    """A SPAWN payload's head for ``token``: the node's endpoint and the first
    ``SPARE_PEERS`` of the order's peers that fit in the head's length (they only save
    time)."""
    endpoints = node_endpoint.encode()
    for peer in peers[:SPARE_PEERS]:
        more = endpoints + ENDPOINT_SEPARATOR.encode() + peer.encode()
        if len(more) > MAX_ENDPOINTS_BYTES:
            break
        endpoints = more
    return SPAWN_HEAD.pack(token, len(endpoints)) + endpoints


class _Spare:
    """The server's end of its spare child: the pid, and the pipe its order goes down."""

    def __init__(self, pid: int, orders: int) -> None:
        self.pid = pid
        self._orders = orders

    @classmethod
    def fork(
        cls, close_in_child: tuple[int, ...], key: bytes, log_level: int, endpoints: list[str]
    ) -> _Spare:
        orders_read, orders_write = os.pipe()
        run = functools.partial(_run_spare, orders_read, key, log_level, endpoints)
        try:
            pid = _fork((*close_in_child, orders_write), run)
        except OSError:
            os.close(orders_write)
            raise
        finally:
            os.close(orders_read)
        os.set_blocking(orders_write, False)
        return cls(pid, orders_write)

    def take(self, payload: bytes) -> int | None:
        """Hand ``payload`` to the spare; its pid, or None when it could not take it all
        at once (its pipe is closed: it is gone, or full: it is stopped)."""
        order = ORDER_LENGTH.pack(len(payload)) + payload
        try:
            written = os.write(self._orders, order)
        except OSError:  # EPIPE: it died; EAGAIN: the pipe is full
            return None
        if written != len(order):
            return None
        self.close()
        return self.pid

    def close(self) -> None:
        """Close our end of the pipe (a spare waiting on it then exits); idempotent."""
        if self._orders >= 0:
            os.close(self._orders)
            self._orders = -1


def _run_spare(
    orders: int, key: bytes, log_level: int, endpoints: list[str], server_pid: int
) -> int:
    """A spare child's life: get ready for any actor (connected to the node, the first of
    ``endpoints``, and to those of the others on ipc; its logging and mailboxes made),
    wait for an order on ``orders``,
    then become that order's actor; exit quietly if the server closes the pipe first.
    Getting ready only saves time: an order is run whether or not it succeeded. A peer
    on tcp is left to the actor: a node with CurveZMQ gives its keys in the order."""
    from ._loop import Mailboxes
    from ._runtime import runtime
    from .exitcodes import EXIT_CRASHED, EXIT_NORMAL, EXIT_ORDER_REFUSED, EXIT_PARENT_GONE

    parent_checked = False
    warmed: list[str] = []  # the peers it connected to
    made: Mailboxes | None = None
    try:
        if not die_with_parent(server_pid):
            return EXIT_PARENT_GONE
        parent_checked = True
        set_title(SPARE_TITLE)
        node_endpoint, *peers = endpoints
        runtime().channel(node_endpoint)  # READY and the actor's requests go through it
        for peer in peers:
            if peer.startswith("ipc://"):
                runtime().channel(peer)
                warmed.append(peer)
        log_to_stderr("spare", log_level)  # the actor's name replaces it in a quarter the time
        made = Mailboxes.make()  # the loop binds them
    except BaseException:
        print(
            f"warren spare (pid {os.getpid()}): its warm-up failed; its order will be run "
            "without it",
            file=sys.stderr,
        )
        traceback.print_exc()
    try:
        first = os.read(orders, 1)  # blocks until the order comes, or EOF
        payload = _read_order(orders, first, key) if first else None
        os.close(orders)
    except BaseException:
        traceback.print_exc()
        return EXIT_CRASHED
    if not first:
        return EXIT_NORMAL  # the server went, or gave the order to another child
    if payload is None:
        print(
            "warren forkserver: a spare child refused what came down its order pipe "
            "(cut short, garbage, or not signed by the node); it ran nothing",
            file=sys.stderr,
            flush=True,
        )
        return EXIT_ORDER_REFUSED
    return _run_child(payload, key, log_level, server_pid, parent_checked, warmed, made)


def _read_order(fd: int, first: bytes, key: bytes) -> bytes | None:
    """The SPAWN payload whose first byte was ``first``, read from the spare's pipe when
    it is whole there (the server writes an order in one write, so all of it is in the
    pipe once its first byte is), no longer than the pipe holds, and signed under
    ``key``; None for anything else."""
    os.set_blocking(fd, False)
    read = functools.partial(os.read, fd)
    head = first + _read_up_to(read, ORDER_LENGTH.size - 1)
    if len(head) < ORDER_LENGTH.size:
        return None
    size = ORDER_LENGTH.unpack(head)[0]
    if size > _pipe_capacity(fd):
        return None
    payload = _read_up_to(read, size)
    if len(payload) < size or signed_order(key, payload) is None:
        return None
    return payload


def _pipe_capacity(fd: int) -> int:
    """How many bytes the pipe ``fd`` holds at most (Linux's F_GETPIPE_SZ; 64 KiB else)."""
    try:
        return fcntl.fcntl(fd, getattr(fcntl, "F_GETPIPE_SZ", 1032))
    except OSError:
        return 2**16


def order_offset(payload: bytes) -> int:
    """Where the signature starts in a SPAWN payload (after token, length, endpoints)."""
    return SPAWN_HEAD.size + SPAWN_HEAD.unpack_from(payload)[1]


def sign(key: bytes, order: bytes) -> bytes:
    return hmac.new(key, order, hashlib.sha256).digest()


def signed_order(key: bytes, payload: bytes) -> bytes | None:
    """A SPAWN payload's pickled order when it carries the node's signature, else None:
    the only bytes this module ever unpickles come out of here."""
    if len(payload) < SPAWN_HEAD.size:
        return None
    at = order_offset(payload)
    mac, order = payload[at : at + SIGNATURE_BYTES], payload[at + SIGNATURE_BYTES :]
    if len(mac) == SIGNATURE_BYTES and hmac.compare_digest(mac, sign(key, order)):
        return order
    return None


def _stop_children(children: set[int]) -> None:
    """SIGTERM every child, reap them as they exit, SIGKILL those left after the grace."""
    for pid in children:
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + CHILD_STOP_GRACE_S
    while children and time.monotonic() < deadline:
        try:
            pid, _status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid:
            children.discard(pid)
        else:
            time.sleep(0.01)
    for pid in children:
        os.kill(pid, signal.SIGKILL)
    while children:
        pid, _status = os.waitpid(-1, 0)
        children.discard(pid)


def _import_main(path: str) -> None:
    """Import the application's main script, so actor classes defined there unpickle.

    It is imported as ``__mp_main__`` (so its ``if __name__ == "__main__"`` block does not
    run) and also installed as ``__main__``, the module pickle names its classes by. The
    codec registers message types of ``__mp_main__`` under ``__main__``, as the parent does.
    """
    global _importing_main
    spec = importlib.util.spec_from_file_location("__mp_main__", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["__mp_main__"] = module
    sys.modules["__main__"] = module
    _importing_main = True
    try:
        spec.loader.exec_module(module)
    finally:
        _importing_main = False


def importing_main() -> bool:
    """True while a forkserver imports the application's script (no Node may start then)."""
    return _importing_main


def _reap(
    sock: socket.socket, children: set[int], spares: set[int], handed: dict[int, bytes]
) -> list[bytes]:
    """Reap every child that exited and report it, but ``spares``: children the node
    never ordered (forgotten once reaped), and a spare that refused the order it was
    ``handed``: that order is returned, to be forked afresh."""
    from .exitcodes import EXIT_ORDER_REFUSED

    refused = []
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            break
        if pid == 0:
            break
        children.discard(pid)
        if pid in spares:
            spares.discard(pid)
            continue
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        order = handed.pop(pid, None)
        if order is not None and code == EXIT_ORDER_REFUSED:
            refused.append(order)
            continue
        try:
            sock.sendall(REPORT.pack(EXITED, 0, pid, code))
        except OSError:
            pass  # the node is gone; the main loop sees EOF and kills the rest
    return refused


def _run_child(
    payload: bytes,
    key: bytes,
    log_level: int,
    server_pid: int,
    parent_checked: bool = False,
    warmed: list[str] | None = None,
    made: Mailboxes | None = None,
) -> int:
    """Run the forked child to its end: it must never return into the server's loop.
    ``server_pid`` is the server that forked it, taken before the fork: asked here, after
    it, the parent would be whoever adopted the child if the server died meanwhile
    (``parent_checked``: a spare did that already; ``warmed``: the peers it connected
    to; ``made``: its mailboxes)."""
    from .exitcodes import EXIT_CRASHED

    try:
        code = _child(payload, key, server_pid, log_level, parent_checked, warmed or [], made)
    except BaseException:
        traceback.print_exc()
        code = EXIT_CRASHED
    sys.stdout.flush()
    sys.stderr.flush()
    return code


def log_to_stderr(actor_name: str, level: int) -> None:
    """Send this actor process's log records to stderr (the node's), at the node's level,
    each line with its time, level, the actor's name and pid, and the logger's name."""
    logging.basicConfig(
        level=level,
        force=True,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s {actor_name}[%(process)d] %(name)s: %(message)s",
    )


def _child(
    payload: bytes,
    key: bytes,
    forkserver_pid: int,
    log_level: int,
    parent_checked: bool,
    warmed: list[str],
    made: Mailboxes | None,
) -> int:
    """Become the actor described by ``payload``, closing the connections made ahead
    (``warmed``) to peers its order does not name, binding the mailboxes made ahead
    (``made``); return the exit code."""
    from .exitcodes import EXIT_PARENT_GONE, EXIT_START_FAILED

    if not parent_checked and not die_with_parent(forkserver_pid):
        return EXIT_PARENT_GONE
    token = SPAWN_HEAD.unpack_from(payload)[0]
    node_endpoint = _endpoints(payload)[0]
    try:
        # Checked again here, where it is unpickled, not only by the server before the
        # fork: nothing but the node's own signed order ever reaches pickle.
        pickled = signed_order(key, payload)
        if pickled is None:
            raise ValueError("the spawn order does not carry the node's signature")
        order = pickle.loads(pickled)
    except Exception as exc:
        from ._node_client import NodeClient
        from ._runtime import runtime

        NodeClient(node_endpoint).failed(token, type(exc).__name__, str(exc), "")
        runtime().context.destroy(linger=1000)
        return EXIT_START_FAILED
    named = {ref.address for ref in peer_refs(order.args, order.kwargs)}
    unnamed = [peer for peer in warmed if peer not in named]
    if unnamed:
        from ._runtime import runtime

        runtime().forget(unnamed)
    set_title(f"warren: {order.options.get('title') or order.name}")
    log_to_stderr(order.name, log_level)
    from ._loop import ActorLoop

    return ActorLoop(order, made).run()
