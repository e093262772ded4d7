#!/usr/bin/env python3
"""Per-call latency of the 12 σOS API calls of σPy's Table 4.1, from Python.

Each call runs N times (after a warm-up) against a realm server on a Unix socket; the table gives
the median and 90th percentile in microseconds, for the σPy-compatible `splib` functions and for
the `Client` methods they wrap. ClntID is the round-trip floor (no file system work).

    python3 pysigma/bench/calls.py [-n 2000] [--tmp /dev/shm] [--socket PATH]
                                   [--rust BIN [--rounds 5] [--server-proc] [--json OUT]]

Without --socket it starts the embedded realm server in-process (`pysigma._pysigma._serve_local`)
on a temporary directory: its own thread, same process, real socket and protocol.

With --rust (the native client doing the same calls: `cargo build --release -p sigma-spproxy
--example calls`, then target/release/examples/calls) it runs rounds of the three sides against
the one server: Python splib, Python Client, and the Rust binary as a subprocess (the server keeps
serving on its own threads while Python waits for it). The order of the sides rotates from round
to round, every side warms up in every round, and the medians are over all samples of a side. The
table gives each call's ratio to Rust, and the range of the per-round ratios. --server-proc puts
the server in a process of its own, so that neither client shares a process with it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

import pysigma
import pysigma.splib as splib
from pysigma import _pysigma

DATA = "Hello World!"  # σPy's benchmark payload (12 bytes)
DATA_BYTES = DATA.encode()

Samples = Dict[str, List[int]]


def timed(n: int, fn: Callable[..., Any], args: Tuple[Any, ...] = (),
          setup: Optional[Callable[[int], Tuple[Any, ...]]] = None,
          teardown: Optional[Callable[[Any], Any]] = None) -> Tuple[List[int], List[int]]:
    """Calls fn(*args) n times, timed alone (setup(i), when given, makes the args untimed;
    teardown(result) runs untimed). Returns the wall-clock ns of each call and the calling
    thread's CPU ns around it (the CPU clock is read outside the wall-clock interval)."""
    wall, cpu = [], []
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    for i in range(n):
        if setup is not None:
            args = setup(i)
        c0 = cpu_clock()
        t0 = clock()
        r = fn(*args)
        t1 = clock()
        c1 = cpu_clock()
        wall.append(t1 - t0)
        cpu.append(c1 - c0)
        if teardown is not None:
            teardown(r)
    return wall, cpu


