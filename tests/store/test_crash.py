"""SIGKILL a real process that owns a store, then recover: nothing synced is lost, no
body comes back wrong, and a combine or a compaction killed at any step loses no live
message."""

import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from warren.store import MessageStore, StoreLocked
from warren.store.engine.scanner import scan_file

from .crash_child import BATCH, batch_size
from .helpers import body, build_fragmented_store, msg_id

ROOT = Path(__file__).resolve().parents[2]


class Child:
    """A crash_child process that is always killed and reaped, whatever the test does."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.store.crash_child", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def lines(self):
        for line in self.process.stdout:
            yield line.strip()

    def kill(self) -> list[str]:
        """SIGKILL the child and return the lines it printed that were not read yet."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)
        if self.process.stdout.closed:
            return []
        unread = self.process.stdout.read().split()
        self.process.stdout.close()
        self.process.stderr.close()
        return unread

    def __enter__(self) -> "Child":
        return self

    def __exit__(self, *exc) -> None:
        self.kill()


def test_a_writer_killed_mid_write_loses_no_synced_message(store_dir):
    with Child("write", str(store_dir)) as child:
        for line in child.lines():
            last_batch = int(line)
            if last_batch >= 40:
                break
        # Under load the child runs ahead of the lines read so far (and removes the batch
        # five behind the one it writes): the last batch it printed is the one it synced.
        for line in child.kill():
            last_batch = int(line)
    assert last_batch >= 40
    with MessageStore(store_dir, file_size_limit=64 * 1024) as recovered:
        assert not recovered.recovered_clean
        for n in range((last_batch - 3) * BATCH, (last_batch + 1) * BATCH):
            assert recovered.read(msg_id(n)) == body(n, batch_size(n)), n
        for n in range((last_batch + 2) * BATCH):
            found = recovered.read(msg_id(n))
            assert found is None or found == body(n, batch_size(n)), n


@pytest.mark.parametrize(
    ("gc", "point"),
    [
        *(
            ("combine", point)
            for point in ("after-plan", "mid-copy", "before-fsync", "after-rename", "before-delete")
        ),
        *(
            ("compact", point)
            for point in (
                "after-journal",
                "mid-blank",
                "mid-move",
                "before-fsync",
                "after-journal-delete",
                "after-cut",
            )
        ),
    ],
)
def test_a_gc_job_killed_at_any_step_loses_no_live_message(tmp_path, gc, point, caplog):
    directory = tmp_path / "store"
    with Child(gc, str(directory), point) as child:
        assert next(child.lines()) == ("combining" if gc == "combine" else "compacting")
        assert child.process.wait(timeout=60) == -signal.SIGKILL
    with MessageStore(tmp_path / "expected", file_size_limit=4096, auto_gc=False) as model:
        live = build_fragmented_store(model)
    with (
        caplog.at_level(logging.WARNING, logger="warren.store"),
        MessageStore(directory, file_size_limit=4096, auto_gc=False, gc=gc) as standalone,
    ):
        assert not os.path.exists(directory / "0.rdt")
        assert not [name for name in os.listdir(directory) if name.endswith(".compact")]
        rolled_back = re.search(r"(\d+) copies complete, (\d+) torn", caplog.text)
        if gc == "compact" and point in ("after-journal", "mid-blank", "mid-move", "before-fsync"):
            assert rolled_back, caplog.text  # the journal was found and undone
            complete, torn = map(int, rolled_back.groups())
            assert torn >= 1 if point != "before-fsync" else complete >= 1
        else:
            assert not rolled_back, caplog.text
        for n, expected in live.items():
            assert standalone.read(msg_id(n)) == expected, n
        assert all(
            standalone.read(msg_id(n)) in (None, body(n, 300)) for n in range(420) if n not in live
        )
    references = [(msg_id(n), 1) for n in live]
    with MessageStore(
        directory,
        file_size_limit=4096,
        ref_counts=references,
        clean_clients=[b"a queue that crashed"],
        gc=gc,
    ) as node_view:
        assert {n for n in range(420) if node_view.contains(msg_id(n))} == set(live)
        node_view.collect_garbage()
        assert all(node_view.read(msg_id(n)) == expected for n, expected in live.items())


@pytest.mark.parametrize("point", ["mid-move", "before-fsync"])
def test_a_gc_process_killed_mid_compaction_costs_the_living_store_nothing(
    tmp_path, store_dir, point
):
    store = MessageStore(store_dir, file_size_limit=4096, auto_gc=False, gc="compact")
    try:
        live = build_fragmented_store(store)
        file = store.choose_compaction()
        found = scan_file(store_dir / f"{file}.rdq")
        store.stage_compaction(file, found.msg_ids, found.offsets, found.total_sizes)
        plan = store.finish_compaction_staging()
        assert plan.moves
        with Child("gc", str(store_dir), str(file), plan.token.hex(), point) as gc:
            assert next(gc.lines()) == "moving"
            assert gc.process.wait(timeout=60) == -signal.SIGKILL
        store.abandon_compaction(plan)  # what the store actor does on the GC's Down
        assert not (store_dir / f"{file}.compact").exists()
        assert all(store.read(msg_id(n)) == expected for n, expected in live.items())
        crashed = tmp_path / "after-crash"
        shutil.copytree(store_dir, crashed, ignore=shutil.ignore_patterns(".lock"))
        with MessageStore(crashed, file_size_limit=4096, gc="compact") as recovered:
            assert {n for n in range(420) if recovered.contains(msg_id(n))} == set(live)
            assert all(recovered.read(msg_id(n)) == expected for n, expected in live.items())
        assert store.collect_garbage() > 0
        assert all(store.read(msg_id(n)) == expected for n, expected in live.items())
    finally:
        store.close()


def test_a_second_process_cannot_open_an_open_store_until_the_first_dies(store_dir):
    with Child("hold", str(store_dir)) as child:
        assert next(child.lines()) == "open"
        with pytest.raises(StoreLocked, match="open in another MessageStore"):
            MessageStore(store_dir)
        child.kill()
    with MessageStore(store_dir) as store:
        assert store.stats()["message_count"] == 0
