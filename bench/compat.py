"""How compatible Warren's AMQP port is, measured with other projects' own client test
suites (``make compat``; docs/amqp.md, "Compatibility, measured with the clients' own
suites").

    python -m bench.compat --suites-dir DIR [--suites pika,kombu,...] [--against rabbitmq]
                           [--test-timeout S] [--suite-timeout S] [--keyword EXPR]

This module owns the whole run: the clients' virtualenv (``build/compat/venv``, installed
from ``bench/compat-requirements.txt`` and reinstalled when that file changes), how each
suite is run (its folder under DIR, its pytest arguments and environment, its time budget),
the brokers it starts and always stops (a fresh Warren node on 127.0.0.1:5672 for each
suite, and with ``--against rabbitmq`` a private RabbitMQ node where ``rabbitmq-server``
is installed), what it keeps in ``build/compat/<broker>/`` (each suite's junit XML, its
pytest output, the broker's log, ``results.json``), and what it prints: a table per broker
(suite, run, passed, failed, skipped, seconds), each failure with a one-line reason, and,
where both brokers ran a suite, every test whose outcome differs between them.

DIR is the folder of the six exported suites (``pika/``, ``kombu/``, ``py-amqp/``,
``aiormq/``, ``aio-pika/``, ``celery/``, and the pytest plugin
``aio-pika-local-broker.py``); nothing is written into it (no caches, no bytecode). TLS
tests are deselected: the port has no TLS. Exit status: 0 when every chosen suite ran to
its end, 1 when one could not (its broker did not start or died, or its budget ran out),
2 when DIR or an option is wrong. ``--keyword EXPR`` runs only the tests pytest's ``-k
EXPR`` selects (with a suite's own ``-k``, both must match): one test again and again,
to see whether it fails only sometimes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from warren.supervisor.tables import Column, format_table

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "build" / "compat"
VENV = BUILD / "venv"
REQUIREMENTS = ROOT / "bench" / "compat-requirements.txt"
PLUGINS = ROOT / "bench" / "compat_plugins"
WARREN = ROOT / ".venv" / "bin" / "warren"

HOST, PORT = "127.0.0.1", 5672  # pika's suite knows no other
URL = f"amqp://guest:guest@{HOST}:{PORT}//"
AIO_PIKA_PLUGIN_FILE = "aio-pika-local-broker.py"
AIO_PIKA_PLUGIN = "aio_pika_local_broker"  # the name it is loaded under (``-p``)

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
INTERRUPT_GRACE_S = 30.0  # after SIGINT, how long pytest has to write its report
TEST_TIMEOUT_S = 60.0
REASON_WIDTH = 160


@dataclass(frozen=True)
class Suite:
    """One client's suite: its folder under DIR, pytest's arguments and the environment
    that points it at the broker, and how long it may take in all."""

    name: str
    args: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()
    budget_s: float = 1200.0
    path: tuple[str, ...] = ()  # folders of bench/compat_plugins on its PYTHONPATH


RABBITMQ_ENV = (("RABBITMQ_HOST", HOST), ("RABBITMQ_5672_TCP", str(PORT)))

SUITES = {
    suite.name: suite
    for suite in (
        # The acceptance tests, less the two files that test a thread-safe connection newer
        # than the released client (they cannot import it); compat_plugins/pika gives the
        # release's helpers module the name the tests import.
        Suite(
            "pika",
            (
                "tests/acceptance",
                "--ignore=tests/acceptance/thread_safe_connection_test.py",
                "--ignore=tests/acceptance/thread_safe_bounded_queue_test.py",
            ),
            budget_s=1500,
            path=("pika",),
        ),
        Suite("kombu", ("t/integration/test_py_amqp.py", "-E", "py-amqp"), RABBITMQ_ENV, 600),
        Suite("py-amqp", ("t/integration", "-E", "rabbitmq", "-k", "not tls"), RABBITMQ_ENV, 300),
        # TLS: the amqps fixtures' variants, and two tests that dial port 5671 themselves.
        Suite(
            "aiormq",
            (
                "tests",
                "-k",
                "not amqps",
                "--deselect=tests/test_connection.py::test_ssl_context",
                "--deselect=tests/test_connection.py::test_ssl_verification_fails_without_trusted_ca",
            ),
            (("AMQP_URL", URL),),
            1800,
        ),
        Suite("aio-pika", ("tests", "-k", "not amqps", "-p", AIO_PIKA_PLUGIN), (), 2400),
        # test_backend.py tests Azure's blob store, not the broker (it cannot import without
        # Azure's client).
        Suite(
            "celery",
            (
                "t/integration",
                "-p",
                "celery.contrib.pytest",
                "--ignore=t/integration/test_backend.py",
            ),
            (("TEST_BROKER", f"pyamqp://guest:guest@{HOST}:{PORT}//"), ("TEST_BACKEND", "rpc")),
            2400,
        ),
    )
}


class Refused(Exception):
    """A wrong folder or option: said in one line, exit 2."""


class BrokerError(Exception):
    """A broker that did not start (the suite is reported as not run)."""


# -- the clients' virtualenv ---------------------------------------------------------------


def clients_python() -> Path:
    """The clients' virtualenv's python, (re)installing it when the requirements changed."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    print(f"compat: installing the clients into {VENV.relative_to(ROOT)} (a minute or so)")
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    done = subprocess.run(pip + ["-r", str(REQUIREMENTS)], capture_output=True, text=True)
    if done.returncode != 0:  # pip's output only then: it warns of much that does not matter
        print(done.stdout + done.stderr, file=sys.stderr)
        raise SystemExit(f"compat: pip could not install {REQUIREMENTS.relative_to(ROOT)}")
    stamp.write_text(wanted)
    return python


