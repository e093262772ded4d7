#!/usr/bin/env python3
"""Wall time of `python3 -c 'import json'` bare vs under sigma-supervise, run alternately.

Prints the median of each side, the ratio supervised/bare, and the notification counts of one
extra supervised run with --stats. Several supervisor configurations can be compared in one run:

    python3 scripts/bench-import.py                      # elided / notified / serve-rule, 30 pairs
    python3 scripts/bench-import.py -n 50 --config off=--always-notify \
        --config shared='--always-notify --pin shared'
    python3 scripts/bench-import.py --rt      # both sides SCHED_FIFO: a busy machine's queueing
                                              # does not drown the difference

The supervisor binary defaults to the release build `scripts/build` made last (musl or glibc,
under $CARGO_TARGET_DIR or target/).
"""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchlib import default_supervisor, real_python


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"bench-import: {shlex.join(cmd)} exited {r.returncode}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=30, help="pairs of runs (default 30)")
    ap.add_argument("--supervisor", default=default_supervisor())
    ap.add_argument("--python", default="python3")
    ap.add_argument("--code", default="import json")
    ap.add_argument("--rt", action="store_true",
                    help="run both sides under `chrt -f 50` (SCHED_FIFO, needs root) so that other "
                         "load on the machine does not queue them")
    ap.add_argument("--config", action="append", default=[],
                    help="NAME=OPTIONS for sigma-supervise (repeatable; default: elided, "
                         "notified (--always-notify) and serve-rule (--serve))")
    args = ap.parse_args()
    import tempfile
    served_dir = tempfile.TemporaryDirectory(prefix="bench-import-serve-")  # removed at exit
    served = served_dir.name
    if not os.access(args.supervisor, os.X_OK):
        sys.exit(f"bench-import: {args.supervisor} not found; run `scripts/build`")
    py = real_python(args.python)
    configs = []
    default_configs = [
        "elided=",                                   # no path rule: path calls not notified
        "notified=--always-notify",                  # every path call notified, answered continue
        f"serve-rule=--serve /sigma/bench={served}",  # a rule: every path read and decided
    ]
    for c in args.config or default_configs:
        name, _, opts = c.partition("=")
        configs.append((name, shlex.split(opts)))
    prefix = ["chrt", "-f", "50"] if args.rt else []
    bare_cmd = [*prefix, py, "-c", args.code]
    sup_cmds = {name: [*prefix, args.supervisor, *opts, "--", py, "-c", args.code]
                for name, opts in configs}

    for cmd in [bare_cmd, *sup_cmds.values()]:  # warm the page cache
        timed(cmd)
    bare: list[float] = []
    sup: dict[str, list[float]] = {name: [] for name, _ in configs}
    for _ in range(args.n):
        bare.append(timed(bare_cmd))
        for name, cmd in sup_cmds.items():
            sup[name].append(timed(cmd))

    b = statistics.median(bare)
    print(f"python: {py}   code: {args.code!r}   pairs: {args.n}   cpus: {os.cpu_count()}   "
          f"load: {os.getloadavg()[0]:.1f}   {'SCHED_FIFO' if args.rt else 'SCHED_OTHER'}")
    print(f"bare        median {b * 1e3:8.2f} ms   (min {min(bare) * 1e3:.2f})")
    for name, opts in configs:
        s = statistics.median(sup[name])
        stats = subprocess.run([args.supervisor, *opts, "--stats", "--", py, "-c", args.code],
                               capture_output=True, text=True)
        header = next((l for l in stats.stderr.splitlines() if l.startswith("sigma-supervise stats:")), "?")
        count = header.split()[2] if header != "?" else "?"
        print(f"{name:<11} median {s * 1e3:8.2f} ms   (min {min(sup[name]) * 1e3:.2f})   "
              f"ratio {s / b:.3f}   notifications {count}   options {shlex.join(opts) or '-'}")
        rows = [l.strip() for l in stats.stderr.splitlines() if l.startswith("  ")]
        print("            " + ", ".join(rows[:6]))


if __name__ == "__main__":
    main()