def bench_suite(api: str, root: str, n: int) -> Tuple[Samples, Samples]:
    """The Table 4.1 calls through `api` ("splib": σPy's call shapes, "client": the Client
    methods with their own argument types), each timed alone; returns (wall, cpu) samples.
    spproxy/examples/calls.rs makes the same calls in the same order from Rust."""
    d = f"{root}/{api}"
    f12, wpath, ppath = f"{d}/file12", f"{d}/w", f"{d}/p"
    c = pysigma.client()
    f: Dict[str, Callable[..., Any]]
    if api == "splib":
        f = {name: getattr(splib, name) for name in ORDER if name != "WatchRead"}
        f["WatchRead"] = pysigma.read_watch_fd  # σPy has no watch read: pysigma's
        write_data: Any = DATA  # splib takes str, as σPy's does
        put_args: Tuple[Any, ...] = (ppath, 0o777, pysigma.OWRITE, DATA, 0, pysigma.NO_LEASE_ID)
        f["PutFile"](f12, 0o777, pysigma.OWRITE, DATA, 0, pysigma.NO_LEASE_ID)
    else:
        f = {
            "Started": c.started, "Exited": c.exited, "ClntID": c.clnt_id,
            "Create": c.create_fd, "Open": c.open_fd, "Read": c.readinto_fd,
            "Write": c.write_fd, "Seek": c.seek_fd, "CloseFD": c.close_fd,
            "PutFile": c.put_file, "GetFile": c.get_file, "Stat": c.stat, "Remove": c.remove,
            "GetDir": c.get_dir, "WatchRead": c.read_watch_fd,
        }
        write_data = DATA_BYTES
        put_args = (ppath, DATA_BYTES, 0o777, pysigma.OWRITE, 0, pysigma.NO_LEASE_ID)
        c.put_file(f12, DATA_BYTES, 0o777, pysigma.OWRITE, 0, pysigma.NO_LEASE_ID)
    Create, Open, Seek, CloseFD, Remove = (f["Create"], f["Open"], f["Seek"], f["CloseFD"],
                                           f["Remove"])
    buf = bytearray(12)
    res: Dict[str, Tuple[List[int], List[int]]] = {}

    res["ClntID"] = timed(n, f["ClntID"])
    res["Started"] = timed(n, f["Started"])
    res["Exited"] = timed(n, f["Exited"], (pysigma.STATUS_OK, "Exited normally!"))
    res["Create"] = timed(n, Create, setup=lambda i: (f"{d}/c{i}", 0o777, pysigma.OWRITE),
                          teardown=CloseFD)
    res["Open"] = timed(n, Open, (f12, pysigma.OREAD, False), teardown=CloseFD)
    wfd = Create(wpath, 0o777, pysigma.OWRITE)
    res["Write"] = timed(n, f["Write"], (wfd, write_data))
    CloseFD(wfd)
    rfd = Open(f12, pysigma.OREAD, False)

    def rewind(_: int) -> Tuple[Any, ...]:
        Seek(rfd, 0)
        return (rfd, buf)

    res["Read"] = timed(n, f["Read"], setup=rewind)
    assert bytes(buf) == DATA_BYTES, buf
    res["Seek"] = timed(n, Seek, (rfd, 0))
    CloseFD(rfd)
    res["CloseFD"] = timed(n, CloseFD, setup=lambda _: (Open(f12, pysigma.OREAD, False),))
    res["PutFile"] = timed(n, f["PutFile"], put_args)
    res["GetFile"] = timed(n, f["GetFile"], (f12,))
    res["Stat"] = timed(n, f["Stat"], (f12,))
    res["Remove"] = timed(n, Remove, setup=lambda i: (f"{d}/c{i}",))
    # The calls σPy's table lacks (calls.rs makes the same): a 10-entry directory listed
    # whole, and a watch read with one creation waiting (the creation is untimed setup).
    gd = f"{d}/dir"
    ensure_dir(gd)
    for i in range(10):
        c.put_file(f"{gd}/e{i}", DATA_BYTES, 0o777, pysigma.OWRITE, 0, pysigma.NO_LEASE_ID)
    res["GetDir"] = timed(n, f["GetDir"], (gd,))
    names, wfd = c.dir_watch(gd)

    def create_one(i: int) -> Tuple[Any, ...]:
        c.put_file(f"{gd}/n{i}", DATA_BYTES, 0o777, pysigma.OWRITE, 0, pysigma.NO_LEASE_ID)
        return (wfd,)

    res["WatchRead"] = timed(n, f["WatchRead"], setup=create_one)
    c.close_fd(wfd)
    for st in c.get_dir(gd):
        c.remove(f"{gd}/{st.name}")
    c.remove(gd)
    for p in (wpath, ppath, f12):
        Remove(p)
    return {k: v[0] for k, v in res.items()}, {k: v[1] for k, v in res.items()}


ORDER = ["Started", "Exited", "Create", "Open", "Write", "Read", "Seek", "CloseFD", "PutFile",
         "GetFile", "Stat", "Remove", "ClntID", "GetDir", "WatchRead"]


TABLE_4_1 = ORDER[:12]  # the twelve calls of σPy's Table 4.1; ClntID is only the floor


def summary(xs: List[int]) -> Tuple[float, float]:
    xs = sorted(xs)
    return statistics.median(xs) / 1000.0, xs[int(len(xs) * 0.9)] / 1000.0


def p50(xs: List[int]) -> float:
    return statistics.median(xs) / 1000.0


def merged(rounds: List[Samples], name: str) -> List[int]:
    return [x for r in rounds for x in r[name]]


def ensure_dir(path: str) -> None:
    try:
        pysigma.stat(path)
    except FileNotFoundError:
        pysigma.create(path, perm=pysigma.DMDIR | 0o777, mode=pysigma.OREAD).close()


def run_python(api: str, root: str, n: int, warmup: int) -> Tuple[Samples, Samples]:
    ensure_dir(f"{root}/{api}")
    if warmup > 0:
        bench_suite(api, root, warmup)
    return bench_suite(api, root, n)


