#!/usr/bin/env python3
"""Per-call latency of the 12 σOS API calls of σPy's Table 4.1, from Python.

Each call runs N times (after a warm-up) against a realm server on a Unix socket; the table gives
the median and 90th percentile in microseconds, for the σPy-compatible `splib` functions and for
the `Client` methods they wrap. ClntID is the round-trip floor (no file system work).

    python3 pysigma/bench/calls.py [-n 2000] [--tmp /dev/shm] [--socket PATH]

Without --socket it starts the embedded realm server in-process (`pysigma._pysigma._serve_local`)
on a temporary directory: its own thread, same process, real socket and protocol.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import pysigma
import pysigma.splib as splib
from pysigma import _pysigma

DATA = "Hello World!"  # σPy's benchmark payload (12 bytes)


def timed(n: int, setup: Optional[Callable[[int], Any]], call: Callable[[Any], Any],
          teardown: Optional[Callable[[Any], Any]] = None) -> List[int]:
    """Runs setup(i) untimed, call(state) timed, teardown(result) untimed; returns ns samples."""
    out = []
    clock = time.perf_counter_ns
    for i in range(n):
        state = setup(i) if setup else None
        t0 = clock()
        r = call(state)
        t1 = clock()
        out.append(t1 - t0)
        if teardown:
            teardown(r)
    return out


def bench_suite(api: str, root: str, n: int) -> Dict[str, List[int]]:
    c = pysigma.client()
    f: Dict[str, Callable[..., Any]]
    if api == "splib":
        f = {name: getattr(splib, name) for name in ORDER}
    else:
        f = {
            "Started": c.started, "Exited": c.exited, "ClntID": c.clnt_id,
            "Create": c.create_fd, "Open": c.open_fd, "Read": c.readinto_fd,
            "Write": lambda fd, s: c.write_fd(fd, s.encode()),
            "Seek": c.seek_fd, "CloseFD": c.close_fd,
            "PutFile": lambda p, perm, mode, d, off, lease: c.put_file(
                p, d.encode(), perm, mode, off, lease),
            "GetFile": c.get_file, "Stat": c.stat, "Remove": c.remove,
        }
    Started, Exited, ClntID = f["Started"], f["Exited"], f["ClntID"]
    Create, Open, Write, Read = f["Create"], f["Open"], f["Write"], f["Read"]
    Seek, CloseFD, PutFile, GetFile = f["Seek"], f["CloseFD"], f["PutFile"], f["GetFile"]
    Stat, Remove = f["Stat"], f["Remove"]

    d = f"{root}/{api}"
    f12 = f"{d}/file12"
    PutFile(f12, 0o777, pysigma.OWRITE, DATA, 0, pysigma.NO_LEASE_ID)
    buf = bytearray(12)
    res: Dict[str, List[int]] = {}

    res["ClntID"] = timed(n, None, lambda _: ClntID())
    res["Started"] = timed(n, None, lambda _: Started())
    res["Exited"] = timed(n, None, lambda _: Exited(1, "Exited normally!"))
    res["Create"] = timed(n, lambda i: f"{d}/c{i}",
                          lambda p: Create(p, 0o777, pysigma.OWRITE), CloseFD)
    res["Open"] = timed(n, None, lambda _: Open(f12, pysigma.OREAD, False), CloseFD)
    wfd = Create(f"{d}/w", 0o777, pysigma.OWRITE)
    res["Write"] = timed(n, None, lambda _: Write(wfd, DATA))
    CloseFD(wfd)
    rfd = Open(f12, pysigma.OREAD, False)
    res["Read"] = timed(n, lambda _: Seek(rfd, 0), lambda _: Read(rfd, buf))
    assert bytes(buf) == DATA.encode(), buf
    res["Seek"] = timed(n, None, lambda _: Seek(rfd, 0))
    CloseFD(rfd)
    res["CloseFD"] = timed(n, lambda _: Open(f12, pysigma.OREAD, False), CloseFD)
    res["PutFile"] = timed(n, None,
                           lambda _: PutFile(f"{d}/p", 0o777, pysigma.OWRITE, DATA, 0,
                                             pysigma.NO_LEASE_ID))
    res["GetFile"] = timed(n, None, lambda _: GetFile(f12))
    res["Stat"] = timed(n, None, lambda _: Stat(f12))
    res["Remove"] = timed(n, lambda i: f"{d}/c{i}", Remove)
    for p in (f"{d}/w", f"{d}/p", f12):
        Remove(p)
    return res


ORDER = ["Started", "Exited", "Create", "Open", "Write", "Read", "Seek", "CloseFD", "PutFile",
         "GetFile", "Stat", "Remove", "ClntID"]


def summary(xs: List[int]) -> Tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) / 1000.0, xs[int(len(xs) * 0.9)] / 1000.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-n", type=int, default=2000, help="timed calls per API call (default 2000)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--socket", help="an spproxy socket to use instead of the embedded server")
    ap.add_argument("--root", default="name/ux/~local",
                    help="realm directory the files go in (default name/ux/~local)")
    ap.add_argument("--tmp", help="where the embedded server's directories go (default: $TMPDIR; "
                    "/dev/shm takes the disk out of Create/Remove)")
    args = ap.parse_args()

    tmp = None
    server_handle = None
    if args.socket is None:
        tmp = tempfile.TemporaryDirectory(prefix="pysigma-bench-", dir=args.tmp)
        for sub in ("ux", "s3"):
            os.mkdir(os.path.join(tmp.name, sub))
        args.socket = os.path.join(tmp.name, "spproxyd.sock")
        server_handle = _pysigma._serve_local(args.socket, os.path.join(tmp.name, "ux"),
                              os.path.join(tmp.name, "s3"))
        server = f"embedded realm server (same process, own threads) in {tmp.name}"
    else:
        server = args.socket
    os.environ["SIGMA_SPPROXY_SOCKET"] = args.socket
    pysigma.connect(args.socket)

    results = {}
    for api in ("splib", "client"):
        pysigma.put_file(f"{args.root}/.bench-probe", b"")  # the directory exists
        pysigma.remove(f"{args.root}/.bench-probe")
        try:
            pysigma.stat(f"{args.root}/{api}")
        except FileNotFoundError:
            pysigma.create(f"{args.root}/{api}", perm=pysigma.DMDIR | 0o777,
                           mode=pysigma.OREAD).close()
        bench_suite(api, args.root, args.warmup)
        results[api] = bench_suite(api, args.root, args.n)

    print(f"pysigma {sys.version.split()[0]} -> {server}; n={args.n} per call, "
          f"warm-up {args.warmup}; µs")
    print(f"{'call':<10} {'splib p50':>10} {'splib p90':>10} {'Client p50':>11} {'Client p90':>11}")
    for name in ORDER:
        s50, s90 = summary(results["splib"][name])
        c50, c90 = summary(results["client"][name])
        print(f"{name:<10} {s50:>10.1f} {s90:>10.1f} {c50:>11.1f} {c90:>11.1f}")
    if tmp is not None and server_handle is not None:
        server_handle.shutdown()
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
