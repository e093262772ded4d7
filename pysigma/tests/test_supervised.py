"""pysigma inside a real proc: the venv's CPython run by sigma-supervise under the sigmaos
profile, talking to the supervisor's embedded realm server over the inherited
SIGMA_SPPROXY_FD socket (the profile refuses socket/connect).

SIGMA_SUPERVISE names the supervisor binary (run.sh builds it and exports it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import Realm

PROGRAMS = Path(__file__).parent / "programs"
UX = "name/ux/~local"
S3 = "name/s3/~local"
BUCKET = "sup-bucket"


def supervisor() -> str:
    path = os.environ.get("SIGMA_SUPERVISE", "")
    if not path or not os.access(path, os.X_OK):
        pytest.fail(
            f"SIGMA_SUPERVISE={path!r} is not an executable sigma-supervise: run pysigma/tests/run.sh "
            "or build it (cargo build -p sigma-supervise) and export its path"
        )
    return path


class Host:
    """The host side of one supervised run: the ux scratch dir and the file:// bucket root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.scratch = root / "ux"
        self.buckets = root / "buckets"
        self.bucket = self.buckets / BUCKET
        self.bucket.mkdir(parents=True)
        self.cache = root / "cache"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        for k in ("SIGMA_SPPROXY_SOCKET", "SIGMA_SPPROXY_FD", "SIGMACONFIG"):
            env.pop(k, None)
        env["XDG_CACHE_HOME"] = str(self.cache)
        return env

    def run(
        self, *args: str, opts: tuple[str, ...] = (), code: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        cmd = [
            supervisor(),
            "--scratch-dir",
            str(self.scratch),
            "--s3",
            f"file://{self.buckets}",
            *opts,
            "--",
            # The venv's interpreter (a symlink to the real one): pyvenv.cfg beside it makes
            # sys.prefix the venv, so the installed wheel is found.
            sys.executable,
        ]
        cmd += ["-c", code, *args] if code is not None else list(args)
        return subprocess.run(cmd, env=self.env(), capture_output=True, text=True, timeout=120)


@pytest.fixture
def host(tmp_path: Path) -> Host:
    return Host(tmp_path)


def exit_lines(stderr: str) -> list[str]:
    return [l for l in stderr.splitlines() if l.startswith("sigma-supervise: proc exited:")]


def test_target_inherits_a_connected_socket(host: Host) -> None:
    code = """
        import fcntl, os, socket, stat, sys
        fd = int(os.environ["SIGMA_SPPROXY_FD"])
        assert fd > 2, fd
        assert stat.S_ISSOCK(os.fstat(fd).st_mode)
        assert not fcntl.fcntl(fd, fcntl.F_GETFD) & fcntl.FD_CLOEXEC
        s = socket.socket(fileno=os.dup(fd))
        assert s.family == socket.AF_UNIX and s.type == socket.SOCK_STREAM
        print(sys.prefix == sys.base_prefix, "site-packages" in __import__("pysigma").__file__)
    """
    p = host.run(code=textwrap.dedent(code))
    assert p.returncode == 0, p.stderr
    # A venv run through its bin/python symlink: sys.prefix is the venv, the wheel is found.
    assert p.stdout.split() == ["False", "True"]
    assert exit_lines(p.stderr) == []


API_SCRIPT = """
import sys
import pysigma

ux, s3 = sys.argv[1], sys.argv[2]
pysigma.started()

# ux: create/write, read back, stat, rename, remove
with pysigma.create(ux + "/made", 0o777, pysigma.OWRITE) as f:
    assert f.write(b"hello ") == 6
    assert f.write(b"world") == 5
assert pysigma.get_file(ux + "/made") == b"hello world"
with pysigma.open(ux + "/made") as f:
    assert f.read() == b"hello world"
st = pysigma.stat(ux + "/made")
assert st.length == 11 and st.is_file, st
assert pysigma.stat(ux).is_dir
pysigma.rename(ux + "/made", ux + "/renamed")
try:
    pysigma.stat(ux + "/made")
    raise AssertionError("stat of a renamed-away file succeeded")
except FileNotFoundError:
    pass
pysigma.put_file(ux + "/gone", b"x")
pysigma.remove(ux + "/gone")

# s3: put, get, stat, rename, remove
pysigma.put_file(s3 + "/dir/obj", b"object bytes")
assert pysigma.get_file(s3 + "/dir/obj") == b"object bytes"
assert pysigma.stat(s3 + "/dir/obj").length == 12
pysigma.rename(s3 + "/dir/obj", s3 + "/kept")
pysigma.put_file(s3 + "/tmp-obj", b"y")
pysigma.remove(s3 + "/tmp-obj")
try:
    pysigma.get_file(s3 + "/tmp-obj")
    raise AssertionError("get of a removed object succeeded")
except FileNotFoundError:
    pass
try:
    pysigma.put_file("name/s3/~local/no-such-bucket/k", b"z")
    raise AssertionError("put into a missing bucket succeeded")
except FileNotFoundError:
    pass

pysigma.exited(pysigma.STATUS_OK, "api done")
print("ok")
"""


def test_api_calls_reach_the_host(host: Host) -> None:
    (host.scratch / "work").mkdir(parents=True)
    p = host.run(f"{UX}/work", f"{S3}/{BUCKET}", code=API_SCRIPT, opts=("--stats",))
    assert p.returncode == 0, p.stderr
    assert p.stdout == "ok\n"
    work = host.scratch / "work"
    assert sorted(x.name for x in work.iterdir()) == ["renamed"]
    assert (work / "renamed").read_bytes() == b"hello world"
    assert sorted(str(x.relative_to(host.bucket)) for x in host.bucket.rglob("*") if x.is_file()) == [
        "kept"
    ]
    assert (host.bucket / "kept").read_bytes() == b"object bytes"
    assert not (host.buckets / "no-such-bucket").exists()
    assert exit_lines(p.stderr) == ['sigma-supervise: proc exited: status 1 (OK) "api done"']
    stats = [l for l in p.stderr.splitlines() if l.startswith("sigma-supervise proc:")]
    assert len(stats) == 1 and stats[0].startswith(
        "sigma-supervise proc: started yes, exited status 1 (OK), "
    ), p.stderr
    assert int(stats[0].split(", ")[2].split()[0]) >= 20, stats


@pytest.fixture
def work(host: Host) -> str:
    (host.scratch / "w").mkdir(parents=True)
    return f"{UX}/w"


def test_hello_program(host: Host) -> None:
    p = host.run(str(PROGRAMS / "hello.py"))
    assert p.returncode == 0, p.stderr
    assert p.stdout == "Hello World!\n"
    assert exit_lines(p.stderr) == ['sigma-supervise: proc exited: status 1 (OK) "Exited normally!"']


def test_file_program(host: Host, work: str) -> None:
    p = host.run(str(PROGRAMS / "file_test.py"), work)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0].startswith("Fd: ") and int(lines[0][4:]) >= 0
    assert lines[1:] == ["Written: 5", "Contents: b'hello'"]
    assert (host.scratch / "w" / "my_file").read_bytes() == b"hello"