def run_rust(binary: str, socket: str, root: str, n: int, warmup: int) -> Tuple[Samples, Samples]:
    """Runs the native client as a subprocess against `socket`. subprocess.run waits with the GIL
    released; the server needs no GIL anyway (its threads are pure Rust)."""
    cmd = [binary, "--socket", socket, "--root", root, "--dir", "rust", "-n", str(n),
           "--warmup", str(warmup)]
    out = subprocess.run(cmd, stdout=subprocess.PIPE, check=True, text=True).stdout
    res: Dict[str, Samples] = json.loads(out)
    missing = [f"{k}.{c}" for k in ("wall", "cpu") for c in ORDER
               if len(res.get(k, {}).get(c, [])) != n]
    if missing:
        raise SystemExit(f"{binary} gave no {n} samples for {', '.join(missing)}")
    return res["wall"], res["cpu"]


class ServerProc:
    """The embedded realm server in a Python process of its own (--server-proc)."""

    CODE = ("import sys\n"
            "from pysigma import _pysigma\n"
            "h = _pysigma._serve_local(sys.argv[1], sys.argv[2], sys.argv[3])\n"
            "print('ready', flush=True)\n"
            "sys.stdin.read()\n"
            "h.shutdown()\n")

    def __init__(self, socket: str, ux: str, s3: str) -> None:
        self.p = subprocess.Popen([sys.executable, "-c", self.CODE, socket, ux, s3],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.p.stdout is not None
        line = self.p.stdout.readline().strip()
        if line != "ready":
            self.p.kill()
            raise SystemExit(f"the server process did not start (said {line!r})")

    def stop(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(timeout=30)


def side_by_side(args: argparse.Namespace, server: str) -> int:
    sides = ["splib", "client", "rust"]
    wall: Dict[str, List[Samples]] = {s: [] for s in sides}
    cpu: Dict[str, List[Samples]] = {s: [] for s in sides}
    load0 = os.getloadavg()[0]
    t0 = time.monotonic()
    for r in range(args.rounds):
        k = r % len(sides)
        for side in sides[k:] + sides[:k]:
            if side == "rust":
                w, c = run_rust(args.rust, args.socket, args.root, args.n, args.warmup)
            else:
                w, c = run_python(side, args.root, args.n, args.warmup)
            wall[side].append(w)
            cpu[side].append(c)
    took = time.monotonic() - t0
    load1 = os.getloadavg()[0]

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": args.n, "warmup": args.warmup, "wall": wall, "cpu": cpu}, f)

    print(f"pysigma {sys.version.split()[0]} and {os.path.basename(args.rust)} (native "
          f"spproxy::Client) -> {server}")
    print(f"{args.rounds} rounds (side order rotating) x n={args.n} per call per side, warm-up "
          f"{args.warmup} per round; {os.cpu_count()} CPUs, load average {load0:.1f} -> "
          f"{load1:.1f}, {took:.0f} s")
    print("µs, medians over all rounds; [range of the per-round ratios]; CPU = the calling "
          "thread's CPU time per call (no waiting: the client-side cost)")
    print(f"{'call':<8} {'Rust':>6} {'Client':>6} {'splib':>6}  {'Client/Rust':>17}  "
          f"{'splib/Rust':>17}  {'CPU Rust':>8} {'Client':>6} {'splib':>6}")
    worst: Dict[str, Tuple[float, str]] = {"client": (0.0, ""), "splib": (0.0, "")}
    for name in ORDER:
        rust = p50(merged(wall["rust"], name))
        cells = []
        for side in ("client", "splib"):
            ratio = p50(merged(wall[side], name)) / rust
            per = [p50(a[name]) / p50(b[name]) for a, b in zip(wall[side], wall["rust"])]
            cells.append(f"{ratio:>4.2f} [{min(per):.2f}-{max(per):.2f}]")
            if name in TABLE_4_1 and ratio > worst[side][0]:
                worst[side] = (ratio, name)
        label = name if name in TABLE_4_1 else f"({name})"
        cpus = " ".join(f"{p50(merged(cpu[s], name)):>{w}.1f}"
                        for s, w in (("rust", 8), ("client", 6), ("splib", 6)))
        print(f"{label:<8} {rust:>6.1f} {p50(merged(wall['client'], name)):>6.1f} "
              f"{p50(merged(wall['splib'], name)):>6.1f}  {cells[0]:>17}  {cells[1]:>17}  {cpus}")
    ok = all(w[0] <= args.target for w in worst.values())
    print(f"every Table 4.1 ratio <= {args.target}: {'yes' if ok else 'no'} "
          f"(worst Client/Rust {worst['client'][0]:.2f} on {worst['client'][1]}, "
          f"worst splib/Rust {worst['splib'][0]:.2f} on {worst['splib'][1]}; "
          f"(ClntID) is the round-trip floor, not counted)")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("-n", type=int, default=2000, help="timed calls per API call (default 2000)")
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--socket", help="an spproxy socket to use instead of the embedded server")
    ap.add_argument("--root", default="name/ux/~local",
                    help="realm directory the files go in (default name/ux/~local)")
    ap.add_argument("--tmp", help="where the embedded server's directories go (default: $TMPDIR; "
                    "/dev/shm takes the disk out of Create/Remove)")
    ap.add_argument("--rust", metavar="BIN",
                    help="the native client example (target/release/examples/calls): compare "
                    "against it, side by side on the same server")
    ap.add_argument("--rounds", type=int, default=5,
                    help="with --rust: rounds of (splib, Client, Rust) (default 5)")
    ap.add_argument("--target", type=float, default=1.2,
                    help="with --rust: the ratio to Rust every call should stay within "
                    "(default 1.2)")
    ap.add_argument("--server-proc", action="store_true",
                    help="run the embedded server in a process of its own, not in this one")
    ap.add_argument("--json", metavar="OUT", help="with --rust: write every sample here")
    args = ap.parse_args()
    if args.n < 1 or args.rounds < 1:
        ap.error("-n and --rounds must be at least 1")
    if args.rust and not os.access(args.rust, os.X_OK):
        ap.error(f"--rust {args.rust}: not an executable (build it with `cargo build --release "
                 "-p sigma-spproxy --example calls`)")

    tmp = None
    server_handle = None
    server_proc = None
    if args.socket is None:
        tmp = tempfile.TemporaryDirectory(prefix="pysigma-bench-", dir=args.tmp)
        for sub in ("ux", "s3"):
            os.mkdir(os.path.join(tmp.name, sub))
        args.socket = os.path.join(tmp.name, "spproxyd.sock")
        ux, s3 = os.path.join(tmp.name, "ux"), os.path.join(tmp.name, "s3")
        if args.server_proc:
            server_proc = ServerProc(args.socket, ux, s3)
            server = f"embedded realm server in its own process (pid {server_proc.p.pid}) " \
                     f"in {tmp.name}"
        else:
            server_handle = _pysigma._serve_local(args.socket, ux, s3)
            server = f"embedded realm server (same process, own threads) in {tmp.name}"
    else:
        server = args.socket
    os.environ["SIGMA_SPPROXY_SOCKET"] = args.socket
    pysigma.connect(args.socket)
    pysigma.put_file(f"{args.root}/.bench-probe", b"")  # the directory exists
    pysigma.remove(f"{args.root}/.bench-probe")

    try:
        if args.rust:
            return side_by_side(args, server)
        results = {api: run_python(api, args.root, args.n, args.warmup)[0]
                   for api in ("splib", "client")}
        print(f"pysigma {sys.version.split()[0]} -> {server}; n={args.n} per call, "
              f"warm-up {args.warmup}; µs")
        print(f"{'call':<10} {'splib p50':>10} {'splib p90':>10} {'Client p50':>11} "
              f"{'Client p90':>11}")
        for name in ORDER:
            s50, s90 = summary(results["splib"][name])
            c50, c90 = summary(results["client"][name])
            print(f"{name:<10} {s50:>10.1f} {s90:>10.1f} {c50:>11.1f} {c90:>11.1f}")
        return 0
    finally:
        pysigma.disconnect()
        if server_handle is not None:
            server_handle.shutdown()
        if server_proc is not None:
            server_proc.stop()
        if tmp is not None:
            tmp.cleanup()


if __name__ == "__main__":
    sys.exit(main())
