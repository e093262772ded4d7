"""Failure paths over a real socket, with a scripted spproxy peer (fakespproxy.py)."""

from __future__ import annotations

import errno
import threading
import time
from typing import Callable, List, Optional

import pytest

import pysigma
from fakespproxy import FakeSpproxy, app_error, rpc_error

# Long enough that a hang is unmistakable, short enough to fail the suite fast.
HANG_LIMIT_S = 20.0


def run_bounded(fn: Callable[[], object]) -> BaseException:
    """Runs `fn` in a thread; returns the exception it raised. Fails if it hangs or returns."""
    box: List[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as e:  # noqa: BLE001
            box.append(e)

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(HANG_LIMIT_S)
    assert not t.is_alive(), "the call hung"
    assert box, "the call returned instead of raising"
    return box[0]


def test_connect_to_missing_socket_is_oserror(tmp_path) -> None:
    e = run_bounded(lambda: pysigma.Client.connect_socket(str(tmp_path / "nope.sock")))
    assert isinstance(e, OSError)
    assert e.errno == errno.ENOENT


def test_server_closes_during_init() -> None:
    with FakeSpproxy(lambda m, f: None, answer_init=False) as srv:
        e = run_bounded(lambda: pysigma.Client.connect_socket(srv.path))
    assert isinstance(e, ConnectionError), repr(e)


@pytest.mark.parametrize(
    "call",
    [
        lambda c: c.stat("name/x"),
        lambda c: c.get_file("name/x"),
        lambda c: c.put_file("name/x", b"data"),
        lambda c: c.clnt_id(),
        lambda c: c.started(),
        lambda c: c.read_fd(0, 10),
    ],
)
def test_server_closes_mid_call_raises_connection_error(call) -> None:
    with FakeSpproxy(lambda m, f: None) as srv:
        c = pysigma.Client.connect_socket(srv.path)
        e = run_bounded(lambda: call(c))
        assert isinstance(e, ConnectionError), repr(e)
        # The connection stays dead: later calls fail fast too.
        e2 = run_bounded(lambda: c.clnt_id())
        assert isinstance(e2, OSError), repr(e2)


def test_concurrent_callers_all_fail_when_server_closes() -> None:
    gate = threading.Event()

    def script(method: str, frames: List[bytes]) -> Optional[List[bytes]]:
        gate.wait(5)
        return None

    with FakeSpproxy(script) as srv:
        c = pysigma.Client.connect_socket(srv.path)
        results: List[BaseException] = []

        def worker() -> None:
            results.append(run_bounded(lambda: c.stat("name/x")))

        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(0.2)
        gate.set()
        for t in threads:
            t.join()
    assert len(results) == 4
    assert all(isinstance(e, OSError) for e in results), results


def test_gil_is_released_during_a_call() -> None:
    release = threading.Event()
    entered = threading.Event()

    def script(method: str, frames: List[bytes]) -> Optional[List[bytes]]:
        entered.set()
        release.wait(10)
        return app_error(13, "name/slow", "not there", err_field=2)

    with FakeSpproxy(script) as srv:
        c = pysigma.Client.connect_socket(srv.path)
        box: List[BaseException] = []

        def caller() -> None:
            try:
                c.stat("name/slow")
            except BaseException as e:  # noqa: BLE001
                box.append(e)

        t = threading.Thread(target=caller)
        t.start()
        assert entered.wait(10)
        # While the call waits on the server, this thread must be able to run Python code.
        spins = 0
        deadline = time.monotonic() + 0.3
        while time.monotonic() < deadline:
            spins += 1
        release.set()
        t.join(HANG_LIMIT_S)
    assert spins > 1000
    assert len(box) == 1 and isinstance(box[0], pysigma.SigmaNotFoundError)
    assert box[0].obj == "name/slow"
    assert box[0].msg == "not there"


EXPECTED = {
    13: (pysigma.SigmaNotFoundError, FileNotFoundError, errno.ENOENT),
    16: (pysigma.SigmaPermissionError, PermissionError, errno.EACCES),
    30: (pysigma.SigmaExistsError, FileExistsError, errno.EEXIST),
    8: (pysigma.SigmaIsADirectoryError, IsADirectoryError, errno.EISDIR),
    24: (pysigma.SigmaNotADirectoryError, NotADirectoryError, errno.ENOTDIR),
    19: (pysigma.SigmaNotADirectoryError, NotADirectoryError, errno.ENOTDIR),
    20: (pysigma.SigmaUnreachableError, ConnectionError, errno.EHOSTUNREACH),
    33: (pysigma.SigmaUnreachableError, ConnectionError, errno.EHOSTUNREACH),
    27: (pysigma.SigmaError, OSError, errno.ENOTEMPTY),
    22: (pysigma.SigmaError, OSError, errno.EINVAL),
    35: (pysigma.SigmaError, OSError, errno.EIO),
}

NAMES = {13: "Notfound", 16: "Perm", 30: "Exists", 8: "Isdir", 24: "NotDir", 19: "Walknodir",
         20: "Unreachable", 33: "IO", 27: "NotEmpty", 22: "Inval", 35: "Error"}


@pytest.mark.parametrize("code", sorted(EXPECTED))
@pytest.mark.parametrize("kind", ["rpc", "app"])
def test_error_codes_map_to_exception_classes(code: int, kind: str) -> None:
    def script(method: str, frames: List[bytes]) -> Optional[List[bytes]]:
        if kind == "rpc":
            return rpc_error(code, "name/obj", "server said no")
        return app_error(code, "name/obj", "server said no", err_field=1)  # SigmaErrRep.err

    with FakeSpproxy(script) as srv:
        c = pysigma.Client.connect_socket(srv.path)
        with pytest.raises(pysigma.SigmaError) as ei:
            c.remove("name/obj")
    cls, builtin, eno = EXPECTED[code]
    e = ei.value
    assert type(e) is cls
    assert isinstance(e, builtin)
    assert e.code == code
    assert e.name == NAMES[code]
    assert e.obj == "name/obj"
    assert e.msg == "server said no"
    assert e.errno == eno
    assert e.filename == "name/obj"
    assert "server said no" in str(e)


def test_every_code_raises_a_sigma_error() -> None:
    for code in range(1, 36):
        with FakeSpproxy(lambda m, f: rpc_error(code)) as srv:
            c = pysigma.Client.connect_socket(srv.path)
            with pytest.raises(pysigma.SigmaError) as ei:
                c.started()
        assert ei.value.code == code
        assert ei.value.name != "Unknown"