def test_stat_benchmark_program(host: Host, work: str) -> None:
    p = host.run(str(PROGRAMS / "stat_test.py"), work, f"{S3}/{BUCKET}")
    assert p.returncode == 0, p.stderr
    labels = [line.split()[0] for line in p.stdout.splitlines()]
    assert labels == [
        "Started", "PutFile_Local", "GetFile_Local", "Stat_Local", "Create_Local",
        "Write_Local", "CloseFD_Local", "Open_Local", "Seek_Local", "Read_Local",
        "CloseFD_Local", "Remove_Local", "Remove_Local", "PutFile_Remote", "GetFile_Remote",
        "Stat_Remote", "Remove_Remote", "Exited",
    ]
    assert list((host.scratch / "w").iterdir()) == []
    assert list(host.bucket.iterdir()) == []


def test_require_started_fails_a_proc_that_never_started(host: Host) -> None:
    p = host.run(code="print('no Started')", opts=("--require-started",))
    assert p.returncode == 125, (p.returncode, p.stderr)
    assert p.stdout == "no Started\n"
    assert p.stderr.splitlines()[-1] == (
        "sigma-supervise: --require-started: the proc never called Started "
        "(program exit status 0)"
    )
    ok = host.run(code="import pysigma; pysigma.started()", opts=("--require-started",))
    assert ok.returncode == 0, ok.stderr
    assert ok.stderr == ""