# -- brokers ------------------------------------------------------------------------------


def port_answers(timeout: float = 1.0) -> bool:
    """Whether an AMQP 0-9-1 server answers on HOST:PORT (its Connection.Start, a method
    frame, comes back for the protocol header)."""
    try:
        with socket.create_connection((HOST, PORT), timeout=timeout) as sock:
            sock.sendall(b"AMQP\x00\x00\x09\x01")
            return sock.recv(1) == b"\x01"
    except OSError:
        return False


def port_taken() -> bool:
    try:
        with socket.create_connection((HOST, PORT), timeout=1.0):
            return True
    except OSError:
        return False


def session_members(sid: int) -> list[psutil.Process]:
    """The live processes of session ``sid`` (a process started with its own session and
    everything it forked that did not leave it)."""
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid != os.getpid() and os.getsid(process.pid) == sid:
                if process.status() != psutil.STATUS_ZOMBIE:
                    found.append(process)
        except (OSError, psutil.Error):
            continue
    return found


def kill_session(sid: int) -> list[str]:
    """SIGKILL what is left of session ``sid``; return what there was, described."""
    left = session_members(sid)
    described = []
    for process in left:
        try:
            described.append(f"{process.pid} {' '.join(process.cmdline())[:60]}")
            process.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=10)
    return described


class Broker:
    """A broker process started in a session of its own, so that it and everything it
    forks can be found and stopped."""

    name = ""

    def __init__(self, scratch: Path, log: Path) -> None:
        self.scratch = scratch
        self.log_path = log
        self.process: subprocess.Popen | None = None

    def command(self) -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def start(self) -> None:
        if port_taken():
            raise BrokerError(f"{HOST}:{PORT} is taken already: stop what listens there")
        argv, env = self.command()
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while not port_answers():
            if self.process.poll() is not None:
                raise BrokerError(
                    f"{self.name} exited with {self.process.returncode} before its port "
                    f"answered (see {self.log_path.relative_to(ROOT)})"
                )
            if time.monotonic() > deadline:
                raise BrokerError(f"{self.name}'s port did not answer in {START_TIMEOUT_S:.0f} s")
            time.sleep(0.2)

    def troubles(self) -> list[str]:
        """What the broker's log says went wrong in it meanwhile, counted."""
        return []

    def death(self) -> str | None:
        """How the broker ended, if it has."""
        if self.process is None or self.process.poll() is None:
            return None
        return f"{self.name} died mid-run (exit {self.process.returncode})"

    def stop(self) -> list[str]:
        """Stop the broker (SIGTERM, SIGKILL after STOP_TIMEOUT_S) and kill whatever of its
        session is left; return what had to be killed."""
        if self.process is None:
            return []
        leftovers = []
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                leftovers.append(f"{self.process.pid} {self.name} (did not stop on SIGTERM)")
        deadline = time.monotonic() + 10
        while session_members(self.process.pid) and time.monotonic() < deadline:
            time.sleep(0.2)  # its children exit after it
        leftovers += kill_session(self.process.pid)
        self.process.wait()
        return leftovers


