import subprocess

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


@pytest.fixture
def small_disk(tmp_path):
    """A real 8 MiB filesystem (tmpfs) to fill up; unmounted at the end."""
    mount_point = tmp_path / "small-disk"
    mount_point.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here (needs root): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], capture_output=True).returncode:
            subprocess.run(["umount", "-l", str(mount_point)], capture_output=True)