def test_exit_status_and_message_line(host: Host) -> None:
    code = 'import pysigma, sys; pysigma.started(); pysigma.exited(pysigma.STATUS_ERR, \'bad "x"\\nmore\'); sys.exit(3)'
    p = host.run(code=code)
    assert p.returncode == 3, p.stderr
    assert exit_lines(p.stderr) == [
        'sigma-supervise: proc exited: status 3 (ERR) "bad \\"x\\"\\nmore"'
    ]


def test_default_scratch_dir_is_per_realm_under_the_cache_root(host: Host) -> None:
    cmd = [supervisor(), "--realm", "r7", "--s3", f"file://{host.buckets}", "--", sys.executable,
           "-c", f"import pysigma; pysigma.put_file('{UX}/f', b'in realm r7')"]
    p = subprocess.run(cmd, env=host.env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    f = host.cache / "sigma-supervise" / "realms" / "r7" / "ux" / "f"
    assert f.read_bytes() == b"in realm r7"


def test_sigma_off_gives_no_api(host: Host) -> None:
    code = """
        import os, pysigma
        assert "SIGMA_SPPROXY_FD" not in os.environ
        try:
            pysigma.started()
        except OSError as e:
            print("OSError", type(e).__name__)
    """
    p = host.run(code=textwrap.dedent(code), opts=("--sigma", "off"))
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith("OSError "), p.stdout


def test_sigma_socket_path_connects_for_the_target(host: Host, realm: Realm) -> None:
    """--sigma PATH: the supervisor connects to a running spproxyd and hands over the fd."""
    code = "import pysigma; pysigma.started(); pysigma.put_file('name/ux/~local/via-socket', b's')"
    before = realm.state()["calls"]
    p = host.run(code=code, opts=("--sigma", realm.socket))
    assert p.returncode == 0, p.stderr
    assert (realm.scratch / "via-socket").read_bytes() == b"s"
    # Init, Started, PutFile reached the outside server; the supervisor saw none of them.
    assert realm.state()["calls"] >= before + 3
    assert exit_lines(p.stderr) == []
    assert not (host.scratch / "via-socket").exists()


def test_unreachable_spproxyd_is_one_clear_line(host: Host) -> None:
    missing = str(host.root / "no.sock")
    p = host.run(code="pass", opts=("--sigma", missing))
    assert p.returncode == 125
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"sigma-supervise: --sigma: cannot connect to spproxyd at {missing}"
    ), p.stderr


def test_target_exit_without_exited_does_not_hang(host: Host) -> None:
    """The target dies mid-session (connection still open, no Exited): the run ends."""
    code = "import os, pysigma; pysigma.started(); pysigma.stat('name/ux/~local'); os._exit(7)"
    p = host.run(code=code, opts=("--stats",))
    assert p.returncode == 7, p.stderr
    assert exit_lines(p.stderr) == []
    assert "sigma-supervise proc: started yes, never exited, " in p.stderr


