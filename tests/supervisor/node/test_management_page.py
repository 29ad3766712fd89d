"""The management page at ``/`` as a person meets it: in a real browser (Debian's chromium,
headless), which runs the page's own script against a running node. It shows a declared
queue and its count, a stream and its consumer's lag, the exchanges and bindings, the
connections and consumers with their prefetch and unacked, the version and uptime, and a
queue's own page with its alpha to delta counts, consumers and charts; it says so, header
red, when the node stops answering and clears that when the node answers again; at a
laptop's width and a phone's nothing scrolls sideways, long names are cut with an
ellipsis, and each chart has a y-axis and series told apart; and it loads nothing from
anywhere but the node (its icon included). A screenshot of it is saved in
build/management-page.png.

Chromium runs in a session of its own with a throwaway profile, and its whole process
group is killed at the end of each test, even a failed one."""

import contextlib
import fcntl
import html.parser
import importlib.metadata
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time
import urllib.parse

import pytest

from warren import connect
from warren.supervisor import Node
from warren.supervisor.node.http_endpoint import PAGE_FILES, PAGE_POLICY

from ...waiting import wait_for
from ..cli.test_cli import ROOT
from .test_metrics import LOOPBACK_ANY_PORT, fetch

CHROMIUM = shutil.which("chromium")
needs_chromium = pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (Debian: apt-get install chromium; .ci/run does)",
)
# Headless, and quiet: no network of its own (component updates, sync, QUIC probes)
HEADLESS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
# Virtual time runs the page's timers at once: enough for its first polls to be drawn.
RENDER_BUDGET_MS = 8000
SCREENSHOT = ROOT / "build" / "management-page.png"
PIPE_FDS_FROM = 10  # the DevTools pipe's ends are moved at or above this fd (see below)
RED, WHITE = "rgb(198, 40, 40)", "rgb(255, 255, 255)"  # the header's, in an outage and not
LONG_NAME = "orders.eu-west-1.production.payments." + "settlement-retry-" * 8 + "end"


@contextlib.contextmanager
def chromium(arguments: list[str], profile, launcher: tuple[str, ...] = (), **popen):
    """Chromium (started through ``launcher`` when given) in a session of its own, with
    ``profile`` as its user data directory; its whole process group is killed on the way
    out, whatever happened."""
    process = subprocess.Popen(
        [*launcher, CHROMIUM, *HEADLESS, f"--user-data-dir={profile}", *arguments],
        start_new_session=True,
        **popen,
    )
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def render(url: str, tmp_path, *arguments: str) -> str:
    """What chromium prints for ``url`` once the page's timers ran for the budget."""
    with chromium(
        [f"--virtual-time-budget={RENDER_BUDGET_MS}", *arguments, url],
        tmp_path / "profile",
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as browser:
        output, _ = browser.communicate(timeout=120)
    assert browser.returncode == 0, f"chromium exited {browser.returncode}"
    return output


class Rows(html.parser.HTMLParser):
    """The text of each cell of the rows marked with one of ``marks`` (``data-queue`` ...),
    by the mark's value."""

    def __init__(self, marks: tuple[str, ...]) -> None:
        super().__init__()
        self.marks = marks
        self.rows: dict[str, list[str]] = {}
        self._row: list[str] | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        attributes = dict(attrs)
        marked = [attributes[mark] for mark in self.marks if mark in attributes]
        if tag == "tr" and marked:
            self._row = self.rows.setdefault(marked[0], [])
        elif tag == "td" and self._row is not None:
            self._cell = []

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self._row.append("".join(self._cell))
            self._cell = None
        elif tag == "tr":
            self._row = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)


def rows_of(dom: str, *marks: str) -> dict[str, list[str]]:
    """The rows of the queues and streams tables (or of those ``marks``), by name."""
    parser = Rows(marks or ("data-queue", "data-stream"))
    parser.feed(dom)
    return parser.rows


def png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", f"{path} is not a PNG"
    return int.from_bytes(header[16:20], "big"), int.from_bytes(header[20:24], "big")