class WarrenNode(Broker):
    """``warren node --amqp 127.0.0.1:5672`` on a fresh data directory."""

    name = "warren"

    def command(self) -> tuple[list[str], dict[str, str]]:
        if not WARREN.exists():
            raise BrokerError(f"no {WARREN.relative_to(ROOT)}: run `make .venv/.installed`")
        argv = [str(WARREN), "node", "--data-dir", str(self.scratch / "data")]
        return argv + ["--amqp", f"{HOST}:{PORT}"], dict(os.environ)

    def troubles(self) -> list[str]:
        """Its actors' crashes (each restarted by its supervisor): a client sees one as a
        queue that is briefly not there, or a channel closed with 541."""
        if not self.log_path.exists():
            return []
        crashes = self.log_path.read_text(errors="replace").count(": crashed\n")
        return [f"{crashes} actor crashes in the node's log"] if crashes else []


class RabbitMQNode(Broker):
    """A private RabbitMQ node (its own name, database, logs and Erlang cookie under the
    scratch directory) on 127.0.0.1:5672, without plugins."""

    name = "rabbitmq"
    SERVERS = ("/usr/lib/rabbitmq/bin/rabbitmq-server", "/usr/sbin/rabbitmq-server")

    @classmethod
    def server(cls) -> str | None:
        found = [s for s in cls.SERVERS if os.access(s, os.X_OK)]
        return found[0] if found else shutil.which("rabbitmq-server")

    def command(self) -> tuple[list[str], dict[str, str]]:
        server = self.server()
        if server is None:
            raise BrokerError("rabbitmq-server is not installed")
        (self.scratch / "enabled_plugins").write_text("[].\n")
        env = dict(
            os.environ,
            HOME=str(self.scratch),
            RABBITMQ_NODENAME="warren-compat@localhost",
            RABBITMQ_NODE_IP_ADDRESS=HOST,
            RABBITMQ_NODE_PORT=str(PORT),
            RABBITMQ_DIST_PORT="25699",
            RABBITMQ_MNESIA_BASE=str(self.scratch / "mnesia"),
            RABBITMQ_LOG_BASE=str(self.scratch / "log"),
            RABBITMQ_ENABLED_PLUGINS_FILE=str(self.scratch / "enabled_plugins"),
            RABBITMQ_PID_FILE=str(self.scratch / "pid"),
        )
        return [server], env

    def stop(self) -> list[str]:
        had_epmd = any(p.name() == "epmd" for p in psutil.process_iter(["name"]))
        leftovers = super().stop()
        if not had_epmd and shutil.which("epmd"):  # Erlang's port mapper, started for it
            subprocess.run(["epmd", "-kill"], capture_output=True, check=False)
        return leftovers


BROKERS = {"warren": WarrenNode, "rabbitmq": RabbitMQNode}


# -- one suite ----------------------------------------------------------------------------


@dataclass
class Result:
    """One suite's run against one broker: each test's outcome and reason, by test id."""

    suite: str
    outcomes: dict[str, tuple[str, str]] = field(default_factory=dict)
    seconds: float = 0.0
    cut_short: str = ""  # why the suite did not run to its end, if it did not
    notes: list[str] = field(default_factory=list)  # anything else worth a word

    def count(self, outcome: str) -> int:
        return sum(1 for o, _ in self.outcomes.values() if o == outcome)

    @property
    def note(self) -> str:
        return "; ".join(filter(None, [self.cut_short, *self.notes]))


