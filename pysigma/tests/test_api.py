"""The Pythonic API against the embedded realm server over a real socket."""

from __future__ import annotations

import errno
import threading

import pytest

import pysigma
from conftest import BUCKET, S3, Realm


def test_public_names_are_exported() -> None:
    for name in pysigma.__all__:
        assert hasattr(pysigma, name), name
    assert pysigma.NO_LEASE_ID == 2**64 - 1
    assert pysigma.NO_OFFSET == 2**64 - 1
    assert (pysigma.OREAD, pysigma.OWRITE, pysigma.ORDWR) == (0, 1, 2)
    assert pysigma.ECODE_NOTFOUND == 13 and pysigma.ECODE_EXISTS == 30
    assert pysigma.STATUS_OK == 1


def test_clnt_id_started_exited(sigma: pysigma.Client, realm: Realm) -> None:
    cid = pysigma.clnt_id()
    assert isinstance(cid, int)
    assert cid != pysigma.NO_CLNT_ID
    assert sigma.clnt_id() == cid  # the default client is the one module calls use
    pysigma.started()
    assert realm.state()["started"] is True
    pysigma.exited(status=pysigma.STATUS_ERR, msg="it failed")
    assert realm.state()["exited"] == (pysigma.STATUS_ERR, "it failed")
    pysigma.exited()
    assert realm.state()["exited"] == (pysigma.STATUS_OK, "")


def test_calls_reach_the_server(sigma: pysigma.Client, realm: Realm) -> None:
    before = realm.state()["calls"]
    for _ in range(5):
        pysigma.clnt_id()
    assert realm.state()["calls"] == before + 5


def test_separate_connections_get_separate_ids(realm: Realm) -> None:
    a = pysigma.Client.connect_socket(realm.socket)
    b = pysigma.Client.connect_socket(realm.socket)
    assert a.clnt_id() != b.clnt_id()


def test_put_get_stat_remove(sigma: pysigma.Client, ux: str, realm: Realm) -> None:
    path = f"{ux}/hello.txt"
    assert pysigma.put_file(path, b"Hello World!") == 12
    assert pysigma.get_file(path) == b"Hello World!"
    host = realm.scratch / path.split("/", 3)[3]
    assert host.read_bytes() == b"Hello World!"
    st = pysigma.stat(path)
    assert isinstance(st, pysigma.Stat)
    assert st.length == 12
    assert st.name == "hello.txt"
    assert not st.is_dir and st.is_file
    assert isinstance(st.qid, pysigma.Qid)
    assert st == pysigma.stat(path)
    assert "hello.txt" in repr(st)
    pysigma.remove(path)
    assert not host.exists()
    with pytest.raises(FileNotFoundError):
        pysigma.stat(path)


def test_put_file_accepts_bytes_like(sigma: pysigma.Client, ux: str) -> None:
    path = f"{ux}/bl"
    pysigma.put_file(path, bytearray(b"abc"))
    assert pysigma.get_file(path) == b"abc"
    pysigma.put_file(path, memoryview(b"xyzw")[1:])
    assert pysigma.get_file(path) == b"yzw"
    pysigma.put_file(path, b"")
    assert pysigma.get_file(path) == b""


def test_put_file_offset(sigma: pysigma.Client, ux: str) -> None:
    path = f"{ux}/off"
    pysigma.put_file(path, b"0123456789")
    pysigma.put_file(path, b"ab", mode=pysigma.OWRITE, offset=3)
    assert pysigma.get_file(path) == b"012ab56789"


def test_stat_directory(sigma: pysigma.Client, ux: str) -> None:
    st = pysigma.stat(ux)
    assert st.is_dir
    assert not st.is_file
    assert st.mode & pysigma.DMDIR


def test_large_file_round_trip(sigma: pysigma.Client, ux: str) -> None:
    data = bytes(range(256)) * 16384  # 4 MiB
    pysigma.put_file(f"{ux}/big", data)
    assert pysigma.get_file(f"{ux}/big") == data
    with pysigma.open(f"{ux}/big") as f:
        assert f.read() == data


