"""σPy compatibility: splib's names and call shapes, in process and as unchanged σPy programs."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pysigma
from conftest import BUCKET, S3, Realm

PROGRAMS = Path(__file__).parent / "programs"


def run_program(realm: Realm, name: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, SIGMA_SPPROXY_SOCKET=realm.socket)
    env.pop("SIGMA_SPPROXY_FD", None)
    return subprocess.run(
        [sys.executable, str(PROGRAMS / name), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_splib_is_importable_by_its_sigmapy_name() -> None:
    import splib

    import pysigma.splib as inner

    assert splib.Started is inner.Started
    assert set(splib.__all__) == set(inner.__all__)


def test_hello_program(realm: Realm) -> None:
    p = run_program(realm, "hello.py")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "Hello World!\n"


def test_file_program(realm: Realm, ux: str) -> None:
    p = run_program(realm, "file_test.py", ux)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("Fd: ") and int(lines[0][4:]) >= 0
    assert lines[1:] == ["Written: 5", "Contents: b'hello'"]
    assert (realm.scratch / ux.split("/", 3)[3] / "my_file").read_bytes() == b"hello"


def test_stat_benchmark_program(realm: Realm, ux: str) -> None:
    p = run_program(realm, "stat_test.py", ux, f"{S3}/{BUCKET}")
    assert p.returncode == 0, p.stderr
    labels = [line.split()[0] for line in p.stdout.splitlines()]
    assert labels == [
        "Started", "PutFile_Local", "GetFile_Local", "Stat_Local", "Create_Local",
        "Write_Local", "CloseFD_Local", "Open_Local", "Seek_Local", "Read_Local",
        "CloseFD_Local", "Remove_Local", "Remove_Local", "PutFile_Remote", "GetFile_Remote",
        "Stat_Remote", "Remove_Remote", "Exited",
    ]
    for line in p.stdout.splitlines():
        assert float(line.split()[1]) >= 0.0
    assert list((realm.scratch / ux.split("/", 3)[3]).iterdir()) == []


def test_calls_in_process(sigma: pysigma.Client, ux: str) -> None:
    import pysigma.splib as splib

    splib.InitSocket()
    assert splib.ClntID() == sigma.clnt_id()
    splib.Started()
    path = f"{ux}/s"
    fd = splib.Create(path, 0o777, pysigma.ORDWR)
    assert isinstance(fd, int)
    assert splib.Write(fd, "héllo") == len("héllo".encode())
    assert splib.Write(fd, b" bytes") == 6
    splib.Seek(fd, 0)
    buf = ctypes.create_string_buffer(4)
    assert splib.Read(fd, buf) == 4 and buf.raw == "héllo".encode()[:4]
    ba = bytearray(100)
    n = splib.Pread(fd, ba, 0)
    assert bytes(ba[:n]) == "héllo bytes".encode()
    mv = memoryview(bytearray(3))
    assert splib.Pread(fd, mv, 1) == 3 and mv.tobytes() == "héllo".encode()[1:4]
    splib.CloseFD(fd)
    fd = splib.Open(path, pysigma.OREAD, False)
    assert splib.Read(fd, bytearray(0)) == 0
    splib.CloseFD(fd)
    assert splib.GetFile(path) == "héllo bytes".encode()
    assert splib.PutFile(path, 0o777, pysigma.OWRITE, "new", 0, pysigma.NO_LEASE_ID) == 3
    assert splib.PutFile(path, 0o777, pysigma.OWRITE, b"x") == 1
    st = splib.Stat(path)
    assert isinstance(st, pysigma.Stat)
    splib.Rename(path, path + "2")
    splib.Remove(path + "2")
    with pytest.raises(FileNotFoundError):
        splib.Stat(path + "2")
    splib.Exited(1, "done")


def test_lower_case_aliases() -> None:
    import pysigma.splib as splib

    assert splib.started is splib.Started
    assert splib.exited is splib.Exited


def test_read_into_readonly_buffer_is_type_error(sigma: pysigma.Client, ux: str) -> None:
    import pysigma.splib as splib

    pysigma.put_file(f"{ux}/r", b"abc")
    fd = splib.Open(f"{ux}/r", pysigma.OREAD, False)
    try:
        with pytest.raises(TypeError):
            splib.Read(fd, b"abc")
        with pytest.raises(TypeError):
            splib.Read(fd, "abc")
    finally:
        splib.CloseFD(fd)