def shortened(line: str) -> str:
    line = " ".join(line.split())
    return line if len(line) <= REASON_WIDTH else line[: REASON_WIDTH - 1] + "…"


def reason(message: str | None, text: str | None) -> str:
    """A failure's reason in one line: its message's first line, or, when that message
    is a whole traceback (a test that failed in a thread of its own reports so), the
    traceback's last unindented line, the exception it ended with."""
    lines = [line for line in (message or text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    if "Traceback (most recent call last)" in lines[0]:
        ends = [line for line in lines[1:] if not line[0].isspace()]
        if ends:
            return shortened(ends[-1])
    return shortened(lines[0])


def read_junit(path: Path) -> dict[str, tuple[str, str]]:
    """Each test's outcome (passed, failed, skipped) and reason from pytest's junit XML; an
    error in a test's setup or teardown fails it."""
    outcomes: dict[str, tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}".lstrip(":")
        outcome, why = "passed", ""
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
                why = reason(child.get("message"), child.text)
                break
            if child.tag == "skipped":
                outcome, why = "skipped", reason(child.get("message"), None)
        if outcomes.get(test, ("passed",))[0] != "failed":
            outcomes[test] = (outcome, why)
    return outcomes


def pytest_env(python: Path, suite_dir: Path, suite: Suite, plugins: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(suite.env)
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    path = [str(PLUGINS / folder) for folder in suite.path] + [str(plugins), str(suite_dir)]
    env["PYTHONPATH"] = os.pathsep.join(path)
    env["PYTHONDONTWRITEBYTECODE"] = "1"  # nothing written into the suites' folders
    return env


def interrupt(process: subprocess.Popen) -> None:
    """SIGINT pytest's session (it then writes its junit XML), SIGKILL it if it lingers."""
    try:
        os.killpg(process.pid, signal.SIGINT)
        process.wait(INTERRUPT_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    except ProcessLookupError:
        pass


def selected(args: tuple[str, ...], keyword: str | None) -> list[str]:
    """A suite's pytest arguments, narrowed to the tests ``keyword`` selects."""
    if not keyword:
        return list(args)
    if "-k" not in args:
        return [*args, "-k", keyword]
    at = args.index("-k") + 1
    return [*args[:at], f"({args[at]}) and ({keyword})", *args[at + 1 :]]


def run_suite(
    suite: Suite, suites_dir: Path, broker: Broker, python: Path, out: Path, options
) -> Result:
    """Run one suite's pytest against a started broker, watching both; return its result."""
    result = Result(suite.name)
    xml = out / f"{suite.name}.xml"
    xml.unlink(missing_ok=True)
    suite_dir = suites_dir / suite.name
    budget = options.suite_timeout or suite.budget_s
    argv = [str(python), "-m", "pytest", *selected(suite.args, options.keyword)]
    argv += ["-p", "no:cacheprovider", "-rfE"]
    argv += ["--continue-on-collection-errors"]  # a module that cannot import fails alone
    argv += [f"--junitxml={xml}", f"--timeout={options.test_timeout:g}"]
    env = pytest_env(python, suite_dir, suite, out / "plugins")
    started = time.monotonic()
    with open(out / f"{suite.name}.log", "wb") as log:
        process = subprocess.Popen(
            argv,
            cwd=suite_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while process.poll() is None:
                death = broker.death()
                if death:
                    result.cut_short = death
                    interrupt(process)
                elif time.monotonic() - started > budget:
                    result.cut_short = f"stopped after its {budget:.0f} s budget"
                    interrupt(process)
                else:
                    time.sleep(0.5)
        finally:
            if process.poll() is None:
                interrupt(process)
            leftovers = kill_session(process.pid)
    result.seconds = time.monotonic() - started
    if leftovers:
        result.notes.append(f"its pytest left {len(leftovers)} processes, killed")
    if xml.exists():
        result.outcomes = read_junit(xml)
    elif not result.cut_short:
        result.cut_short = f"pytest exited {process.returncode} without a report"
    if not result.cut_short and process.returncode not in (0, 1):  # 1: some tests failed
        result.cut_short = f"pytest exited {process.returncode} (see its output)"
    return result


def run_against(broker_name: str, chosen: list[Suite], suites_dir: Path, python: Path, options):
    """Every chosen suite against a fresh broker of ``broker_name``; their results."""
    out = BUILD / broker_name
    out.mkdir(parents=True, exist_ok=True)
    plugins = out / "plugins"
    plugins.mkdir(exist_ok=True)
    shutil.copyfile(suites_dir / AIO_PIKA_PLUGIN_FILE, plugins / f"{AIO_PIKA_PLUGIN}.py")
    results = []
    for suite in chosen:
        print(f"compat: {suite.name} against {broker_name} ...", flush=True)
        scratch = Path(tempfile.mkdtemp(prefix=f"warren-compat-{broker_name}-"))
        broker = BROKERS[broker_name](scratch, out / f"{suite.name}.{broker_name}.log")
        try:
            try:
                broker.start()
            except BrokerError as failed:
                result = Result(suite.name, cut_short=f"not run: {failed}")
            else:
                result = run_suite(suite, suites_dir, broker, python, out, options)
        finally:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # stop it whatever comes
            try:
                leftovers = broker.stop()
            finally:
                signal.signal(signal.SIGINT, previous)
                shutil.rmtree(scratch, ignore_errors=True)
        result.notes += broker.troubles()
        if leftovers:
            result.notes.append(f"{broker_name} left {len(leftovers)} processes, killed")
        results.append(result)
        print(f"compat: {suite.name}: {summary(result)}", flush=True)
        save(out / "results.json", result)
    return results


def summary(result: Result) -> str:
    counts = ", ".join(
        f"{result.count(o)} {o}" for o in ("passed", "failed", "skipped") if result.count(o)
    )
    return f"{counts or 'no test ran'} in {result.seconds:.0f} s" + (
        f" ({result.note})" if result.note else ""
    )


def save(path: Path, result: Result) -> None:
    """Keep a suite's outcomes in ``results.json`` beside the others' of the same broker."""
    kept = json.loads(path.read_text()) if path.exists() else {}
    kept[result.suite] = {
        "seconds": round(result.seconds, 1),
        "cut_short": result.cut_short,
        "notes": result.notes,
        "tests": {test: list(outcome) for test, outcome in sorted(result.outcomes.items())},
    }
    path.write_text(json.dumps(kept, indent=1) + "\n")


# -- the report ---------------------------------------------------------------------------

COLUMNS = (
    Column("suite"),
    Column("run", ">", min_width=4),
    Column("passed", ">", min_width=6),
    Column("failed", ">", min_width=6),
    Column("skipped", ">", min_width=7),
    Column("seconds", ">", min_width=7),
    Column("note", wrap=True, min_width=20),
)


def table(broker_name: str, results: list[Result]) -> str:
    rows = [
        [
            r.suite,
            str(r.count("passed") + r.count("failed")),
            str(r.count("passed")),
            str(r.count("failed")),
            str(r.count("skipped")),
            f"{r.seconds:.0f}",
            r.note,
        ]
        for r in results
    ]
    return f"The clients' suites against {broker_name}\n\n{format_table(COLUMNS, rows)}"


def failures(results: list[Result]) -> str:
    """Each suite's failed tests, grouped under the reason they share, most first."""
    lines = []
    for r in results:
        by_reason: dict[str, list[str]] = {}
        for test, (outcome, why) in r.outcomes.items():
            if outcome == "failed":
                by_reason.setdefault(why or "(no message)", []).append(test)
        if by_reason:
            lines.append(f"{r.suite}: {r.count('failed')} failed")
        for why, tests in sorted(by_reason.items(), key=lambda item: -len(item[1])):
            lines.append(f"  {len(tests)} x {why}")
            lines += [f"      {test}" for test in tests]
    return "\n".join(lines)


def differences(warren: list[Result], rabbitmq: list[Result]) -> str:
    """Test by test, where a suite ran against both brokers and the outcomes differ."""
    theirs = {r.suite: r for r in rabbitmq if r.outcomes}
    lines = []
    for ours in warren:
        if ours.suite not in theirs or not ours.outcomes:
            continue
        other = theirs[ours.suite].outcomes
        differ = [
            (test, ours.outcomes.get(test, ("not run", "")), other.get(test, ("not run", "")))
            for test in sorted(set(ours.outcomes) | set(other))
            if ours.outcomes.get(test, ("not run",))[0] != other.get(test, ("not run",))[0]
        ]
        lines.append(f"{ours.suite}: {len(differ)} tests differ")
        for test, (w, w_why), (q, q_why) in differ:
            lines.append(f"  {test}: warren {w}, rabbitmq {q}")
            if w_why or q_why:
                lines.append(f"      {w_why or q_why}")
    return "\n".join(lines) or "no suite ran against both brokers"


# -- command line -------------------------------------------------------------------------


def check_suites_dir(given: str | None) -> Path:
    expected = [*SUITES, AIO_PIKA_PLUGIN_FILE]
    if not given:
        raise Refused(
            "give the folder of the exported client suites: --suites-dir DIR "
            f"(make compat SUITES=DIR), holding {', '.join(expected)}"
        )
    folder = Path(given).resolve()
    missing = [name for name in expected if not (folder / name).exists()]
    if missing:
        raise Refused(f"{given} does not hold the client suites: missing {', '.join(missing)}")
    return folder


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compat", description=__doc__)
    parser.add_argument("--suites-dir", help="the folder of the six exported suites")
    parser.add_argument("--suites", default=",".join(SUITES), help="which to run, by name")
    parser.add_argument("--against", choices=["rabbitmq"], help="also run them on RabbitMQ")
    parser.add_argument("--test-timeout", type=float, default=TEST_TIMEOUT_S)
    parser.add_argument("--suite-timeout", type=float, help="each suite's budget, seconds")
    parser.add_argument("--keyword", help="only the tests pytest's -k EXPR selects")
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    options = parse(argv)
    try:
        suites_dir = check_suites_dir(options.suites_dir)
        names = [n.strip() for n in options.suites.split(",") if n.strip()]
        unknown = [n for n in names if n not in SUITES]
        if unknown or not names:
            raise Refused(f"unknown suite(s) {unknown}; known: {', '.join(SUITES)}")
    except Refused as refused:
        print(f"compat: {refused}", file=sys.stderr)
        return 2
    chosen = [SUITES[n] for n in names]
    brokers = ["warren"]
    if options.against == "rabbitmq":
        if RabbitMQNode.server() is None:
            print("compat: rabbitmq-server is not installed here: no RabbitMQ run to compare")
        else:
            brokers.append("rabbitmq")

    def stop_on(signum, frame):
        raise KeyboardInterrupt

    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # SIGINT: even if inherited
        signal.signal(signum, stop_on)  # ignored, as by a shell's background job
    python = clients_python()
    ran = {b: run_against(b, chosen, suites_dir, python, options) for b in brokers}
    for broker_name, results in ran.items():
        print()
        print(table(broker_name, results))
        listed = failures(results)
        if listed:
            print()
            print(f"Failures against {broker_name}:")
            print(listed)
    if "rabbitmq" in ran:
        print()
        print("Where Warren and RabbitMQ differ:")
        print(differences(ran["warren"], ran["rabbitmq"]))
    print(f"\n(junit XML, pytest's output and the brokers' logs: {BUILD.relative_to(ROOT)}/)")
    return 1 if any(r.cut_short for results in ran.values() for r in results) else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:
        print("compat: interrupted; every broker and test run it started is stopped")
        sys.exit(130)
