from collections.abc import Iterator
from pathlib import Path

import pytest

from .etcd_members import ETCD, EtcdMembers, etcd_members


@pytest.fixture(scope="module")
def etcd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdMembers]:
    """Three etcd members for the module's tests (each test names its own cluster)."""
    if ETCD is None:
        pytest.skip("needs etcd (Debian's etcd-server, which .ci/run installs)")
    with etcd_members(tmp_path_factory.mktemp("etcd")) as members:
        yield members


@pytest.fixture
def own_etcd(tmp_path: Path) -> Iterator[EtcdMembers]:
    """Three etcd members of the test's own, which it may kill."""
    if ETCD is None:
        pytest.skip("needs etcd (Debian's etcd-server, which .ci/run installs)")
    with etcd_members(tmp_path / "etcd") as members:
        yield members