def test_sigterm_evicts_a_proc_waiting_in_wait_evict(host: Host) -> None:
    """σOS eviction: SIGTERM to the supervisor returns the proc's WaitEvict; the proc reports
    Exited(EVICTED) and exits by itself (the signal is not forwarded to it)."""
    code = textwrap.dedent(
        """
        import sys, pysigma
        pysigma.started()
        print("waiting", flush=True)
        pysigma.wait_evict()
        pysigma.exited(pysigma.STATUS_EVICTED, "evicted, cleaned up")
        print("cleaned up", flush=True)
        """
    )
    cmd = [
        supervisor(),
        "--scratch-dir",
        str(host.scratch),
        "--s3",
        f"file://{host.buckets}",
        "--",
        sys.executable,
        "-c",
        code,
    ]
    p = subprocess.Popen(
        cmd, env=host.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert p.stdout is not None
    assert p.stdout.readline() == "waiting\n"
    time.sleep(0.3)  # let the WaitEvict call reach the server
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 0, err
    assert out == "cleaned up\n"
    assert exit_lines(err) == [
        'sigma-supervise: proc exited: status 2 (EVICTED) "evicted, cleaned up"'
    ]


def test_scratch_quota_option(host: Host) -> None:
    code = textwrap.dedent(
        f"""
        import pysigma
        f = pysigma.create("{UX}/q", 0o644, pysigma.OWRITE)
        f.seek(1 << 40)
        try:
            f.write(b"x")
        except pysigma.SigmaError as e:
            print("refused:", str(e))
        f.seek(1000)
        f.write(b"y")
        print("ok")
        """
    )
    r = host.run(opts=("--scratch-quota", "64K"), code=code)
    assert r.returncode == 0, r.stderr
    assert "no space left on device" in r.stdout, r.stdout
    assert r.stdout.endswith("ok\n")
    assert (host.scratch / "q").stat().st_size == 1001


def test_hostile_proc_cannot_take_the_supervisor_down(host: Host) -> None:
    """A proc attacking its realm server: offsets that overflow, then a frame announcing 1 GiB on
    the raw socket. The supervisor stays up, answers until the bad frame, closes only that
    connection, and reports the proc's own exit status."""
    code = textwrap.dedent(
        f"""
        import os, struct, pysigma
        f = pysigma.create("{UX}/h", 0o644, pysigma.ORDWR)
        for off in (2**64 - 1, 2**40):
            f.seek(off)
            try:
                f.write(b"x")
                print("written at", off)
            except pysigma.SigmaError as e:
                print("refused", type(e).__name__)
        f.close()
        pysigma.put_file("{UX}/still", b"alive")
        print(pysigma.get_file("{UX}/still").decode())
        fd = int(os.environ["SIGMA_SPPROXY_FD"])
        os.write(fd, struct.pack("<QII", 99, 1, (1 << 30) + 4) + bytes(4096))
        print("closed" if os.read(fd, 1) == b"" else "answered")
        raise SystemExit(7)
        """
    )
    r = host.run(code=code)
    assert r.returncode == 7, r.stderr
    assert r.stdout.splitlines() == ["refused SigmaError", "refused SigmaError", "alive", "closed"]
    assert (host.scratch / "h").stat().st_size == 0


def test_the_sigmaos_api_program_passes_against_the_embedded_server(host: Host) -> None:
    """tests/sigmaos/procs/api.py, which scripts/sigmaos-e2e runs against σOS's own spproxyd
    (every check there must pass), against the embedded server: the two answer alike."""
    script = Path(__file__).resolve().parents[2] / "tests" / "sigmaos" / "procs" / "api.py"
    p = host.run(str(script), "api-out")
    assert p.returncode == 0, p.stderr
    report = json.loads((host.scratch / "api-out").read_text())
    assert len(report) >= 10, report
    assert {k: v for k, v in report.items() if v != "ok"} == {}
    # What the program made it removed again: only its report is left.
    assert sorted(x.name for x in host.scratch.iterdir()) == ["api-out"]