class DevTools:
    """Chromium driven over its DevTools pipe (``--remote-debugging-pipe``): it reads
    commands on its fd 3 and writes answers and events on its fd 4, each one JSON ended by
    a NUL byte. Only what the tests need: open a page, evaluate an expression in it."""

    def __init__(self, commands: int, answers: int) -> None:
        self._commands, self._answers = commands, answers
        self._buffer = b""
        self._last_id = 0

    def call(self, method: str, params: dict | None = None, session: str | None = None):
        self._last_id += 1
        command = {"id": self._last_id, "method": method, "params": params or {}}
        if session is not None:
            command["sessionId"] = session
        os.write(self._commands, json.dumps(command).encode() + b"\0")
        deadline = time.monotonic() + 30
        while True:  # events and other answers come in between: skipped
            while b"\0" not in self._buffer:
                ready, _, _ = select.select([self._answers], [], [], deadline - time.monotonic())
                assert ready, f"chromium did not answer {method} within 30 s"
                chunk = os.read(self._answers, 1 << 16)
                assert chunk, "chromium closed its DevTools pipe"
                self._buffer += chunk
            message, _, self._buffer = self._buffer.partition(b"\0")
            answer = json.loads(message)
            if answer.get("id") == self._last_id:
                assert "error" not in answer, answer["error"]
                return answer["result"]

    def open(self, url: str) -> str:
        """A new tab on ``url``; the session that talks to it."""
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        return self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]

    def evaluate(self, session: str, expression: str):
        result = self.call(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")


@contextlib.contextmanager
def driven_chromium(profile):
    """Chromium on its DevTools pipe, as a ``DevTools``. Chromium wants the pipe on its fds
    3 and 4 exactly: bash puts it there (``3<&R 4>&W``) and execs chromium, since Python
    code in the forked child (``preexec_fn``) is unsafe in this process, which runs the
    node's threads. Both ends are moved to ``PIPE_FDS_FROM`` or above first, so one
    redirection never overwrites the other end."""
    ours_read, its_write = os.pipe()
    its_read, ours_write = os.pipe()
    lifted = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, PIPE_FDS_FROM) for fd in (its_read, its_write)]
    for fd in (its_read, its_write):
        os.close(fd)
    try:
        with chromium(
            ["--remote-debugging-pipe", "about:blank"],
            profile,
            ("bash", "-c", f'exec "$0" "$@" 3<&{lifted[0]} 4>&{lifted[1]}'),
            pass_fds=lifted,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ):
            for fd in lifted:
                os.close(fd)
            lifted = []
            yield DevTools(ours_write, ours_read)
    finally:
        for fd in (ours_read, ours_write, *lifted):
            os.close(fd)


def test_the_page_and_its_files_are_served_and_name_nothing_from_elsewhere(tmp_path):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        status, headers, page = fetch(node.http_endpoint + "/")
        assert status == 200 and headers["Content-Type"] == "text/html; charset=utf-8"
        assert headers["Content-Security-Policy"] == PAGE_POLICY == "default-src 'self'"
        linked = re.findall(rb'(?:src|href)="([^"]+)"', page)
        assert {b"page.css", b"page.js", b"favicon.svg", b"api/overview"} <= set(linked)
        for link in linked:
            status, _, _ = fetch(urllib.parse.urljoin(node.http_endpoint + "/", link.decode()))
            assert status == 200, link
        for path, _, content_type in PAGE_FILES:
            status, headers, body = fetch(node.http_endpoint + path)
            assert status == 200 and headers["Content-Type"] == content_type
            # the SVG namespace is a name, never fetched; any other address would be
            addresses = set(re.findall(rb"\w+://[^\s\"'`)]*", body))
            assert addresses <= {b"http://www.w3.org/2000/svg"}, (path, addresses)
        # a browser asks for /favicon.ico of its own accord: it is there, not a 404
        status, headers, icon = fetch(node.http_endpoint + "/favicon.ico")
        assert status == 200 and headers["Content-Type"] == "image/svg+xml"
        assert icon.startswith(b"<svg")
        assert sum(len(fetch(node.http_endpoint + path)[2]) for path, _, _ in PAGE_FILES) < 60_000