def test_file_object_calls(sigma: pysigma.Client, ux: str) -> None:
    path = f"{ux}/f"
    with pysigma.create(path, perm=0o644, mode=pysigma.ORDWR) as f:
        assert isinstance(f, pysigma.File)
        assert isinstance(f.fd, int)
        assert f.path == path
        assert not f.closed
        assert f.write(b"Hello World!") == 12
        f.seek(0)
        assert f.read(5) == b"Hello"
        assert f.read() == b" World!"
        assert f.read() == b""
        assert f.pread(5, 6) == b"World"
        f.seek(6)
        buf = bytearray(3)
        assert f.readinto(buf) == 3
        assert buf == b"Wor"
    assert f.closed
    with pytest.raises(ValueError):
        f.read()
    f.close()  # closing again is a no-op
    with pysigma.open(path) as g:
        assert g.read() == b"Hello World!"
    assert "closed" in repr(g)


def test_open_wait_on_existing_file(sigma: pysigma.Client, ux: str) -> None:
    pysigma.put_file(f"{ux}/w", b"x")
    with pysigma.open(f"{ux}/w", pysigma.OREAD, wait=True) as f:
        assert f.read() == b"x"


def test_context_manager_closes_on_exception(sigma: pysigma.Client, ux: str) -> None:
    with pytest.raises(RuntimeError):
        with pysigma.create(f"{ux}/e") as f:
            f.write(b"partial")
            raise RuntimeError("boom")
    assert f.closed
    assert pysigma.get_file(f"{ux}/e") == b"partial"


def test_closed_fd_is_gone_on_the_server(sigma: pysigma.Client, ux: str) -> None:
    f = pysigma.create(f"{ux}/c")
    fd = f.fd
    f.close()
    with pytest.raises(pysigma.SigmaError):
        sigma.read_fd(fd, 1)


def test_rename(sigma: pysigma.Client, ux: str) -> None:
    pysigma.put_file(f"{ux}/a", b"A")
    pysigma.rename(f"{ux}/a", f"{ux}/b")
    assert pysigma.get_file(f"{ux}/b") == b"A"
    with pytest.raises(pysigma.SigmaNotFoundError):
        pysigma.get_file(f"{ux}/a")


def test_s3_paths(sigma: pysigma.Client, realm: Realm) -> None:
    path = f"{S3}/{BUCKET}/dir/obj.bin"
    pysigma.put_file(path, b"in the bucket")
    assert pysigma.get_file(path) == b"in the bucket"
    assert pysigma.stat(path).length == len(b"in the bucket")
    assert (realm.s3 / BUCKET / "dir" / "obj.bin").read_bytes() == b"in the bucket"
    with pysigma.open(path) as f:
        assert f.read() == b"in the bucket"
        assert f.pread(3, 3) == b"the"
    pysigma.remove(path)
    with pytest.raises(FileNotFoundError):
        pysigma.get_file(path)


def test_s3_missing_bucket(sigma: pysigma.Client) -> None:
    with pytest.raises(pysigma.SigmaNotFoundError) as ei:
        pysigma.get_file(f"{S3}/no-such-bucket/key")
    assert ei.value.code == pysigma.ECODE_NOTFOUND


def test_path_outside_the_realm_is_permission_error(sigma: pysigma.Client) -> None:
    with pytest.raises(PermissionError) as ei:
        pysigma.get_file("name/ux/~local/../../etc/passwd")
    assert isinstance(ei.value, pysigma.SigmaPermissionError)
    assert ei.value.code == pysigma.ECODE_PERM
    assert ei.value.name == "Perm"
    assert ei.value.errno == errno.EACCES


def test_unknown_server_is_not_found(sigma: pysigma.Client) -> None:
    with pytest.raises(FileNotFoundError):
        pysigma.stat("name/mongo/~local/x")


def test_write_on_read_only_fd_is_permission_error(sigma: pysigma.Client, ux: str) -> None:
    pysigma.put_file(f"{ux}/ro", b"x")
    with pysigma.open(f"{ux}/ro", pysigma.OREAD) as f:
        with pytest.raises(PermissionError):
            f.write(b"y")


def test_read_of_directory_fd_is_a_directory_error(sigma: pysigma.Client, ux: str) -> None:
    with pytest.raises(IsADirectoryError):
        pysigma.get_file(ux)


# -- errors ---------------------------------------------------------------------------------


