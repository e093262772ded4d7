"""pysigma's calls against whichever σOS serves the proc: σOS's own spproxyd (scripts/sigmaos-e2e)
or sigma-supervise's embedded server (pysigma/tests/test_supervised.py runs this same file).
Each check is reported to name/ux/~local/<OUT> as JSON, `{check: "ok" | "FAILED: why"}`, then
the proc exits OK: the caller judges the report, and both servers must answer every check alike.

usage: e2e-api.py OUT
"""
import json
import sys
import traceback

import pysigma

pysigma.started()
out = sys.argv[1]
ux = "name/ux/~local"
d = f"{ux}/{out}.d"
report = {}
c = pysigma.client()


def check(name):
    def run(f):
        try:
            f()
            report[name] = "ok"
        except Exception as e:  # the report says what differed; the caller fails on it
            last = traceback.extract_tb(e.__traceback__)[-1]
            report[name] = f"FAILED: line {last.lineno}: {type(e).__name__}: {e}"
        return f

    return run


def raises(exc, f, *args):
    try:
        f(*args)
    except exc:
        return
    raise AssertionError(f"{f.__name__}{args} did not raise {exc.__name__}")


@check("mkdir")
def _():
    c.create(d, pysigma.DMDIR | 0o755, pysigma.OREAD).close()
    assert pysigma.stat(d).is_dir


@check("put-get")
def _():
    pysigma.put_file(f"{d}/a", b"12345")
    assert pysigma.get_file(f"{d}/a") == b"12345"


@check("put-offset")
def _():
    pysigma.put_file(f"{d}/off", b"0123456789")
    pysigma.put_file(f"{d}/off", b"ab", mode=pysigma.OWRITE, offset=3)
    assert pysigma.get_file(f"{d}/off") == b"012ab56789"


@check("file-calls")
def _():
    with pysigma.create(f"{d}/f", perm=0o644, mode=pysigma.ORDWR) as f:
        assert f.write(b"Hello World!") == 12
        f.seek(0)
        assert f.read(5) == b"Hello"
        assert f.pread(5, 6) == b"World"
    with pysigma.open(f"{d}/f", pysigma.OREAD, wait=True) as f:
        assert f.read() == b"Hello World!"


@check("stat")
def _():
    st = pysigma.stat(f"{d}/f")
    assert (st.is_file, st.is_dir, st.length, st.name) == (True, False, 12, "f"), st


@check("get-dir")
def _():
    c.create(f"{d}/sub", pysigma.DMDIR | 0o755, pysigma.OREAD).close()
    got = sorted((s.name, s.is_dir, s.length if not s.is_dir else 0) for s in pysigma.get_dir(d))
    want = [("a", False, 5), ("f", False, 12), ("off", False, 10), ("sub", True, 0)]
    assert got == want, got


@check("rename")
def _():
    pysigma.rename(f"{d}/a", f"{d}/b")
    assert pysigma.get_file(f"{d}/b") == b"12345"
    raises(FileNotFoundError, pysigma.get_file, f"{d}/a")


@check("dir-watch")
def _():
    names, wfd = c.dir_watch(f"{d}/sub")
    assert names == [], names
    c.put_file(f"{d}/sub/new", b"x")
    seen = []
    while not seen:
        seen += c.read_watch_fd(wfd)
    assert ("new", True) in seen, seen
    c.close_fd(wfd)


# No stat of a missing path: spproxyd at f2183c66 dereferences the nil stat of its error reply
# and crashes (proxy/sigmap/srv/clntconn.go, Stat), taking every proc's connection with it.
@check("not-found")
def _():
    raises(FileNotFoundError, pysigma.get_file, f"{d}/missing")
    raises(FileNotFoundError, pysigma.get_dir, f"{d}/missing")


@check("remove")
def _():
    for name in ["b", "f", "off", "sub/new", "sub"]:
        pysigma.remove(f"{d}/{name}")
    assert pysigma.get_dir(d) == []
    pysigma.remove(d)
    raises(FileNotFoundError, pysigma.get_dir, d)


pysigma.put_file(f"{ux}/{out}", json.dumps(report).encode())
print(json.dumps(report))
pysigma.exited(pysigma.STATUS_OK, "api")
