#!/usr/bin/env python3
"""Commands run alternately, side by side in one run: the median wall time of each and its
difference and ratio to the first's.

    python3 scripts/bench-ab.py -n 400 'old=OLD /bin/true' 'new=NEW /bin/true'
    python3 scripts/bench-ab.py -n 150 'bare=python3 -c pass' 'jailed=NEW python3 -c pass'

Each argument is NAME=COMMAND (split like a shell would; leading VAR=value words set the
environment). Two warm-up rounds are not counted. Every command must exit 0. Each round starts
one command later than the one before (A B C, B C A, C A B, ...): a command's work that
outlives it (a namespace's teardown, a write-back) falls on each of the others alike.
"""
import argparse
import os
import shlex
import statistics
import subprocess
import sys
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=100, help="rounds (default 100)")
    ap.add_argument("commands", nargs="+", metavar="NAME=COMMAND")
    args = ap.parse_args()
    runs = {}
    for a in args.commands:
        name, sep, cmd = a.partition("=")
        if not sep or not cmd:
            sys.exit(f"bench-ab: `{a}` is not NAME=COMMAND")
        words, env = shlex.split(cmd), dict(os.environ)
        while words and "=" in words[0] and not words[0].startswith(("/", ".")):
            k, _, v = words.pop(0).partition("=")
            env[k] = v
        runs[name] = (words, env)
    times = {k: [] for k in runs}
    names = list(runs)
    for i in range(args.n + 2):
        for k in names[i % len(names):] + names[: i % len(names)]:
            words, env = runs[k]
            t0 = time.perf_counter()
            r = subprocess.run(words, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            dt = time.perf_counter() - t0
            if r.returncode != 0:
                sys.exit(f"bench-ab: {k} exited {r.returncode}: {r.stderr.decode(errors='replace')}")
            if i >= 2:
                times[k].append(dt * 1000)
    first = statistics.median(times[next(iter(runs))])
    print(f"{args.n} rounds, medians")
    for k in runs:
        m = statistics.median(times[k])
        print(f"{k:16} {m:9.3f} ms  {m - first:+8.3f}  x{m / first:6.3f}")


main()