@needs_chromium
def test_chromium_shows_a_declared_queue_with_its_count_and_a_streams_consumer_lag(tmp_path):
    published = 7
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
        node.declare_queue("orders")
        node.declare_queue("events", type="stream")
        with node.connect() as conn:
            conn.publish_many("orders", [b"order %d" % n for n in range(published)])
            conn.publish_many("events", [b"event %d" % n for n in range(10)])
            with conn.consume("events", offset="first", name="billing") as consumer:
                for record in consumer:
                    if record.offset == 3:
                        break  # billing stores offset 3 as it leaves: 6 records behind
        wait_for(lambda: b'"lag": 6' in fetch(node.http_endpoint + "/api/queues")[2])
        node.declare_queue("invoices", type="super-stream", partitions=2)
        with node.connect() as conn:  # a consumer group's member on both partitions
            member = conn.consume("invoices", name="workers", single_active=True)

            def grouped() -> bool:
                member.get(timeout=0.2)  # it beats from its reads
                queues = json.loads(fetch(node.http_endpoint + "/api/queues")[2])
                return all(q.get("consumer_groups") for q in queues if q.get("super_stream"))

            wait_for(grouped, timeout=60)
            rows = rows_of(render(node.http_endpoint + "/", tmp_path, "--dump-dom"))
            member.cancel()
        assert rows["invoices-1"][0] == "invoices-1 \u00b7 partition 1 of invoices"
        assert rows["invoices-1"][-1] == "workers (group of 1 member)"

        name, state, ready, unacked = rows["orders"][:4]
        assert (name, state, ready, unacked) == ("orders", "running", str(published), "0")
        assert rows["events"][:5] == ["events", "running", "0", "10", "10"]
        assert rows["events"][-1] == "billing (6)"
        SCREENSHOT.parent.mkdir(exist_ok=True)
        SCREENSHOT.unlink(missing_ok=True)
        render(
            node.http_endpoint + "/",
            tmp_path,
            f"--screenshot={SCREENSHOT}",
            "--window-size=1280,900",
            "--hide-scrollbars",
        )
    assert png_size(SCREENSHOT) == (1280, 900)
    print(f"the management page, as chromium drew it: {SCREENSHOT}")


@needs_chromium
def test_the_page_says_when_the_node_stops_answering_and_clears_it_when_it_answers_again(
    tmp_path,
):
    data = tmp_path / "data"
    ready_in_page = "document.querySelector('tr[data-queue=\"orders\"] .ready')?.textContent"
    outage = "[document.getElementById('outage').hidden, document.getElementById('outage')"
    outage += ".textContent, document.getElementById('figures').className]"
    header = "getComputedStyle(document.getElementById('header')).backgroundColor"
    with driven_chromium(tmp_path / "profile") as browser:
        with Node(data, http=LOOPBACK_ANY_PORT) as node:
            node.declare_queue("orders")
            with node.connect() as conn:
                conn.publish_many("orders", [b"before"] * 3)
            address = node.http_endpoint.removeprefix("http://")
            page = browser.open(node.http_endpoint + "/")
            wait_for(lambda: browser.evaluate(page, ready_in_page) == "3")
            assert browser.evaluate(page, outage)[0] is True
            assert browser.evaluate(page, header) == WHITE

        # Given the node has stopped: its endpoint refuses connections
        # Then the page says so, since when, and keeps its last figures, greyed
        wait_for(lambda: browser.evaluate(page, outage)[0] is False)
        _, banner, figures = browser.evaluate(page, outage)
        assert re.search(r"Node not answering since \d\d:\d\d:\d\d", banner), banner
        assert figures == "stale"
        assert browser.evaluate(page, ready_in_page) == "3"
        assert browser.evaluate(page, header) == RED  # the header turns red with the banner

        # When a node answers at the same address again, with more messages
        with Node(data, http=address) as node:
            with node.connect() as conn:
                conn.publish_many("orders", [b"after"] * 2)
            # Then the banner goes, the figures are the new ones, and the outage is noted
            wait_for(lambda: browser.evaluate(page, ready_in_page) == "5")
            hidden, _, figures = browser.evaluate(page, outage)
            assert hidden is True and figures == ""
            assert browser.evaluate(page, header) == WHITE
            last_outage = "document.getElementById('last-outage').textContent"
            assert re.search(
                r"did not answer from \d\d:\d\d:\d\d to \d\d:\d\d:\d\d",
                browser.evaluate(page, last_outage),
            )


