#!/usr/bin/env python3
"""Jail set-up cost, side by side in one run: every variant of one command is run in turn,
round after round (so load on the machine hits them alike; each round starts one variant later,
so what a run leaves behind falls on each of the others alike), and the medians are compared.

Variants: bare; `unshare -Urmpf --mount-proc` (the namespace floor: user, mount, pid) and
`unshare -Urmpfn` (with a network namespace too, as bwrap and the jail have);
bubblewrap building a comparable view (user, mount, pid and network namespaces, read-only
/usr, /lib*, /bin, /etc, the interpreter's prefix, tmpfs /tmp, /dev, /proc);
`sigma-supervise --no-jail`; `sigma-supervise` (the σcontainer: user, mount, pid, network,
IPC, UTS namespaces, pivot_root, curated /etc, Landlock, seccomp).

    python3 scripts/bench-jail.py -n 40                        # /bin/true, python3 -c pass, import json
    python3 scripts/bench-jail.py -n 40 --only true
    python3 scripts/bench-jail.py -n 100 --only true --baseline OLD   # OLD: an earlier build
    python3 scripts/bench-jail.py -n 100 --only true --baseline old=OLD --baseline mid=MID

Needs bwrap (Debian's bubblewrap). The supervisor defaults to the release build scripts/build
made last.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchlib import default_supervisor, real_python


def bwrap_view(prefix: str) -> list[str]:
    args = ["bwrap", "--unshare-user", "--unshare-pid", "--unshare-net", "--die-with-parent",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc",
            "--tmpfs", "/tmp", "--dev", "/dev", "--proc", "/proc"]
    for d in ("/bin", "/sbin", "/lib", "/lib64"):
        if os.path.islink(d):
            args += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            args += ["--ro-bind", d, d]
    if not prefix.startswith("/usr"):
        args += ["--ro-bind", prefix, prefix]
    return args


# Every variant runs in a project directory of its own, as a user's run would: the jail shows it
# (a working directory that is /tmp itself, every user's, is not shown by default).
PROJECT = tempfile.TemporaryDirectory(prefix="bench-jail.")


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=PROJECT.name)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        sys.exit(f"bench-jail: {' '.join(cmd)} exited {r.returncode}")
    return dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=30, help="rounds (default 30)")
    ap.add_argument("--supervisor", default=default_supervisor())
    ap.add_argument("--only", choices=["true", "pass", "json"], action="append")
    ap.add_argument("--baseline", metavar="[NAME=]BIN", action="append", default=[],
                    help="another build of sigma-supervise, run jailed alongside in every round "
                         "(repeatable; NAME labels it)")
    args = ap.parse_args()
    if not shutil.which("bwrap"):
        sys.exit("bench-jail: bwrap not found (apt-get install bubblewrap)")
    py = real_python()
    prefix = str(Path(py).resolve().parent.parent)
    workloads = {
        "true": ["/bin/true"],
        "pass": [py, "-c", "pass"],
        "json": [py, "-c", "import json"],
    }
    sup = args.supervisor
    for name in args.only or list(workloads):
        cmd = workloads[name]
        variants = {
            "bare": cmd,
            "unshare -Urmpf": ["unshare", "-Urmpf", "--mount-proc"] + cmd,
            # The same namespaces as bwrap's and the jail's (a network namespace too), no view.
            "unshare -Urmpfn": ["unshare", "-Urmpfn", "--mount-proc"] + cmd,
            "bwrap": bwrap_view(prefix) + cmd,
            "sigma-supervise --no-jail": [sup, "--no-jail"] + cmd,
            "sigma-supervise (jailed)": [sup] + cmd,
        }
        bases = []
        for b in args.baseline:
            name, _, path = b.partition("=") if "=" in b and not b.startswith("/") else ("", "", b)
            label = f"{name or 'baseline'} (jailed)"
            bases.append(label)
            variants[label] = [path] + cmd
        times = {k: [] for k in variants}
        for k, c in variants.items():  # warm-up
            timed(c)
        names = list(variants)
        for i in range(args.n):
            # Each round starts one variant later than the one before: what a run leaves
            # behind (its namespaces' teardown) falls on each of the others alike.
            for k in names[i % len(names):] + names[: i % len(names)]:
                c = variants[k]
                times[k].append(timed(c))
        med = {k: statistics.median(v) * 1000 for k, v in times.items()}
        print(f"\n{' '.join(cmd)}  ({args.n} rounds, medians)")
        print(f"{'variant':28} {'ms':>8} {'over bare ms':>13} {'÷ bare':>8}")
        for k in variants:
            print(f"{k:28} {med[k]:8.2f} {med[k] - med['bare']:13.2f} {med[k] / med['bare']:8.2f}")
        jail_over = med["sigma-supervise (jailed)"] - med["bare"]
        bwrap_over = med["bwrap"] - med["bare"]
        floor_over = med["unshare -Urmpf"] - med["bare"]
        print(f"jailed overhead - namespace floor (unshare -Urmpf) = {jail_over - floor_over:.2f} ms")
        for label in bases:
            base_over = med[label] - med["bare"]
            print(f"jailed overhead / {label.removesuffix(' (jailed)')}'s = {jail_over / base_over:.2f}"
                  f" (over the floor: {base_over - floor_over:.2f} ms)")
        if bwrap_over > 0:
            print(f"jailed overhead / bwrap overhead = {jail_over / bwrap_over:.2f}")
            # The kernel's own price for these namespaces, before any view is built.
            floor = med["unshare -Urmpfn"] - med["bare"]
            print(f"namespace floor (user, mount, pid, net) / bwrap overhead = "
                  f"{floor / bwrap_over:.2f}")


main()
