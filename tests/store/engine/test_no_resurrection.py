"""A store used directly, with no reference counts to recover by, never brings back a
message that was removed, and a re-sent in-doubt write never leaves a reference behind."""

import pytest

from warren.store import MessageStore
from warren.store.engine.removal_log import ENTRY_BYTES, log_name, read_entries

from ..crash_child import CHURN, churned_bodies
from ..helpers import body, msg_id
from ..test_crash import Child


@pytest.mark.parametrize("restart", [False, True], ids=["crash", "clean-restart-then-crash"])
def test_removed_messages_stay_removed_after_a_crash(store_dir, restart):
    with Child("churn", str(store_dir), *(["restart"] if restart else [])) as child:
        assert next(child.lines()) == "ready"
        child.kill()
    live = churned_bodies()
    with MessageStore(store_dir, file_size_limit=16 * 1024, auto_gc=False) as recovered:
        assert not recovered.recovered_clean
        assert recovered.stats()["message_count"] == len(live)
        for n in range(CHURN):
            assert recovered.read(msg_id(n)) == live.get(n), n


def test_the_removal_log_forgets_files_that_are_gone(store_dir):
    with MessageStore(store_dir, file_size_limit=4096, auto_gc=False) as store:
        for n in range(400):
            store.write(msg_id(n), body(n))
        store.sync()
        for n in range(200):  # the first files empty out entirely
            store.remove(msg_id(n))
        store.sync()
        for n in range(200, 400, 2):
            store.remove(msg_id(n))
        store.sync()
        files = set(store.stats()["files"])
    logs = sorted(path.name for path in store_dir.glob("*.removed"))
    assert logs and logs == sorted(
        log_name(file) for file in files if (store_dir / log_name(file)).exists()
    )
    entries = read_entries(str(store_dir), files)
    assert 100 <= len(entries) < 150  # the 200 removes of emptied files are gone
    assert sum((store_dir / name).stat().st_size for name in logs) == (len(entries) * ENTRY_BYTES)


def test_resending_in_doubt_writes_after_a_crash_then_removing_all_once_empties_the_store(
    store_dir,
):
    with Child("churn", str(store_dir)) as child:
        assert next(child.lines()) == "ready"
        child.kill()
    live = churned_bodies()
    with MessageStore(store_dir, file_size_limit=16 * 1024, auto_gc=False) as store:
        for n in range(CHURN):  # everything is in doubt: send it again
            store.write(msg_id(n), live.get(n, body(n)))
        settled = store.sync()
        assert len(settled.durable) == CHURN
        assert store.stats()["writes_adopted"] == len(live)
        for n in range(CHURN):
            assert store.remove(msg_id(n)), n
        store.sync()
        assert store.stats()["message_count"] == 0
        assert store.stats()["valid_bytes"] == 0