@needs_chromium
def test_chromium_shows_exchanges_bindings_and_connections_with_consumers_prefetch_and_unacked(
    tmp_path,
):
    with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT, listen="tcp://127.0.0.1:*") as node:
        node.declare_queue("orders")
        node.declare_exchange("shop", kind="topic")
        node.bind_queue("orders", "shop", "order.*")
        with node.connect() as local, connect(node.listen_endpoint) as remote:
            local.publish_many("orders", [b"order"] * 5)
            mine = local.consume("orders", prefetch=3)
            held = [next(mine) for _ in range(3)]  # the prefetch is full
            theirs = remote.consume("orders", prefetch=10)
            held.append(next(theirs))  # and the remote one holds the two left
            wait_for(
                lambda: b'"messages_unacked": 5' in fetch(node.http_endpoint + "/api/overview")[2]
            )
            wait_for(
                lambda: len(json.loads(fetch(node.http_endpoint + "/api/connections")[2])) == 2
            )

            dom = render(node.http_endpoint + "/", tmp_path, "--dump-dom")

        exchanges = rows_of(dom, "data-exchange")
        assert exchanges[""] == ["(default)", "direct", "durable", "1"]  # routes to every queue
        assert exchanges["shop"] == ["shop", "topic", "durable", "1"]
        assert list(rows_of(dom, "data-binding").values()) == [["shop", "order.*", "orders"]]
        connections = sorted(rows_of(dom, "data-connection").values(), key=lambda row: row[1])
        assert connections[0][1].startswith(f"pid {os.getpid()}")  # and its process's name
        assert [row[2:] for row in connections] == [["1", "3", "orders"], ["1", "2", "orders"]]
        assert connections[1][1] == "remote, over tcp"
        consumers = sorted(rows_of(dom, "data-consumer").values(), key=lambda row: int(row[3]))
        assert [[row[0], *row[2:]] for row in consumers] == [
            ["orders", "1", "3", "3"],
            ["orders", "1", "10", "2"],
        ]
        version = importlib.metadata.version("warren-mq")
        text = re.sub(r"<[^>]*>", "", dom)
        assert re.search(rf"running · Warren {re.escape(version)} · up \d+ (s|min) · 1 queue", text)


@needs_chromium
def test_a_queues_own_page_shows_its_figures_its_four_states_its_consumers_and_charts(tmp_path):
    view = """(() => {
        const view = document.getElementById('queue-view');
        if (view === null) return { lines: 0 };  // the page is not loaded yet
        const consumer = view.querySelector('tr[data-consumer]');
        return {
            shown: [view.hidden, document.getElementById('figures').hidden],
            heading: view.querySelector('h2')?.textContent,
            states: Object.fromEntries([...view.querySelectorAll('[data-state]')].map(
                (state) => [state.dataset.state, state.querySelector('dd').textContent])),
            consumer: consumer && [...consumer.cells].map((cell) => cell.textContent),
            bindings: [...view.querySelectorAll('tr[data-binding]')].map(
                (row) => [...row.cells].map((cell) => cell.textContent)),
            lines: view.querySelectorAll('.chart polyline').length,
        };
    })()"""
    with driven_chromium(tmp_path / "profile") as browser:
        with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
            node.declare_queue(LONG_NAME)
            node.declare_exchange("shop")
            node.bind_queue(LONG_NAME, "shop", "payments")
            with node.connect() as conn:
                conn.publish_many(LONG_NAME, [b"payment"] * 4)
                consumer = conn.consume(LONG_NAME, prefetch=2)
                next(consumer)
                address = node.http_endpoint + "/#/queue/" + urllib.parse.quote(LONG_NAME, safe="")
                page = browser.open(address)
                # Then the queue's page shows once the node answered, with a chart of its
                # depth at once and of its rates from the second answer on
                wait_for(lambda: (browser.evaluate(page, view)["lines"] or 0) >= 3)
                shown = browser.evaluate(page, view)
                (queue,) = json.loads(fetch(node.http_endpoint + "/api/queues")[2])
                assert shown["shown"] == [False, True]
                assert shown["heading"] == f"Queue {LONG_NAME} running"
                assert shown["states"] == {
                    state: str(queue[state]) for state in ("alpha", "beta", "gamma", "delta")
                }
                assert sum(queue[state] for state in ("alpha", "beta", "gamma", "delta")) == 2
                assert shown["consumer"][2:] == ["1", "2", "2"]  # consumers, prefetch, unacked
                assert shown["bindings"] == [["shop", "payments"]]
                # And the page of every queue is one link away
                browser.evaluate(page, "location.hash = '#queues'")
                wait_for(lambda: browser.evaluate(page, view)["shown"] == [True, False])


