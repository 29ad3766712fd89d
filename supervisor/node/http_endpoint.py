"""The node's HTTP endpoint: its figures for Prometheus, as JSON and as a management
page, read-only, served from the node's own process (``Node(http="127.0.0.1:15692")``,
``warren node --http``).

    GET /                     the management page (HTML), with /page.css, /page.js and
                              its icon (/favicon.svg, and /favicon.ico, the same)
    GET /metrics              Prometheus text format: node-wide series
    GET /metrics/per-object   the same, with a series per queue, stream, store and actor
    GET /api/overview         JSON: the node, its alarms, queue totals, its counters
    GET /api/queues           JSON: every declared queue and stream with its figures
    GET /api/actors           JSON: every actor with its process and counters
    GET /api/tree             JSON: the supervision tree, each child's state and restarts
    GET /api/connections      JSON: the client connections that consume, with their consumers
    GET /api/exchanges        JSON: every exchange, the default one first
    GET /api/bindings         JSON: every binding of a queue to an exchange
    GET /api/cluster          JSON: the node's view of its cluster (leader, epoch, ISR, etcd)

Anything else is a 404 (a path it does not serve) or a 405 (another method than GET,
whichever: TRACE and names no server knows too), and a request it cannot read a 400,
414 or 505: every one a one-line text body, never the standard library's HTML page. The
``Server`` header is ``Warren``, without the Python version. The series and the
documents come from ``warren.supervisor.node.metrics``; the Prometheus text is
prometheus_client's own rendering of a registry of the node's (never the process-wide
default one), holding one collector.

The page is four small files shipped in the package (``page/``, package data), read
when asked: it loads nothing else, and its script draws everything from the JSON pages
it polls (see ``page/page.js``), so it works on a machine without internet access. The
HTML is sent with a Content-Security-Policy of ``default-src 'self'``, so a browser
refuses anything the page would fetch from elsewhere.

The address is ``HOST:PORT``; port 0 takes any free one (``endpoint`` says which). A host
other than loopback is refused unless ``insecure`` says the network is the operator's
alone, the rule the tcp listener applies (``check_listen_address``): the figures name
queues and the machine's memory and disk.

Threads: the server runs in a daemon thread of the node's process (``warren-http``) and
each connection in a daemon thread of its own, accepted from a backlog of
``LISTEN_BACKLOG`` (the standard library's 5 made a burst of a few scrapers and pages wait
for the kernel to retransmit the connections it dropped, a second or more each), whose
socket times out after ``CLIENT_TIMEOUT_S``: a client that sends nothing, or reads
slowly, holds its own thread and nothing else; it never delays another scrape, the
node, or its stop. ``close`` stops accepting and closes the listening socket without
waiting for such connections. Every scrape's figures are gathered on the metrics thread
(``NodeFigures``); one that is not gathered within ``SNAPSHOT_TIMEOUT_S`` is answered
503.

Races: a connection kept alive (a browser's, polling the JSON pages) outlives ``close``
in its own thread. Its next request, and one whose figures were being gathered while the
node stopped, is answered 503 "the node is stopping" and its connection closed: a
browser never goes on talking to a stopped node, and reconnects to whichever node binds
the address next.
"""

from __future__ import annotations

import functools
import importlib.resources
import logging
import socket
import socketserver
import threading
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from warren.queues.broker.listener import LOOPBACK_HOSTS, host_and_port

from ..tables import strict_json
from .metrics import (
    NodeFigures,
    Snapshot,
    WarrenCollector,
    actors_document,
    cluster_document,
    connections_document,
    overview_document,
    queues_document,
)

log = logging.getLogger("warren.node")

CLIENT_TIMEOUT_S = 10.0  # a connection silent this long is closed
LISTEN_BACKLOG = 128  # connections the kernel holds until the server accepts them
SERVER_NAME = "Warren"  # the Server header
PROMETHEUS_TEXT = "text/plain; version=0.0.4; charset=utf-8"
JSON = "application/json"
HTML = "text/html; charset=utf-8"
# The management page's files, in the package's page/ folder: (served at, file, type).
PAGE_FILES = (
    ("/", "index.html", HTML),
    ("/page.css", "page.css", "text/css; charset=utf-8"),
    ("/page.js", "page.js", "text/javascript; charset=utf-8"),
    ("/favicon.svg", "favicon.svg", "image/svg+xml"),
    ("/favicon.ico", "favicon.svg", "image/svg+xml"),  # asked for by browsers unprompted
)
PAGE_POLICY = "default-src 'self'"  # the page's Content-Security-Policy
STOPPING = b"the node is stopping\n"


