import pytest

from warren.store import MessageStore


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "msg_store_persistent"


@pytest.fixture
def open_store(store_dir):
    """Open stores on the test's directory; whatever is still open is closed at the end."""
    opened = []

    def _open(**options):
        store = MessageStore(store_dir, **options)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()