def test_notfound_is_file_not_found_error(sigma: pysigma.Client, ux: str) -> None:
    with pytest.raises(FileNotFoundError) as ei:
        pysigma.open(f"{ux}/missing")
    e = ei.value
    assert isinstance(e, pysigma.SigmaNotFoundError)
    assert isinstance(e, pysigma.SigmaError)
    assert isinstance(e, OSError)
    assert e.code == pysigma.ECODE_NOTFOUND == 13
    assert e.name == "Notfound"
    assert e.errno == errno.ENOENT
    for call in (pysigma.stat, pysigma.get_file, pysigma.remove):
        with pytest.raises(pysigma.SigmaNotFoundError):
            call(f"{ux}/missing")
    with pytest.raises(pysigma.SigmaNotFoundError):
        pysigma.rename(f"{ux}/missing", f"{ux}/other")


def test_exists_is_file_exists_error(sigma: pysigma.Client, ux: str) -> None:
    pysigma.create(f"{ux}/x").close()
    with pytest.raises(FileExistsError) as ei:
        pysigma.create(f"{ux}/x")
    assert isinstance(ei.value, pysigma.SigmaExistsError)
    assert ei.value.code == pysigma.ECODE_EXISTS
    assert ei.value.name == "Exists"
    assert ei.value.errno == errno.EEXIST


def test_sigma_errors_pickle(sigma: pysigma.Client, ux: str) -> None:
    import pickle

    with pytest.raises(pysigma.SigmaError) as ei:
        pysigma.stat(f"{ux}/nope")
    e2 = pickle.loads(pickle.dumps(ei.value))
    assert type(e2) is type(ei.value)
    assert e2.code == 13 and e2.name == "Notfound"


# -- wrong Python types -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "call",
    [
        lambda: pysigma.stat(1),
        lambda: pysigma.stat(b"name/x"),
        lambda: pysigma.stat(None),
        lambda: pysigma.get_file(3.5),
        lambda: pysigma.put_file("name/ux/~local/t", "a str"),
        lambda: pysigma.put_file("name/ux/~local/t", 12),
        lambda: pysigma.put_file("name/ux/~local/t", [1, 2]),
        lambda: pysigma.put_file("name/ux/~local/t", b"x", perm="rw"),
        lambda: pysigma.put_file("name/ux/~local/t", b"x", offset=1.5),
        lambda: pysigma.create("name/ux/~local/t", mode="w"),
        lambda: pysigma.open("name/ux/~local/t", wait=1),
        lambda: pysigma.rename("a", 2),
        lambda: pysigma.exited("ok"),
        lambda: pysigma.remove(object()),
        lambda: pysigma.connect(5),
    ],
)
def test_wrong_types_raise_type_error(sigma: pysigma.Client, call) -> None:
    with pytest.raises(TypeError):
        call()


def test_file_wrong_types(sigma: pysigma.Client, ux: str) -> None:
    with pysigma.create(f"{ux}/t", mode=pysigma.ORDWR) as f:
        with pytest.raises(TypeError):
            f.write("text")
        with pytest.raises(TypeError):
            f.write(None)
        with pytest.raises(TypeError):
            f.read("3")
        with pytest.raises(TypeError):
            f.seek("0")
        with pytest.raises(TypeError):
            f.readinto(b"immutable")
        with pytest.raises(TypeError):
            f.readinto(42)
        with pytest.raises(TypeError):
            sigma.read_fd("fd", 1)
    with pytest.raises(TypeError):
        pysigma.File()  # no public constructor


def test_out_of_range_numbers(sigma: pysigma.Client) -> None:
    with pytest.raises(OverflowError):
        pysigma.put_file("name/ux/~local/t", b"x", perm=-1)
    with pytest.raises(OverflowError):
        pysigma.exited(2**32)


# -- threads and the GIL --------------------------------------------------------------------


def test_threads_share_one_client(sigma: pysigma.Client, ux: str) -> None:
    n = 8
    for i in range(n):
        pysigma.put_file(f"{ux}/t{i}", str(i).encode() * 1000)
    errors: list = []

    def worker(i: int) -> None:
        try:
            for _ in range(50):
                assert sigma.get_file(f"{ux}/t{i}") == str(i).encode() * 1000
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_default_client_connects_lazily_from_env(realm: Realm) -> None:
    pysigma.disconnect()
    a = pysigma.clnt_id()
    assert pysigma.clnt_id() == a
    pysigma.disconnect()
    assert pysigma.clnt_id() != a