def check_http_address(address: object, *, insecure: bool) -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT``; ValueError for anything else, and for a host
    other than loopback unless ``insecure``."""
    host, port = host_and_port(
        address, "the HTTP endpoint", "such as 127.0.0.1:15692 (port 0: any free one)"
    )
    if host not in LOOPBACK_HOSTS and not insecure:
        raise ValueError(
            f"{address} is not a loopback address: anyone who reaches it could read the "
            f"node's queues and figures. Pass --insecure if the network is yours alone"
        )
    return host, port


class HttpEndpoint:
    """The server; see the module docstring. Serving from construction to ``close``."""

    def __init__(self, address: str, figures: NodeFigures) -> None:
        host, port = check_http_address(address, insecure=True)  # the node checked the rule
        self._figures = figures
        self._registries: dict[bool, CollectorRegistry] = {}
        for per_object in (False, True):
            registry = CollectorRegistry()
            registry.register(WarrenCollector(figures, per_object=per_object))
            self._registries[per_object] = registry
        self._routes: dict[str, Callable[[], tuple[str, bytes]]] = {
            "/metrics": functools.partial(self._prometheus, False),
            "/metrics/per-object": functools.partial(self._prometheus, True),
            "/api/overview": functools.partial(self._document, overview_document, False),
            "/api/queues": functools.partial(self._document, queues_document, False),
            "/api/actors": functools.partial(self._document, actors_document, True),
            "/api/tree": self._tree,
            "/api/connections": functools.partial(self._document, connections_document, False),
            "/api/cluster": functools.partial(self._document, cluster_document, False),
            "/api/exchanges": functools.partial(self._routing, 0),
            "/api/bindings": functools.partial(self._routing, 1),
        }
        for path, file_name, content_type in PAGE_FILES:
            self._routes[path] = functools.partial(_page_file, file_name, content_type)
        try:
            self._server = _Server((host, port), self._routes)
        except OSError as exc:
            figures.close()
            raise OSError(f"the HTTP endpoint cannot bind {address}: {exc.strerror}") from None
        bound_port = self._server.server_address[1]
        shown = f"[{host}]" if ":" in host else host
        self.endpoint = f"http://{shown}:{bound_port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever,
            kwargs={"poll_interval": 0.1},
            daemon=True,
            name="warren-http",
        )
        self._thread.start()

    def _prometheus(self, per_object: bool) -> tuple[str, bytes]:
        return PROMETHEUS_TEXT, generate_latest(self._registries[per_object])

    def _document(self, build: Callable[[Snapshot], object], per_object: bool) -> tuple[str, bytes]:
        return JSON, _json(build(self._figures.snapshot(per_object=per_object)))

    def _tree(self) -> tuple[str, bytes]:
        return JSON, _json(self._figures.tree())

    def _routing(self, part: int) -> tuple[str, bytes]:
        """The exchanges (``part`` 0) or the bindings (1)."""
        return JSON, _json(self._figures.exchanges_and_bindings()[part])

    def close(self) -> None:
        """Stop serving and close the listening socket; open connections are closed at
        their next request, or end on their own (daemon threads, timed out)."""
        self._server.stopping.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
        self._figures.close()


def _json(document: object) -> bytes:
    return strict_json(document).encode() + b"\n"


def _page_file(file_name: str, content_type: str) -> tuple[str, bytes]:
    """One file of the management page, as the installed package holds it."""
    return content_type, (importlib.resources.files(__package__) / "page" / file_name).read_bytes()


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = LISTEN_BACKLOG

    def __init__(
        self, address: tuple[str, int], routes: dict[str, Callable[[], tuple[str, bytes]]]
    ) -> None:
        self.routes = routes
        self.stopping = threading.Event()  # set by close: requests answered 503, then closed
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        super().__init__(address, _Handler)

    def server_bind(self) -> None:
        # HTTPServer's own looks the host's name up (getfqdn), which can wait on DNS.
        socketserver.TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = CLIENT_TIMEOUT_S

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        route = self.server.routes.get(path)
        if route is None:
            self._reply(404, "text/plain", f"no page {path}: {_pages(self.server)}\n".encode())
            return
        if self.server.stopping.is_set():
            self._reply(503, "text/plain", STOPPING)
            return
        try:
            content_type, body = route()
        except TimeoutError:
            self._reply(503, "text/plain", b"the node's figures were not gathered in time\n")
            return
        except Exception as exc:  # one line to the client, the whole story to the log
            if self.server.stopping.is_set():  # the figures closed under it: no fault
                self._reply(503, "text/plain", STOPPING)
                return
            log.exception("node: serving %s failed", path)
            self._reply(500, "text/plain", f"{type(exc).__name__}: {exc}\n".encode())
            return
        self._reply(200, content_type, body)

    def _not_allowed(self) -> None:
        # the request's body, if any, is not read: the connection ends with this answer
        self.close_connection = True
        path = urlsplit(self.path).path
        if path not in self.server.routes:
            self._reply(404, "text/plain", f"no page {path}: {_pages(self.server)}\n".encode())
            return
        self._reply(405, "text/plain", f"{self.command} {path}: only GET is served\n".encode())

    do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = _not_allowed

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's answer to a method it finds no ``do_`` for (501) and to
        a request it cannot read (400, 414, 505): the endpoint's one-line text instead of
        its HTML page. A request cut short has its connection closed."""
        if code == HTTPStatus.NOT_IMPLEMENTED and self.command:
            self._not_allowed()
            return
        self.close_connection = True
        if self.request_version == "HTTP/0.9":  # not read that far: answer with a status line
            self.request_version = self.protocol_version
        text = " ".join((message or HTTPStatus(code).phrase).split())
        self._reply(code, "text/plain", f"{text}\n".encode())

    def version_string(self) -> str:
        return SERVER_NAME

    def _reply(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if content_type == HTML:
            self.send_header("Content-Security-Policy", PAGE_POLICY)
        if status == 405:
            self.send_header("Allow", "GET")
        if self.server.stopping.is_set():
            self.close_connection = True
        if self.close_connection:
            self.send_header("Connection", "close")
        try:
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
        except ConnectionError:  # the client left before its answer: nobody to tell
            self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        log.debug("http %s: " + format, self.client_address[0], *args)


def _pages(server: _Server) -> str:
    return "the pages are " + ", ".join(sorted(server.routes))
