"""``make compat``'s runner (``bench/compat.py``) refuses, in one line and before it
installs or starts anything, a suites folder that is not given or does not hold the six
suites, and a suite it does not know; and it reads pytest's junit XML into outcomes as the
table counts them. (Running the suites themselves takes 20 minutes and more: ``make
compat``, never ``make test``.)"""

import subprocess
import sys
from pathlib import Path

import pytest

from bench import compat

ROOT = Path(__file__).resolve().parents[1]


def run_compat(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.compat", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def the_suites(folder: Path) -> Path:
    """A folder laid out as the exported suites are (empty ones)."""
    folder.mkdir()
    for name in compat.SUITES:
        (folder / name).mkdir()
    (folder / compat.AIO_PIKA_PLUGIN_FILE).write_text("")
    return folder


@pytest.mark.parametrize(
    ("args", "said"),
    [
        ((), "give the folder of the exported client suites"),
        (("--suites-dir", "{empty}"), "does not hold the client suites: missing pika, kombu"),
        (("--suites-dir", "{suites}", "--suites", "pika,bunny"), "unknown suite(s) ['bunny']"),
    ],
)
def test_a_missing_or_wrong_suites_folder_is_refused_in_one_line(tmp_path, args, said):
    (tmp_path / "empty").mkdir()
    suites = the_suites(tmp_path / "suites")
    args = [a.format(empty=tmp_path / "empty", suites=suites) for a in args]
    done = run_compat(*args)
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and said in done.stderr, done.stderr


# A failure raised in a test's own thread and reported by its main thread, as pika's are.
THREADED = "&#10;".join(
    [
        "AssertionError: Traceback (most recent call last):",
        "  File &quot;base.py&quot;, line 130, in start",
        "    self.assertTrue(ended)",
        "AssertionError: closed: (540) NOT_IMPLEMENTED",
    ]
)


def test_junit_outcomes_count_errors_as_failures_with_the_line_that_says_why(tmp_path):
    xml = tmp_path / "suite.xml"
    xml.write_text(
        """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="t.test_a" name="test_ok" time="0.1"/>
<testcase classname="t.test_a" name="test_bad" time="0.1">
<failure message="amqp.exceptions.NotFound: (404)&#10;more">traceback</failure></testcase>
<testcase classname="t.test_a" name="test_torn" time="0.1">
<error message="failed on teardown">traceback</error></testcase>
<testcase classname="t.test_a" name="test_threaded" time="0.1">
<failure message="{THREADED}">traceback</failure></testcase>
<testcase classname="t.test_a" name="test_later" time="0.1">
<skipped type="pytest.skip" message="needs redis">skip</skipped></testcase>
</testsuite></testsuites>""".replace("{THREADED}", THREADED)
    )
    assert compat.read_junit(xml) == {
        "t.test_a::test_ok": ("passed", ""),
        "t.test_a::test_bad": ("failed", "amqp.exceptions.NotFound: (404)"),
        "t.test_a::test_torn": ("failed", "failed on teardown"),
        "t.test_a::test_threaded": ("failed", "AssertionError: closed: (540) NOT_IMPLEMENTED"),
        "t.test_a::test_later": ("skipped", "needs redis"),
    }


def test_the_brokers_are_compared_test_by_test_where_both_ran_a_suite():
    warren = [
        compat.Result(
            "kombu", {"a": ("passed", ""), "b": ("failed", "(540) tx"), "c": ("skipped", "")}
        ),
        compat.Result("pika", {"x": ("failed", "(406)")}),
    ]
    rabbitmq = [
        compat.Result("kombu", {"a": ("passed", ""), "b": ("passed", ""), "c": ("skipped", "")}),
        compat.Result("pika", cut_short="not run: rabbitmq exited 1 before its port answered"),
    ]
    assert compat.differences(warren, rabbitmq).splitlines() == [
        "kombu: 1 tests differ",
        "  b: warren failed, rabbitmq passed",
        "      (540) tx",
    ]


def test_a_keyword_narrows_every_suite_to_the_tests_it_selects_with_their_own_selection_kept():
    def selection(name: str) -> list[str]:
        return compat.selected(compat.SUITES[name].args, "test_expired")

    celery = selection("celery")  # a suite without a selection of its own
    assert celery[-2:] == ["-k", "test_expired"]
    aio_pika = selection("aio-pika")  # one that deselects its TLS tests
    at = aio_pika.index("-k")
    assert aio_pika[at + 1] == "(not amqps) and (test_expired)"
    assert aio_pika.count("-k") == 1
    assert compat.selected(compat.SUITES["pika"].args, None) == list(compat.SUITES["pika"].args)