def test_connect_explicit_socket(realm: Realm) -> None:
    c = pysigma.connect(realm.socket)
    assert pysigma.client() is c
    assert pysigma.clnt_id() == c.clnt_id()
    pysigma.disconnect()


def test_sigmaconfig_procenv_is_forwarded_at_init(realm: Realm, tmp_path) -> None:
    import json
    import os
    import subprocess
    import sys

    cfg = {"pidStr": "pytest-proc-7", "program": "test", "realmStr": "rootrealm"}
    env = dict(os.environ, SIGMA_SPPROXY_SOCKET=realm.socket, SIGMACONFIG=json.dumps(cfg))
    code = "import pysigma; pysigma.started(); print(pysigma.clnt_id())"
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert realm.state()["pid"] == "pytest-proc-7"


def test_bad_sigmaconfig_is_a_clear_error(realm: Realm) -> None:
    import os
    import subprocess
    import sys

    env = dict(os.environ, SIGMA_SPPROXY_SOCKET=realm.socket, SIGMACONFIG="{not json")
    p = subprocess.run([sys.executable, "-c", "import pysigma; pysigma.started()"], env=env,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode != 0
    assert "ConnectionError" in p.stderr and "SIGMACONFIG" in p.stderr, p.stderr


def test_inherited_fd_from_sigma_spproxy_fd(realm: Realm) -> None:
    import os
    import socket
    import subprocess
    import sys

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(realm.socket)
    env = dict(os.environ, SIGMA_SPPROXY_FD=str(s.fileno()))
    env.pop("SIGMA_SPPROXY_SOCKET", None)  # the fd alone must be enough
    code = "import pysigma; print(pysigma.clnt_id())"
    p = subprocess.run([sys.executable, "-c", code], env=env, pass_fds=[s.fileno()],
                       capture_output=True, text=True, timeout=60)
    s.close()
    assert p.returncode == 0, p.stderr
    assert int(p.stdout) != pysigma.NO_CLNT_ID


def test_get_dir_lists_entries(sigma: pysigma.Client, ux: str) -> None:
    sigma.create(f"{ux}/d", pysigma.DMDIR | 0o755, pysigma.OREAD).close()
    sigma.put_file(f"{ux}/d/a", b"12345")
    sigma.create(f"{ux}/d/sub", pysigma.DMDIR | 0o755, pysigma.OREAD).close()
    ents = pysigma.get_dir(f"{ux}/d")
    assert [(s.name, s.is_dir) for s in ents] == [("a", False), ("sub", True)]
    assert ents[0].length == 5
    with pytest.raises(FileNotFoundError):
        pysigma.get_dir(f"{ux}/missing")


def test_dir_watch_reports_changes(sigma: pysigma.Client, ux: str) -> None:
    sigma.create(f"{ux}/w", pysigma.DMDIR | 0o755, pysigma.OREAD).close()
    sigma.put_file(f"{ux}/w/old", b"")
    names, wfd = sigma.dir_watch(f"{ux}/w")
    assert names == ["old"]
    other = pysigma.connect()
    other.put_file(f"{ux}/w/new", b"x")
    other.remove(f"{ux}/w/old")
    seen: list[tuple[str, bool]] = []
    while len(seen) < 2:
        seen += sigma.read_watch_fd(wfd)
    assert sorted(seen) == [("new", True), ("old", False)]
    sigma.close_fd(wfd)


def test_wait_evict_returns_on_eviction(realm: Realm) -> None:
    c = pysigma.connect()
    done = threading.Event()

    def wait() -> None:
        c.wait_evict()
        done.set()

    t = threading.Thread(target=wait)
    t.start()
    assert not done.wait(0.1)
    c.stat("name/ux/~local")  # the connection still serves other calls
    realm.server.evict()  # (the realm stays evicted: a later wait_evict returns at once)
    assert done.wait(5)
    t.join()
    c.exited(pysigma.STATUS_EVICTED, "evicted")