@needs_chromium
def test_at_a_laptops_width_and_a_phones_nothing_scrolls_sideways_and_long_names_are_cut(
    tmp_path,
):
    layout = """(() => {
        const overflows = (inner, outer) =>
            inner.getBoundingClientRect().right > outer.getBoundingClientRect().right + 0.5;
        const name = document.querySelector('#queue-table td.name');
        return {
            page: document.documentElement.scrollWidth - window.innerWidth,
            tables: [...document.querySelectorAll('table')].filter(
                (table) => overflows(table, table.closest('.card'))).map((table) => table.id),
            name: [name.title, name.scrollWidth > name.clientWidth,
                   getComputedStyle(name).textOverflow],
            charts: [...document.querySelectorAll('#charts .chart')].map((chart) => ({
                axis: [...chart.querySelectorAll('.y-axis span')].map((label) => [
                    label.textContent, parseFloat(getComputedStyle(label).fontSize)]),
                series: [...chart.querySelectorAll('.legend line')].map((line) =>
                    getComputedStyle(line).stroke + ' ' + getComputedStyle(line).strokeDasharray),
            })),
        };
    })()"""
    rows = "document.querySelectorAll('#queue-table tr[data-queue]').length"
    queues = [LONG_NAME, *(f"queue-{n:02d}" for n in range(16))]
    with driven_chromium(tmp_path / "profile") as browser:
        with Node(tmp_path / "data", http=LOOPBACK_ANY_PORT) as node:
            for name in queues:
                node.declare_queue(name)
            node.declare_queue(LONG_NAME + "-stream", type="stream")
            node.declare_exchange(LONG_NAME + "-exchange", kind="topic")
            node.bind_queue(LONG_NAME, LONG_NAME + "-exchange", "#." + LONG_NAME)
            with node.connect() as conn:
                conn.publish_many(LONG_NAME, [b"payment"] * 3)
            page = browser.open(node.http_endpoint + "/")
            wait_for(lambda: browser.evaluate(page, rows) == len(queues))
            for width in (1280, 400):
                browser.call(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": 900, "deviceScaleFactor": 1, "mobile": False},
                    page,
                )
                shown = browser.evaluate(page, layout)
                assert shown["page"] <= 0, f"the page scrolls sideways at {width} px"
                assert shown["tables"] == [], f"wider than their cards at {width} px"
                assert shown["name"] == [LONG_NAME, True, "ellipsis"]
                for chart in shown["charts"]:
                    labels = [text for text, _ in chart["axis"]]
                    assert len(labels) == 3 and labels[-1] == "0" and labels[0] != "0", labels
                    assert min(size for _, size in chart["axis"]) >= 11
                    assert len(set(chart["series"])) == len(chart["series"]) >= 2, chart
            # Many queues: the filter keeps those whose name holds its text
            browser.evaluate(
                page,
                "const box = document.getElementById('queue-filter'); box.value = 'QUEUE-1';"
                "box.dispatchEvent(new Event('input'))",
            )
            assert browser.evaluate(page, rows) == 6  # queue-10 to queue-15
            shown = "document.getElementById('queue-count').textContent"
            assert browser.evaluate(page, shown) == f"6 of {len(queues)} queues"
