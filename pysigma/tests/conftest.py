"""Fixtures: a real embedded realm server on a real Unix socket, one per test session."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Iterator

import pytest

import pysigma
from pysigma import _pysigma

sys.path.insert(0, os.path.dirname(__file__))

# Where the realm paths land in the server's backing directories.
UX = "name/ux/~local"
S3 = "name/s3/~local"
BUCKET = "pytest-bucket"


class Realm:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.socket = str(root / "spproxyd.sock")
        self.scratch = root / "ux"
        self.s3 = root / "s3"
        self.scratch.mkdir()
        self.s3.mkdir()
        (self.s3 / BUCKET).mkdir()
        self.server = _pysigma._serve_local(self.socket, str(self.scratch), str(self.s3))

    def state(self) -> dict:
        return self.server.proc_state()


@pytest.fixture(scope="session")
def realm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Realm]:
    r = Realm(tmp_path_factory.mktemp("realm"))
    old = os.environ.get("SIGMA_SPPROXY_SOCKET")
    os.environ["SIGMA_SPPROXY_SOCKET"] = r.socket
    os.environ.pop("SIGMA_SPPROXY_FD", None)
    yield r
    if old is None:
        os.environ.pop("SIGMA_SPPROXY_SOCKET", None)
    else:
        os.environ["SIGMA_SPPROXY_SOCKET"] = old


@pytest.fixture
def sigma(realm: Realm) -> Iterator[pysigma.Client]:
    """The module's default client, fresh for each test."""
    pysigma.disconnect()
    yield pysigma.client()
    pysigma.disconnect()


@pytest.fixture
def ux(request: pytest.FixtureRequest, realm: Realm) -> str:
    """A per-test directory name under the local ux server, created on the host side."""
    name = request.node.name.replace("[", "_").replace("]", "_")
    (realm.scratch / name).mkdir(exist_ok=True)
    return f"{UX}/{name}"

# σPy programs the tests run as subprocesses, not test modules.
collect_ignore = ["programs"]
