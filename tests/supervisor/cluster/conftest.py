from collections.abc import Iterator
from pathlib import Path

import pytest

from warren.supervisor.cluster.local_etcd import ETCD, LocalEtcd, local_etcd


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalEtcd]:
    """Three etcd members for the module's tests (each test names its own cluster)."""
    if ETCD is None:
        pytest.skip("needs etcd (Debian's etcd-server, which .ci/run installs)")
    with local_etcd(tmp_path_factory.mktemp("etcd")) as members:
        yield members


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[LocalEtcd]:
    """Three etcd members of the test's own, which it may kill."""
    if ETCD is None:
        pytest.skip("needs etcd (Debian's etcd-server, which .ci/run installs)")
    with local_etcd(tmp_path / "etcd") as members:
        yield members
